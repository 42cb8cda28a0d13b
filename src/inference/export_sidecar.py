"""The .json beside an export: what the artifact expects (input shape, image mode, preprocessing; a text net's
token ids, and the tokenizer saved beside it) and gives (the task module's `output_description()`), the class
names and net config, and how its parity was checked."""

import json
import logging
from pathlib import Path

from lightning import LightningModule

from src.inference.export_formats import PARITY_RULE

log = logging.getLogger(__name__)


def write_sidecar(
    artifact: Path, model: LightningModule, fmt: str, max_diff: float, tolerance: float, checkpoint: Path
) -> Path:
    """<artifact>.json: what the artifact expects and gives, and how it was checked."""
    preprocessing = model.hparams.get("preprocessing") or {}  # none: trained before predict was added
    sidecar = artifact.with_name(artifact.name + ".json")
    described = {  # image_mode and preprocessing are null when the datamodule did not say
        "shape": ["batch", *(preprocessing.get("input_shape") or [])],
        "dtype": "float32",
        "image_mode": preprocessing.get("image_mode"),
        "preprocessing": preprocessing.get("transform"),
    }
    # part: text
    if preprocessing.get("kind") == "text":
        from src.inference.text_inputs import save_tokenizer_beside

        described = save_tokenizer_beside(artifact, preprocessing)
    # /part
    if described["preprocessing"] is None:
        log.warning(
            f"{sidecar.name}: the input preprocessing is null, since {preprocessing.get('datamodule', 'the checkpoint')} does not "
            "say how an image file becomes the net's input; feed the artifact what its test split gives"
        )
    sidecar.write_text(
        json.dumps(
            {
                "format": fmt,
                "checkpoint": str(checkpoint),
                "input": described,
                "output": model.output_description(),
                "class_names": model.label_names(),
                "net": model.hparams.net,
                "parity": {"max_diff": max_diff, "tolerance": tolerance, "rule": PARITY_RULE},
            },
            indent=1,
        )
        + "\n"
    )
    return sidecar
