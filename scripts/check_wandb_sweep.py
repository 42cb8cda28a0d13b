"""Check wandb sweep files before `wandb sweep` creates a sweep from one: every value of every parameter, put
on src/train.py's command line as the agent puts it, must reach the run as the file says.

    python scripts/check_wandb_sweep.py configs/wandb_sweep/digits_mlp.yml

The agent writes each parameter as one argument `key=value`, the value formatted by Python's `str()` (wandb's
`create_sweep_command_args`, its `${args_no_hyphens}`). Hydra then reads that argument with its own grammar,
so some values arrive as something else (wandb issue #5523): null becomes the string "None", a list holding
null holds "None", a dict cannot be parsed, a string with a comma is a sweep. Numbers, true/false, lists of
them and strings (spaces included) arrive as written. A string in a sweep file is read as Hydra's
override syntax: "null" is null, "[null, 1]" a list holding null, "'a,b'" the string a,b. The check refuses
a value that Hydra would read differently, and one whose command does not compose with configs/, naming the
parameter, one line each; it exits with 1 when any is refused.
"""

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"
ARGS_MACRO = "${args_no_hyphens}"
# wandb's distributions whose min and max are exponents: the values they give are e^min ... e^max.
EXPONENTS = ("log_uniform", "q_log_uniform")


def as_argument(name: str, value: Any) -> str:
    """One parameter as the agent writes it into the command (wandb's own formatting)."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    return create_sweep_command_args({"args": {name: {"value": value}}})[ARGS_MACRO[2:-1]][0]


def agent_argv(sweep: dict[str, Any], values: dict[str, Any], python: str = "python") -> list[str]:
    """The command the wandb agent runs for one job of `sweep` with these parameter values: its `command`
    with the macros filled in as the agent fills them (wandb_agent.Agent._command_run; its loop is copied
    here, being no function of its own). The agent's interpreter is `python` from the PATH."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command

    macros = {
        "env": ["/usr/bin/env"],
        "interpreter": [python],
        "program": [sweep["program"]],
        ARGS_MACRO[2:-1]: [as_argument(name, value) for name, value in values.items()],
    }
    argv = []
    for item in create_sweep_command(list(sweep["command"])):
        item = str(item)
        argv += macros.get(item[2:-1], []) if item.startswith("${") and item.endswith("}") else [item]
    return argv


def samples(spec: dict[str, Any]) -> list[Any]:
    """The values of a parameter to check: all that it lists, or the ends of its range."""
    if "value" in spec:
        return [spec["value"]]
    if "values" in spec:
        return list(spec["values"])
    if "min" in spec and "max" in spec:
        ends = [spec["min"], spec["max"]]
        return [math.exp(end) for end in ends] if spec.get("distribution") in EXPONENTS else ends
    return [spec["mu"]] if "mu" in spec else []


def same(read: Any, written: Any) -> bool:
    """Hydra's reading equals the sweep's value, and is of the same kind (1 is not true, "1" is not 1)."""
    if isinstance(written, bool) or isinstance(read, bool):
        return type(read) is type(written) and read == written
    if isinstance(written, int | float) and isinstance(read, int | float):
        return read == written or (math.isnan(read) and math.isnan(written))
    if isinstance(written, list) and isinstance(read, list):
        return len(read) == len(written) and all(map(same, read, written))
    return type(read) is type(written) and read == written


def how_to_fix(value: Any) -> str:
    if value is None:
        return 'write the string "null" instead (Hydra\'s null)'
    if isinstance(value, dict):
        return "make each of its keys a parameter of its own (<parameter>.<key>)"
    if isinstance(value, str):
        return f"quote it for Hydra: \"'{value}'\""
    return 'write it as a string in Hydra\'s syntax instead, e.g. "[64, null]"'


def one_line(error: Exception) -> str:
    text = " ".join(str(error).split()).split(" See https://hydra.cc")[0].split(" Config search path")[0]
    return f"{type(error).__name__}: {text}"


def reading_problem(name: str, value: Any) -> str | None:
    """Why Hydra would not read the agent's `name=value` as `value` (a string: as Hydra's syntax), or None."""
    item = as_argument(name, value)
    where = f"parameter {name}: value {value!r} reaches src/train.py as `{item}`"
    try:
        (override,) = OverridesParser.create().parse_overrides([item])
    except Exception as error:
        return f"{where}, which Hydra cannot read ({one_line(error)}); {how_to_fix(value)}"
    if override.is_sweep_override():
        return f"{where}, which Hydra reads as a sweep (a comma or a range); {how_to_fix(value)}"
    if not isinstance(value, str) and not same(override.value(), value):
        return f"{where}, which Hydra reads as {override.value()!r}; {how_to_fix(value)}"
    return None


def job_problems(sweep: dict[str, Any], values: dict[str, Any], checked: list[str]) -> tuple[Any, list[str]]:
    """The config of the agent's command for a job with these parameter values, composed, and why it would not
    compose or would not hold the values of the parameters `checked` at their keys (one line each)."""
    argv = agent_argv(sweep, values)
    try:
        cfg = compose(Path(sweep["program"]).stem, overrides=argv[argv.index(sweep["program"]) + 1 :])
    except Exception as error:
        job = ", ".join(f"{name}={values[name]!r}" for name in checked)
        return None, [f"parameter {checked[0]}: with {job} the command does not compose: {one_line(error)}"]
    problems = []
    for name in checked:
        (override,) = OverridesParser.create().parse_overrides([as_argument(name, values[name])])
        key = override.key_or_group
        if (CONFIG_DIR / key).is_dir():
            continue  # an option of a config group: composing proved that it exists
        node = OmegaConf.select(cfg, key)
        composed = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node
        if not same(composed, override.value()):
            problems.append(
                f"parameter {name}: value {values[name]!r}: the composed config holds {composed!r} at {key} "
                "(does the command set it again?)"
            )
    return cfg, problems


def sweep_problems(path: Path) -> list[str]:
    """Everything in a sweep file that would not reach src/train.py as written: one line each."""
    try:
        sweep = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        return [f"{path}: not YAML: {' '.join(str(error).split())}"]
    command = [str(item) for item in sweep.get("command") or []]
    program = sweep.get("program")
    if not program or not (ROOT / program).is_file() or "${program}" not in command:
        return [f"{path}: program: {program!r}: give src/train.py, and ${{program}} in command"]
    if command.count(ARGS_MACRO) != 1 or any(i.startswith("${args") and i != ARGS_MACRO for i in command):
        return [
            f"{path}: command: give the parameters to Hydra as {ARGS_MACRO}, once, and no other ${{args...}}"
        ]
    problems, readable = [], {}
    for name, spec in (sweep.get("parameters") or {}).items():
        readable[name] = []
        for value in samples(spec):
            problem = reading_problem(name, value)
            problems += [problem] if problem else []
            readable[name] += [] if problem else [value]
        problems += (
            []
            if samples(spec)
            else [
                f"parameter {name}: no value, values, min and max, or mu to check (nested parameters are a dict)"
            ]
        )
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        # Each value is checked in a job whose other parameters are at their first value. The job of all the
        # first values first; when it fails, each first value alone, so that a bad one is reported once.
        first = {name: values[0] for name, values in readable.items() if values}
        cfg, found = job_problems(sweep, first, list(first)) if first else (None, [])
        if cfg is not None:
            problems += found
            done = set(first)
        else:
            done = set()
            for name in list(first):
                if found := job_problems(sweep, {name: first[name]}, [name])[1]:
                    problems += found
                    done.add(name)
                    del first[name]
        fixed = [item for item in command if not item.startswith("${")]
        try:
            cfg = cfg if cfg is not None else compose(Path(program).stem, overrides=fixed)
            if "wandb" not in (cfg.get("logger") or {}):
                problems.append("command: no wandb logger; add logger=wandb, or no job reports to the sweep")
        except Exception as error:
            problems.append(f"command: {' '.join(fixed)} does not compose: {one_line(error)}")
        for name, values in readable.items():
            others = {key: value for key, value in first.items() if key != name}
            for value in values[1:] if name in done else values:
                problems += job_problems(sweep, others | {name: value}, [name])[1]
    GlobalHydra.instance().clear()
    return [f"{path}: {problem}" for problem in problems]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "sweep_files", type=Path, nargs="+", help="wandb sweep files (configs/wandb_sweep/*.yml)"
    )
    problems = [problem for path in parser.parse_args().sweep_files for problem in sweep_problems(path)]
    print("\n".join(problems) or "every value reaches src/train.py as written")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
