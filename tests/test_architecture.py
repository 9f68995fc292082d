"""docs/ARCHITECTURE.md's "Layout" lists every module of the three packages, and nothing else:
a module added, moved or removed without the doc fails here. And deploy/'s floor plan: the SSH
client and its errors at the top, one package per registered runner under runners/, file names
no other package uses, no module over 600 lines."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bnnexport", "converters", "deploy")
MAX_LINES = 600
SHARED_NAMES = {"__init__", "errors", "registry"}  # file names each package may have its own of


def _layout_section() -> str:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    start = text.index("\n## Layout\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_layout_section_lists_exactly_the_modules_in_the_tree():
    listed = re.findall(r"^\| `([^`]+\.py)` \|", _layout_section(), flags=re.MULTILINE)
    tree = sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert sorted(listed) == tree, {
        "in the tree, not in the doc": sorted(set(tree) - set(listed)),
        "in the doc, not in the tree": sorted(set(listed) - set(tree)),
    }


def _entries(folder: Path) -> list[str]:
    """The modules (NAME.py) and packages (NAME/) directly in `folder`."""
    return sorted(
        p.name if p.suffix == ".py" else f"{p.name}/"
        for p in folder.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").is_file()
    )


def test_deploys_top_level_is_the_ssh_client_its_errors_and_the_runners():
    assert _entries(ROOT / "deploy") == ["__init__.py", "errors.py", "runners/", "ssh.py"]


def test_deploy_runners_holds_the_registry_and_one_package_per_registered_runner():
    from deploy.runners import get_runner, runner_names

    assert _entries(ROOT / "deploy" / "runners") == sorted(
        ["__init__.py", "registry.py", *(f"{name}/" for name in runner_names())]
    )
    for name in runner_names():  # each runner is defined in its own package
        assert type(get_runner(name)).__module__.startswith(f"deploy.runners.{name}."), name


def test_deploys_file_names_are_its_own():
    """A name says where a module lives: none of deploy/'s is used twice, in deploy/ or in the
    other two packages (`__init__`, `errors`, `registry` excepted)."""
    deploy = [p.stem for p in (ROOT / "deploy").rglob("*.py") if p.stem not in SHARED_NAMES]
    elsewhere = {
        name
        for package in ("bnnexport", "converters")
        for p in (ROOT / package).rglob("*.py")
        for name in (p.stem, p.parent.name)
    }
    assert [name for name, n in Counter(deploy).items() if n > 1] == []
    assert sorted(set(deploy) & elsewhere) == []


@pytest.mark.parametrize("package", ["deploy"])
def test_no_module_is_over_600_lines(package):
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / package).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
