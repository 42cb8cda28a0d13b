"""Class names as every part of a task shows them: the data names them, models save them with their
checkpoints, pictures and prediction files print them. Here, so that none of those imports another."""

from collections.abc import Sequence
from typing import Any


def names_or_indices(names: Sequence[Any] | None, num_classes: int) -> list[str]:
    """The class names as strings, or "0" .. "num_classes-1" for a dataset that does not name its classes."""
    return [str(name) for name in names] if names else [str(i) for i in range(num_classes)]
