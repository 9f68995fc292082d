"""The package graph: no import cycles, converters/ and deploy/ independent of what is above
them, and no module importing or reaching into another module's private names. Read from the
source with `ast`, lazy (in-function) imports included; `if TYPE_CHECKING:` blocks are
annotations only for the first check; the floor plan's checks count them too: no circle in any
package even through them, the rooms of bnnexport/ import only what their docstrings allow and
form no circle between them, the translator (converters/translate/) imports only what its
package docstring lists, and a device runner's package only its own modules and what runners
share. The benchmark scripts import their siblings by bare name (`from _common import ...`, run
with benchmarks/ on sys.path); those count as `benchmarks.<name>`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bnnexport", "converters", "deploy", "benchmarks")
SCRIPT_DIRS = ("benchmarks",)  # scripts, not a package: siblings are imported by bare name


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if any(part.startswith(".") for part in parts):  # e.g. benchmarks/.venv-larq
                continue
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _runtime_nodes(tree: ast.AST, type_checking: bool = False):
    """Every node except those under `if TYPE_CHECKING:` (with `type_checking`, every node)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if (
            not type_checking
            and isinstance(node, ast.If)
            and getattr(node.test, "id", None) == "TYPE_CHECKING"
        ):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def folder_name(module: str) -> str:
    """A module by the folder it lives in: `bnnexport.converters.X` (the name it installs as,
    pyproject's package-dir) is `converters.X` here, as `bnnexport.deploy.X` is `deploy.X`."""
    for folder in ("converters", "deploy"):
        if module == f"bnnexport.{folder}" or module.startswith(f"bnnexport.{folder}."):
            return module.removeprefix("bnnexport.")
    return module


def _qualified(module: str, path: Path) -> str:
    """`module` as imported from `path`, by its folder: a benchmark script's bare sibling gets
    its package."""
    directory = path.parent.relative_to(ROOT)
    if str(directory) in SCRIPT_DIRS and (path.parent / f"{module.split('.')[0]}.py").is_file():
        return f"{directory}.{module}"
    return folder_name(module)


def _imports(path: Path, type_checking: bool = False) -> list[tuple[str, list[str]]]:
    """(module, names) for every absolute import of a module of ours (with `type_checking`,
    those under `if TYPE_CHECKING:` too)."""
    found = []
    for node in _runtime_nodes(ast.parse(path.read_text()), type_checking):
        if isinstance(node, ast.Import):
            found += [(_qualified(alias.name, path), []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((_qualified(node.module, path), [alias.name for alias in node.names]))
    return [(m, names) for m, names in found if m.split(".")[0] in PACKAGES]


def _private_attributes(path: Path) -> list[str]:
    """`module._name` for every private attribute read through a module of ours bound to a
    name (`import converters.lce as lce`, `from bnnexport.stages import bench`, then `bench._x`)."""
    tree = ast.parse(path.read_text())
    bound = {}
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = _qualified(alias.name, path)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{_qualified(node.module, path)}.{alias.name}"
    return [
        f"{bound[node.value.id]}.{node.attr}"
        for node in _runtime_nodes(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and bound.get(node.value.id) in MODULES
        and node.attr.startswith("_") and not node.attr.startswith("__")
    ]  # fmt: skip


def _edges(name: str, type_checking: bool = False) -> set[str]:
    """The modules `name` imports: `from pkg import sub` is an edge to pkg.sub, not pkg."""
    edges = set()
    for module, names in _imports(MODULES[name], type_checking):
        submodules = {f"{module}.{n}" for n in names} & set(MODULES)
        edges |= submodules or {module}
        if submodules and len(submodules) < len(names):
            edges.add(module)
    edges.discard(name)
    return {e for e in edges if e in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_there_are_no_import_cycles():
    assert _cycles({name: _edges(name) for name in MODULES}) == []


@pytest.mark.parametrize("package", ["bnnexport", "converters", "deploy"])
def test_no_import_cycle_even_through_type_checking_imports(package):
    """An annotation-only import still ties two modules into one: none closes a circle."""
    inside = {name for name in MODULES if name.split(".")[0] == package}
    assert _cycles({name: _edges(name, type_checking=True) & inside for name in inside}) == []


def _in_translator(module: str) -> bool:
    return module == "converters.translate" or module.startswith("converters.translate.")


# what converters/translate/__init__.py says the translator may import from converters
TRANSLATOR_MAY_IMPORT = {"converters.errors", "converters.graph", "converters.patterns",
                         "converters.layer_map", "converters.runtimes",
                         "converters.flatbuffer"}  # fmt: skip


def test_the_translator_imports_only_what_its_package_says_it_may():
    offending = [
        f"{name} imports {module}"
        for name in MODULES if _in_translator(name)
        for module in _edges(name, type_checking=True)
        if module.split(".")[0] == "converters" and not _in_translator(module)
        and module not in TRANSLATOR_MAY_IMPORT
    ]  # fmt: skip
    assert offending == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("converters", ("bnnexport",)), ("deploy", ("bnnexport", "converters"))],
)
def test_lower_packages_never_import_higher_ones(package, forbidden):
    offending = [
        f"{name} imports {module}"
        for name, path in MODULES.items() if name.split(".")[0] == package
        for module, _ in _imports(path) if module.split(".")[0] in forbidden
    ]  # fmt: skip
    assert offending == []


def test_no_module_imports_another_modules_private_names():
    offending = [
        f"{name} imports {module}.{n}"
        for name, path in MODULES.items()
        for module, names in _imports(path) if module != name
        for n in names if n.startswith("_") and not n.startswith("__")
    ]  # fmt: skip
    assert offending == []


def test_no_module_reaches_into_another_modules_private_names():
    offending = [
        f"{name} reads {attribute}"
        for name, path in MODULES.items()
        for attribute in _private_attributes(path)
        if attribute.rsplit(".", 1)[0] != name
    ]  # fmt: skip
    assert offending == []


def test_benchmark_scripts_imports_of_their_siblings_are_in_the_graph():
    assert "benchmarks._common" in _edges("benchmarks.zoo_latency")


# deploy/: what every runner may use; all else a runner imports is in its own package
RUNNERS_SHARE = {
    "deploy.errors",
    "deploy.connection",
    "deploy.runners.registry",
}


def _runner_package(name: str) -> str | None:
    """`deploy.runners.NAME` for a module of runner NAME's package, else None."""
    parts = name.split(".")
    if parts[:2] == ["deploy", "runners"] and len(parts) > 2 and parts[2] != "registry":
        return ".".join(parts[:3])
    return None


def test_a_runner_package_imports_only_its_own_modules_and_what_runners_share():
    offending = [
        f"{name} imports {target}"
        for name in MODULES if (own := _runner_package(name))
        for target in _edges(name, type_checking=True) if target.startswith("deploy.")
        and target not in RUNNERS_SHARE and _runner_package(target) != own
    ]  # fmt: skip
    assert offending == []


def _transport_modules() -> set[str]:
    import bnnexport.deploy.transports  # noqa: F401  (registers every transport)
    from bnnexport.deploy.connection import transports

    return {folder_name(t.open.__module__) for t in transports()}


def test_only_deploy_transports_imports_a_transport():
    """The seam: bench and the runners reach a device through `deploy.transports` and the
    `Connection` protocol, never through a transport's module (the emulator serves an SSH
    device and makes its client)."""
    transport = _transport_modules()
    offending = [
        f"{name} imports {target}"
        for name in MODULES if name not in ("deploy.transports", "deploy.emulator")
        for target in _edges(name, type_checking=True) if target in transport
    ]  # fmt: skip
    assert transport and offending == []


def test_inside_deploy_only_the_runners_package_imports_a_runner():
    offending = [
        f"{name} imports {target}"
        for name in MODULES if name.split(".")[0] == "deploy"
        and _runner_package(name) is None and name != "deploy.runners"
        for target in _edges(name, type_checking=True) if _runner_package(target)
    ]  # fmt: skip
    assert offending == []


# bnnexport/'s rooms and what each may import of bnnexport (its own modules aside), as each
# room's docstring says; errors and imports are the ground floor every room stands on
ROOMS = ("nn", "run", "training", "optim", "stages", "models", "datasets", "cli")
GROUND = {"bnnexport.errors", "bnnexport.imports"}
BELOW_THE_STAGES = {"bnnexport.nn", "bnnexport.run", "bnnexport.models", "bnnexport.datasets",
                    "bnnexport.optim", "bnnexport.training"}  # fmt: skip
ROOM_MAY_IMPORT = {
    "bnnexport.nn": GROUND,
    "bnnexport.datasets": GROUND,
    "bnnexport.models": GROUND | {"bnnexport.nn"},
    "bnnexport.optim": GROUND | {"bnnexport.nn"},
    "bnnexport.run": GROUND | {"bnnexport.nn", "bnnexport.models"},
    "bnnexport.training": GROUND | BELOW_THE_STAGES - {"bnnexport.training"},
    "bnnexport.stages": GROUND | BELOW_THE_STAGES,
}  # fmt: skip


def _room(name: str) -> str:
    """`bnnexport.ROOM` for a module of one of bnnexport's rooms, else the module itself."""
    parts = name.split(".")
    if parts[0] == "bnnexport" and len(parts) > 2 and parts[1] in ROOMS:
        return ".".join(parts[:2])
    return name


def _room_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name in MODULES:
        if name.split(".")[0] == "bnnexport":
            targets = {
                _room(t) for t in _edges(name, type_checking=True) if t.startswith("bnnexport")
            }
            edges.setdefault(_room(name), set()).update(targets - {_room(name)})
    return edges


def test_bnnexports_rooms_import_only_what_their_docstrings_allow():
    offending = {
        room: sorted(targets - ROOM_MAY_IMPORT[room])
        for room, targets in _room_edges().items()
        if room in ROOM_MAY_IMPORT and targets - ROOM_MAY_IMPORT[room]
    }
    assert offending == {}


def test_bnnexports_rooms_and_stages_form_no_circle():
    """No arrow back up: a room (every module inside it taken as one) and the stages form no
    circle, so each stands on what it imports."""
    edges = _room_edges()
    graph = {room: targets & set(edges) for room, targets in edges.items()}
    assert _cycles(graph) == []


def test_every_room_of_bnnexport_says_what_it_holds_and_may_import():
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((ROOT / "bnnexport" / room / "__init__.py").read_text()))
        assert doc and "may import" in doc, room
