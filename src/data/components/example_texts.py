"""The example text dataset: generated, deterministic, offline, in about a second.

What it is: restaurant-review sentences made from templates, e.g. "although the soup was not bland, the
waiter seemed rude" -> negative. Each clause says the {aspect} {was, is, seemed} [not, never, hardly]
[really, very, ...] {adjective}: positive or negative, flipped by the negation. One or two clauses make a
sentence, and the label follows from the clauses and their ORDER:

- one clause: its sentiment;
- "A and B": their sentiment when they agree, else `mixed`;
- "A but B", "although A, B", "B although A": B's sentiment (B is the other sentiment than A).

So "the food was not bad but the service was awful" is negative and "the food was bad but the service was not
awful" positive: the same bag of words with two labels. A bag-of-words model cannot read negation or which
clause comes after "but" (scripts/text_baseline.py: its accuracy); a transformer can. Three classes
(negative, mixed, positive), 6,000 training and 1,000 test sentences, every sentence distinct.

`experiment` configs build it on first use (configs/data/example_texts.yaml: TextDataModule's `prepare`):
`out/train.csv` and `out/test.csv` (`text,label` with class names), and `out/tokenizer`, a BERT-style
WordPiece tokenizer made from the training sentences only ([PAD] is id 0; lowercase; [CLS] ... [SEP]).
"""

import csv
import logging
import os
import random
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

CLASS_NAMES = ["negative", "mixed", "positive"]
ASPECTS = [
    "food", "service", "staff", "music", "room", "view", "price", "coffee", "wine", "bread", "menu", "waiter",
    "location", "dessert", "soup", "pasta", "terrace", "breakfast",
]  # fmt: skip
POSITIVE = [
    "good", "great", "lovely", "excellent", "fine", "tasty", "friendly", "perfect", "nice", "superb",
    "pleasant", "wonderful",
]  # fmt: skip
NEGATIVE = [
    "bad", "awful", "terrible", "poor", "bland", "rude", "slow", "dull", "horrible", "noisy", "cold",
    "mediocre",
]  # fmt: skip
VERBS = ["was", "is", "seemed"]
NEGATIONS = ["not", "never", "hardly"]
INTENSIFIERS = ["really", "very", "quite", "rather", "truly"]
OPENERS = ["honestly,", "overall", "i think", "to be fair,", "sadly", "frankly,"]
# The sentence templates (see the module docstring) and their shares, and the share of negated clauses: together
# they set how far a bag of words gets (about 0.8: it fails on negations and on the order templates).
TEMPLATES = {"one": 0.3, "and": 0.45, "but": 0.09, "although": 0.08, "although_last": 0.08}
NEGATED = 0.1
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] is id 0, as in BERT


def make_example_texts(
    out: str | Path, train: int = 6000, test: int = 1000, seed: int = 0, exist_ok: bool = False
) -> Path:
    """Write `train` + `test` distinct sentences and the tokenizer into `out` (see the module docstring).

    `seed` fixes the sentences and which of them are test sentences. An existing `out` is kept as it is with
    `exist_ok` (a build on first use), else refused. The folder is written beside `out` and renamed at the
    end, so a run killed halfway leaves no half folder, and processes that build it at once keep the first.
    """
    out = Path(out)
    if out.exists():
        if exist_ok:
            return out
        raise FileExistsError(f"{out} already exists; remove it or choose another output folder")
    if train < 1 or test < 1:
        raise ValueError(f"need at least one training ({train}) and one test ({test}) sentence")
    rows = sentences(train + test, random.Random(seed))
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        partial.mkdir(parents=True)
        for name, part in (("test.csv", rows[:test]), ("train.csv", rows[test:])):
            with open(partial / name, "w", newline="") as file:
                csv.writer(file).writerows([("text", "label"), *part])
        make_tokenizer([text for text, _ in rows[test:]], partial / "tokenizer")
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    try:
        partial.rename(out)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not (exist_ok and out.is_dir()):  # else another process (another rank or node) was first
            raise
        return out
    log.info(f"Wrote {train} training and {test} test sentences and their tokenizer to {out}")
    return out


def sentences(count: int, rng: random.Random) -> list[tuple[str, str]]:
    """`count` distinct (sentence, class name) pairs."""
    seen: dict[str, str] = {}
    templates, shares = list(TEMPLATES), list(TEMPLATES.values())
    while len(seen) < count:
        text, label = sentence(rng.choices(templates, shares)[0], rng)
        seen.setdefault(text, label)
    return list(seen.items())


def sentence(template: str, rng: random.Random) -> tuple[str, str]:
    """One sentence of `template` and its class name."""
    first, first_sentiment = clause(rng, rng.choice((1, -1)))
    if template == "one":
        text, sentiment = first, first_sentiment
    else:
        # "but" and "although" join opposite sentiments; "and" joins either.
        wanted = rng.choice((1, -1)) if template == "and" else -first_sentiment
        second, sentiment = clause(rng, wanted)
        aspect = first.split()[1]
        while second.split()[1] == aspect:  # two clauses about one aspect read oddly
            second, sentiment = clause(rng, wanted)
        if template == "and":
            text = f"{first} and {second}"
            sentiment = sentiment if sentiment == first_sentiment else 0
        else:
            text = {
                "but": f"{first} but {second}",
                "although": f"although {first}, {second}",
                "although_last": f"{second} although {first}",
            }[template]
    if rng.random() < 0.3:
        text = f"{rng.choice(OPENERS)} {text}"
    return text, CLASS_NAMES[sentiment + 1]


def clause(rng: random.Random, sentiment: int) -> tuple[str, int]:
    """'the {aspect} {verb} [negation] [intensifier] {adjective}' with the given sentiment (1 or -1)."""
    negated = rng.random() < NEGATED
    adjectives = POSITIVE if (sentiment > 0) != negated else NEGATIVE
    words = ["the", rng.choice(ASPECTS), rng.choice(VERBS)]
    if negated:
        words.append(rng.choice(NEGATIONS))
    if rng.random() < 0.3:
        words.append(rng.choice(INTENSIFIERS))
    words.append(rng.choice(adjectives))
    return " ".join(words), sentiment


def make_tokenizer(texts: list[str], folder: Path) -> None:
    """A BERT-style WordPiece tokenizer of `texts`, saved with save_pretrained into `folder`: lowercase, [CLS]
    text [SEP], and a vocabulary of the special tokens, every word of `texts` and every character (alone and
    as a "##" continuation), so that a word it has not seen is spelled out, not [UNK]. Counted rather than
    learnt with tokenizers' WordPiece trainer, which breaks ties between equally frequent pieces differently in
    every process: the same texts give the same tokenizer file."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = sorted(
        {word for text in texts for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))}
    )
    characters = sorted({character for word in words for character in word})
    pieces = [*SPECIAL_TOKENS, *characters, *(f"##{character}" for character in characters), *words]
    vocabulary = {piece: i for i, piece in enumerate(dict.fromkeys(pieces))}
    tokenizer = Tokenizer(models.WordPiece(vocabulary, unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    tokenizer.decoder = decoders.WordPiece()
    cls, sep = vocabulary["[CLS]"], vocabulary["[SEP]"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    ).save_pretrained(str(folder))
