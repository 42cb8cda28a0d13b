"""Make this copy of the template your own project: its name, description, author, Python version, wandb
project, default loggers, and (optionally) without the example datasets.

    copier copy --trust <template> my-project   # asks the questions of copier.yml, then runs this script
    python scripts/new_project.py --name my-project --examples=strip   # or by hand, in a fresh clone

It edits files in place, in the folder above `scripts/`, and can run again (copier update does): every step
sets a value or removes a file, so a second run changes nothing more.

Stripping the examples removes the image-folder data option (its datamodule, config, experiment, example
script and tests) and the full-MNIST download option, with their README sections. The two datasets that
ship inside installed packages stay: mnist5k, the default, and digits, on which the tests train in seconds.
"""

import argparse
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGGERS = ["csv", "tensorboard", "wandb", "mlflow"]
PYTHONS = ["3.10", "3.11", "3.12"]
# The example files; README sections about them sit between <!-- example --> and <!-- /example -->.
EXAMPLES = [
    "src/data/image_folder_datamodule.py",
    "configs/data/image_folder.yaml",
    "configs/experiment/mnist_images.yaml",
    "scripts/make_example_images.py",
    "tests/test_image_folder.py",
    "src/data/mnist_datamodule.py",
    "configs/data/mnist.yaml",
    "tests/test_mnist.py",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True, help="the project's name, e.g. 'Cell counting'")
    parser.add_argument("--description", default="", help="one sentence: what the project does")
    parser.add_argument("--author", default="", help="author name (pyproject.toml)")
    parser.add_argument("--python", default="3.10", help=f"oldest Python it supports: {', '.join(PYTHONS)}")
    parser.add_argument("--wandb-project", default=None, help="wandb project (default: the package name)")
    parser.add_argument("--wandb-entity", default="", help="wandb team or user (default: your own)")
    parser.add_argument("--loggers", default="csv", help=f"comma-separated, from {', '.join(LOGGERS)}")
    parser.add_argument(
        "--examples", choices=["keep", "strip"], default="keep", help="strip: remove the example datasets"
    )
    args = parser.parse_args()
    loggers = [name for name in args.loggers.split(",") if name]
    for name in loggers:
        if name not in LOGGERS:
            parser.error(f"--loggers: {name} is not a logger; choose from {', '.join(LOGGERS)}")
    if not loggers:
        parser.error(f"--loggers: give at least one of {', '.join(LOGGERS)}")
    if args.python not in PYTHONS:
        parser.error(f"--python {args.python} is not supported; choose one of {', '.join(PYTHONS)}")
    package = slug(args.name)
    if not package:
        parser.error(f"--name {args.name!r} has no letters or digits to name a package with")

    set_project(package, args.description, args.author, args.python)
    set_readme(args.name, args.description)
    set_wandb(args.wandb_project or package, args.wandb_entity or None)
    set_default_loggers(loggers)
    if args.examples == "strip":
        strip_examples()
    print(f"{args.name}: ready in {ROOT}")


def slug(name: str) -> str:
    """A package name from a project name: 'Cell counting!' -> 'cell-counting'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def edit(path: str, pattern: str, replacement: str, count: int = 1) -> None:
    """Replace `pattern` (a regex, multiline) in a file, which must match: a template change that moved the
    text fails loudly here instead of leaving the old value."""
    file = ROOT / path
    text, found = re.subn(pattern, lambda _: replacement, file.read_text(), count=count, flags=re.M)
    if not found:
        raise SystemExit(f"{path}: found nothing to replace for {pattern!r}; has the template changed?")
    file.write_text(text)


def toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def set_project(package: str, description: str, author: str, python: str) -> None:
    edit("pyproject.toml", r'^name = ".*"$', f"name = {toml_string(package)}")
    if description:
        edit("pyproject.toml", r'^description = ".*"$', f"description = {toml_string(description)}")
    python_line = f'requires-python = ">={python}"'
    if author:
        authors = f"authors = [{{ name = {toml_string(author)} }}]"
        if re.search(r"^authors = ", (ROOT / "pyproject.toml").read_text(), flags=re.M):
            edit("pyproject.toml", r"^authors = .*$", authors)
        else:
            python_line += "\n" + authors
    edit("pyproject.toml", r'^requires-python = ".*"$', python_line)


def set_readme(name: str, description: str) -> None:
    """The title, and the paragraph under it (what the project is)."""
    if description:
        edit("README.md", r"^# .*\n\n(?:.+\n)+", f"# {name}\n\n{description}\n")
    else:
        edit("README.md", r"^# .*$", f"# {name}")


def set_wandb(project: str, entity: str | None) -> None:
    edit("configs/logger/wandb.yaml", r"^(  project: )\S+", f"  project: {project}")
    edit("configs/logger/wandb.yaml", r"^(  entity: )\S+", f"  entity: {entity or 'null'}")


def set_default_loggers(loggers: list[str]) -> None:
    """One logger becomes the default directly; several are combined in configs/logger/default.yaml."""
    if len(loggers) == 1:
        choice = loggers[0]
        (ROOT / "configs" / "logger" / "default.yaml").unlink(missing_ok=True)
    else:
        choice = "default"
        lines = "".join(f"  - {name}\n" for name in loggers)
        (ROOT / "configs" / "logger" / "default.yaml").write_text(
            f"# This project's loggers, all at once (chosen when the project was generated).\n"
            f"defaults:\n{lines}  - _self_\n"
        )
    edit("configs/train.yaml", r"^(  - logger: )\S+", f"  - logger: {choice}")


def strip_examples() -> None:
    for path in EXAMPLES:
        (ROOT / path).unlink(missing_ok=True)
    shutil.rmtree(ROOT / "data" / "mnist_images", ignore_errors=True)
    readme = ROOT / "README.md"
    text = re.sub(r"<!-- example -->.*?<!-- /example -->\n?", "", readme.read_text(), flags=re.S)
    readme.write_text(text)


if __name__ == "__main__":
    main()
