"""The floor plan: docs/ARCHITECTURE.md's "Layout" lists every module of the three packages and
nothing else, and the plan it shows holds. bnnexport/ and converters/ keep a few top-level
modules, no module is over 600 lines, the translator has its room, deploy/ holds the connection
seam, one module per registered transport, its errors, the emulated device and one package per
registered runner, no module name is used
twice across the three packages, and tests/ mirrors the packages. (The import rules between
rooms are tests/test_imports.py's.)"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bnnexport", "converters", "deploy")
MAX_LINES = 600
# modules directly in a package, __init__.py included
TOP_LEVEL_LIMIT = {"converters": 10}
# the file names several packages may each have their own of
SHARED_NAMES = {"__init__", "errors", "registry"}
# the translator's modules: ONNX -> TensorFlow, and the TensorFlow it emits
TRANSLATOR_NAMES = {"onnx_to_tf", "onnx_to_tflite", "tf_layers", "tf_elementwise", "tf_ops",
                    "values", "padding", "groups"}  # fmt: skip
TRANSLATOR_PREFIXES = ("tf_", "onnx_to_")  # and any new one named like them
# tests/ folders for code that is not one package's: the CLI's guarantees, shared helpers
TEST_FOLDERS_OF_NO_PACKAGE = {"reliability", "support", "stages"}


def _layout_section() -> str:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    start = text.index("\n## Layout\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _entries(folder: Path) -> list[str]:
    """The modules (NAME.py) and packages (NAME/) directly in `folder`."""
    return sorted(
        p.name if p.suffix == ".py" else f"{p.name}/"
        for p in folder.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").is_file()
    )


def _rooms(package: Path) -> set[str]:
    return {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}


def test_the_layout_section_lists_exactly_the_modules_in_the_tree():
    listed = re.findall(r"^\| `([^`]+\.py)` \|", _layout_section(), flags=re.MULTILINE)
    tree = sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in _modules(pkg))
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert sorted(listed) == tree, {
        "in the tree, not in the doc": sorted(set(tree) - set(listed)),
        "in the doc, not in the tree": sorted(set(listed) - set(tree)),
    }


@pytest.mark.parametrize("package", sorted(TOP_LEVEL_LIMIT))
def test_a_package_keeps_a_few_top_level_modules(package):
    top_level = sorted(p.name for p in (ROOT / package).glob("*.py"))
    assert len(top_level) <= TOP_LEVEL_LIMIT[package], top_level


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_600_lines(package):
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _modules(package)}
    assert {path: n for path, n in lines.items() if n > MAX_LINES} == {}


# bnnexport/'s top level: the ground floor (errors, imports), the entry points, and its rooms;
# every stage is in stages/, the optimizers in optim/
BNNEXPORT_TOP_LEVEL = ["__init__.py", "__main__.py", "errors.py", "imports.py", "cli/", "datasets/",
                       "models/", "nn/", "optim/", "run/", "stages/", "training/"]  # fmt: skip
STAGES = ("train", "verify", "pack", "export", "convert", "convert_any", "init", "summary",
          "zoo", "pipeline", "sweep", "compare")  # fmt: skip
OPTIMIZERS = ("bop", "composite", "schedules")


def test_bnnexports_top_level_is_its_ground_floor_and_its_rooms():
    assert _entries(ROOT / "bnnexport") == sorted(BNNEXPORT_TOP_LEVEL)


def test_every_stage_lives_in_stages_and_every_optimizer_in_optim():
    """The stages in one room (bench, built of several modules, a room inside it), the
    optimizers in theirs, and the run directory's room holding run-directory formats only."""
    stages = ROOT / "bnnexport" / "stages"
    assert {f"{name}.py" for name in STAGES} | {"bench/"} <= set(_entries(stages))
    assert "measure.py" in _entries(stages / "bench")  # the bench stage, not bench/bench.py
    assert {f"{name}.py" for name in OPTIMIZERS} <= set(_entries(ROOT / "bnnexport" / "optim"))
    run_files = {p.stem for p in (ROOT / "bnnexport" / "run").glob("*.py")}
    assert run_files.isdisjoint({"progress", "reports", "report"}), run_files


def _installed_name(folder: Path) -> str:
    """The package a folder of the tree installs as: converters/ and deploy/ under bnnexport."""
    parts = folder.relative_to(ROOT).parts
    return ".".join(parts if parts[0] == "bnnexport" else ("bnnexport", *parts))


def test_every_package_installs_under_bnnexport_from_the_folder_it_lives_in():
    """One import namespace: pyproject lists every package of the three folders, each under
    `bnnexport.`, with converters/ and deploy/ mapped from the top of the repository."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = sorted(_installed_name(p.parent) for pkg in PACKAGES
                  for p in (ROOT / pkg).rglob("__init__.py"))  # fmt: skip
    assert sorted(setuptools["packages"]) == tree
    assert setuptools["package-dir"] == {f"bnnexport.{p}": p for p in ("converters", "deploy")}


def test_no_module_with_a_generic_name_is_importable_once_installed(tmp_path):
    """What `pip install` put in site-packages, seen from a folder of no checkout: bnnexport,
    and no `converters` or `deploy` beside a user's own modules of those names."""
    import subprocess
    import sys

    code = ("import importlib.util as u; "
            "print([n for n in ('converters', 'deploy', 'bnnexport.converters', "
            "'bnnexport.deploy') if u.find_spec(n) is not None])")  # fmt: skip
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    found = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert found.strip() == "['bnnexport.converters', 'bnnexport.deploy']"


# entry points, which every package that runs a process of its own may have
ENTRY_POINTS = {"main", "run"}


def _public_definitions(path: Path) -> set[str]:
    import ast

    return {
        node.name
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_")
    }


def test_no_public_name_is_defined_in_two_of_the_three_packages():
    """A name says which thing it is: a public function or class defined at the top of a module
    of one package (bnnexport, converters, deploy) is not defined in another (the two
    `InputShapeError`s, `compare`s and `open_model`s were each one name for two things)."""
    where: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in _modules(package):
            for name in _public_definitions(path) - ENTRY_POINTS:
                where.setdefault(name, set()).add(package)
    assert {name: sorted(p) for name, p in where.items() if len(p) > 1} == {}


MAX_FUNCTION_LINES = 60


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_over_60_lines(package):
    """A function reads at once: none of the three packages' functions (methods and nested
    ones included, docstring included) is longer than 60 lines. (Complexity: ruff's C901,
    `max-complexity = 20` in pyproject.toml.)"""
    import ast

    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
        for path in _modules(package)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []


def _is_translator(path: Path) -> bool:
    return path.stem in TRANSLATOR_NAMES or path.stem.startswith(TRANSLATOR_PREFIXES)


def test_the_translators_modules_live_only_in_converters_translate():
    translator = [p for p in _modules("converters") if _is_translator(p)]
    outside = [str(p.relative_to(ROOT)) for p in translator
               if p.parent != ROOT / "converters" / "translate"]  # fmt: skip
    assert translator and outside == []


def test_deploys_top_level_is_the_seam_a_module_per_transport_the_emulator_and_the_runners():
    import bnnexport.deploy.transports  # noqa: F401  (registers every transport)
    from bnnexport.deploy.connection import transports

    modules = [f"{t.open.__module__.rpartition('.')[2]}.py" for t in transports()]
    assert _entries(ROOT / "deploy") == sorted(
        ["__init__.py", "connection.py", "emulator.py", "errors.py", "runners/",
         "transports.py", *modules]
    )  # fmt: skip
    assert len(modules) == len(set(modules)) >= 2  # ssh and adb, each in its own module


def test_every_transport_implements_the_connection_protocol():
    from bnnexport.deploy.connection import Connection, Reach, transports
    from bnnexport.deploy.transports import open_device

    for transport in transports():
        address = f"{transport.prefix}someone@somewhere" if transport.prefix else "pi@raspberrypi"
        reach = Reach(**{name: 1 for name in transport.takes if name == "port"})
        assert isinstance(open_device(address, reach), Connection), transport.name


def test_deploy_runners_holds_the_registry_and_one_package_per_registered_runner():
    from bnnexport.deploy.runners import get_runner, runner_names

    assert _entries(ROOT / "deploy" / "runners") == sorted(
        ["__init__.py", "registry.py", *(f"{name}/" for name in runner_names())]
    )
    for name in runner_names():  # each runner is defined in its own package
        assert type(get_runner(name)).__module__.startswith(f"bnnexport.deploy.runners.{name}."), (
            name
        )


def test_no_module_name_is_used_twice_in_the_three_packages():
    """A name says where a module lives: a module's file name, or a package's folder name, is
    used once across bnnexport/, converters/ and deploy/ (`__init__`, `errors`, `registry`
    excepted; the CLI's commands are named after their stage; a room may hold a module of its
    own name, stages/bench/measure.py, the stage the room is built around)."""
    cli = ROOT / "bnnexport" / "cli"
    names = [
        p.stem
        for pkg in PACKAGES
        for p in _modules(pkg)
        if p.stem not in SHARED_NAMES and p.parent != cli and p.stem != p.parent.name
    ]
    folders = [p.parent.name for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")]
    names += [folder for folder in folders if folder not in PACKAGES]
    assert sorted(name for name, n in Counter(names).items() if n > 1) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_tests_mirror_the_packages_rooms(package):
    """tests/PACKAGE/ has a folder per room of converters/ and deploy/; bnnexport/'s rooms have
    a tests/ folder of their own each (the CLI's is tests/stages)."""
    rooms = _rooms(ROOT / package) - {"cli"}
    if package == "bnnexport":
        folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()}
        assert rooms <= folders, sorted(rooms - folders)
        return
    folders = {p.name for p in (ROOT / "tests" / package).iterdir()
               if p.is_dir() and not p.name.startswith((".", "_"))}  # fmt: skip
    assert folders == rooms


def test_every_test_folder_belongs_to_a_package_or_says_why_not():
    rooms = {room for pkg in PACKAGES for room in _rooms(ROOT / pkg)} | set(PACKAGES)
    folders = {p.name for p in (ROOT / "tests").iterdir()
               if p.is_dir() and not p.name.startswith((".", "_"))}  # fmt: skip
    assert folders - rooms - TEST_FOLDERS_OF_NO_PACKAGE == set()


def test_no_two_test_modules_share_a_file_name():
    """tests/ has no __init__.py files (pytest imports a test module by its file name, with its
    folder on sys.path), so two test files of one name cannot both be collected."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def _functions(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text())
    return {
        node.name.lstrip("_")
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and not any("fixture" in ast.unparse(d) for d in node.decorator_list)  # pytest's
    }


def test_no_test_file_copies_a_helper_tests_support_has():
    """A helper tests share lives once, in tests/support; a test file defining a function of the
    same name (a private copy included) has copied it."""
    support = set().union(*(_functions(p) for p in (ROOT / "tests" / "support").glob("*.py")))
    support -= {"main", "run"}  # scripts' entry points, not helpers
    copies = {
        str(p.relative_to(ROOT)): sorted(_functions(p) & support)
        for p in (ROOT / "tests").rglob("test_*.py")
        if _functions(p) & support
    }
    assert copies == {}
