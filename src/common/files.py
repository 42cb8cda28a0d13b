"""Files written whole or not at all: the run record, the shards' facts and the sweep summary write through
this one function. Here, so that the run machinery, the data and the Hydra plugins share it without importing
each other."""

import os
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Readers never see a half-written file; jobs running in parallel each write their own temporary."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
