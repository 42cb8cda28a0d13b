"""A torchvision classification model (`torchvision.models`) as a classifier net, from scratch or from its
pretrained weights, downloaded or already on disk."""

from typing import Any

import torch
import torchvision
from torch import Tensor, nn

from src.models.components.pretrained import check_input_size, check_weights_file, weights_preprocessing


class TorchvisionNet(nn.Module):
    """`torchvision.models.get_model(name, weights=...)` whose last Linear layer (its classifier) is made anew
    for `num_classes`, returning logits. These models take 3 channels: a grayscale input is repeated to three.

    `weights`: the name of one of the model's weights (`IMAGENET1K_V1`, `DEFAULT`, ...), downloaded on first use
    (torch caches them), or null for random ones. `weights_file`: those weights already on disk (torchvision's
    .pth file), loaded instead of downloading; `weights` then only says which they are (null: DEFAULT), for
    the preprocessing. Further keys go to the model's builder.
    """

    def __init__(
        self,
        name: str,
        input_shape: list[int],
        num_classes: int,
        weights: str | None = None,
        weights_file: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        _check_name(name)
        if input_shape[0] not in (1, 3):
            raise ValueError(
                f"model.net.name={name} takes 1 or 3 channels, not data.input_shape[0]={input_shape[0]}"
            )
        self.repeat = 3 if input_shape[0] == 1 else 1
        enum = _weights(name, weights) if weights is not None else None
        if weights_file is not None:
            self.model = torchvision.models.get_model(name, weights=None, **kwargs)
            state = torch.load(check_weights_file(weights_file), map_location="cpu", weights_only=True)
            try:
                self.model.load_state_dict(state)
            except RuntimeError as err:
                raise ValueError(
                    f"model.net.weights_file={weights_file} does not hold weights of torchvision's {name}: "
                    f"{str(err).splitlines()[0]}"
                ) from err
        else:
            try:
                self.model = torchvision.models.get_model(name, weights=enum, **kwargs)
            except OSError as err:  # the download failed
                raise RuntimeError(
                    f"could not download the weights model.net.weights={weights} of {name} ({err}); with no "
                    "network, give the file with model.net.weights_file=<path>, or train from scratch with "
                    "model.net.weights=null"
                ) from err
        self._head_name = _replace_last_linear(self.model, num_classes, name)
        size = (enum or torchvision.models.get_model_weights(name).DEFAULT).transforms().crop_size
        check_input_size(self, list(input_shape), f"model.net.name={name}", [size[0], size[-1]])

    @classmethod
    def weights_preprocessing(cls, net: dict[str, Any]) -> dict[str, Any] | None:
        """The mean, std, crop size and interpolation of the weights' transforms; None for random weights."""
        if net.get("weights") is None and net.get("weights_file") is None:
            return None
        _check_name(net["name"])
        enum = _weights(net["name"], net.get("weights") or "DEFAULT")
        transforms = enum.transforms()
        size = transforms.crop_size
        return weights_preprocessing(
            transforms.mean,
            transforms.std,
            [size[0], size[-1]],
            transforms.interpolation.value,
            f"torchvision's {enum}",
        )

    def head_module(self) -> nn.Module:
        """The classifier made for num_classes; the rest is the backbone."""
        return self.model.get_submodule(self._head_name)

    def forward(self, x: Tensor) -> Tensor:
        if self.repeat > 1:
            x = x.expand(-1, self.repeat, -1, -1)
        out = self.model(x)
        # GoogLeNet and Inception return auxiliary logits beside the main ones in training.
        return out if isinstance(out, Tensor) else out[0]


def _check_name(name: str) -> None:
    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        raise ValueError(
            f"model.net.name={name} is not a torchvision classification model; choose one of {', '.join(available)}"
        )


def _weights(name: str, weights: str) -> Any:
    enum = torchvision.models.get_model_weights(name)
    if weights not in enum.__members__:
        raise ValueError(
            f"model.net.weights={weights} is not a weight of {name}; choose {', '.join(enum.__members__)} or null"
        )
    return enum[weights]


def _replace_last_linear(model: nn.Module, num_classes: int, name: str) -> str:
    """Replace the model's last Linear layer by one with `num_classes` outputs; return its name."""
    linears = [module_name for module_name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise ValueError(
            f"model.net.name={name} has no Linear classifier to make anew for the data's classes"
        )
    old = model.get_submodule(linears[-1])
    model.set_submodule(linears[-1], nn.Linear(old.in_features, num_classes))
    return linears[-1]
