"""The text net (model/net=hf) and TextClassifierModule: a tiny BERT the tests save with save_pretrained and a
WordPiece tokenizer they train, no network. LoRA checkpoints hold only the trainable tensors and a reference
to the base, go through Lightning's save, load and resume, and refuse a base with other weights."""

from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from src.models.components.hf_net import HFNet, with_lora
from src.models.finetuning import FrozenBackbone, parameter_groups  # [part: pretrained]
from src.models.text_classifier_module import TextClassifierModule

TEXTS = ["the food was good", "the service was awful", "not bad but slow", "great food but rude staff"]
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
# No dropout in the saved model: a resumed run then matches an uninterrupted one without restoring RNG states.
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
LORA = {"r": 4, "alpha": 16, "dropout": 0.0, "target_modules": None}


def train_tokenizer(folder: Path) -> int:
    """A BERT-style WordPiece tokenizer trained on TEXTS, saved with save_pretrained; its size."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(
        TEXTS * 5, trainers.WordPieceTrainer(vocab_size=120, special_tokens=specials)
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        **{f"{n}_token": f"[{n.upper()}]" for n in ("pad", "unk", "cls", "sep", "mask")},
    )
    fast.save_pretrained(str(folder))
    return len(fast)


def save_bert(folder: Path, vocab_size: int, seed: int = 0, **settings) -> Path:
    """A randomly initialised tiny BERT classifier (2 labels) saved with save_pretrained, like a downloaded one."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    config = AutoConfig.for_model("bert", vocab_size=vocab_size, num_labels=2, **{**TINY, **settings})
    AutoModelForSequenceClassification.from_config(config).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text_model")
    size = train_tokenizer(root / "tokenizer")
    return {
        "vocabulary_size": size,
        "tokenizer": root / "tokenizer",
        "bert": save_bert(root / "bert", size, **NO_DROPOUT),
        "other_bert": save_bert(root / "other_bert", size, seed=1, **NO_DROPOUT),
        "small_bert": save_bert(root / "small_bert", 10),
    }


def net_config(files: dict[str, Path], **changes) -> dict:
    """configs/model/net/hf.yaml as the module gets it (resolved, plain data), with `changes`."""
    config = OmegaConf.load(Path(__file__).parents[1] / "configs/model/net/hf.yaml")
    config.num_classes = 3
    config.tokenizer = str(files["tokenizer"])
    config.weights_dir = str(files["bert"])
    for key, value in changes.items():
        OmegaConf.update(config, key, value, merge=False)
    return OmegaConf.to_container(config, resolve=True)


def make_net(files: dict[str, Path], **changes) -> HFNet:
    config = net_config(files, **changes)
    del config["_target_"]
    return HFNet(**config)


def batch(files: dict[str, Path], texts: list[str] = TEXTS) -> dict[str, torch.Tensor]:
    """The batch contract: input_ids and attention_mask padded on the right to the longest text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(files["tokenizer"]), local_files_only=True)
    return dict(tokenizer(texts, padding=True, return_tensors="pt", return_token_type_ids=False))


def loader(files: dict[str, Path]) -> DataLoader:
    inputs = batch(files)
    samples = [({k: v[i] for k, v in inputs.items()}, i % 3) for i in range(len(TEXTS))]
    return DataLoader(samples, batch_size=2)


def module(files: dict[str, Path], lora: dict | None = None, **hparams) -> TextClassifierModule:
    optimizer = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.01, "weight_decay": 0.01}
    net = net_config(files, lora=lora or {})
    return TextClassifierModule(num_classes=3, net=net, optimizer=optimizer, **hparams)


def fit(model: L.LightningModule, files: dict[str, Path], root: Path, steps: int, **fit_args) -> Path:
    """`steps` optimizer steps on the CPU, then the checkpoint Lightning writes (its `last.ckpt`)."""
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=root,
        callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=root, save_last=True, every_n_train_steps=1)],
    )
    trainer.fit(model, train_dataloaders=loader(files), **fit_args)
    return root / "last.ckpt"


def test_the_net_loads_saved_weights_in_train_mode_and_gives_logits(files):
    net = make_net(files)
    assert net.training and net.model.training  # from_pretrained left it in eval mode: dropout off
    assert net(**batch(files)).shape == (len(TEXTS), 3)
    assert net.head_module() is net.model.classifier and net.head_module().out_features == 3


def test_from_scratch_the_config_sizes_the_net_and_the_tokenizer_its_vocabulary(files):
    net = make_net(files, weights_dir=None)
    assert net.model.config.hidden_size == 64 and net.model.config.num_hidden_layers == 2
    assert net.model.get_input_embeddings().num_embeddings == files["vocabulary_size"]
    assert net(**batch(files, TEXTS[:2])).shape == (2, 3)


def test_the_tokenizer_resolver_follows_the_weights(files):
    from src.launch.resolvers import register_resolvers

    register_resolvers()
    config = OmegaConf.load(Path(__file__).parents[1] / "configs/model/net/hf.yaml")
    assert config.tokenizer is None
    config.name = "bert-base-uncased"
    assert config.tokenizer == "bert-base-uncased"
    config.weights_dir = "/weights"
    assert config.tokenizer == "/weights"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"weights_dir": "TOKENIZER"}, "model.net.weights_dir=.* holds no config.json"),
        ({"weights_dir": "SMALL"}, r"model.net.tokenizer=.* has \d+ tokens, more than the 10 embeddings"),
        ({"weights_dir": None, "config.vocab_size": 10}, r"more than the 10 embeddings of model.net.config"),
        (
            {"lora": LORA | {"target_modules": ["qkv"]}},
            r"target_modules=\['qkv'\]: qkv not in .*query, value",
        ),
        ({"weights_dir": None, "lora": LORA}, "model.net.lora.r=4 needs pretrained weights"),
        ({"weights_dir": None, "config.model_type": "nonsense"}, "model.net.config.model_type=nonsense"),
    ],
)
def test_bad_input_fails_in_one_line_naming_the_key(files, changes, message):
    paths = {"TOKENIZER": str(files["tokenizer"]), "SMALL": str(files["small_bert"])}
    changes = {
        key: paths.get(value, value) if isinstance(value, str) else value for key, value in changes.items()
    }
    with pytest.raises((ValueError, FileNotFoundError), match=message) as error:
        make_net(files, **changes)
    assert "\n" not in str(error.value)


def test_lora_trains_under_2_percent_of_a_bert_base():
    from transformers import AutoConfig, AutoModelForSequenceClassification

    with torch.device("meta"):  # the sizes only: no memory, no time
        bert_base = AutoModelForSequenceClassification.from_config(AutoConfig.for_model("bert", num_labels=2))
        model = with_lora(bert_base, LORA | {"r": 8}, ["classifier"])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert total > 100e6 and trainable / total <= 0.02  # 0.27 %: adapters on query and value, and the head


def test_a_lora_state_dict_holds_the_trainable_tensors_and_a_reference_to_the_base(files):
    net = make_net(files, lora=LORA).eval()
    state = net.state_dict()
    trainable = {name for name, p in net.named_parameters() if p.requires_grad}
    assert trainable and set(state) == trainable | {"_extra_state"}
    assert all("lora_" in name or ".modules_to_save." in name for name in trainable)
    reference = state["_extra_state"]
    assert reference["key"] == "model.net.weights_dir" and reference["source"] == str(files["bert"])
    assert len(reference["sha256"]) == 64
    # Another net built from the same config takes it: the frozen base comes from its own weights.
    with torch.no_grad():
        for name, parameter in net.named_parameters():
            if "lora_B" in name:  # peft starts them at zero
                parameter.normal_(std=0.1)
    other = make_net(files, lora=LORA).eval()
    other.load_state_dict(net.state_dict())
    assert torch.equal(other(**batch(files)), net(**batch(files)))


def test_lora_checkpoints_save_load_and_resume_through_lightning(files, tmp_path):
    torch.manual_seed(0)  # the adapters' and the head's initial values
    lora_module = module(files, lora=LORA)
    lora_checkpoint = fit(lora_module, files, tmp_path / "lora", steps=2)
    full_checkpoint = fit(module(files), files, tmp_path / "full", steps=2)
    # The frozen base stays out: a small share of a full fine-tuning checkpoint.
    assert lora_checkpoint.stat().st_size < 0.1 * full_checkpoint.stat().st_size

    loaded = TextClassifierModule.load_from_checkpoint(lora_checkpoint, weights_only=True).eval()
    lora_module.eval()
    assert torch.allclose(loaded(batch(files)), lora_module(batch(files)))

    # Resumed from step 2 to 4, the same weights as 4 steps in one go (no dropout: no RNG to restore).
    resumed = module(files, lora=LORA)
    fit(resumed, files, tmp_path / "resumed", steps=4, ckpt_path=lora_checkpoint)
    torch.manual_seed(0)
    straight = module(files, lora=LORA)
    fit(straight, files, tmp_path / "straight", steps=4)
    for (name, a), b in zip(resumed.state_dict().items(), straight.state_dict().values(), strict=True):
        assert not isinstance(a, torch.Tensor) or torch.equal(a, b), name


def test_a_lora_checkpoint_refuses_a_base_with_other_weights(files, tmp_path):
    checkpoint = fit(module(files, lora=LORA), files, tmp_path, steps=1)
    trained = net_config(files, lora=LORA)
    # The same weights in another folder load: the reference is their hash, not the path.
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in files["bert"].iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    TextClassifierModule.load_from_checkpoint(
        checkpoint, weights_only=True, net={**trained, "weights_dir": str(copy)}
    )
    with pytest.raises(
        ValueError,
        match=r"model.net.weights_dir=.*other_bert has base weights with sha256 \w{64}, "
        r"but the checkpoint's adapters were trained on .* with sha256 \w{64}",
    ) as error:
        other = {**trained, "weights_dir": str(files["other_bert"])}
        TextClassifierModule.load_from_checkpoint(checkpoint, weights_only=True, net=other)
    assert "\n" not in str(error.value)


def test_merged_gives_the_same_logits_with_a_complete_plain_model(files):
    net = make_net(files, lora=LORA).eval()
    with torch.no_grad():
        for name, parameter in net.named_parameters():
            if "lora_B" in name:  # peft starts them at zero, which would make merging trivially exact
                parameter.normal_(std=0.1)
    merged = net.merged().eval()
    inputs = batch(files)
    assert torch.allclose(merged(**inputs), net(**inputs), atol=1e-6)
    assert not any("lora_" in name for name in merged.state_dict())
    assert "model.bert.embeddings.word_embeddings.weight" in merged.state_dict()


# part: pretrained
def test_fine_tuning_splits_head_and_backbone_and_keeps_a_lora_base_frozen(files):
    full = module(files, decay_norm_and_bias=False)
    groups = {group["name"]: group for group in parameter_groups(full)}
    no_decay = {id(p) for p in groups["backbone_no_decay"]["params"]}
    layer_norm = full.net.model.bert.embeddings.LayerNorm
    assert id(layer_norm.weight) in no_decay and id(layer_norm.bias) in no_decay
    assert {id(p) for p in groups["head"]["params"]} == {id(full.net.model.classifier.weight)}

    lora_module = module(files, lora=LORA)
    adapters = [p for name, p in lora_module.net.named_parameters() if "lora_" in name]
    base = [
        p
        for name, p in lora_module.net.named_parameters()
        if "lora_" not in name and "modules_to_save" not in name
    ]
    callback = FrozenBackbone(epochs=1)
    callback.set_frozen(lora_module, True)
    assert not any(p.requires_grad for p in adapters)
    callback.set_frozen(lora_module, False)
    assert all(p.requires_grad for p in adapters) and not any(p.requires_grad for p in base)


# /part
