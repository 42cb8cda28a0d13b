"""Make this copy of the template your own project: its name, installed commands, description, author, licence,
Python versions (pyproject.toml and the CI matrix), README, wandb project, default loggers, and (optionally)
without the example datasets. The user-facing docs (docs/*.md: tutorial, how-tos, reference) stay; the notes
for the template's maintainers (docs/maintainers/) go.

    copier copy --trust <template> my-project   # asks the questions of copier.yml, then runs this script
    python scripts/new_project.py --name my-project --examples=strip   # or by hand, in a fresh clone

It edits files in place, in the folder above `scripts/`, and can run again (copier update does): every step
sets a value or removes a file, so a second run changes nothing more. The README is replaced only while it is
still the template's own (scripts/project_readme.md becomes it): a README you wrote is never touched.

Stripping the examples removes the image-folder data option (its datamodule, config, experiment, example
script and tests) and the full-MNIST download option, with their sections of the README and of docs/. The
two datasets that ship inside installed packages stay: mnist5k, the default, and digits, on which the tests
train in seconds.
"""

import argparse
import datetime
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The generated project's README, with {{ name }}, {{ description }} and {{ package }} to fill in.
PROJECT_README = "scripts/project_readme.md"
# The first line of the template's own README: while README.md starts with it, it is replaced.
TEMPLATE_README_TITLE = "# Lightning + Hydra project template\n"
DEFAULT_DESCRIPTION = "Image classification with PyTorch Lightning and Hydra."
TASKS = ["train", "eval", "predict", "export", "report"]  # the installed commands are <package>-<task>
LOGGERS = ["csv", "tensorboard", "wandb", "mlflow"]
PYTHONS = ["3.11", "3.12", "3.13"]  # oldest first: the CI matrix tests from the chosen one up
# The template maintainers' notes (performance measurements, design): not a generated project's.
MAINTAINER_DOCS = "docs/maintainers"
# The example files; sections of the README and docs/*.md about them sit between <!-- example --> and
# <!-- /example -->.
EXAMPLES = [
    "src/data/image_folder_datamodule.py",
    "configs/data/image_folder.yaml",
    "configs/experiment/mnist_images.yaml",
    "configs/experiment/finetune_images.yaml",
    "scripts/make_example_images.py",
    "src/data/components/example_images.py",
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
    parser.add_argument(
        "--python", default=PYTHONS[0], help=f"oldest Python it supports: {', '.join(PYTHONS)}"
    )
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
    set_license(args.author)
    set_ci(args.python)
    set_readme(args.name, args.description or DEFAULT_DESCRIPTION, package)
    set_wandb(args.wandb_project or package, args.wandb_entity or None)
    set_default_loggers(loggers)
    remove_maintainer_docs()
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
    python_line = f'requires-python = ">={python}"  # the oldest Python this project supports'
    if author:
        authors = f"authors = [{{ name = {toml_string(author)} }}]"
        if re.search(r"^authors = ", (ROOT / "pyproject.toml").read_text(), flags=re.M):
            edit("pyproject.toml", r"^authors = .*$", authors)
        else:
            python_line += "\n" + authors
    edit("pyproject.toml", r"^requires-python = .*$", python_line)
    edit("pyproject.toml", r'^target-version = ".*"$', f'target-version = "py{python.replace(".", "")}"')
    for task in TASKS:  # the installed commands: named after the project, never a shell builtin
        edit(
            "pyproject.toml",
            rf'^[\w.-]+-{task} = "src\.{task}:main"$',
            f'{package}-{task} = "src.{task}:main"',
        )


def set_license(author: str) -> None:
    """The copyright line names the author, from this year on."""
    if author:
        year = datetime.date.today().year
        edit("LICENSE", r"^Copyright \(c\) .*$", f"Copyright (c) {year} {author}")


def set_ci(python: str) -> None:
    """The CI workflow tests every supported Python from the oldest the project supports."""
    versions = ", ".join(f'"{version}"' for version in PYTHONS[PYTHONS.index(python) :])
    edit(".github/workflows/ci.yml", r"(?<=\bpython: )\[[^]]*\]", f"[{versions}]")


def set_readme(name: str, description: str, package: str) -> None:
    """The project's own README (scripts/project_readme.md), in place of the template's, which explains the
    template; once the README is the project's, it is the user's and left alone."""
    source, readme = ROOT / PROJECT_README, ROOT / "README.md"
    if source.exists() and readme.read_text().startswith(TEMPLATE_README_TITLE):
        text = source.read_text()
        for key, value in {"name": name, "description": description, "package": package}.items():
            text = text.replace("{{ " + key + " }}", value)
        readme.write_text(text)
    source.unlink(missing_ok=True)


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


def remove_maintainer_docs() -> None:
    """The template's upkeep (docs/maintainers/) is not the project's: its pages link only to docs/*.md."""
    shutil.rmtree(ROOT / MAINTAINER_DOCS, ignore_errors=True)


def strip_examples() -> None:
    for path in EXAMPLES:
        (ROOT / path).unlink(missing_ok=True)
    shutil.rmtree(ROOT / "data" / "mnist_images", ignore_errors=True)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = re.sub(r"<!-- example -->.*?<!-- /example -->\n?", "", page.read_text(), flags=re.S)
        page.write_text(text)


if __name__ == "__main__":
    main()
