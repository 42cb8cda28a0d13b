"""Lightning, PyTorch, Hydra, OmegaConf and Optuna are used through their public API (STYLE.md rule 16). A
private name of theirs (one `_`, like `trainer._x` or `from lightning... import _y`) appears only in the one
module per library that lists each use, why, and the upstream issue: PRIVATE_API_MODULES."""

import ast
import builtins
import contextlib
import functools
import inspect
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = ("src", "hydra_plugins")

LIBRARIES = {
    "lightning",
    "lightning_fabric",
    "pytorch_lightning",
    "torch",
    "torchvision",
    "torchmetrics",
    "hydra",
    "omegaconf",
    "optuna",
}
# Where the private names may appear: each module's docstring lists every use, why, and the upstream issue.
PRIVATE_API_MODULES = {"src/compat/lightning.py"}
# Names this project gives to objects of those libraries, whatever the code around them: a Lightning Trainer,
# LightningModule, strategy, launcher, callback, logger or checkpoint callback; an Optuna study, trial or
# storage; Hydra's JobReturn; the rich Live display that Lightning's progress bar owns.
LIBRARY_OBJECTS = {
    "trainer",
    "pl_module",
    "module",
    "strategy",
    "launcher",
    "callback",
    "logger",
    "checkpoint",
    "study",
    "trial",
    "storage",
    "job_return",
    "progress",
    "live",
}


def is_private(name: str) -> bool:
    """`_x`: private by Python's convention. Not `__x__` (a dunder), nor `_x_` (Hydra's `_target_` and the
    other config keys it reads)."""
    return name.startswith("_") and not name.endswith("_")


def from_library(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in LIBRARIES


@functools.cache
def library_private_names(cls: type) -> frozenset[str]:
    """The private names a class gets from the libraries' classes it derives from: their methods and class
    attributes, and the attributes their code sets on `self`."""
    names: set[str] = set()
    for base in inspect.getmro(cls):
        if not from_library(getattr(base, "__module__", None)):
            continue
        names |= {name for name in vars(base) if is_private(name)}
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
        except (OSError, TypeError, SyntaxError):  # no Python source (a class made in C)
            continue
        names |= {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and is_private(node.attr)
        }
    return frozenset(names)


def chain_names(node: ast.expr) -> list[str]:
    """`a.b.c` -> ["a", "b", "c"]; a chain that starts with a call or subscript keeps what follows it."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def is_super_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


class PrivateUses(ast.NodeVisitor):
    """Every use of a library's private name in one module: `(line, what)` in `found`."""

    def __init__(self, tree: ast.Module, package: str) -> None:
        self.found: list[tuple[int, str, str]] = []  # line, the private name, the code that uses it
        self.library_names: set[str] = set()  # names the module binds to the libraries' modules and objects
        self.namespace: dict[str, Any] = {"__package__": package, "__builtins__": builtins}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                self._bind(node)
        self.class_privates: dict[str, frozenset[str]] = {}  # the module's own classes
        self.privates: list[frozenset[str]] = [frozenset()]  # of the class being visited
        self.typed: list[set[str]] = [set()]  # parameters annotated with a library's type

    def _bind(self, node: ast.Import | ast.ImportFrom) -> None:
        """Note the names an import binds to a library, and import it, to resolve the classes it names."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                if from_library(alias.name):
                    self.library_names.add(alias.asname or alias.name.split(".")[0])
        elif not node.level and from_library(node.module):
            self.library_names |= {alias.asname or alias.name for alias in node.names}
        modules = (
            [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
        relative = isinstance(node, ast.ImportFrom) and node.level > 0
        # What a class here can derive from; other packages (wandb, onnx, ...) are not imported.
        if relative or any(from_library(name) or name.split(".")[0] in PACKAGE_ROOTS for name in modules):
            with contextlib.suppress(ImportError):
                exec(compile(ast.Module(body=[node], type_ignores=[]), "<imports>", "exec"), self.namespace)

    def report(self, node: ast.AST, name: str, what: str) -> None:
        self.found.append((node.lineno, name, what))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if from_library(alias.name) and any(is_private(part) for part in alias.name.split(".")):
                private = next(part for part in alias.name.split(".") if is_private(part))
                self.report(node, private, f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not from_library(node.module):
            return
        for part in node.module.split("."):
            if is_private(part):
                self.report(node, part, f"from {node.module} import ...")
        for alias in node.names:
            if is_private(alias.name):
                self.report(node, alias.name, f"from {node.module} import {alias.name}")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        privates: set[str] = set()
        for base in node.bases:
            try:
                resolved = eval(compile(ast.Expression(base), "<base>", "eval"), self.namespace)
            except Exception:  # a name of this module, or one the imports above could not resolve
                privates |= self.class_privates.get(ast.unparse(base), frozenset())
                continue
            if isinstance(resolved, type):
                privates |= library_private_names(resolved)
        self.class_privates[node.name] = frozenset(privates)
        self.privates.append(frozenset(privates))
        for statement in node.body:
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef) and statement.name in privates:
                self.report(statement, statement.name, f"def {statement.name} (overrides a library's)")
        self.generic_visit(node)
        self.privates.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        typed = {
            argument.arg
            for argument in arguments
            if argument.annotation is not None
            and any(name in self.library_names for name in chain_names(_unquoted(argument.annotation))[:1])
        }
        self.typed.append(self.typed[-1] | typed)
        self.generic_visit(node)
        self.typed.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if is_private(node.attr):
            self._check(node, node.value, node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        # getattr(trainer, "_x"), setattr(module, "_x", ...): the same as the attribute
        if (
            isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr", "hasattr", "delattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and is_private(node.args[1].value)
        ):
            self._check(node, node.args[0], node.args[1].value)
        self.generic_visit(node)

    def _check(self, node: ast.AST, owner: ast.expr, name: str) -> None:
        what = f"{ast.unparse(owner)}.{name}"
        if is_super_call(owner) or (isinstance(owner, ast.Name) and owner.id in {"self", "cls"}):
            if name in self.privates[-1]:  # a library's, inherited
                self.report(node, name, what)
            return
        names = chain_names(owner)
        if not names:
            return
        if names[0] in self.library_names | self.typed[-1] or LIBRARY_OBJECTS & set(names):
            self.report(node, name, what)


def _unquoted(annotation: ast.expr) -> ast.expr:
    """A string annotation ("optuna.Study") parsed."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            return ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return annotation
    return annotation


def private_uses(source: str, package: str = "src") -> list[tuple[int, str, str]]:
    checker = PrivateUses(tree := ast.parse(source), package)
    checker.visit(tree)
    return checker.found


def project_files() -> list[Path]:
    return sorted(path for root in PACKAGE_ROOTS for path in (ROOT / root).rglob("*.py"))


def test_libraries_are_used_through_their_public_api():
    found = []
    for path in project_files():
        relative = path.relative_to(ROOT).as_posix()
        if relative in PRIVATE_API_MODULES:
            continue
        package = ".".join(path.relative_to(ROOT).parent.parts)
        found += [f"{relative}:{line}: {what}" for line, _, what in private_uses(path.read_text(), package)]
    modules = ", ".join(sorted(PRIVATE_API_MODULES))
    assert not found, (
        f"private names of a library outside {modules} (use the public API, or move the use there with why "
        "and the upstream issue):\n" + "\n".join(found)
    )


def test_each_private_api_module_lists_its_uses():
    for module in PRIVATE_API_MODULES:
        source = (ROOT / module).read_text()
        docstring = ast.get_docstring(ast.parse(source)) or ""
        used = {name for _, name, _ in private_uses(source)}
        missing = sorted(name for name in used if f"`{name}`" not in docstring)
        assert not missing, f"{module} uses {', '.join(missing)} without listing them in its docstring"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "from lightning.fabric.utilities.cloud_io import _is_local_file_protocol",
            "_is_local_file_protocol",
        ),
        ("from torch._dynamo import config", "from torch._dynamo import ..."),
        ("import torch._dynamo", "import torch._dynamo"),
        ("from torch import nn\nnn.modules.batchnorm._NormBase", "nn.modules.batchnorm._NormBase"),
        ("import lightning as L\nL.pytorch._graveyard", "L.pytorch._graveyard"),
        ("def f(trainer):\n    return trainer._accelerator_connector", "trainer._accelerator_connector"),
        ("def f(s):\n    return s.study._storage", "s.study._storage"),
        ("def f(job_return):\n    return job_return._return_value", "job_return._return_value"),
        ("def f(x):\n    return x.progress.live._lock", "x.progress.live._lock"),
        ("import optuna\ndef f(s: optuna.Study):\n    return s._storage", "s._storage"),
        ("def f(s: 'optuna.Study'):\n    import optuna\n    return s._study_id", "s._study_id"),
        (
            "def f(module):\n    setattr(module, '_hydra_subprocess_cmd', None)",
            "module._hydra_subprocess_cmd",
        ),
        (
            "from lightning.pytorch.loggers.csv_logs import ExperimentWriter\n"
            "class W(ExperimentWriter):\n"
            "    def save(self):\n"
            "        super()._record_new_keys()",
            "super()._record_new_keys",
        ),
        (
            "import lightning as L\n"
            "class C(L.Callback):\n"
            "    pass\n"
            "class D(C):\n"
            "    def f(self, trainer):\n"
            "        return self._check_hook_overrides",
            None,  # a name the Callback class does not have: the project's own
        ),
        (
            "from lightning.pytorch.callbacks import ModelCheckpoint\n"
            "class C(ModelCheckpoint):\n"
            "    pass\n"
            "class D(C):\n"
            "    def every(self):\n"
            "        return self._every_n_train_steps",
            "self._every_n_train_steps",  # set by ModelCheckpoint.__init__, inherited through C
        ),
        (
            "from lightning.pytorch.callbacks import RichProgressBar\n"
            "class B(RichProgressBar):\n"
            "    def _init_progress(self, trainer):\n"
            "        pass",
            "def _init_progress (overrides a library's)",
        ),
    ],
)
def test_the_check_finds_a_private_use(source, expected):
    found = [what for _, _, what in private_uses(source)]
    if expected is None:
        assert found == []
    else:
        assert any(what.endswith(expected) for what in found), found


@pytest.mark.parametrize(
    "source",
    [
        "class A:\n    def __init__(self):\n        self._swapped = False\n    def f(self):\n        return self._swapped",
        "import lightning as L\nclass C(L.Callback):\n    def f(self):\n        self._drawn_at = 0\n        return self._drawn_at",
        "def f(cfg):\n    return cfg.model._target_",
        "import torch\ntorch.nn.Module.__init__",
        "def f(other):\n    return other._cache",
    ],
)
def test_the_check_allows_the_projects_own_names(source):
    assert private_uses(source) == []
