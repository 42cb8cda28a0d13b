"""Docs that cannot rot: what README.md, docs/ and the configs' comments tell a user to type, or to open, is
checked against the project as it is. The rules a page (or a config comment) follows:

- Every `python src/<task>.py ...` command, in a ```bash block (one command a line, comments after `#`) or in
  an inline code span, composes its config with Hydra as `--cfg job` would, without running it: its
  overrides name real keys and options, its flags are Hydra's. Placeholders are in angle brackets
  (`logs/train/runs/<run>`, `model/net=<name>`): a placeholder value is taken as given, an option or key that
  is a placeholder is left out. With `-m` each sweep composes with its first value (an Optuna `interval` with
  its lower end); a sweep over a `hydra.` key is refused, as Hydra refuses it.
- Every path that starts with configs/, src/, scripts/, tests/, hydra_plugins/ or docs/, in code spans, code
  blocks and links, exists. A path with `<...>` or a glob `*` is not checked; for a file that the user or
  generation creates (configs/local/..., configs/logger/default.yaml) only its folder is.
- Every relative link leads to a file, and its `#anchor` to a heading of that page (GitHub's anchors:
  lowercase, spaces to `-`, punctuation other than `-` and `_` dropped).
- Every option named as `group=option` (`trainer=ddp`, `model/net=mlp`, `'callbacks=[default,ema]'`,
  `model/net=mlp,simple_cnn`) in code spans and ```bash blocks is an option of that group; `null` always is.
- A list of a group's options starts with `group=option` and goes on with bare names after commas:
  "`debug=fdr` (one batch), limit, overfit, profiler, default". It names every option of the group, or ends
  with `...` ("`trainer=ddp`, gpu, ..."), then each name must be one. Every defaults entry of
  configs/train.yaml whose group has several options gives such a list.
- The pages a generated project keeps (docs/*.md and its README, scripts/project_readme.md) and the configs'
  comments neither link to nor name what generation removes: docs/maintainers/, scripts/project_readme.md. A
  link from them to a heading of README.md needs that heading in both READMEs, the template's and the
  project's. The template's README.md may link anywhere.
- The configs' comments follow the same rules: a command in them (in backticks, or else from `python` to the
  end of the line) composes, and the options and paths they name exist.
- A line that shows a mistake on purpose (a troubleshooting example) ends with `<!-- wrong on purpose -->`;
  that comment alone on a line marks the line or code block after it. Nothing there is checked.
"""

import collections
import contextlib
import copy
import dataclasses
import functools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, IntervalSweep, Override
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict, read_write

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "configs"
# The README a generated project gets; it becomes README.md at the root, so its links start there.
PROJECT_README = "scripts/project_readme.md"
MAINTAINERS = "docs/maintainers/"  # template-only pages: generation removes them
TEMPLATE_ONLY = (MAINTAINERS, PROJECT_README)  # what generation removes from a project
NAMED_ROOTS = ("configs", "src", "scripts", "tests", "hydra_plugins", "docs")
# Files a user (configs/local/, git-ignored) or project generation (several default loggers) creates: only
# their folder is checked.
USERS_OWN = ("configs/local/", "configs/logger/default.yaml")
# A line that shows a mistake on purpose (a troubleshooting example) carries this HTML comment (invisible on
# the page); alone on its line, it marks the code block or line that follows.
WRONG_ON_PURPOSE = "<!-- wrong on purpose -->"
SHELL_LANGUAGES = {"bash", "sh", "shell", "console", "zsh"}
# The primary configs whose defaults comments are checked; in train.yaml each multi-option group lists them.
PRIMARY_CONFIGS = sorted(path.stem for path in CONFIG_DIR.glob("*.yaml"))  # train, eval, ...
PLACEHOLDER = "PLACEHOLDER"  # what `<run>` and `<name>` become in a command


# --- reading Markdown ---------------------------------------------------------------------------------------


def markdown_files(root: Path = ROOT) -> list[Path]:
    """README.md, the generated project's README and docs/**/*.md: those of them that exist."""
    pages = [root / "README.md", root / PROJECT_README, *sorted((root / "docs").rglob("*.md"))]
    return [page for page in pages if page.is_file()]


def name_of(path: Path, root: Path = ROOT) -> str:
    return path.relative_to(root).as_posix()


def kept_by_generation(name: str) -> bool:
    """Whether a page is one a generated project has: docs/*.md and its README (not the template's)."""
    return name == PROJECT_README or (name.startswith("docs/") and not name.startswith(MAINTAINERS))


FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
# An inline code span: a run of backticks, text that does not cross a blank line, the same run again.
SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:[^`\n]|\n(?![ \t]*\n)|(?!\1)`+)+?)(?<!`)\1(?!`)")


@dataclass(frozen=True)
class Page:
    """A Markdown page split into its code and its prose, with line numbers."""

    blocks: list[tuple[int, str, str]]  # (line, language, text) of each line of a fenced code block
    spans: list[tuple[int, str]]  # (line, text) of each inline code span
    prose: str  # the text outside code blocks and spans (blanked out, so that line numbers stay)


def read_page(path: Path) -> Page:
    """The page's code and prose; lines marked WRONG_ON_PURPOSE (and the code block or line after a marker
    alone on its line) are left out."""
    lines = path.read_text().split("\n")
    blocks, fence, language, skip = [], None, "", False
    for number, line in enumerate(lines, 1):
        if WRONG_ON_PURPOSE in line:
            skip = not line.replace(WRONG_ON_PURPOSE, "").strip()
            lines[number - 1] = ""
            continue
        if skip and fence is None and not FENCE.match(line):
            skip = bool(not line.strip())  # the marked line: after blank lines, the next one
            lines[number - 1] = ""
            continue
        if fence is None and (opened := FENCE.match(line)):
            fence, language = opened.group(1), opened.group(2).lower()
            lines[number - 1] = ""
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence, skip = None, False
            elif not skip:
                blocks.append((number, language, line))
            lines[number - 1] = ""
    text = "\n".join(lines)
    spans = [(text.count("\n", 0, m.start()) + 1, " ".join(m.group(2).split())) for m in SPAN.finditer(text)]
    prose = SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return Page(blocks, spans, prose)


def shell_lines(page: Page) -> list[tuple[int, str]]:
    """The lines of the page's shell code blocks, a line ending in `\\` joined with the next, without a `$ `
    prompt."""
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, language, line in page.blocks:
        if language not in SHELL_LANGUAGES:
            continue
        if pending:
            number, line = pending[0], pending[1] + " " + line.strip()
        pending = (number, line[:-1]) if line.rstrip().endswith("\\") else None
        if pending:
            continue
        joined.append((number, re.sub(r"^\s*\$ ", "", line)))
    return joined


# --- commands -----------------------------------------------------------------------------------------------


@functools.cache
def entry_points(root: Path = ROOT) -> dict[str, str]:
    """{script: config name} of src/*.py with a `@hydra.main(config_name=...)`: train -> train, ..."""
    found = {}
    for path in sorted((root / "src").glob("*.py")):
        if main := re.search(r"@hydra\.main\([^)]*config_name=\"(\w+)\"", path.read_text()):
            found[path.stem] = main.group(1)
    return found


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    text: str  # as written, from `python` on
    script: str  # src/<script>.py
    args: tuple[str, ...]  # what the shell passes it, placeholders replaced by PLACEHOLDER
    error: str | None = None  # why the shell would not run it as written


# Where a command starts: a python (or torchrun) word, then its arguments.
START = re.compile(r"(?<![\w.-])(?:[\w./-]*/)?(?:python(?:3(?:\.\d+)?)?|torchrun)(?=\s)")
PLACEHOLDER_TEXT = re.compile(r"<(?=[^\s<>!=-])[^<>\n]*(?<=\S)>")
SHELL_OPERATOR = re.compile(r"^[();<>|&]+$")


def unquoted(code: str) -> str:
    """A shell line with what is inside quotes blanked out (quotes kept), so that its syntax shows."""
    out, quote = [], None
    for char in code:
        if quote:
            quote = None if char == quote else quote
            out.append(char if quote is None else " ")
        else:
            quote = char if char in "'\"" else None
            out.append(char)
    return "".join(out)


def without_comment(code: str) -> str:
    """A shell line without its comment: from a `#` that starts a word, outside quotes."""
    comment = re.search(r"(?:^|\s)#", unquoted(code))
    return code[: comment.start()] if comment else code


def command_at(text: str, where: str) -> Command | None:
    """The `python src/<script>.py args` command that `text` starts with (up to a shell operator: `|`, `;`,
    `&&`, `)`), or None when it runs no script of src/. A command the shell would refuse (an unclosed quote,
    an unquoted `(`) comes with its `error`."""
    lexer = shlex.shlex(
        PLACEHOLDER_TEXT.sub(PLACEHOLDER, without_comment(text)), posix=True, punctuation_chars=True
    )
    lexer.whitespace_split, lexer.commenters = True, ""
    tokens, error = [], None
    if re.search(r"[^\s(]\(", unquoted(without_comment(text))):  # `data.fold=range(0,5)`, unquoted
        error = "an unquoted ( is a bash syntax error: quote the override ('data.fold=range(0,5)')"
    try:
        for token in lexer:
            if SHELL_OPERATOR.match(token):
                break
            tokens.append(token)
    except ValueError as unclosed:
        error = str(unclosed)
    if tokens[0].endswith("torchrun") or tokens[1:3] == ["-m", "torch.distributed.run"]:
        scripts = [
            i for i, token in enumerate(tokens) if token.endswith(".py")
        ]  # after the launcher's options
        first = scripts[0] if scripts else None
    else:
        first = 1 if len(tokens) > 1 else None
    if first is None or not re.fullmatch(r"src/[^/]+\.py", tokens[first]):
        return None  # `python -m pytest`, `python scripts/new_project.py`: not an entry point's command
    script = tokens[first].removeprefix("src/").removesuffix(".py")
    if PLACEHOLDER in script:
        return None  # `python src/<task>.py`: a pattern, not a command
    return Command(where, text.strip(), script, tuple(tokens[first + 1 :]), error)


def commands_in_code(code: str, where: str) -> list[Command]:
    """The commands in a line of code: from each python (or torchrun) word on."""
    found = [command_at(code[m.start() :], where) for m in START.finditer(code)]
    return [command for command in found if command]


def commands_in_page(path: Path, root: Path = ROOT) -> list[Command]:
    page, name = read_page(path), name_of(path, root)
    found = []
    for number, line in shell_lines(page):
        found += commands_in_code(line, f"{name}:{number}")
    for number, span in page.spans:
        found += commands_in_code(span, f"{name}:{number}")
    return sorted(found, key=lambda command: int(command.where.rpartition(":")[2]))


def yaml_comments(path: Path) -> list[tuple[int, str]]:
    """(line, text after `#`) of each comment of a YAML file (a `#` inside quotes is no comment)."""
    comments = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        quote = None
        for i, char in enumerate(line):
            if quote:
                quote = None if char == quote else quote
            elif char in "'\"" and (i == 0 or line[i - 1] in " :[{,-"):
                quote = char
            elif char == "#" and (i == 0 or line[i - 1] in " \t"):
                comments.append((number, line[i + 1 :]))
                break
    return comments


def commands_in_comment(comment: str, where: str) -> list[Command]:
    """A command in a config comment is in backticks, or runs to the end of the line (a sentence's full stop
    is not part of it)."""
    spans = [m.group(2) for m in SPAN.finditer(comment) if START.search(m.group(2))]
    if spans:
        return [command for span in spans for command in commands_in_code(span, where)]
    return commands_in_code(re.sub(r"\.\s*$", "", comment), where)


def config_files(root: Path = ROOT) -> list[Path]:
    return sorted((root / "configs").rglob("*.yaml"))


def all_commands(root: Path = ROOT) -> list[Command]:
    commands = [command for page in markdown_files(root) for command in commands_in_page(page, root)]
    for config in config_files(root):
        for number, comment in yaml_comments(config):
            commands += commands_in_comment(comment, f"{name_of(config, root)}:{number}")
    return commands


def numbered(commands: list[Command]) -> list[Command]:
    """Ids that name where each command is: the second command of a line is `<file>:<line>(2)`."""
    seen: collections.Counter[str] = collections.Counter()
    out = []
    for command in commands:
        seen[command.where] += 1
        count = seen[command.where]
        out.append(command if count == 1 else dataclasses.replace(command, where=f"{command.where}({count})"))
    return out


@functools.cache
def group_options(group: str) -> list[str]:
    """The options Hydra knows for a config group (configs/<group>/*.yaml, and Hydra's own for hydra/...);
    [] when `group` is no group. Needs an initialized Hydra (the `hydra_configs` fixture)."""
    return GlobalHydra.instance().config_loader().get_group_options(group)


def first_value(override: Override) -> str:
    """The value a sweep's first job gets: the first choice, the start of a range, the lower end of an
    interval."""
    sweep = override.value()
    if isinstance(sweep, IntervalSweep):
        return str(sweep.start)
    if isinstance(sweep, Glob):
        return sweep.filter(group_options(override.key_or_group))[0]
    return next(override.sweep_string_iterator())


def compose_args(command: Command) -> tuple[str, list[str]] | None:
    """The config name and overrides that Hydra would compose for the command; None when it composes
    nothing (shell completion, --version). Raises AssertionError for what Hydra would refuse."""
    assert command.error is None, f"{command.where}: `{command.text}`: {command.error}"
    if "--version" in command.args:
        return None
    args, unknown = get_args_parser().parse_known_args(list(command.args))
    assert not unknown, f"{command.where}: `{command.text}`: Hydra has no flag {' '.join(unknown)}"
    modes = [flag for flag in ("run", "multirun", "cfg", "info", "shell_completion") if getattr(args, flag)]
    assert len(modes) <= 1, (
        f"{command.where}: `{command.text}`: Hydra takes only one of --run, --multirun, --cfg, --info and "
        "--shell-completion"
    )
    for flag in ("config_path", "config_dir", "experimental_rerun"):
        assert getattr(args, flag) is None, f"{command.where}: this test does not check --{flag} commands"
    if args.shell_completion:
        for word in args.overrides:
            assert re.fullmatch(r"(install|uninstall)=(bash|zsh|fish)", word), f"{command.where}: -sc {word}"
        return None
    scripts = entry_points()
    assert command.script in scripts, (
        f"{command.where}: src/{command.script}.py is no entry point; they are "
        + ", ".join(f"src/{script}.py" for script in scripts)
    )
    config_name = args.config_name or scripts[command.script]
    words = [word for word in args.overrides if word not in (PLACEHOLDER, "...")]  # `...`: any overrides
    overrides = []
    for override in OverridesParser.create().parse_overrides(words):
        if PLACEHOLDER in override.key_or_group:
            continue  # `data.<key>=...`: nothing to check
        value = override.input_line.partition("=")[2]
        if (PLACEHOLDER in value or value == "...") and group_options(override.key_or_group):
            continue  # `model/net=<name>`, `experiment=...`: an option to come
        if args.multirun and override.is_sweep_override():
            assert not override.is_hydra_override(), (
                f"{command.where}: Sweeping over Hydra's configuration is not supported: {override.input_line}"
            )
            overrides.append(f"{override.get_key_element()}={first_value(override)}")
        else:
            overrides.append(override.input_line)
    return config_name, overrides


@functools.cache
def composed(config_name: str, group_overrides: tuple[str, ...], with_hydra: bool) -> DictConfig | str:
    """The config composed with these config group overrides (the ones that change the defaults list), or
    Hydra's error: once per set, for the commands that share it. Without its `hydra` node (half the size, half
    the time to copy) unless asked."""
    if not with_hydra:
        cfg = composed(config_name, group_overrides, with_hydra=True)
        if isinstance(cfg, DictConfig):
            cfg = copy.deepcopy(cfg)
            with open_dict(cfg):
                del cfg["hydra"]
        return cfg
    try:
        return compose(config_name, overrides=list(group_overrides), return_hydra_config=True)
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def compose_problem(command: Command) -> str | None:
    """Why the command would not compose, or None.

    Hydra composes in two steps: the defaults list with the overrides of config groups (`trainer=ddp`), then
    the other overrides (`trainer.devices=4`) applied to the composed config. The first step is done once
    per set of group overrides (a compose takes 0.2 s), the second for each command, with Hydra's own
    function for it."""
    try:
        config_name, overrides = compose_args(command) or (None, [])
        if config_name is None:
            return None
        parsed = OverridesParser.create().parse_overrides(overrides)
        ConfigLoaderImpl.validate_sweep_overrides_legal(parsed, run_mode=RunMode.RUN, from_shell=True)
    except Exception as error:  # AssertionError, or Hydra's parse error of an override
        return str(error) if isinstance(error, AssertionError) else f"{command.where}: {error}"
    groups = [o for o in parsed if group_options(o.key_or_group) and not isinstance(o.value(), dict)]
    keys = [o for o in parsed if o not in groups]
    with_hydra = any(o.key_or_group.startswith("hydra") for o in keys)
    base = composed(config_name, tuple(o.input_line for o in groups), with_hydra)
    if isinstance(base, str):
        return f"{command.where}: `{command.text}` does not compose: {base}"
    cfg = copy.deepcopy(base)
    try:
        with read_write(cfg.hydra) if with_hydra else contextlib.nullcontext():
            ConfigLoaderImpl._apply_overrides_to_config(keys, cfg)
    except Exception as error:
        return f"{command.where}: `{command.text}` does not compose: {type(error).__name__}: {error}"
    return None


@pytest.fixture
def hydra_configs():
    """Hydra initialized on configs/, as `python src/<task>.py` finds them."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


COMMANDS = numbered(all_commands())


@pytest.mark.parametrize("command", COMMANDS, ids=[command.where for command in COMMANDS])
def test_every_command_composes(hydra_configs, command: Command):
    problem = compose_problem(command)
    assert problem is None, problem


def test_the_readme_has_commands_to_check():
    assert any(command.where.startswith("README.md:") for command in COMMANDS)
    assert {"train", "eval"} <= {command.script for command in COMMANDS}


# --- paths, links and options named ---------------------------------------------------------------------------

PATH = re.compile(
    rf"(?<![\w./-])((?:{'|'.join(NAMED_ROOTS)})/[^\s`'\"()\[\]{{}},;:|<>*#]*)([<*{{]?)(#[\w-]*)?"
)


def named_paths(text: str) -> Iterator[tuple[str, str | None]]:
    """(path, anchor or None) of each path of the project named in `text`, but those with placeholders or
    globs."""
    for m in PATH.finditer(text):
        if not m.group(2):
            yield m.group(1).rstrip("."), (m.group(3) or "#")[1:] or None


def exists(named: str, project: Path) -> bool:
    """Whether a path named in the docs is there; for a file the user or generation creates, its folder."""
    return (project / named).parent.exists() if named.startswith(USERS_OWN) else (project / named).exists()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lowercase, without punctuation but `-` and `_`, spaces to `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]*>|[`*]", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(path: Path) -> set[str]:
    """The anchors of a page: one per heading (a repeated heading gets -1, -2, ...) and each <a id/name>."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for line in read_page(path).prose.splitlines():
        if heading := re.match(r"^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$", line):
            base = slug(heading.group(1))
            found.add(f"{base}-{counts[base]}" if base in counts else base)
            counts[base] = counts.get(base, 0) + 1
        found |= set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
    return found


def link_problem(page: Path, target: str, base: Path) -> str | None:
    """Why a link `target` from `page` (relative to `base`) leads nowhere, or None."""
    if re.match(r"^[a-z][\w+.-]*:", target):  # https:, mailto:
        return None
    file, _, anchor = target.partition("#")
    linked = (base / file).resolve() if file else page
    if not linked.exists():
        return "no such file"
    if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
        return f"{linked.name} has no heading whose anchor is #{anchor}"
    return None


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)


def path_problems(path: Path, root: Path = ROOT, project: Path = ROOT) -> list[str]:
    """Paths named in code that do not exist (in `project`), links that lead nowhere."""
    page, name = read_page(path), name_of(path, root)
    base = root if name == PROJECT_README else path.parent
    problems = []
    code = [(number, text) for number, _, text in page.blocks] + page.spans
    for number, text in code:
        for named, anchor in named_paths(text):
            where = f"{name}:{number}: {named}"
            if kept_by_generation(name) and named.startswith(TEMPLATE_ONLY):
                problems.append(f"{where}: generated projects have no {named}; name it in README.md only")
            elif not exists(named, project):
                problems.append(f"{where}: no such file")
            elif anchor and named.endswith(".md") and anchor not in anchors(project / named):
                problems.append(f"{where}: no heading whose anchor is #{anchor}")
    for pattern in (LINK, REFERENCE):
        for m in pattern.finditer(page.prose):
            number, target = page.prose.count("\n", 0, m.start()) + 1, m.group(1)
            where = f"{name}:{number}: link {target}"
            file, _, anchor = target.partition("#")
            resolved = (base / file).resolve()
            if kept_by_generation(name) and resolved.is_relative_to((root / MAINTAINERS).resolve()):
                problems.append(f"{where}: generated projects have no {MAINTAINERS}; link it from README.md")
            elif problem := link_problem(path, target, base):
                problems.append(f"{where}: {problem}")
            elif kept_by_generation(name) and anchor and resolved == (root / "README.md").resolve():
                # In a generated project the README is scripts/project_readme.md: the heading must be in both.
                project_readme = root / PROJECT_README
                if project_readme.exists() and anchor not in anchors(project_readme):
                    problems.append(
                        f"{where}: {PROJECT_README} (a generated project's README) has no #{anchor}"
                    )
    return problems


OPTION = re.compile(
    r"(?<![\w./~+$-])\+{0,2}(?P<group>[a-z][\w]*(?:/\w+)*)="
    r"(?P<value>\[[^\]\n]*\]|[\w-]+(?:,[\w-]+(?![\w./=-]))*)(?=$|[\s'\"`)\];:,]|\.(?:\s|$))"
)


def options_named(text: str) -> Iterator[tuple[str, str]]:
    """(group, option) of each `group=option` in `text` (each of `group=[a,b]` and `group=a,b`), for any
    `group` that is a config group; placeholders and `...` left out."""
    for m in OPTION.finditer(text):
        group = m.group("group")
        if not group_options(group):
            continue  # a key (seed=7, mode=min), not a group
        for option in m.group("value").strip("[]").split(","):
            option = option.strip()
            if option and PLACEHOLDER not in option and not option.startswith("."):
                yield group, option


def option_problems(text: str, where: str) -> list[str]:
    problems = []
    for group, option in options_named(PLACEHOLDER_TEXT.sub(PLACEHOLDER, text)):
        if option != "null" and option not in group_options(group):
            choices = ", ".join(sorted(group_options(group)))
            problems.append(f"{where}: {group}={option}: no such option of {group} ({choices})")
    return problems


def page_option_problems(path: Path, root: Path = ROOT) -> list[str]:
    page, name = read_page(path), name_of(path, root)
    problems = []
    for number, text in shell_lines(page) + page.spans:
        problems += option_problems(text, f"{name}:{number}")
    return problems


PAGES = markdown_files()


@pytest.mark.parametrize("page", PAGES, ids=[name_of(page) for page in PAGES])
def test_every_path_and_link_a_page_names_exists(page: Path):
    problems = path_problems(page)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=[name_of(page) for page in PAGES])
def test_every_option_a_page_names_exists(hydra_configs, page: Path):
    problems = page_option_problems(page)
    assert not problems, "\n".join(problems)


# --- the configs' own comments --------------------------------------------------------------------------------

# `, name` or `, name (remark)`, then punctuation or the comment's end (a list ends with its sentence); `, ...`.
LIST_ITEM = re.compile(
    r"\s*,\s*(?:and\s+|or\s+)?(?:(\.\.\.|…)|([\w-]+)(?:\s*\([^()]*\))?(?=\s*(?:[,;:)]|\.(?:\s|$)|$)))"
)


def option_lists(comment: str) -> Iterator[tuple[str, list[str], bool]]:
    """(group, names, complete) of each list of a group's options in a comment: `group=name` and bare names
    after commas (`debug=fdr (one batch), limit, overfit`); complete unless it ends with `...`. A single
    `group=name` is no list."""
    text = comment.replace("`", "")
    for m in OPTION.finditer(text):
        if "," in m.group("value") or not group_options(m.group("group")):
            continue  # a list value or a sweep (`callbacks=[a,b]`, `model/net=a,b`): a choice, not a list
        names, pos = [m.group("value")], m.end()
        if remark := re.match(r"\s*\([^()]*\)", text[pos:]):
            pos += remark.end()
        while item := LIST_ITEM.match(text, pos):
            names.append(item.group(1) or item.group(2))
            pos = item.end()
        if len(names) > 1:
            complete = names[-1] not in ("...", "…")
            yield m.group("group"), [name for name in names if name not in ("...", "…")], complete


def list_problems(comment: str, where: str) -> list[str]:
    problems = []
    for group, names, complete in option_lists(comment):
        options = set(group_options(group))
        if unknown := [name for name in names if name not in options]:
            problems.append(f"{where}: {group}: {', '.join(unknown)} listed, but no such option")
        if complete and (missing := options - set(names)):
            problems.append(
                f"{where}: {group}: the list leaves out {', '.join(sorted(missing))} "
                "(name them, or end the list with `...`)"
            )
    return problems


def comment_blocks(config: Path) -> list[tuple[int, str]]:
    """(first line, text) of each comment of a YAML file, comment lines that follow each other joined."""
    lines = config.read_text().splitlines()
    blocks: list[tuple[int, list[str]]] = []
    previous = None  # the line number of the last comment line
    for number, comment in yaml_comments(config):
        whole_line = lines[number - 1].lstrip().startswith("#")
        if whole_line and previous == number - 1:
            blocks[-1][1].append(comment)
        else:
            blocks.append((number, [comment]))
        previous = number if whole_line else None
    return [(number, " ".join(" ".join(parts).split())) for number, parts in blocks]


def config_comment_problems(config: Path, root: Path = ROOT) -> list[str]:
    """Options, option lists and paths that a config's comments name and that do not exist."""
    name = name_of(config, root)
    problems = []
    for number, comment in comment_blocks(config):
        problems += list_problems(comment, f"{name}:{number}")
    for number, comment in yaml_comments(config):
        where = f"{name}:{number}"
        problems += option_problems(comment, where)
        for named, _ in named_paths(comment):
            if named.startswith(TEMPLATE_ONLY):
                problems.append(f"{where}: {named}: generated projects have no such file")
            elif not exists(named, root):
                problems.append(f"{where}: {named}: no such file")
    return problems


def test_every_option_and_path_a_config_comment_names_exists(hydra_configs):
    problems = [problem for config in config_files() for problem in config_comment_problems(config)]
    assert not problems, "\n".join(problems)


def defaults_entries(config: Path) -> list[tuple[int, str, str]]:
    """(line, group, comment) of each entry of a config's defaults list: its own comment and the comment
    lines right above it."""
    entries, above, inside = [], [], False
    for number, line in enumerate(config.read_text().splitlines(), 1):
        if line.startswith("defaults:"):
            inside = True
        elif inside and (entry := re.match(r"^\s+-\s+(?:optional\s+|override\s+)*/?([\w/]+)\s*:", line)):
            comment = line.partition(" #")[2]
            entries.append((number, entry.group(1), " ".join([*above, comment])))
            above = []
        elif inside and line.strip().startswith("#"):
            above.append(line.strip()[1:])
        elif inside and line.strip() and not line.startswith((" ", "-")):
            break
        else:
            above = []
    return entries


@pytest.mark.parametrize("name", PRIMARY_CONFIGS)
def test_the_defaults_comments_list_the_options_present(hydra_configs, name: str):
    """A defaults entry's comment that lists its group's options lists the files present; in train.yaml,
    the menu of a training run, every group with several options lists them."""
    config = CONFIG_DIR / f"{name}.yaml"
    problems = []
    for number, group, comment in defaults_entries(config):
        where = f"configs/{name}.yaml:{number}"
        problems += list_problems(comment, where)
        files = list((CONFIG_DIR / group).glob("*.yaml"))
        if name == "train" and len(files) > 1 and group not in {g for g, _, _ in option_lists(comment)}:
            problems.append(f"{where}: {group} has {len(files)} options; list them (`{group}=a, b, ...`)")
    assert not problems, "\n".join(problems)


# --- the checks can fail ------------------------------------------------------------------------------------


def test_the_checks_find_a_wrong_command_path_link_and_option(hydra_configs, tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "sweeps.md").write_text("# Sweeps\n\n## Optuna searches\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Title\n\n## Runs\n\n"
        "```bash\n"
        "python src/train.py -m trainer=ddp model/net=mlp,simple_cnn   # two jobs: the first one composes\n"
        "python src/train.py -m 'data.fold=range(0,5)' 'model/net=glob(m*)'\n"
        "python src/train.py trainer.max_epochz=3\n"
        "python src/fit.py\n"
        "python src/train.py model.optimizer.lr=0.1,0.01\n"
        "python src/train.py -m data.fold=range(0,5)\n"
        "python src/train.py model=resnet   <!-- wrong on purpose -->\n"
        "python src/train.py -m --cfg job\n"
        "```\n\n"
        "Also `python src/eval.py run_dir=logs/train/runs/<run> model/net=<name>` and "
        "`python src/train.py -m 'hydra.run.dir=a,b'`.\n"
        "See `configs/trainer/ddp.yaml`, `configs/trainer/nope.yaml`, `configs/model/net/<name>.yaml`, "
        "`trainer=nope`, `'callbacks=[default,emma]'`,\n"
        "[runs](#runs), [gone](docs/gone.md), [sweeps](docs/sweeps.md#optuna-searches), "
        "[no heading](docs/sweeps.md#grid).\n"
    )
    problems = {
        command.where: compose_problem(command) for command in numbered(commands_in_page(readme, tmp_path))
    }
    expected = {
        "README.md:6": None,
        "README.md:7": None,
        "README.md:8": "Could not override 'trainer.max_epochz'",
        "README.md:9": "src/fit.py is no entry point",
        "README.md:10": "Ambiguous value for argument 'model.optimizer.lr=0.1,0.01'",
        "README.md:11": "an unquoted ( is a bash syntax error",
        "README.md:13": "Hydra takes only one of --run, --multirun, --cfg",
        "README.md:16": None,
        "README.md:16(2)": "Sweeping over Hydra's configuration is not supported",
    }
    assert problems.keys() == expected.keys()
    for where, problem in problems.items():
        assert (problem is None) if expected[where] is None else (expected[where] in problem), (
            where,
            problem,
        )

    assert path_problems(readme, root=tmp_path) == [
        "README.md:9: src/fit.py: no such file",
        "README.md:17: configs/trainer/nope.yaml: no such file",
        "README.md:18: link docs/gone.md: no such file",
        "README.md:18: link docs/sweeps.md#grid: sweeps.md has no heading whose anchor is #grid",
    ]
    assert [p.split(": ")[1] for p in page_option_problems(readme, tmp_path)] == [
        "trainer=nope",
        "callbacks=emma",
    ]


def test_the_list_check_finds_a_missing_or_unknown_option(hydra_configs):
    assert list(
        option_lists("A preset, last so it wins: `debug=fdr` (one batch), limit, overfit, profiler, default.")
    ) == [("debug", ["fdr", "limit", "overfit", "profiler", "default"], True)]
    assert list_problems("`debug=fdr` (one batch), limit, overfit, default", "x")[0].endswith(
        "debug: the list leaves out profiler (name them, or end the list with `...`)"
    )
    assert list_problems("`trainer=ddp`, gpu, tpu, ...", "x") == [
        "x: trainer: tpu listed, but no such option"
    ]
    assert not list_problems("`trainer=ddp`, gpu, ...; `callbacks=none` for none, `data=digits` then", "x")
    assert list(option_lists("`callbacks=[default,ema]`, or `model/net=mlp,simple_cnn`")) == []
