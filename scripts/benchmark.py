"""How much the template costs over hand-written PyTorch: step throughput, start-up time and the data path.

    python scripts/benchmark.py                  # CPU, 5 alternating repetitions (about 10 minutes)
    python scripts/benchmark.py --tiny           # a few steps of everything: checks the script, not speed
    python scripts/benchmark.py --device cuda --precision bf16-mixed --channels-last --compile

Every figure is a median of `--repeats` runs that alternate between the sides being compared, and each
comparison is printed as a ratio measured in this one run (no figures from elsewhere). The results also go
to a JSON file (logs/benchmark/<time>.json by default) for tracking across commits.

1. Step throughput. `python src/train.py` as a user runs it (the default callbacks and the throughput meter,
   logger=csv, the progress bar drawn on a pseudo-terminal) against two hand-written loops on the same net, data tensors, batch size,
   optimizer and number of epochs and steps: "classic" (a DataLoader over a TensorDataset, the loop of every
   PyTorch tutorial) and "tight" (batches indexed straight from the tensors); and against "lightning", the
   same LightningModule in a bare Trainer (no callbacks, logger or progress bar): Lightning's own cost, the
   floor of any template built on it. Each loop trains (forward, loss,
   zero_grad, backward, step) and evaluates under no_grad every epoch. Two rates, both from the end of the
   first (warm-up) step: `train` counts the training steps only, `fit` all wall time, evaluation and (for the
   template) checkpoints and logging included. The template's rates are its own perf/ metrics. Augmentation
   is off on both sides (the hand loops do none).
   Every side runs with the template's malloc setting (extras.keep_freed_memory), so the ratios measure the
   layers and nothing else; "classic_untuned" is the classic loop with glibc's default thresholds, as a
   script gets them, to show what that setting is worth. Each side's page faults per run are reported too.
2. Start-up: wall time of `python src/train.py debug=fdr` against the import floor
   `python -c "import torch, lightning"`, and of `--help` and `--cfg job`.
3. Data path: batches per second of the datamodule's train loader alone (data.loading=batches and samples)
   against the template's training steps per second: a ratio well above 1 means data is not the bottleneck.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

# The cases: the template's config options for each. Batch size 128 for both.
CASES = {
    "mlp": ["data=digits", "model/net=mlp"],
    "cnn": ["data=mnist5k", "model=classifier"],
}
BATCH_SIZE = 128
# The template, then what it is compared with: Lightning alone (the same module, no callbacks, logger or progress
# bar: the floor of any Lightning-based template), the two hand-written loops, and the classic loop again
# without the template's malloc setting.
SIDES = ["template", "lightning", "classic", "tight", "classic_untuned"]
# Step throughput goals, on the CPU: the template's train rate as a fraction of another side's. On the MLP, whose
# steps take 2-3 ms, Lightning's own loop is already slower than the classic one: the template is measured
# against bare Lightning there (its own layers only). On the CNN, against the classic loop.
GOALS = {"mlp": ("lightning", 0.95), "cnn": ("classic", 0.95)}
STARTUP_GOAL_S = 2.0  # debug=fdr may take at most this much longer than the import floor
HELP_GOAL_S = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeats", type=int, default=5, help="alternating repetitions per figure")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default: mlp 30, cnn 2)")
    parser.add_argument("--cases", default="mlp,cnn", help=f"comma-separated, from {', '.join(CASES)}")
    parser.add_argument("--precision", default="32", help="trainer.precision, e.g. bf16-mixed (cuda)")
    parser.add_argument("--channels-last", action="store_true", help="channels-last convs and inputs")
    parser.add_argument("--compile", action="store_true", help="torch.compile the net on both sides")
    parser.add_argument(
        "--tiny", action="store_true", help="2 epochs of 3 steps, once, loops in this process: a smoke test"
    )
    parser.add_argument("--output", type=Path, default=None, help="the JSON file to write")
    # Internal: run one hand-written loop in this process and print its result as JSON.
    parser.add_argument("--loop", choices=SIDES[1:], help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = args.cases.split(",")
    for case in cases:
        if case not in CASES:
            parser.error(f"--cases: {case} is not a case; choose from {', '.join(CASES)}")
    if args.device == "cuda" and not _cuda_available():
        parser.error("--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is False)")
    if args.loop:
        print(json.dumps(hand_loop(args)))
        return
    if args.tiny:
        args.repeats, args.limit, args.epochs = 1, 3, 2
    results = {
        "machine": machine(args.device),
        "settings": {
            "device": args.device,
            "repeats": args.repeats,
            "batch_size": BATCH_SIZE,
            "precision": args.precision,
            "channels_last": args.channels_last,
            "compile": args.compile,
            "tiny": args.tiny,
        },
        "step_throughput": {case: step_throughput(args, case) for case in cases},
        "startup": startup(args),
    }
    results["data_path"] = {case: data_path(args, case, results["step_throughput"][case]) for case in cases}
    output = args.output or ROOT / "logs" / "benchmark" / f"{datetime.now():%Y-%m-%d_%H-%M-%S}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"\nWrote {output}")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def epochs_for(args: argparse.Namespace, case: str) -> int:
    return args.epochs or {"mlp": 30, "cnn": 2}[case]


# --- 1. Step throughput ---------------------------------------------------------------------------------


def template_overrides(args: argparse.Namespace, case: str) -> list[str]:
    """The config of a case, shared by the template run and (for net, optimizer, data) the hand loops."""
    overrides = [*CASES[case], f"data.batch_size={BATCH_SIZE}", "data.random_shift=0"]
    if args.device == "cuda":
        overrides += ["trainer.accelerator=gpu", "data.loading=device"]
    if args.channels_last:
        overrides.append("model.channels_last=true")
    if args.compile:
        overrides.append("model.compile=true")
    return overrides


def step_throughput(args: argparse.Namespace, case: str) -> dict[str, Any]:
    epochs = epochs_for(args, case)
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for repeat in range(args.repeats):
        shift = repeat % len(SIDES)
        for side in SIDES[shift:] + SIDES[:shift]:  # alternate who goes first
            before = page_faults()
            result = run_template(args, case, epochs) if side == "template" else run_loop(args, case, side)
            runs[side].append({**result, "page_faults": page_faults() - before})
    figures: dict[str, Any] = {"epochs": epochs}
    for side, results in runs.items():
        for rate in ("train", "fit"):
            values = [r[rate] for r in results]
            figures[f"{side}_{rate}_samples_per_sec"] = median = statistics.median(values)
            # How much the repetitions disagree (max - min over the median): the noise of this machine.
            figures[f"{side}_{rate}_spread"] = (max(values) - min(values)) / median
        figures[f"{side}_page_faults"] = statistics.median(r["page_faults"] for r in results)
    for baseline in SIDES[1:]:
        for rate in ("train", "fit"):
            figures[f"ratio_{rate}_vs_{baseline}"] = (
                figures[f"template_{rate}_samples_per_sec"] / figures[f"{baseline}_{rate}_samples_per_sec"]
            )
    side, goal = GOALS[case]
    figures["goal"] = {"vs": side, "ratio": goal}
    figures["goal_met"] = figures[f"ratio_train_vs_{side}"] >= goal
    return figures


def page_faults() -> int:
    """Minor page faults so far of this process and its finished children (a run's is the difference)."""
    import resource

    return sum(resource.getrusage(who).ru_minflt for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def run_template(args: argparse.Namespace, case: str, epochs: int) -> dict[str, float]:
    """`python src/train.py` on a pseudo-terminal, as a user starts it; its own perf/ metrics."""
    with tempfile.TemporaryDirectory() as log_dir:
        command = [
            PYTHON,
            "src/train.py",
            *template_overrides(args, case),
            "logger=csv",
            "callbacks=[default,throughput]",  # the default callbacks, and the meter whose perf/ rates these are
            f"trainer.max_epochs={epochs}",
            f"trainer.min_epochs={epochs}",  # early stopping does not end a run before the others
            f"trainer.precision={args.precision}",
            f"paths.log_dir={log_dir}",
            "run_name=benchmark",
        ]
        if args.limit:
            command += [
                f"trainer.limit_train_batches={args.limit}",
                f"trainer.limit_val_batches={args.limit}",
            ]
        code, output = run_in_terminal(command)
        if code != 0:
            raise RuntimeError(f"the template run failed ({code}): {' '.join(command)}\n{output[-3000:]}")
        rows = metric_rows(
            Path(log_dir) / "train" / "runs" / "benchmark" / "csv" / "version_0" / "metrics.csv"
        )
    # The train rate is logged per epoch: over the run it is their harmonic mean (the epochs are the same
    # size). The fit rate is cumulative: its last value covers the whole run.
    train = [row["perf/train_samples_per_sec"] for row in rows if "perf/train_samples_per_sec" in row]
    fit = [row["perf/fit_samples_per_sec"] for row in rows if "perf/fit_samples_per_sec" in row]
    return {"train": statistics.harmonic_mean(train), "fit": fit[-1]}


def run_in_terminal(command: list[str]) -> tuple[int, str]:
    """Run `command` with a pseudo-terminal as its output, so the progress bar draws as it does for a user."""
    try:
        import pty
    except ImportError:  # no pseudo-terminals (Windows): plain pipes
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr
    leader, follower = pty.openpty()
    process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(), b"".join(chunks).decode(errors="replace")


def metric_rows(path: Path) -> list[dict[str, float]]:
    """The rows of a run's metrics.csv, each with the metrics it has."""
    import csv

    with open(path) as file:
        return [{key: float(value) for key, value in row.items() if value} for row in csv.DictReader(file)]


def run_loop(args: argparse.Namespace, case: str, style: str) -> dict[str, float]:
    """A loop that is not the template's, in a fresh process like the template run (--tiny: in this one, to
    check the script quickly; its figures then mean nothing)."""
    if args.tiny:
        return hand_loop(argparse.Namespace(**{**vars(args), "loop": style, "case": case}))
    command = [PYTHON, __file__, "--loop", style, "--case", case, "--device", args.device]
    command += ["--precision", args.precision, "--epochs", str(epochs_for(args, case))]
    command += ["--channels-last"] * args.channels_last + ["--compile"] * args.compile
    if args.limit:
        command += ["--limit", str(args.limit)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {style} loop failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compose_case(args: argparse.Namespace, case: str, extra: list[str] = ()) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=[*template_overrides(args, case), f"paths.root_dir={ROOT}", *extra])


def hand_loop(args: argparse.Namespace) -> dict[str, float]:
    """The classic PyTorch loop on the template's net, optimizer and data tensors: samples per second."""
    import torch
    import torch.nn.functional as F
    from hydra.utils import instantiate
    from torch.utils.data import DataLoader, TensorDataset

    from src.run.memory import keep_freed_memory

    if args.loop != "classic_untuned":  # the template's default (extras.keep_freed_memory)
        keep_freed_memory()
    if args.loop == "lightning":  # the template's own data path (data.loading=device on a GPU)
        cfg = compose_case(args, args.case)
        torch.manual_seed(cfg.seed)
        return lightning_loop(args, instantiate(cfg.model), instantiate(cfg.data, _convert_="all"))
    cfg = compose_case(args, args.case, ["data.loading=batches"])  # host tensors, moved below
    torch.manual_seed(cfg.seed)
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.setup("fit")
    device = torch.device(args.device)
    x_train, y_train = (t.to(device) for t in datamodule.data_train.tensors)
    x_val, y_val = (t.to(device) for t in datamodule.data_val.tensors)
    net = instantiate(cfg.model.net).to(device)
    if args.channels_last:
        net = net.to(memory_format=torch.channels_last)
        x_train, x_val = (x.contiguous(memory_format=torch.channels_last) for x in (x_train, x_val))
    if args.compile:
        net.compile()
    optimizer = instantiate(cfg.model.optimizer)(params=net.parameters())
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision.startswith("bf16"))

    def batches(x: torch.Tensor, y: torch.Tensor, shuffle: bool):
        if args.loop.startswith("classic"):
            yield from DataLoader(TensorDataset(x, y), batch_size=BATCH_SIZE, shuffle=shuffle)
        else:
            order = torch.randperm(len(x), device=device) if shuffle else torch.arange(len(x), device=device)
            for start in range(0, len(x), BATCH_SIZE):
                index = order[start : start + BATCH_SIZE]
                yield x[index], y[index]

    steps, samples, train_seconds, start = 0, 0, 0.0, None
    for _ in range(args.epochs):
        net.train()
        last = time.perf_counter()
        for i, (x, y) in enumerate(batches(x_train, y_train, shuffle=True)):
            if args.limit and i == args.limit:
                break
            with autocast:
                loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            now = time.perf_counter()
            steps += 1
            if steps == 1:  # the warm-up step (compiles, with --compile) is left out, as in the template
                start = now
            else:
                samples += len(x)
                train_seconds += now - last
            last = now
        net.eval()
        correct = 0
        with torch.no_grad(), autocast:
            for i, (x, y) in enumerate(batches(x_val, y_val, shuffle=False)):
                if args.limit and i == args.limit:
                    break
                logits = net(x)
                loss = F.cross_entropy(logits, y)
                correct += int((logits.argmax(1) == y).sum())  # reading it back waits for the device
    fit_seconds = time.perf_counter() - start
    return {"train": samples / train_seconds, "fit": samples / fit_seconds, "val_acc": correct / len(x_val)}


def lightning_loop(args: argparse.Namespace, model: Any, datamodule: Any) -> dict[str, float]:
    """The template's LightningModule and datamodule in a bare Lightning Trainer: no callbacks but the rate
    meter, no logger, no progress bar, no checkpoints, no sanity check."""
    import lightning as L

    from src.callbacks.throughput import Throughput

    class EpochRates(Throughput):
        """The template's rate meter, keeping every epoch's training rate (as the CSV log does)."""

        def __init__(self) -> None:
            super().__init__()
            self.epochs: list[float] = []

        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.epochs.append(self._samples / self._seconds)
            super().on_train_epoch_end(trainer, pl_module)

    meter = EpochRates()
    limits = {"limit_train_batches": args.limit, "limit_val_batches": args.limit} if args.limit else {}
    trainer = L.Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=1,
        precision=args.precision,
        max_epochs=args.epochs,
        callbacks=[meter],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **limits,
    )
    trainer.fit(model, datamodule=datamodule)
    fit = float(trainer.callback_metrics["perf/fit_samples_per_sec"])
    return {"train": statistics.harmonic_mean(meter.epochs), "fit": fit}


# --- 2. Start-up ------------------------------------------------------------------------------------------


def startup(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as log_dir:
        commands = {
            "import_floor": [PYTHON, "-c", "import torch, lightning"],
            "debug_fdr": [PYTHON, "src/train.py", "debug=fdr", f"paths.log_dir={log_dir}"],
            "help": [PYTHON, "src/train.py", "--help"],
            "cfg_job": [PYTHON, "src/train.py", "--cfg", "job"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, command in commands.items():
                begin = time.perf_counter()
                done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
                times[name].append(time.perf_counter() - begin)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    figures: dict[str, Any] = {f"{name}_s": statistics.median(values) for name, values in times.items()}
    figures["debug_fdr_over_floor_s"] = figures["debug_fdr_s"] - figures["import_floor_s"]
    figures["debug_fdr_ratio_to_floor"] = figures["debug_fdr_s"] / figures["import_floor_s"]
    figures["goal_met"] = (
        figures["debug_fdr_over_floor_s"] <= STARTUP_GOAL_S and figures["help_s"] < HELP_GOAL_S
    )
    return figures


# --- 3. Data path -----------------------------------------------------------------------------------------


def data_path(args: argparse.Namespace, case: str, steps: dict[str, Any]) -> dict[str, Any]:
    from hydra.utils import instantiate

    step_rate = steps["template_train_samples_per_sec"] / BATCH_SIZE
    figures: dict[str, Any] = {"model_steps_per_sec": step_rate}
    for loading in ("batches", "samples"):
        # Host-side loaders, on any device: their rate is what feeds a GPU as well.
        datamodule = instantiate(compose_case(args, case, [f"data.loading={loading}"]).data, _convert_="all")
        datamodule.setup("fit")
        loader = datamodule.train_dataloader()
        rates = []
        for repeat in range(args.repeats):
            loader.batch_sampler.sampler.set_epoch(repeat)
            begin, count = time.perf_counter(), 0
            for _ in loader:
                count += 1
                if args.limit and count == args.limit:
                    break
            rates.append(count / (time.perf_counter() - begin))
        figures[f"loader_{loading}_batches_per_sec"] = statistics.median(rates)
        figures[f"loader_{loading}_over_model"] = figures[f"loader_{loading}_batches_per_sec"] / step_rate
    return figures


# --- Report -----------------------------------------------------------------------------------------------


def machine(device: str) -> dict[str, Any]:
    import lightning
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "commit": commit.stdout.strip() or None,
        "time": datetime.now().isoformat(timespec="seconds"),
    }


def print_table(results: dict[str, Any]) -> None:
    settings = results["settings"]
    print(f"\nTemplate vs hand-written PyTorch, {settings['device']}, median of {settings['repeats']}")
    print("samples/s of each side, and the template's rate as a fraction of each other side's")
    width = {side: max(12, len(side) + 5) for side in SIDES}
    header = "".join(f"{side + '/s':>{width[side]}}" for side in SIDES)
    header += "".join(f"{'vs ' + side:>{width[side]}}" for side in SIDES[1:])
    print(f"{'case':5} {'rate':6}{header}")
    for case, f in results["step_throughput"].items():
        for rate in ("train", "fit"):
            rates = "".join(f"{f[f'{side}_{rate}_samples_per_sec']:{width[side]}.0f}" for side in SIDES)
            ratios = "".join(f"{f[f'ratio_{rate}_vs_{side}']:{width[side]}.3f}" for side in SIDES[1:])
            print(f"{case:5} {rate:6}{rates}{ratios}")
        faults = ", ".join(f"{side} {f[f'{side}_page_faults'] / 1e6:.2f}M" for side in SIDES)
        print(f"{'':5} page faults per run: {faults}")
        goal = f["goal"]
        print(
            f"{'':5} goal: train vs {goal['vs']} >= {goal['ratio']:.2f}: {'met' if f['goal_met'] else 'NOT met'}"
        )
    s = results["startup"]
    print(
        f"\nStart-up: debug=fdr {s['debug_fdr_s']:.2f} s, import floor {s['import_floor_s']:.2f} s "
        f"(+{s['debug_fdr_over_floor_s']:.2f} s, x{s['debug_fdr_ratio_to_floor']:.2f}); "
        f"--help {s['help_s']:.2f} s; --cfg job {s['cfg_job_s']:.2f} s; "
        f"goals (+{STARTUP_GOAL_S:g} s, --help < {HELP_GOAL_S:g} s): {'met' if s['goal_met'] else 'NOT met'}"
    )
    print("\nData path: train loader alone vs the model's steps")
    for case, d in results["data_path"].items():
        print(
            f"{case:5} model {d['model_steps_per_sec']:.0f} steps/s; loader batches "
            f"{d['loader_batches_batches_per_sec']:.0f}/s (x{d['loader_batches_over_model']:.1f}), samples "
            f"{d['loader_samples_batches_per_sec']:.0f}/s (x{d['loader_samples_over_model']:.1f})"
        )


if __name__ == "__main__":
    main()
