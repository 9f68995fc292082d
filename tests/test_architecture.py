"""docs/ARCHITECTURE.md's "Layout" lists every module of the three packages, and nothing else:
a module added, moved or removed without the doc fails here. And the floor plan it shows holds:
converters/ keeps a few top-level modules and short ones, the translator in its own room, no
module name used twice, and tests/ mirroring the packages."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bnnexport", "converters", "deploy")


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


CONVERTERS = ROOT / "converters"
CONVERTERS_TOP_LEVEL_LIMIT = 10  # modules directly in converters/, __init__.py included
MODULE_LINE_LIMIT = 600
# the translator's modules: ONNX -> TensorFlow, and the TensorFlow it emits
TRANSLATOR_NAMES = {"onnx_to_tf", "onnx_to_tflite", "tf_layers", "tf_elementwise", "tf_ops",
                    "values", "padding", "groups"}  # fmt: skip
TRANSLATOR_PREFIXES = ("tf_", "onnx_to_")  # and any new one named like them
# the names more than one module may carry; every other module name is used once
SHARED_NAMES = {"__init__.py", "errors.py", "registry.py"}


def test_converters_has_at_most_ten_top_level_modules():
    top_level = sorted(p.name for p in CONVERTERS.glob("*.py"))
    assert len(top_level) <= CONVERTERS_TOP_LEVEL_LIMIT, top_level


def test_no_module_of_converters_is_over_600_lines():
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for p in CONVERTERS.rglob("*.py")}  # fmt: skip
    assert {path: n for path, n in lines.items() if n > MODULE_LINE_LIMIT} == {}


def _is_translator(path: Path) -> bool:
    return path.stem in TRANSLATOR_NAMES or path.stem.startswith(TRANSLATOR_PREFIXES)


def test_the_translators_modules_live_only_in_converters_translate():
    translator = [p for p in CONVERTERS.rglob("*.py") if _is_translator(p)]
    outside = [str(p.relative_to(ROOT)) for p in translator if p.parent != CONVERTERS / "translate"]
    assert translator and outside == []


def test_no_module_name_of_converters_is_used_twice_in_the_three_packages():
    names = [p.name for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    twice = sorted({p.name for p in CONVERTERS.rglob("*.py")
                    if p.name not in SHARED_NAMES and names.count(p.name) > 1})  # fmt: skip
    assert twice == []


def test_tests_of_converters_mirror_its_rooms():
    rooms = {p.name for p in CONVERTERS.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in (ROOT / "tests" / "converters").iterdir()
               if p.is_dir() and not p.name.startswith((".", "_"))}  # fmt: skip
    assert folders == rooms


def test_no_two_test_modules_share_a_file_name():
    """tests/ has no __init__.py files (pytest imports a test module by its file name, with its
    folder on sys.path), so two test files of one name cannot both be collected."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
