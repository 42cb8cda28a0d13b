"""Starting from pretrained weights: timm and torchvision nets, preprocessing that follows the weights, and
fine-tuning (a frozen backbone first, a slower one after, a warm-up). No test downloads weights: they use
random ones, or a weights file the test writes itself."""

import csv
import json
from itertools import pairwise
from pathlib import Path

import lightning as L
import pytest
import timm
import torch
import torchvision
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, TensorDataset

from src import api
from src.models.classifier_module import ClassifierModule
from src.models.components.timm_net import TimmNet
from src.models.components.torchvision_net import TorchvisionNet
from src.models.components.warmup_cosine import WarmupCosine
from src.models.finetuning import NORMS, parameter_groups
from src.run import preflight

TIMM = "test_resnet"  # one of timm's test models: a real ResNet of 0.5 M parameters, made for 160x160
DIGITS_TIMM = ["data=digits", "model/net=timm", f"model.net.name={TIMM}"]


def test_a_timm_weights_file_loads_without_the_hub_and_gets_a_new_head(tmp_path: Path):
    pretrained = timm.create_model(TIMM, num_classes=1000)  # as downloaded: ImageNet's 1,000 classes
    weights_file = tmp_path / "weights.pth"
    torch.save(pretrained.state_dict(), weights_file)

    net = TimmNet(TIMM, input_shape=[3, 32, 32], num_classes=10, weights_file=str(weights_file))
    for name in ("layer1.0.conv1.weight", "layer1.0.bn1.running_var"):  # a weight and a norm statistic
        assert torch.equal(net.model.state_dict()[name], pretrained.state_dict()[name])
    assert not torch.equal(
        TimmNet(TIMM, [3, 32, 32], 10).model.layer1[0].conv1.weight, pretrained.layer1[0].conv1.weight
    )
    assert net.head_module().out_features == 10
    # One channel (MNIST) from RGB weights: timm sums the first conv's weights over the colours.
    gray = TimmNet(TIMM, input_shape=[1, 32, 32], num_classes=10, weights_file=str(weights_file))
    first = pretrained.pretrained_cfg["first_conv"] + ".weight"
    assert torch.allclose(gray.model.state_dict()[first], pretrained.state_dict()[first].sum(1, keepdim=True))


def test_a_torchvision_weights_file_loads_and_its_last_linear_is_made_anew(tmp_path: Path):
    released = torchvision.models.get_model("mobilenet_v3_small")  # the architecture of the released file
    weights_file = tmp_path / "mobilenet_v3_small.pth"
    torch.save(released.state_dict(), weights_file)

    net = TorchvisionNet(
        "mobilenet_v3_small", input_shape=[1, 32, 32], num_classes=7, weights_file=str(weights_file)
    )
    assert torch.equal(net.model.features[0][0].weight, released.features[0][0].weight)
    assert net.head_module() is net.model.classifier[3] and net.head_module().out_features == 7
    assert net(torch.zeros(2, 1, 32, 32)).shape == (2, 7)  # grayscale repeated to the 3 channels it takes

    wrong = tmp_path / "resnet.pth"
    torch.save(torchvision.models.get_model("resnet18").state_dict(), wrong)
    with pytest.raises(
        ValueError,
        match=r"model.net.weights_file=.*resnet.pth does not hold weights of torchvision's mobilenet_v3_small",
    ):
        TorchvisionNet("mobilenet_v3_small", input_shape=[3, 32, 32], num_classes=7, weights_file=str(wrong))


def test_a_net_that_cannot_take_the_data_size_fails_before_training_naming_the_fix():
    with pytest.raises(
        ValueError,
        match=r"model.net.name=test_vit does not take 28x28 images .* set data.input_shape=\[1,160,160\]",
    ):
        TimmNet("test_vit", input_shape=[1, 28, 28], num_classes=10)  # a ViT: fixed 16-pixel patches
    with pytest.raises(ValueError, match=r"model.net.name=resnet1 is not a timm model; e.g. "):
        TimmNet("resnet1", input_shape=[1, 28, 28], num_classes=10)
    with pytest.raises(
        ValueError,
        match=r"model.net.weights=IMAGENET is not a weight of resnet18; choose IMAGENET1K_V1, DEFAULT or null",
    ):
        TorchvisionNet("resnet18", input_shape=[3, 32, 32], num_classes=10, weights="IMAGENET")


def test_torchvision_weights_give_their_transforms_preprocessing():
    known = TorchvisionNet.weights_preprocessing({"name": "resnet18", "weights": "IMAGENET1K_V1"})
    assert known["input_size"] == [224, 224] and known["interpolation"] == "bilinear"
    assert known["mean"] == [0.485, 0.456, 0.406]
    assert TorchvisionNet.weights_preprocessing({"name": "resnet18", "weights": None}) is None


class Snapshots(L.Callback):
    """The net's tensors (parameters and norm statistics) at the start and at the end of each epoch."""

    def __init__(self) -> None:
        self.start: dict[str, torch.Tensor] = {}
        self.ends: list[dict[str, torch.Tensor]] = []

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.start = {k: v.clone() for k, v in module.net.state_dict().items()}

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.ends.append({k: v.clone() for k, v in module.net.state_dict().items()})


def finetuning_module(**settings) -> ClassifierModule:
    net = {
        "_target_": "src.models.components.timm_net.TimmNet",
        "name": TIMM,
        "input_shape": [1, 16, 16],
        "num_classes": 4,
    }
    optimizer = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.01, "weight_decay": 0.1}
    return ClassifierModule(net=net, optimizer=optimizer, num_classes=4, scheduler=None, **settings)


def test_a_frozen_backbone_keeps_every_tensor_and_norm_statistic_until_it_is_unfrozen(tmp_path: Path):
    L.seed_everything(0)
    data = TensorDataset(torch.randn(64, 1, 16, 16), torch.randint(0, 4, (64,)))
    module = finetuning_module(freeze_backbone_epochs=1, backbone_lr_scale=0.1)
    snapshots = Snapshots()
    trainer = L.Trainer(
        max_epochs=2, val_check_interval=0.5,  # a validation inside the frozen epoch: train mode comes back after it
        callbacks=[snapshots], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(module, DataLoader(data, batch_size=16), DataLoader(data, batch_size=16))

    head = {f"model.{name}" for name, _ in module.net.model.get_classifier().named_parameters(prefix="")}
    head = {f"model.{module.net.model.pretrained_cfg['classifier']}.{name.split('.')[-1]}" for name in head}
    frozen, unfrozen = snapshots.ends
    backbone = [name for name in snapshots.start if name not in head and "num_batches_tracked" not in name]
    assert any("running_mean" in name for name in backbone)
    for name in backbone:
        assert torch.equal(frozen[name], snapshots.start[name]), f"{name} moved while frozen"
    assert all(not torch.equal(frozen[name], snapshots.start[name]) for name in head)  # the head learnt
    moved = [name for name in backbone if not torch.equal(unfrozen[name], frozen[name])]
    assert len(moved) == len(backbone)  # unfrozen: every weight and statistic of the backbone moves
    assert all(p.requires_grad for p in module.parameters())
    assert all(m.training for m in module.net.modules() if isinstance(m, NORMS))


def test_parameter_groups_name_the_backbone_and_head_and_spare_biases_and_norms_the_decay():
    module = finetuning_module(backbone_lr_scale=0.1)
    groups = {group["name"]: group for group in parameter_groups(module)}
    assert set(groups) == {"backbone", "backbone_no_decay", "head", "head_no_decay"}
    assert groups["backbone"]["lr_scale"] == 0.1 and "lr_scale" not in groups["head"]
    no_decay = [p for name in ("backbone_no_decay", "head_no_decay") for p in groups[name]["params"]]
    assert all(p.ndim == 1 for p in no_decay) and groups["head_no_decay"]["weight_decay"] == 0.0
    norms = [m.weight for m in module.net.modules() if isinstance(m, NORMS)]
    assert all(any(w is p for p in no_decay) for w in norms)
    assert sum(len(g["params"]) for g in groups.values()) == len(list(module.parameters()))
    assert module.net.head_module().bias in groups["head_no_decay"]["params"]
    every = {
        g["name"]
        for g in parameter_groups(finetuning_module(backbone_lr_scale=0.1, decay_norm_and_bias=True))
    }
    assert every == {"backbone", "head"}


def test_warmup_reaches_the_base_rate_at_the_configured_step_then_decays():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([{"params": [parameter], "lr": 0.1}, {"params": [], "lr": 0.01}])
    scheduler = WarmupCosine(optimizer, total_steps=10, warmup_steps=4, start_factor=0.0)
    rates = []
    for _ in range(11):
        rates.append([group["lr"] for group in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    assert [r[0] for r in rates[:5]] == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1])
    assert rates[4][1] == pytest.approx(0.01)  # each group its own rate: a scaled backbone keeps its ratio
    assert rates[7][0] == pytest.approx(0.05) and rates[10][0] == pytest.approx(0.0)
    assert all(a[0] > b[0] for a, b in pairwise(rates[4:11]))
    short = WarmupCosine(optimizer, total_steps=10, warmup_steps=20)  # a debug run: warms up over all of it
    assert short.warmup_steps == 10
    with pytest.raises(ValueError, match=r"model.scheduler.warmup_steps=-1 must be 0 \(no warm-up\) or more"):
        WarmupCosine(optimizer, total_steps=10, warmup_steps=-1)


def test_a_frozen_backbone_under_ddp_needs_unused_parameters_allowed(compose_cfg):
    cfg = compose_cfg("train", [*DIGITS_TIMM, "model.freeze_backbone_epochs=1", "trainer=ddp_sim"])
    with pytest.raises(
        ValueError,
        match=r"model.freeze_backbone_epochs=1 under trainer.strategy=ddp: .* add trainer.strategy=ddp_find_unused_parameters_true",
    ):
        preflight.check_run(cfg)
    cfg.trainer.strategy = "ddp_find_unused_parameters_true"
    preflight.check_run(cfg)


def test_fine_tuning_needs_a_net_with_a_head():
    net = {"_target_": "src.models.components.mlp.MLP", "input_shape": [1, 8, 8], "num_classes": 10}
    optimizer = {"_target_": "torch.optim.Adam", "_partial_": True}
    with pytest.raises(
        ValueError,
        match=r"model.freeze_backbone_epochs=2 .* need a net that says which part is its head; MLP does not",
    ):
        ClassifierModule(net=net, optimizer=optimizer, num_classes=10, freeze_backbone_epochs=2)


def lr_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "csv" / "version_0" / "metrics.csv") as file:
        return [row for row in csv.DictReader(file) if row.get("lr-Adam/head")]


@pytest.mark.slow
@pytest.mark.parametrize(
    "net",
    [
        [*DIGITS_TIMM, "model.freeze_backbone_epochs=1", "model.backbone_lr_scale=0.1"],
        [
            "data=digits",
            "model/net=torchvision",
            "model.net.name=mobilenet_v3_small",
            "model.backbone_lr_scale=0.1",
        ],
    ],
    ids=["timm", "torchvision"],
)
def test_a_pretrained_net_trains_predicts_and_exports(
    net: list[str], here: list[str], here_for_inference: list[str]
):
    few = ["trainer.max_epochs=2", "+trainer.limit_train_batches=4", "+trainer.limit_val_batches=2"]
    trained = api.train([*here, *net, *few])  # tested on the whole split
    run_dir = trained.run_dir
    rows = lr_rows(run_dir)  # the LR monitor shows both groups, at their scaled rates
    assert rows and all(
        float(r["lr-Adam/backbone"]) == pytest.approx(0.1 * float(r["lr-Adam/head"])) for r in rows
    )

    predicted = api.predict([*here_for_inference, f"run_dir={run_dir}"])  # the same best.ckpt
    assert predicted.metrics["predict/acc"] == pytest.approx(trained.metrics["test/acc"])
    api.export([*here_for_inference, f"run_dir={run_dir}", "format=onnx"])
    sidecar = json.loads((run_dir / "checkpoints" / "best.onnx.json").read_text())
    assert sidecar["parity"]["max_diff"] <= sidecar["parity"]["tolerance"]
    loaded = torch.load(run_dir / "checkpoints" / "best.ckpt", weights_only=True)  # plain data only
    assert OmegaConf.create(loaded["hyper_parameters"]).net.name in (TIMM, "mobilenet_v3_small")


@pytest.mark.slow
class Phases(L.Callback):
    """At each training batch: the epoch, whether the backbone is frozen, and whether its norms train."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool, bool]] = []

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, *args) -> None:
        head = set(module.net.head_module().parameters())
        backbone = [p for p in module.net.parameters() if p not in head]
        norms = [
            m
            for m in module.net.modules()
            if isinstance(m, NORMS) and m not in set(module.net.head_module().modules())
        ]
        self.seen.append(
            (
                trainer.current_epoch,
                not any(p.requires_grad for p in backbone),
                any(m.training for m in norms),
            )
        )


class SaveAndDieAtStep(L.Callback):
    """A mid-epoch checkpoint at optimizer step `step` (as last_checkpoint writes them), then the run dies."""

    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            raise RuntimeError("killed")


def test_a_run_resumed_in_the_middle_of_the_frozen_epoch_is_still_frozen_then_unfreezes(tmp_path: Path):
    L.seed_everything(0)
    data = DataLoader(TensorDataset(torch.randn(64, 1, 16, 16), torch.randint(0, 4, (64,))), batch_size=16)
    quiet = {
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": tmp_path,
    }
    first = L.Trainer(max_epochs=2, callbacks=[SaveAndDieAtStep(2, tmp_path / "killed.ckpt")], **quiet)
    with pytest.raises(RuntimeError, match="killed"):  # at step 2 of the 4 of epoch 0
        first.fit(finetuning_module(freeze_backbone_epochs=1), data, data)

    phases = Phases()
    resumed = L.Trainer(max_epochs=2, callbacks=[phases], **quiet)
    resumed.fit(finetuning_module(freeze_backbone_epochs=1), data, data, ckpt_path=tmp_path / "killed.ckpt")
    # Lightning skips on_train_epoch_start when it resumes mid-epoch: the phase is set at on_train_start too.
    assert phases.seen[:2] == [(0, True, False), (0, True, False)]  # the rest of epoch 0: frozen
    assert phases.seen[2:] == [(1, False, True)] * 4  # epoch 1: everything trains


def test_bad_pretrained_net_settings_name_the_key_and_what_is_valid(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"model.net.weights_file=.*missing.pth is not a file"):
        TimmNet(TIMM, input_shape=[3, 32, 32], num_classes=10, weights_file=str(tmp_path / "missing.pth"))
    with pytest.raises(FileNotFoundError, match=r"model.net.weights_file=.*missing.pth is not a file"):
        TorchvisionNet("resnet18", [3, 32, 32], 10, weights_file=str(tmp_path / "missing.pth"))
    with pytest.raises(
        ValueError, match=r"model.net.name=resnet18 takes 1 or 3 channels, not data.input_shape\[0\]=4"
    ):
        TorchvisionNet("resnet18", [4, 32, 32], 10)
    with pytest.raises(
        ValueError,
        match=r"model.net.name=resnet50x is not a torchvision classification model; choose one of alexnet",
    ):
        TorchvisionNet("resnet50x", [3, 32, 32], 10)
    with pytest.raises(
        ValueError, match=r"model.freeze_backbone_epochs=-1 must be 0 \(never frozen\) or more"
    ):
        finetuning_module(freeze_backbone_epochs=-1)
    with pytest.raises(ValueError, match=r"model.backbone_lr_scale=-0.1 must be 0 or more"):
        finetuning_module(backbone_lr_scale=-0.1)
