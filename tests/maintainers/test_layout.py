"""The layout the README describes: what a user owns stands apart from the machinery, and the packages
import each other in one direction only."""

import ast
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = ("src", "hydra_plugins")


def package_of(module: str, subpackages: bool = True) -> str | None:
    """The package a module belongs to: `src.run.builder` -> `src.run`; `src.tasks` -> `src` (the entry
    points, tasks and inference at the top of src/); `hydra_plugins.x.y` -> `hydra_plugins`; with
    `subpackages=False`, `src` or `hydra_plugins`, and `src.common` (which imports nothing of the project, so
    no loop goes through it) on its own. None outside the project."""
    parts = module.split(".")
    if parts[0] == "hydra_plugins":
        return "hydra_plugins"
    if parts[0] != "src":
        return None
    if (subpackages or parts[1:2] == ["common"]) and len(parts) > 1 and (ROOT / "src" / parts[1]).is_dir():
        return f"src.{parts[1]}"
    return "src"


def imports_of(path: Path, lazy: bool = True) -> set[str]:
    """Every module `path` imports, at the top or inside a function (lazy imports count too, unless
    `lazy=False`: then only the imports at the top of the module)."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if lazy else tree.body:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's package
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def package_graph(subpackages: bool = True) -> dict[str, set[str]]:
    """Which project package imports which (within a package is not an edge)."""
    graph: dict[str, set[str]] = {}
    for root in PACKAGE_ROOTS:
        for path in (ROOT / root).rglob("*.py"):
            source = package_of(".".join(path.relative_to(ROOT).with_suffix("").parts), subpackages)
            targets = {package_of(name, subpackages) for name in imports_of(path)} - {None, source}
            graph.setdefault(source, set()).update(targets)
    return graph


def importers_of(module: str) -> set[str]:
    """The project's files (paths from the root) that import `module` or a name from it."""
    return {
        path.relative_to(ROOT).as_posix()
        for root in PACKAGE_ROOTS
        for path in (ROOT / root).rglob("*.py")
        if any(name == module or name.startswith(f"{module}.") for name in imports_of(path))
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a list of nodes (first == last), or None."""
    state: dict[str, str] = {}  # visiting or done

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = "visiting"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "visiting":
                return [*trail[trail.index(target) :], target]  # target is on the current path
            if target not in state and (cycle := visit(target, [*trail, target])):
                return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_packages_import_each_other_in_one_direction():
    for graph in (package_graph(), package_graph(subpackages=False)):
        cycle = find_cycle(graph)
        assert cycle is None, f"import loop between packages: {' -> '.join(cycle)}"
    # The Hydra plugins are found by Hydra on every start of any Hydra app in the environment: they stand on
    # their own, and the project uses them (the Optuna pruning callback asks the sweeper for its trial). The
    # file writer they share with the run record is in src/common/, imported inside the functions that write:
    # at the top of a plugin module, importing `src` would register this project's resolvers in any Hydra app.
    graph = package_graph()
    assert graph["hydra_plugins"] <= {"src.common"}, graph["hydra_plugins"]
    for path in (ROOT / "hydra_plugins").rglob("*.py"):
        assert {package_of(name) for name in imports_of(path, lazy=False)} <= {None, "hydra_plugins"}, path
    # The machinery never reaches up into what the user owns.
    for machinery in ("src.run", "src.launch"):
        assert not graph.get(machinery, set()) & {"src", "src.models", "src.data", "src.callbacks"}, machinery
    # Models and data stand below the run: they never import the tasks (the shard task is src/sharding.py),
    # the run machinery, the launch plumbing or the plugins. A model names its prediction writer in
    # src/inference/ (as Lightning's configure_callbacks does), never the inference tasks.
    for layer in ("src.models", "src.data"):
        assert not graph[layer] & {"src", "src.run", "src.launch", "hydra_plugins"}, (layer, graph[layer])
    below = {
        path for path in importers_of("src.inference.tasks") if path.startswith(("src/models/", "src/data/"))
    }
    assert not below, below
    # Models stand on their own: a model file works with any data and any callbacks. What models, data and
    # callbacks share (class names, how an image or a class is shown, what a strategy, an accelerator or a
    # `_target_` names, writing a file whole) is in src/common/, which imports none.
    assert not graph["src.models"] & {"src.data", "src.callbacks"}, graph["src.models"]
    assert not graph.get("src.common", set()) - {"src.common"}, graph["src.common"]
    # The preflight checks are a leaf nobody builds on: callbacks (as models and data, which import no
    # src.run) find the names they share with the checks (strategies, accelerators, `_target_` classes) in
    # src/common/.
    callbacks = {path for path in importers_of("src.run.preflight") if path.startswith("src/callbacks/")}
    assert not callbacks, callbacks


def test_the_loop_check_finds_a_loop():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_one_name_per_callback():
    """configs/callbacks/<name>.yaml configures `<name>` with a class from src/callbacks/<name>.py (or
    Lightning's): the file, the config option and the key carry one name."""
    for config in sorted((ROOT / "configs" / "callbacks").glob("*.yaml")):
        entries = yaml.safe_load(config.read_text()) or {}
        entries.pop("defaults", None)
        for key, entry in entries.items():
            assert key == config.stem, f"{config.name} configures callbacks.{key}"
            target = entry["_target_"]
            if target.startswith("src."):
                module, cls = target.rsplit(".", 1)
                assert module == f"src.callbacks.{config.stem}", f"{config.name}: {target}"
                words = config.stem.split("_")
                assert cls.lower() == "".join(words).lower(), f"{config.name}: class {cls}"
