"""How much code a project owns: the code lines of its Python outside tests/ and scripts/ (lines that are not
blank, comments or docstrings) and the config lines of configs/ (not blank, not comments).

It counts the core (a project generated with no part, made in a temporary folder) and the template with every
part; `make bench` prints it. A template's tool: generation leaves it out.

    python scripts/count_lines.py
"""

import ast
import io
import shutil
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The goals for the core: what every project keeps should stay small enough to read in an afternoon.
GOALS = {"code": 1500, "config": 450}
SKIPPED = ("tests", "scripts", ".venv", "logs", "data", ".git")


def code_lines(source: str) -> int:
    """Lines that hold code: not blank, not only a comment, not part of a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines: set[int] = set()
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (*skipped, tokenize.ENDMARKER):
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def config_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def count(root: Path) -> dict[str, int]:
    """The code lines of the Python files and the config lines of the YAML files under `root`."""
    files = [
        path for path in root.rglob("*") if path.is_file() and path.relative_to(root).parts[0] not in SKIPPED
    ]
    return {
        "code": sum(code_lines(path.read_text()) for path in files if path.suffix == ".py"),
        "config": sum(config_lines(path.read_text()) for path in files if path.suffix == ".yaml"),
    }


def core(root: Path) -> dict[str, int]:
    """The figures of a project generated from `root` with no part, made in a temporary folder."""
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder) / "core"
        for name in tracked:
            if (root / name).is_file():
                (project / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / name, project / name)
        generate = [sys.executable, "scripts/new_project.py", "--name", "core", "--parts="]
        subprocess.run(generate, cwd=project, check=True, capture_output=True, text=True)
        return count(project)


def main() -> None:
    if (ROOT / "scripts" / "parts.yaml").exists():
        figures, every_part = core(ROOT), count(ROOT)
        for kind, goal in GOALS.items():
            print(
                f"core: {figures[kind]:,} {kind} lines (goal {goal:,}); with every part: {every_part[kind]:,}"
            )
    else:
        for kind, value in count(ROOT).items():
            print(f"this project: {value:,} {kind} lines")


if __name__ == "__main__":
    main()
