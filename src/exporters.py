"""Export formats, each with a parity check that runs the written artifact and compares it with the model.

- onnx: `torch.onnx.export` (the current, dynamo-based exporter), a dynamic batch axis, checked with
  onnxruntime. Needs the export extra: pip install -e ".[export]".
- torch_export: a `torch.export` ExportedProgram (.pt2), dynamic batch, checked by loading it back.
- state_dict: the net's bare weights (.pt), checked by loading them into a net built from its config.

Each artifact outputs the net's logits for a batch of preprocessed images (apply softmax for
probabilities). The check feeds real images in two batch sizes, so a batch axis that was not really
dynamic fails too.
"""

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

ONNX_PACKAGES = ("onnx", "onnxruntime", "onnxscript")  # torch.onnx.export needs onnxscript since torch 2.9


def require(packages: tuple[str, ...], what: str) -> None:
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f'{what} needs the export extra (missing: {", ".join(missing)}): pip install -e ".[export]"'
        )


def _batch_dim() -> dict[int, Any]:
    return {0: torch.export.Dim("batch", min=1, max=4096)}


def save_onnx(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    require(ONNX_PACKAGES, "format=onnx")
    torch.onnx.export(
        model,
        (example,),
        str(path),
        dynamo=True,
        input_names=["images"],
        output_names=["logits"],
        dynamic_shapes=(_batch_dim(),),
        # One self-contained .onnx file; past protobuf's 2 GB limit the weights go to <name>.onnx.data.
        external_data=sum(p.numel() * p.element_size() for p in model.parameters()) > 1_800_000_000,
        verbose=False,
    )


def run_onnx(path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda images: torch.from_numpy(session.run(None, {"images": images.numpy()})[0])


def save_torch_export(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    program = torch.export.export(model, (example,), dynamic_shapes=(_batch_dim(),))
    torch.export.save(program, str(path))


def run_torch_export(path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    return torch.export.load(str(path)).module()


def save_state_dict(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    torch.save(model.net.state_dict(), path)


def run_state_dict(path: Path, net_config: dict[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    net = instantiate(net_config)
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return net.eval()


FORMATS = {  # name: (file suffix, writer)
    "onnx": (".onnx", save_onnx),
    "torch_export": (".pt2", save_torch_export),
    "state_dict": (".pt", save_state_dict),
}


def loader_for(fmt: str, path: Path, net_config: dict[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    if fmt == "onnx":
        return run_onnx(path)
    if fmt == "torch_export":
        return run_torch_export(path)
    return run_state_dict(path, net_config)


def check_parity(
    reference: Callable[[torch.Tensor], torch.Tensor],
    candidate: Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    tolerance: float,
    what: str,
) -> float:
    """The largest absolute difference of the candidate's outputs from the reference's, over the whole batch
    and its first few samples; an error when it exceeds `tolerance`."""
    worst = 0.0
    with torch.no_grad():
        for batch in (images, images[: max(1, len(images) // 2 - 1)]):
            expected, got = reference(batch).float(), candidate(batch).float()
            if got.shape != expected.shape:
                raise ValueError(
                    f"{what} gives outputs of shape {list(got.shape)}, the model {list(expected.shape)}"
                )
            worst = max(worst, (got - expected).abs().max().item())
    if not worst <= tolerance:  # also catches NaN
        raise ValueError(
            f"{what} failed its parity check: its outputs differ from the model's by up to {worst:.3g}, more than "
            f"tolerance={tolerance:g} (on {len(images)} real images); do not use it"
        )
    return worst
