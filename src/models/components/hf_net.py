"""Any Hugging Face `AutoModelForSequenceClassification` as a text classifier net: from a hub name, from a
`save_pretrained` folder (no network), or from scratch from config keys; optionally with LoRA adapters (peft).

transformers and peft are imported inside the functions that use them: importing this module costs nothing.
"""

import copy
import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from src.common.text import load_tokenizer

LORA_DEFAULTS = {"r": None, "alpha": 16, "dropout": 0.1, "target_modules": None}


class HFNet(nn.Module):
    """A sequence classifier whose head is made for `num_classes`, mapping a batch's `input_ids` and
    `attention_mask` (B, L), padded with the tokenizer's pad token, to (B, num_classes) logits.

    The base is, by the first key set: `weights_dir` (a save_pretrained folder, loaded with no network),
    `name` (a hub name, downloaded once), else a new model of architecture `config` (`model_type` and the
    sizes, for `AutoConfig.for_model`; `vocab_size: null` is the tokenizer's size).

    `lora.r` set: the base is frozen and only LoRA adapters (on `lora.target_modules`, null: peft's default
    for the architecture) and the head train. Then the net's state_dict holds only those trainable tensors
    and a reference to the base (its source and the sha256 of its weights): checkpoints stay small, and
    loading one rebuilds the base from this config and refuses a base whose weights differ. `merged()`
    gives the plain model with the adapters folded in, for export.
    """

    def __init__(
        self,
        num_classes: int,
        tokenizer: str,
        name: str | None = None,
        weights_dir: str | None = None,
        config: dict[str, Any] | None = None,
        lora: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        vocabulary = load_tokenizer(tokenizer, "model.net.tokenizer")
        if vocabulary.pad_token_id is None:
            raise ValueError(
                f"model.net.tokenizer={tokenizer} has no padding token, and batches are padded: give a "
                "tokenizer with one (for GPT-style ones, save it after tokenizer.pad_token = tokenizer.eos_token)"
            )
        lora = {**LORA_DEFAULTS, **(lora or {})}
        key, source = ("model.net.weights_dir", weights_dir) if weights_dir else ("model.net.name", name)
        if lora["r"] and source is None:
            raise ValueError(
                f"model.net.lora.r={lora['r']} needs pretrained weights (LoRA adapts a frozen base; from "
                "scratch it would be random): set model.net.weights_dir or model.net.name, or lora.r=null"
            )
        if source is None:
            key, source = "model.net.config.vocab_size", (config or {}).get("vocab_size")
            model = from_scratch(config or {}, num_classes, len(vocabulary))
        else:
            model = from_pretrained(key, source, num_classes)
        check_vocabulary(model, len(vocabulary), tokenizer, key, source)
        model.config.pad_token_id = vocabulary.pad_token_id
        # The head: the children of the model besides its backbone (`bert`, `roberta`, ...) that hold weights.
        self.head_names = [
            child_name
            for child_name, child in model.named_children()
            if child_name != model.base_model_prefix and any(True for _ in child.parameters())
        ]
        self.base: dict[str, str] = {}  # with LoRA: what the adapters were trained on (see get_extra_state)
        if lora["r"]:
            self.base = {"key": key, "source": str(source), "sha256": weights_sha256(model, self.head_names)}
            model = with_lora(model, lora, self.head_names)
        # from_pretrained returns the model in eval mode (dropout off), which Lightning would keep.
        self.model = model.train()
        trainable = {f"model.{n}" for n, p in model.named_parameters() if p.requires_grad}
        # The state_dict entries a checkpoint leaves out (the frozen base under LoRA), which loading takes
        # from the base this config builds.
        self.frozen_keys = [f"model.{k}" for k in model.state_dict() if f"model.{k}" not in trainable]
        if not self.base:
            self.frozen_keys = []
        self.register_state_dict_post_hook(leave_out_frozen)
        self.register_load_state_dict_pre_hook(take_frozen_from_base)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        # Positional tensors, not the batch's dict: an export traces the net with them as its inputs.
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def max_length(self) -> int:
        """The longest sequence the model takes (its position embeddings)."""
        return int(getattr(self.model.config, "max_position_embeddings", None) or 4096)

    def head_module(self) -> nn.Module:
        """The classifier made for num_classes (with LoRA: peft's trainable copy and the original); the rest
        is the backbone, which fine-tuning freezes first and trains at a scaled rate."""
        model = self.model.get_base_model() if self.base else self.model
        heads = [getattr(model, name) for name in self.head_names]
        return heads[0] if len(heads) == 1 else nn.ModuleList(heads)

    def get_extra_state(self) -> dict[str, str]:
        """Saved in the state_dict: the base's reference (empty without LoRA), as plain strings."""
        return dict(self.base)

    def set_extra_state(self, state: dict[str, str]) -> None:
        """Refuse adapters trained on other base weights than the ones this config built."""
        if state and self.base and state["sha256"] != self.base["sha256"]:
            raise ValueError(
                f"{self.base['key']}={self.base['source']} has base weights with sha256 {self.base['sha256']}, "
                f"but the checkpoint's adapters were trained on {state['key']}={state['source']} with sha256 "
                f"{state['sha256']}: give the base the run was trained with"
            )

    def merged(self) -> nn.Module:
        """A copy with the LoRA adapters merged into the base (a plain transformers model inside, whose
        state_dict is complete), for export; without LoRA, a plain copy."""
        net = copy.deepcopy(self)
        if net.base:
            net.model = net.model.merge_and_unload()
            net.base, net.frozen_keys = {}, []
        return net


def leave_out_frozen(net: HFNet, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """state_dict hook (public nn.Module API): drop the frozen base's tensors; only the trainable ones stay."""
    for key in net.frozen_keys:
        state.pop(prefix + key, None)


def take_frozen_from_base(net: HFNet, state: dict[str, Any], prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: the tensors a checkpoint left out are the base's own, already in place."""
    if not net.frozen_keys:
        return
    tensors = dict(net.named_parameters(remove_duplicate=False)) | dict(
        net.named_buffers(remove_duplicate=False)
    )
    for key in net.frozen_keys:
        state.setdefault(prefix + key, tensors[key])


def from_pretrained(key: str, source: str, num_classes: int) -> nn.Module:
    """The model in folder `source` (key model.net.weights_dir) or of hub name `source`, its head made anew
    where its size differs from num_classes; in float32, which mixed precision keeps as master weights."""
    from transformers import AutoModelForSequenceClassification

    local = key == "model.net.weights_dir"
    if local and not (Path(source) / "config.json").is_file():
        raise FileNotFoundError(
            f"{key}={source} holds no config.json: give a folder written by save_pretrained"
        )
    try:
        return AutoModelForSequenceClassification.from_pretrained(
            str(source),
            num_labels=num_classes,
            ignore_mismatched_sizes=True,
            local_files_only=local,
            dtype=torch.float32,
        )
    except OSError as err:
        if local:
            raise
        raise OSError(
            f"{key}={source} could not be loaded ({str(err).splitlines()[0]}); offline? give a save_pretrained "
            "folder with model.net.weights_dir"
        ) from err


def from_scratch(config: dict[str, Any], num_classes: int, vocabulary_size: int) -> nn.Module:
    """A new model of the architecture `config` (model.net.config), with random weights."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    settings = dict(config)
    model_type = settings.pop("model_type", None)
    if settings.get("vocab_size") is None:
        settings["vocab_size"] = vocabulary_size
    try:
        architecture = AutoConfig.for_model(model_type, num_labels=num_classes, **settings)
    except ValueError as err:
        raise ValueError(
            f"model.net.config.model_type={model_type} is not a transformers architecture (bert, roberta, "
            f"distilbert, ...): {str(err).splitlines()[0]}"
        ) from err
    return AutoModelForSequenceClassification.from_config(architecture)


def check_vocabulary(model: nn.Module, size: int, tokenizer: str, key: str, source: Any) -> None:
    """Every token id must index an embedding: a larger tokenizer fails inside the first batch otherwise."""
    embeddings = model.get_input_embeddings().num_embeddings
    if size > embeddings:
        raise ValueError(
            f"model.net.tokenizer={tokenizer} has {size} tokens, more than the {embeddings} embeddings of "
            f"{key}={source}: give the tokenizer the weights were trained with (from scratch: "
            "model.net.config.vocab_size=null takes the tokenizer's size)"
        )


def weights_sha256(model: nn.Module, head_names: list[str]) -> str:
    """The sha256 of the base's tensors (names, dtypes, shapes and values; the head left out, as it may be new)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if name.split(".")[0] in head_names:
            continue
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def linear_names(model: nn.Module, head_names: list[str]) -> list[str]:
    """The distinct names of the Linear layers outside the head: what LoRA may target."""
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and name.split(".")[0] not in head_names
        }
    )


def with_lora(model: nn.Module, lora: dict[str, Any], head_names: list[str]) -> nn.Module:
    """`model` with LoRA adapters on `lora["target_modules"]` (peft's default for the architecture when null)
    and a trainable copy of the head; every other weight frozen."""
    import peft
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULT_TARGETS

    candidates = linear_names(model, head_names)
    targets = lora["target_modules"]
    if targets is None:
        targets = DEFAULT_TARGETS.get(model.config.model_type)
        if targets is None:
            raise ValueError(
                f"model.net.lora.target_modules=null: peft has no default for {model.config.model_type} "
                f"models; name the layers, e.g. model.net.lora.target_modules=[{','.join(candidates[:2])}] "
                f"(its Linear layers: {', '.join(candidates)})"
            )
    targets = [targets] if isinstance(targets, str) else list(targets)
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        raise ValueError(
            f"model.net.lora.target_modules={targets}: {', '.join(missing)} not in the "
            f"{model.config.model_type} model; its Linear layers are named {', '.join(candidates)}"
        )
    config = peft.LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=targets,
        modules_to_save=head_names,
    )
    return peft.get_peft_model(model, config)
