"""Make this copy of the template your own project: its name, installed commands, description, author, licence,
Python versions (pyproject.toml and the CI matrix), README, wandb project, default loggers, and the parts it
keeps on top of the core (scripts/parts.yaml). The user-facing docs (docs/*.md: tutorial, how-tos,
reference) stay, without the sections of the parts left out; the notes for the template's maintainers
(docs/maintainers/) go.

    copier copy --trust <template> my-project   # asks the questions of copier.yml, then runs this script
    python scripts/new_project.py --name my-project --parts=segmentation,predict   # or by hand, in a fresh clone

It edits files in place, in the folder above `scripts/`, and can run again (copier update does): every step
sets a value or removes a file, so a second run changes nothing more. The README is replaced only while it is
still the template's own (scripts/project_readme.md becomes it): a README you wrote is never touched.
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
TASKS = ["train", "eval", "predict", "export", "report", "serve", "shard"]  # installed as <package>-<task>
LOGGERS = ["csv", "tensorboard", "wandb", "mlflow"]
PYTHONS = ["3.11", "3.12", "3.13"]  # oldest first: the CI matrix tests from the chosen one up
# The template maintainers' notes (performance measurements, design): not a generated project's.
MAINTAINER_DOCS = "docs/maintainers"
# What a project may leave out: scripts/parts.yaml, read by choose_parts().
PARTS_FILE = "scripts/parts.yaml"
# The template's own upkeep, which no project keeps: these files, and the lines marked with the part `template`.
# tests/maintainers: generation, docs walk, linters; the benchmarks against bare Lightning and hand-written loops,
# and the core-size counter, measure the template (a project times its own runs with callbacks=[default,throughput]).
TEMPLATE_ONLY = [
    PARTS_FILE,
    "tests/maintainers",
    "scripts/benchmark.py",
    "scripts/benchmark_streaming.py",
    "scripts/count_lines.py",
]
# A line kept only with some parts ends in `[part: a, b]` (kept when a and b are kept) or `[part: a | b]` (kept
# when a or b is); a block is kept likewise between a start line `# part: a, b` (`<!-- part: a | b -->` in
# Markdown) and an end line `# /part` (`<!-- /part -->`). A marker uses `,` or `|`, never both.
LINE_TAG = re.compile(r"\s*\[part: ([\w,| -]+)\]\s*$")
BLOCK_START = re.compile(r"^\s*(?:#|<!--)\s*part: ([\w,| -]+?)\s*(?:-->)?\s*$")
BLOCK_END = re.compile(r"^\s*(?:#|<!--)\s*/part\s*(?:-->)?\s*$")
# The files the markers may stand in: text that a part's lines can be part of.
MARKED = (".py", ".yaml", ".yml", ".toml", ".md", ".cfg", ".txt", ".sh", "Makefile", "run")
# An import list that generation changed (a name or a marker gone) is joined onto one line where it fits, as
# ruff formats a list written that way: `from a import (\n    b,\n)` becomes `from a import b`.
IMPORT_LIST = re.compile(r"^([ \t]*from [\w.]+ import )\(\n((?:[ \t]+\w+(?: as \w+)?,\n)+)[ \t]*\)$", re.M)


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
        "--parts",
        default="all",
        help="comma-separated parts to keep on top of the core (scripts/parts.yaml), 'all' or '' for none",
    )
    args = parser.parse_args()
    manifest = read_parts()
    # A project made earlier has no manifest left: its parts were chosen then.
    chosen = set(manifest) if args.parts == "all" else {name for name in args.parts.split(",") if name}
    for name in sorted(chosen - set(manifest)) if manifest else []:
        parser.error(f"--parts: {name} is not a part; choose from {', '.join(manifest)} (or all)")
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

    kept = with_needs(manifest, chosen) if manifest else set()
    for name in loggers:
        if manifest and name in manifest and name not in kept:
            parser.error(
                f"--loggers: {name} needs the {name} part; add it to --parts, or choose another logger"
            )

    if manifest:
        choose_parts(manifest, kept)  # first: the edits below find the lines the parts left
    set_project(package, args.description, args.author, args.python)
    set_license(args.author)
    set_ci(args.python)
    set_readme(args.name, args.description or DEFAULT_DESCRIPTION, package)
    set_wandb(args.wandb_project or package, args.wandb_entity or None)
    set_default_loggers(loggers)
    remove_maintainer_docs()
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
    for task in [task for task in TASKS if (ROOT / "src" / f"{task}.py").exists()]:
        # the installed commands: named after the project, never a shell builtin
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


def read_parts() -> dict[str, dict]:
    """The parts of scripts/parts.yaml, or none in a project generated earlier (the file went with them)."""
    import yaml  # installed with Hydra; imported here so that --help works before `make install`

    path = ROOT / PARTS_FILE
    return yaml.safe_load(path.read_text()) if path.exists() else {}


def with_needs(manifest: dict[str, dict], chosen: set[str]) -> set[str]:
    """The chosen parts and every part they need, and what those need."""
    todo, kept = list(chosen), set()
    while todo:
        name = todo.pop()
        if name not in kept:
            kept.add(name)
            todo += manifest[name].get("needs", [])
    return kept


def files_left_out(manifest: dict[str, dict], kept: set[str]) -> list[str]:
    """The files and folders of the parts not kept (a file two parts list stays while either is kept), and those
    that two parts share `with` each other when either is not kept."""
    paths, keeps = [], set()
    for name, part in manifest.items():
        if name in kept:
            keeps.update(part.get("files", []))
        else:
            paths += part.get("files", [])
        for other, files in (part.get("with") or {}).items():
            if name not in kept or other not in kept:
                paths += files
    return [path for path in paths if path not in keeps]


def wanted(names: str, kept: set[str], known: set[str] | None, where: str) -> bool:
    """Whether the lines of the marker `part: <names>` stay: `a, b` when every part named is kept, `a | b` when
    any is. A marker that mixes both (which would bind first?) or names a part not `known` is refused."""
    if "," in names and "|" in names:
        raise SystemExit(f"{where}: `part: {names}` mixes `,` (all of) and `|` (any of); use one of them")
    parts = [name.strip() for name in re.split(r"[,|]", names)]
    if known is not None and (unknown := sorted(set(parts) - known)):
        raise SystemExit(f"{where}: `part: {names}` names {', '.join(unknown)}, which is not a part")
    return (any if "|" in names else all)(name in kept for name in parts)


def keep_lines(
    text: str, kept: set[str], where: str, known: set[str] | None = None, width: int | None = None
) -> str:
    """`text` without the lines and blocks of parts not kept, and without any marker. Blank lines are kept
    as a formatter left them: a block left out takes the blank lines before it along (those after it
    separate what follows), and a marker's line takes no blank line that would double one. Markers may name
    only `known` parts (None: any). With a `width` (Python), an import list that lost a name or a marker is
    joined onto one line where it fits in `width`."""
    lines: list[str] = []
    blocks: list[bool] = []  # for each open block, whether its lines are kept
    squeeze = False  # after a marker: blank lines that follow a blank line are dropped
    changed: set[int] = set()  # the indices in `lines` of lines that lost a marker or follow a line left out
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if start := BLOCK_START.match(line):
            keep = wanted(start[1], kept, known, f"{where}:{number}")
            if all(blocks) and not keep:
                while lines and not lines[-1].strip():
                    lines.pop()
            blocks.append(keep)
            squeeze = True
            changed.add(len(lines))
            continue
        if BLOCK_END.match(line):
            if not blocks:
                raise SystemExit(f"{where}:{number}: a part's end marker without its start")
            blocks.pop()
            squeeze = True
            changed.add(len(lines))
            continue
        if not all(blocks):
            continue
        if not line.strip() and squeeze and (not lines or not lines[-1].strip()):
            continue
        squeeze = False
        if tag := LINE_TAG.search(line.rstrip("\n")):
            changed.add(len(lines))
            if not wanted(tag[1], kept, known, f"{where}:{number}"):
                squeeze = True  # a group of tagged lines (imports) left out leaves one blank line, not two
                continue
            end = "\n" if line.endswith("\n") else ""
            line = line.rstrip("\n")[: tag.start()].rstrip()
            line = (line[:-1].rstrip() if line.endswith("#") else line) + end  # a comment of the tag alone
        lines.append(line)
    if blocks:
        raise SystemExit(f"{where}: a part's block is never closed (# /part)")
    text = "".join(lines).rstrip("\n") + "\n" if lines else ""
    return join_imports(text, changed, width) if width else text


def join_imports(text: str, changed: set[int], width: int) -> str:
    """`text` with each import list that holds a `changed` line (or ends after one) on one line, where it fits
    in `width`; a list that keeps a comment is not matched, and stays as it is."""

    def join(found: re.Match) -> str:
        first = text.count("\n", 0, found.start())  # the line of `from ... import (`
        names = [name.strip() for name in found[2].split(",\n") if name.strip()]
        line = found[1] + ", ".join(names)
        inside = set(range(first + 1, first + found[0].count("\n") + 1))
        return line if changed & inside and len(line) <= width else found[0]

    return IMPORT_LIST.sub(join, text)


def line_length() -> int:
    """ruff's line length (pyproject.toml), which a joined import list must fit."""
    found = re.search(r"^line-length = (\d+)", (ROOT / "pyproject.toml").read_text(), flags=re.M)
    return int(found[1]) if found else 88  # ruff's default


def choose_parts(manifest: dict[str, dict], kept: set[str]) -> None:
    """Remove the parts not kept (their files, and their lines in the files that stay), then the markers and
    the manifest: what is left is the project's own."""
    for path in files_left_out(manifest, kept):
        target = ROOT / path
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    known, width = {*manifest, "template"}, line_length()
    for path in sorted(ROOT.rglob("*")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in (".git", ".venv", "logs", "data") or not path.is_file():
            continue
        if not (path.suffix in MARKED or path.name in MARKED):
            continue
        text = path.read_text(errors="replace")
        if "part" in text:
            new = keep_lines(text, kept, str(relative), known, width if path.suffix == ".py" else None)
            if new != text:
                path.write_text(new)
    for path in TEMPLATE_ONLY:
        if (ROOT / path).is_dir():
            shutil.rmtree(ROOT / path)
        else:
            (ROOT / path).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
