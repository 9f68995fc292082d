"""The docstring examples of converters/ and deploy/, run under the names they install as
(`bnnexport.converters.X`, `bnnexport.deploy.X`). pytest's --doctest-modules, which runs
bnnexport/'s, would import a module of these folders a second time under the folder's own name
(a second registry of transports and runners beside the first)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules(folder: str) -> list[str]:
    names = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(("bnnexport", *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return names


MODULES = _modules("converters") + _modules("deploy")


@pytest.mark.parametrize("name", MODULES)
def test_the_modules_docstring_examples_run(name):
    module = importlib.import_module(name)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)  # pytest's default flags
    for test in doctest.DocTestFinder().find(module, name):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_the_examples_are_found_and_a_wrong_one_fails():
    """The runner above finds the examples it should, and fails one that is wrong."""
    tests = doctest.DocTestFinder().find(importlib.import_module("bnnexport.converters.choices"))
    assert sum(len(t.examples) for t in tests) >= 1
    wrong = doctest.DocTestParser().get_doctest(">>> 1 + 1\n3\n", {}, "wrong", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(wrong, out=lambda _: None)
    assert runner.failures == 1
