"""docs/ARCHITECTURE.md's "Layout" lists every module of the three packages, and nothing else:
a module added, moved or removed without the doc fails here."""

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
