"""Any timm model (https://github.com/huggingface/pytorch-image-models) as a classifier net, from scratch or from
its pretrained weights, downloaded or already on disk."""

from typing import Any

import timm
from torch import Tensor, nn

from src.models.components.pretrained import check_input_size, check_weights_file, weights_preprocessing


class TimmNet(nn.Module):
    """`timm.create_model(name)` with a head made for `num_classes` and an input layer for the data's channels
    (timm adapts RGB weights to 1 channel by summing them), returning logits.

    `pretrained=true` downloads the weights from the Hugging Face hub on first use (timm caches them);
    `weights_file` loads a file already on disk instead (timm's file overlay: no hub access). Further keys
    (`+model.net.drop_path_rate=0.1`, `+model.net.img_size=32`) go to `timm.create_model`.
    """

    def __init__(
        self,
        name: str,
        input_shape: list[int],
        num_classes: int,
        pretrained: bool = False,
        weights_file: str | None = None,
        drop_rate: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        _check_name(name)
        overlay = {"file": check_weights_file(weights_file)} if weights_file is not None else None
        try:
            self.model = timm.create_model(
                name,
                pretrained=pretrained or weights_file is not None,
                pretrained_cfg_overlay=overlay,
                num_classes=num_classes,
                in_chans=input_shape[0],
                drop_rate=drop_rate,
                **kwargs,
            )
        except Exception as err:
            if not pretrained or weights_file is not None or not _is_network_error(err):
                raise
            raise RuntimeError(
                f"could not download the pretrained weights of model.net.name={name} ({err}); with no network, "
                "give a file already on disk with model.net.weights_file=<path>, or train from scratch with "
                "model.net.pretrained=false"
            ) from err
        size = list(self.model.pretrained_cfg["input_size"][-2:])
        check_input_size(self.model, list(input_shape), f"model.net.name={name}", size)

    @classmethod
    def weights_preprocessing(cls, net: dict[str, Any]) -> dict[str, Any] | None:
        """The mean, std, input size and interpolation of the weights' pretrained config; None from scratch."""
        if not net.get("pretrained") and net.get("weights_file") is None:
            return None
        _check_name(net["name"])
        config = timm.get_pretrained_cfg(net["name"])
        if config is None:
            raise ValueError(
                f"model.net.name={net['name']} has no pretrained weights in timm; set model.net.pretrained=false"
            )
        return weights_preprocessing(
            config.mean, config.std, config.input_size, config.interpolation, f"timm's {net['name']} weights"
        )

    def head_module(self) -> nn.Module:
        """The classifier made for num_classes; the rest is the backbone."""
        return self.model.get_classifier()

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)


def _check_name(name: str) -> None:
    if not timm.is_model(name):
        close = timm.list_models(f"*{name}*")[:8]
        hint = (
            f"e.g. {', '.join(close)}" if close else "see timm.list_models() (resnet18, convnext_atto, ...)"
        )
        raise ValueError(f"model.net.name={name} is not a timm model; {hint}")


def _is_network_error(err: BaseException) -> bool:
    """The hub could not be reached: an OS-level error, or one of the HTTP clients huggingface_hub uses."""
    package = type(err).__module__.split(".")[0]
    return isinstance(err, OSError | ConnectionError) or package in {
        "httpx",
        "httpx2",
        "httpcore",
        "httpcore2",
        "huggingface_hub",
        "requests",
        "urllib3",
    }
