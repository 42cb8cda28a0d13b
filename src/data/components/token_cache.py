"""Token ids of a text file, tokenized once and kept on disk, and the dataset that serves them.

The cache file is `<cache_dir>/<sha256 of the file's bytes>-<tokenizer fingerprint>-<text column>.pt`: a
changed file, another tokenizer or another column is another file, so a stale cache is never read. It holds the
ids untruncated (`max_length` is applied when a sample is read: changing it needs no new tokenization) as one
flat int32 tensor with row offsets, which `torch.load(weights_only=True)` reads.
"""

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from src.common.text import tokenizer_fingerprint

log = logging.getLogger(__name__)

CHUNK = 10_000  # texts per tokenizer call: the ids of one chunk at a time exist as Python lists


def cache_path(cache_dir: str | Path, file: str | Path, tokenizer: Any, text_column: str) -> Path:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    column = re.sub(r"[^A-Za-z0-9_.-]", "_", text_column)[:40]
    return Path(cache_dir) / f"{digest.hexdigest()}-{tokenizer_fingerprint(tokenizer)}-{column}.pt"


def tokenize(texts: list[str], tokenizer: Any) -> dict[str, Any]:
    """The ids of every text with the tokenizer's special tokens, untruncated: {"ids": flat int32 tensor,
    "offsets": int64 (n + 1,), text i's ids being ids[offsets[i]:offsets[i + 1]], "tail": how many special
    tokens the tokenizer adds at the end ([SEP]: 1), which truncation keeps}."""
    pieces = []
    for start in range(0, len(texts), CHUNK):
        ids = tokenizer(texts[start : start + CHUNK], add_special_tokens=True)["input_ids"]
        pieces.extend(torch.tensor(row, dtype=torch.int32) for row in ids)
    lengths = torch.tensor([len(piece) for piece in pieces], dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    ids = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int32)
    return {"ids": ids, "offsets": offsets, "tail": trailing_special_tokens(tokenizer)}


def trailing_special_tokens(tokenizer: Any) -> int:
    """How many ids the tokenizer appends after a text's own ([SEP] for BERT: 1; none for GPT-2: 0)."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    start = next(i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain)
    return len(full) - start - len(plain)


def cached_tokens(
    file: str | Path,
    texts: list[str],
    tokenizer: Any,
    text_column: str,
    cache_dir: str | Path | None,
    write: bool,
) -> dict[str, Any]:
    """`tokenize(texts)` of `file`, read from the cache when it has them; tokenized and, with `write`, saved
    otherwise (written whole, then renamed: a reader never sees half a file)."""
    path = cache_path(cache_dir, file, tokenizer, text_column) if cache_dir is not None else None
    if path is not None and path.is_file():
        log.info(f"Token ids of {file} read from the cache {path}")
        return torch.load(path, weights_only=True)
    log.info(f"Tokenizing the {len(texts)} texts of {file}")
    tokens = tokenize(texts, tokenizer)
    if path is not None and write:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        torch.save(tokens, partial)
        os.replace(partial, path)
    return tokens


class TokenizedTexts(Dataset):
    """`(ids, label)` samples: the token ids of one text (LongTensor, truncated to `max_length` keeping the
    last `tail` special tokens) and its class index. `lengths` and `targets` give every sample's length and
    label without reading it (the length-grouped batches and the folds use them)."""

    def __init__(
        self, ids: Tensor, offsets: Tensor, targets: list[int], max_length: int, tail: int = 0
    ) -> None:
        self.ids, self.offsets, self.targets = ids, offsets, targets
        self.max_length, self.tail = max_length, tail
        self.lengths = (offsets[1:] - offsets[:-1]).clamp(max=max_length)

    @property
    def tokens(self) -> dict[str, Any]:
        """The samples' untruncated ids in the form `tokenize` gives."""
        return {"ids": self.ids, "offsets": self.offsets, "tail": self.tail}

    @classmethod
    def joined(
        cls, parts: list[tuple[dict[str, Any], list[int]]], targets: list[int], max_length: int
    ) -> "TokenizedTexts":
        """The dataset of the chosen rows of several `tokenize` results, one after the other; `targets` are
        their labels, in that order."""
        pieces, lengths = [], []
        for tokens, rows in parts:
            offsets, rows = tokens["offsets"], torch.as_tensor(rows, dtype=torch.int64)
            starts, sizes = offsets[rows], offsets[rows + 1] - offsets[rows]
            # Every id of the chosen rows at once: each row's start, repeated for its ids, plus 0, 1, ...
            within = torch.arange(int(sizes.sum())) - torch.repeat_interleave(sizes.cumsum(0) - sizes, sizes)
            pieces.append(tokens["ids"][torch.repeat_interleave(starts, sizes) + within])
            lengths.append(sizes)
        sizes = torch.cat(lengths)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
        tail = max(tokens["tail"] for tokens, _ in parts)
        return cls(torch.cat(pieces), offsets, targets, max_length, tail)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        ids = self.ids[start:end]
        if end - start > self.max_length:
            head = self.max_length - self.tail
            ids = torch.cat([ids[:head], ids[len(ids) - self.tail :]]) if self.tail else ids[:head]
        return ids.long(), self.targets[index]

    def truncated(self) -> int:
        """How many samples are longer than `max_length` (and lose their ends)."""
        return int(((self.offsets[1:] - self.offsets[:-1]) > self.max_length).sum())
