"""What predict runs a text classifier on (`inputs=`: a .txt file, one text per line, or a CSV, TSV, JSON lines
or Parquet file with the training data's text column), tokenized as the checkpoint's data was; and the
tokenizer an export saves beside its artifact, so that the artifact is usable alone."""

import shutil
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from src.common.text import load_tokenizer
from src.data.components.text_batches import PadCollate
from src.data.components.text_files import FORMATS, read_text_file


def read_texts(inputs: Any, text_column: str) -> list[str]:
    """The texts of `inputs`, a file or a list of files, in order: each non-blank line of a .txt file, the
    `text_column` of a table file."""
    texts: list[str] = []
    for item in [inputs] if isinstance(inputs, str) else list(inputs):
        path = Path(str(item)).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"inputs: {item} is not a file; give a .txt file (one text per line) or a "
                f"{', '.join(FORMATS)} file with a {text_column} column"
            )
        if path.suffix.lower() == ".txt":
            texts += [line for line in path.read_text().splitlines() if line.strip()]
        else:
            texts += read_text_file(path, text_column, None, "inputs")[0]
    if not texts:
        raise ValueError(f"inputs={inputs} holds no text")
    return texts


def text_loader(texts: list[str], preprocessing: dict[str, Any], batch_size: int) -> DataLoader:
    """Batches of `texts` as the net takes them: tokenized by the checkpoint's tokenizer, cut to its data's
    max_length, padded to each batch's longest."""
    tokenizer = load_tokenizer(preprocessing["tokenizer"], "the checkpoint's tokenizer")
    encoded = tokenizer(texts, truncation=True, max_length=preprocessing["max_length"])["input_ids"]
    samples = [(torch.tensor(ids, dtype=torch.long), -1) for ids in encoded]  # -1: no label
    return DataLoader(samples, batch_size=batch_size, collate_fn=PadCollate(tokenizer.pad_token_id))


def save_tokenizer_beside(artifact: Path, preprocessing: dict[str, Any]) -> dict[str, Any]:
    """Save the checkpoint's tokenizer as `<artifact>.tokenizer/` (replacing an earlier one: the artifact it
    belonged to is being replaced too); return the sidecar's `input` entry."""
    folder = artifact.with_name(artifact.name + ".tokenizer")
    shutil.rmtree(folder, ignore_errors=True)
    load_tokenizer(preprocessing["tokenizer"], "the checkpoint's tokenizer").save_pretrained(folder)
    return {
        "names": ["input_ids", "attention_mask"],
        "shape": ["batch", "sequence"],
        "dtype": "int64",
        "tokenizer": folder.name,  # beside the artifact
        "max_length": preprocessing["max_length"],
        "preprocessing": f"tokenize with {folder.name}, truncate to max_length, pad to the longest text",
    }
