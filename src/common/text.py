"""The tokenizer of a text net, as the data (which tokenizes) and the net (whose embeddings must cover its
vocabulary) both load it. Here, so that neither imports the other. transformers is imported only when a
tokenizer is loaded: a run without text never pays for it."""

import hashlib
from pathlib import Path
from typing import Any


def load_tokenizer(source: str, key: str = "model.net.tokenizer") -> Any:
    """The tokenizer in folder `source` (a `save_pretrained` folder: no network) or of hub name `source`
    (downloaded once, then cached by Hugging Face). `key` is the config key errors name."""
    try:
        from transformers import AutoTokenizer
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(f'{key}={source} needs the text extra: pip install -e ".[text]"') from err
    if source is None:
        raise ValueError(f"{key} is null: give a tokenizer folder (save_pretrained) or a hub name")
    folder = Path(source)
    if folder.exists():
        if not folder.is_dir() or (
            not any(folder.glob("tokenizer*.json")) and not any(folder.glob("vocab.*"))
        ):
            raise FileNotFoundError(
                f"{key}={source} holds no tokenizer (no tokenizer.json or vocab file): give the folder a "
                "tokenizer was saved to with save_pretrained"
            )
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise FileNotFoundError(f"{key}={source} does not exist; give a tokenizer folder or a hub name")
    try:
        return AutoTokenizer.from_pretrained(source)
    except OSError as err:
        raise OSError(
            f"{key}={source} is neither a folder nor a hub model that could be loaded (offline? give a "
            f"save_pretrained folder): {str(err).splitlines()[0]}"
        ) from err


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of what the tokenizer does (its full definition: vocabulary, normalizer, pre-tokenizer, special
    tokens), the same wherever it was loaded from: the tokenization cache is keyed by it."""
    definition = (
        tokenizer.backend_tokenizer.to_str() if hasattr(tokenizer, "backend_tokenizer") else repr(tokenizer)
    )
    return hashlib.sha256(definition.encode()).hexdigest()[:16]
