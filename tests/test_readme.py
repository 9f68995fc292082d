"""The README's `convert_module` example runs as written and converts its binary layer."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_example() -> str:
    text = README.read_text()
    block = re.search(r"<!-- readme-example.*?```python\n(.*?)```", text, re.S)
    assert block is not None, "README lost its convert_module example"
    return block.group(1)


@pytest.mark.filterwarnings("ignore")
def test_readme_convert_module_example_runs_and_prints_what_it_says(tmp_path):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 16  # a short example, as promised
    printed = io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    finally:
        os.chdir(cwd)
    expected = re.search(r"# (.*)$", code.strip().splitlines()[-1]).group(1)
    assert printed.getvalue().strip().splitlines()[-1] == expected
    assert (tmp_path / "net-arm64.tflite").is_file() and (tmp_path / "net-arm64.onnx").is_file()
