"""The package's shape: the public names users import, and imports that only run down the layers."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import collector

PACKAGE = Path(collector.__file__).parent

#: Which parts of the package each part may import. The vocabulary (config, turn, stop,
#: errors) is at the bottom; providers, envs and the record format know only the vocabulary;
#: the run's storage knows the record; analysis reads the storage and the record; one episode
#: uses providers, envs and the record (never the storage: the loop produces records, the
#: driver commits them); the driver side (run) uses everything below it and starts the simulator.
VOCABULARY = {"config", "turn", "stop", "errors"}
ALLOWED = {
    "errors": set(),
    "stop": set(),
    "turn": set(),
    # check_run_config looks up simulator preset names, inside the function, so that a config
    # that names no simulator never imports it.
    "config": {"errors", "stop", "sim"},
    "providers": VOCABULARY,
    "envs": VOCABULARY,
    "record": VOCABULARY,
    "storage": VOCABULARY | {"record"},
    "analysis": VOCABULARY | {"record", "storage"},
    "episode": VOCABULARY | {"providers", "envs", "record"},
    # Experiment trackers read what the analysis reads (the summary is the report's data).
    "tracking": VOCABULARY | {"record", "storage", "analysis"},
    # A harness's episode (its gateway, process and record) sits beside the loop, on the same parts.
    "harness": VOCABULARY | {"providers", "envs", "record", "episode"},
    "run": VOCABULARY | {"providers", "envs", "record", "storage", "episode", "sim", "tracking", "harness"},
    # `python -m collector.sim` is the CLI's `sim` command; the app itself imports no layer.
    "sim": {"cli"},
    "tools": {"envs"},
    # The files an installed package ships for a first run (demo config, starter project).
    "starter": {"errors"},
}


def _part(module: str) -> str:
    """The top-level part of the package a dotted module name belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports() -> dict[str, set[str]]:
    """Every `collector.*` import in the package, as part -> parts it imports."""
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        source = _part(module.removesuffix(".__init__"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if name.startswith("collector.") and _part(name) != source:
                    edges.setdefault(source, set()).add(_part(name))
    return edges


def test_imports_only_run_down_the_layers() -> None:
    """No module imports a part of the package above its own (the README's data flow holds)."""
    edges = _imports()
    wrong = {part: sorted(targets - ALLOWED[part]) for part, targets in edges.items()
             if part in ALLOWED and targets - ALLOWED[part]}
    assert wrong == {}
    assert set(edges) - set(ALLOWED) <= {"cli", "__init__", "__main__"}


def test_package_root_reexports_the_public_names() -> None:
    """`from collector import tool, load_run, Environment, ...` works for every name in __all__."""
    assert set(collector.__all__) == {
        "Environment", "EpisodeWorld", "Task", "Tool", "tool", "StopReason", "RunConfig", "load_config",
        "load_run", "truncation_table", "PARTITIONING", "__version__", "EpisodeContext", "ToolCallContext",
    }
    for name in collector.__all__:
        assert getattr(collector, name) is not None
    from collector.analysis.tables import load_run
    from collector.envs.toolkit import tool

    assert collector.load_run is load_run
    assert collector.tool is tool


def test_moved_modules_keep_their_public_import_paths() -> None:
    """`collector.tools.tool`, `collector.envs.base` and `collector.analysis` still import."""
    tools = importlib.import_module("collector.tools")
    analysis = importlib.import_module("collector.analysis")
    tables = importlib.import_module("collector.analysis.tables")
    episodes = importlib.import_module("collector.analysis.episodes")
    assert tools.tool is importlib.import_module("collector.envs.toolkit").tool
    assert set(analysis.__all__) == set(tables.__all__) | set(episodes.__all__)
    for name in analysis.__all__:
        assert getattr(analysis, name) in (getattr(tables, name, None), getattr(episodes, name, None))
    assert importlib.import_module("collector.envs.base").Environment is collector.Environment


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(path: Path, module: str, modules: dict[str, Path]) -> set[str]:
    """The names every import in `path` asks for, at module level or inside a function, with
    `from X import Y` as `X.Y` when Y is a module and relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return names


def _module_of(name: str, modules: dict[str, Path]) -> str | None:
    """The package module `name` lives in (`collector.run.job.run_job` -> `collector.run.job`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def test_only_the_cluster_module_imports_ray() -> None:
    """Ray stays behind one module (`collector.run.cluster`): the worker's logic, the driver loop
    and everything else are plain Python, testable without a cluster."""
    modules = _modules()
    importers = {module for module, path in modules.items()
                 if any(n == "ray" or n.startswith("ray.") for n in _imported(path, module, modules))}
    assert importers == {"collector.run.cluster"}


def _circles(graph: dict[str, set[str]]) -> list[str]:
    """Every circle a depth-first walk meets: a path back to a module still on the path."""
    circles: list[str] = []
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            circles.append(" -> ".join([*path[path.index(module):], module]))
            return
        if module in done:
            return
        path.append(module)
        for target in sorted(graph[module]):
            visit(target)
        path.pop()
        done.add(module)

    for start in sorted(graph):
        visit(start)
    return circles


def test_no_import_circle_among_the_packages_modules() -> None:
    """No module reaches itself through imports, counting those inside functions: a circle
    hidden in a function-level import is still two modules that cannot be read apart."""
    modules = _modules()
    graph = {module: {target for name in _imported(path, module, modules)
                      if (target := _module_of(name, modules)) is not None and target != module}
             for module, path in modules.items()}
    assert _circles(graph) == []
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a"]  # the walk finds one
