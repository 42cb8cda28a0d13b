"""Export formats, each with a parity check that runs the written artifact and compares it with the model.

- onnx: `torch.onnx.export` (the current, dynamo-based exporter), a dynamic batch axis, checked with
  onnxruntime. Needs the export extra: pip install -e ".[export]".
- torch_export: a `torch.export` ExportedProgram (.pt2), dynamic batch, checked by loading it back.
- state_dict: the net's bare weights (.pt), checked by loading them into a net built from its config.

Each artifact gives the net's output for a batch of its inputs (preprocessed images; a text's token ids and
attention mask), named and with dynamic axes as the task module says (`export_inputs`, `export_axes`,
`export_net`): what it means is the task module's
`output_description()`, written into the .json beside it (a classifier's (N, classes) logits, a segmenter's
(N, classes, H, W) per-pixel logits). The check feeds real inputs in two batch sizes (texts: two sequence
lengths too), so an axis that was not really dynamic fails too.
"""

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

ONNX_PACKAGES = ("onnx", "onnxruntime", "onnxscript")  # torch.onnx.export needs onnxscript since torch 2.9

# The net's inputs in (positionally, in the order export_inputs names them), its output out.
Runnable = Callable[..., torch.Tensor]
Inputs = dict[str, torch.Tensor]  # a batch of the net's inputs by name (the ONNX inputs' names)

# What check_parity allows, as the sidecar states it.
PARITY_RULE = "max |artifact - model| <= tolerance * max(1, max |model|), over each batch's outputs"


def require(packages: tuple[str, ...], what: str) -> None:
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f'{what} needs the export extra (missing: {", ".join(missing)}): pip install -e ".[export]"'
        )


def dynamic_shapes(model: nn.Module, example: Inputs) -> tuple[dict[int, Any], ...]:
    """The dynamic axes of each input (the batch; a text's sequence too), as the task module says."""
    axes = model.export_axes()
    return tuple(axes[name] for name in example)


def save_onnx(model: nn.Module, example: Inputs, path: Path) -> None:
    torch.onnx.export(
        model.export_net(),
        tuple(example.values()),
        str(path),
        dynamo=True,
        input_names=list(example),
        output_names=[model.output_description()["name"]],  # "logits" for the template's tasks
        dynamic_shapes=dynamic_shapes(model, example),
        # One self-contained .onnx file; past protobuf's 2 GB limit the weights go to <name>.onnx.data.
        external_data=sum(p.numel() * p.element_size() for p in model.parameters()) > 1_800_000_000,
        verbose=False,
    )


def load_onnx(path: Path, net_config: dict[str, Any]) -> Runnable:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        feed = {name: tensor.numpy() for name, tensor in zip(names, inputs, strict=True)}
        return torch.from_numpy(session.run(None, feed)[0])

    return run


def save_torch_export(model: nn.Module, example: Inputs, path: Path) -> None:
    program = torch.export.export(
        model.export_net(), tuple(example.values()), dynamic_shapes=dynamic_shapes(model, example)
    )
    torch.export.save(program, str(path))


def load_torch_export(path: Path, net_config: dict[str, Any]) -> Runnable:
    return torch.export.load(str(path)).module()


def save_state_dict(model: nn.Module, example: Inputs, path: Path) -> None:
    torch.save(model.net.state_dict(), path)


def load_state_dict(path: Path, net_config: dict[str, Any]) -> Runnable:
    net = instantiate(net_config)  # the bare weights need the net's config to become a net again
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return net.eval()


@dataclass(frozen=True)
class Format:
    """How an export format is written, and how the written artifact is loaded back for the parity check."""

    suffix: str  # of the artifact's file name
    save: Callable[[nn.Module, Inputs, Path], None]  # (task module, example inputs, path)
    load: Callable[[Path, dict[str, Any]], Runnable]  # (path, the net's config) -> inputs to outputs
    packages: tuple[str, ...] = ()  # what it needs besides torch, checked before anything is written


FORMATS = {
    "onnx": Format(".onnx", save_onnx, load_onnx, ONNX_PACKAGES),
    "torch_export": Format(".pt2", save_torch_export, load_torch_export),
    "state_dict": Format(".pt", save_state_dict, load_state_dict),
}


@contextmanager
def staged(artifact: Path) -> Iterator[Path]:
    """A path to write the artifact to, moved to `artifact` only when the block succeeds: an export that fails
    its parity check leaves nothing behind, and the earlier artifact that overwrite=true would replace stays."""
    artifact.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{artifact.name}.", dir=artifact.parent))
    try:
        yield staging / artifact.name
        # The artifact, and an ONNX model's external weights when it has them.
        for written in staging.iterdir():
            os.replace(written, artifact.parent / written.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_parity(
    reference: Runnable,
    candidate: Runnable,
    batches: torch.Tensor | list[Inputs],
    tolerance: float,
    what: str,
) -> float:
    """The largest difference of the candidate's outputs from the reference's, on each batch of inputs (a
    tensor of images: the batch and its first few), relative to the reference's largest output when that is
    above 1 (PARITY_RULE); an error when it exceeds `tolerance`. Float32 rounds to a share of the values it
    adds up, so a net whose logits reach 16 (a trained segmenter's) differs by more, on every output, than one
    whose logits stay near 1."""
    if isinstance(batches, torch.Tensor):
        batches = [{"images": batches}, {"images": batches[: max(1, len(batches) // 2 - 1)]}]
    worst = 0.0
    with torch.no_grad():
        for batch in batches:
            expected, got = reference(*batch.values()).float(), candidate(*batch.values()).float()
            if got.shape != expected.shape:
                raise ValueError(
                    f"{what} gives outputs of shape {list(got.shape)}, the model {list(expected.shape)}"
                )
            scale = max(1.0, expected.abs().max().item())
            worst = max(worst, (got - expected).abs().max().item() / scale)
    if not worst <= tolerance:  # also catches NaN
        count = len(next(iter(batches[0].values())))
        raise ValueError(
            f"{what} failed its parity check: its outputs differ from the model's by up to {worst:.3g} (relative "
            "to the model's largest output when above 1), more than "
            f"tolerance={tolerance:g} (on {count} real inputs); it is not kept"
        )
    return worst
