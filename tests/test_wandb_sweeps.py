"""wandb sweeps (configs/wandb_sweep/): every value of every shipped sweep file reaches src/train.py as written
and composes, and one job, its command built as the agent builds it, runs offline on two DDP ranks into one
run dir and one wandb run of the sweep. The sweep server itself cannot be reached from the tests: everything
up to it is tested here."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, cli_env, only_run_dir
from tests.test_tracking import wandb_run

SWEEP_FILES = sorted((ROOT / "configs" / "wandb_sweep").glob("*.yml"))


def load_check():
    spec = importlib.util.spec_from_file_location(
        "check_wandb_sweep", ROOT / "scripts" / "check_wandb_sweep.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = load_check()


@pytest.mark.slow
@pytest.mark.parametrize("path", SWEEP_FILES, ids=[path.name for path in SWEEP_FILES])
def test_every_value_of_every_parameter_of_a_shipped_sweep_reaches_hydra_and_composes(path: Path):
    sweep = yaml.safe_load(path.read_text())
    assert sweep["parameters"] and all(check.samples(spec) for spec in sweep["parameters"].values())
    assert check.sweep_problems(path) == []


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("one string", False),  # one argument, not split by a shell: Hydra reads the spaces (wandb #5523)
        ("null", False),  # a string is Hydra's syntax: null
        ("[64, null]", False),
        ("'a,b'", False),
        ([128, 64], False),  # Python's str() of a list is Hydra's list
        (["a b", "c"], False),
        (0.001, False),
        (1e-05, False),  # `1e-05`
        (True, False),  # `True`: Hydra's true
        (7, False),
        (None, True),  # `None`: Hydra reads the string "None"
        ([64, None], True),  # `[64, None]`: a list holding "None"
        ({"dropout": 0.1}, True),  # `{'dropout': 0.1}`: not Hydra's syntax
        ("a,b", True),  # a sweep over a and b
        ("x=y", True),
    ],
)
def test_a_value_is_refused_when_hydra_would_read_the_agents_argument_otherwise(value, refused: bool):
    assert (check.reading_problem("key", value) is not None) == refused


@pytest.mark.slow
def test_the_check_refuses_a_sweep_file_naming_each_bad_parameter(tmp_path: Path):
    sweep = yaml.safe_load(SWEEP_FILES[0].read_text()) if SWEEP_FILES else {}
    sweep["parameters"] = {
        "model.optimizer.lr": {"values": [0.001]},
        "model.scheduler": {"values": ["null", None]},  # "null" is fine, None is not
        "model.net.hidden_sizes": {"values": [[64, None]]},
        "model.net.widths": {"values": [1]},  # no such key
        "model/net": {"values": ["mlp", "nope"]},  # no such option
    }
    sweep["command"] = [*sweep["command"], "model.optimizer.lr=0.1"]  # after the parameters: it wins
    path = tmp_path / "sweep.yml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    # python scripts/check_wandb_sweep.py <file>, as docs/wandb.md has a user run it before `wandb sweep`
    result = subprocess.run(
        [sys.executable, "scripts/check_wandb_sweep.py", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "parameter model.scheduler",
        "parameter model.net.hidden_sizes",
        "parameter model.optimizer.lr",
        "parameter model.net.widths",
        "parameter model/net",
    ]
    assert "reaches src/train.py as `model.scheduler=None`, which Hydra reads as 'None'" in lines[0]
    assert "holds 0.1 at model.optimizer.lr" in lines[2] and "model/net/nope" in lines[4]


def agent_job(tmp_path: Path, *extra: str) -> tuple[Path, str]:
    """Run the first job of configs/wandb_sweep/digits_mlp.yml as `wandb agent` would: its command built
    as the agent builds it, and the environment the agent gives it (the sweep and run ids, the file with
    the job's parameters). Then `extra`: offline, a short run, files under tmp_path. The run dir and run id."""
    sweep = yaml.safe_load((ROOT / "configs" / "wandb_sweep" / "digits_mlp.yml").read_text())
    values = {name: check.samples(spec)[0] for name, spec in sweep["parameters"].items()}
    # The agent's interpreter is `python` from the PATH; the tests' is this one.
    argv = check.agent_argv(sweep, values, python=sys.executable)
    argv += ["logger.wandb.offline=true", "trainer.max_epochs=1", "extras.print_config=false", *extra]
    argv += [f"paths.log_dir={tmp_path / 'logs'}", f"paths.data_dir={tmp_path / 'data'}"]
    # What the agent sets for the job's process (wandb_agent.py), which a user's shell never has: these
    # variables are the agent's, so setting them here is what the agent does, not a shortcut of the test.
    # WANDB_DIR: the agent keeps one that is set (else it sets its working directory).
    from wandb.sdk.lib import config_util

    run_id, agent_dir = "abcd1234", tmp_path / "agent"
    params = agent_dir / "wandb" / "sweep-swp00001" / f"config-{run_id}.yaml"
    config_util.save_config_file_from_dict(str(params), {k: {"value": v} for k, v in values.items()})
    env = {
        "WANDB_DIR": str(agent_dir),
        "WANDB_SWEEP_ID": "swp00001",
        "WANDB_RUN_ID": run_id,
        "WANDB_SWEEP_PARAM_PATH": str(params),
        "WANDB_PROJECT": "sweep-project",
    }
    result = subprocess.run(argv, cwd=ROOT, env=cli_env(**env), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # wandb wrote into the run dir, not the agent's: only the agent's file is there
    assert [path for path in agent_dir.rglob("*") if path.is_file()] == [params]
    return only_run_dir(tmp_path / "logs"), run_id


@pytest.mark.slow
def test_an_agents_job_on_two_ranks_runs_offline_into_one_run_dir_and_one_wandb_run(tmp_path: Path):
    # logger.wandb.id: the template gives wandb an id of its own when a named run resumes; under the agent
    # wandb keeps the agent's run id (and project) and ignores it, so the job stays in the sweep.
    run_dir, run_id = agent_job(tmp_path, "trainer=ddp_sim", "logger.wandb.id=templateid")
    assert run_dir.name == run_id  # run_name=${oc.env:WANDB_RUN_ID,null} in the sweep's command
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "completed" and record["wandb_id"] == run_id and record["world_size"] == 2
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 1  # from rank 0 alone
    wandb = wandb_run(run_dir)
    # The agent's run, in the sweep's project: not the config's project nor an id of the template's.
    run = wandb["run"]
    assert run.run_id == run_id and run.sweep_id == "swp00001" and run.project == "sweep-project"
    config = wandb["config"]  # the resolved config, nested, with the run record
    assert config["model"]["optimizer"]["lr"] == 0.0003 and config["model"]["net"]["hidden_sizes"] == [64]
    assert config["model"]["net"]["input_shape"] == [1, 8, 8]  # resolved, not "${data.input_shape}"
    assert config["run"]["world_size"] == 2
