"""The README's examples run as written: `convert_module`'s converts its binary layer, "Your own
model" trains a hand-written BNN with Bop, converts it and benches the flatbuffer, and the
researchers' commands run at a tiny size."""

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


@pytest.mark.slow
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


# The researchers' commands at a tiny size: one γ less, one τ, two seeds, one short epoch.
TINY = {
    "--gamma 1e-2,1e-3,1e-4": "--gamma 1e-2,1e-3",
    "--threshold 1e-6,0": "--threshold 0",
    "--seeds 3": "--seeds 2",
    "--epochs 5": "--epochs 1",
    "--batch-size 100": "--batch-size 1000",
    "--eval-every 20": "--eval-every 2",
    "optimizer=bop,gamma=0.001,threshold=1e-06": "optimizer=bop,gamma=0.001,threshold=0",
}


def researchers_commands() -> list[str]:
    text = README.read_text()
    block = re.search(r"<!-- researchers-example.*?```bash\n(.*?)```", text, re.S)
    assert block is not None, "README lost its researchers' example"
    return [line for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.long  # six short training runs: minutes, so in `make test-all`
def test_readme_researchers_commands_run_at_a_tiny_size(tmp_path):
    import json
    import subprocess
    import sys

    commands = researchers_commands()
    assert len(commands) == 3 and all(c.startswith(".venv/bin/bnnexport ") for c in commands)
    for command in commands:
        for full, tiny in TINY.items():
            command = command.replace(full, tiny)
        command = command.replace(".venv/bin/bnnexport", f"{sys.executable} -m bnnexport", 1)
        result = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True,
                                text=True, timeout=1800)  # fmt: skip
        assert result.returncode == 0, (command, result.stderr[-2000:])
    runs = tmp_path / "runs"
    sweep = json.loads((runs / "sec51" / "sweep.json").read_text())
    assert [(s["optimizer"], s["seeds"]) for s in sweep["settings"]] == [
        ("bop", [0, 1]), ("bop", [0, 1]), ("adam-latent", [0, 1]),
    ]  # fmt: skip
    assert all(s["test_accuracy_std"] >= 0 for s in sweep["settings"])
    versus = json.loads((runs / "sec51-bop-vs-latent" / "compare.json").read_text())["rows"]
    assert [(r["optimizer"], len(r["runs"])) for r in versus] == [("bop", 2), ("adam-latent", 2)]
    gamma = json.loads((runs / "sec51-gamma" / "compare.json").read_text())["rows"]
    assert sorted(r["hyperparameters"]["gamma"] for r in gamma) == [1e-3, 1e-2]
    for figure in ("sec51/sweep.png", "sec51-bop-vs-latent/compare.png", "sec51-gamma/compare.png"):
        assert (runs / figure).stat().st_size > 10_000


def own_model_example() -> tuple[str, list[str]]:
    """The "Your own model" section's Python block and its shell commands."""
    text = README.read_text()
    block = re.search(
        r"<!-- own-model-example.*?```python\n(.*?)```\s*```bash\n(.*?)```", text, re.S
    )
    assert block is not None, "README lost its own-model example"
    commands = [line.split("#")[0].strip() for line in block.group(2).splitlines()]
    return block.group(1), [c for c in commands if c]


def _exec_in(code: str, folder: Path) -> tuple[str, dict]:
    printed, namespace = io.StringIO(), {"__name__": "readme"}
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, str(README), "exec"), namespace)
    finally:
        os.chdir(cwd)
    return printed.getvalue(), namespace


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_readme_own_model_example_finds_its_kernels_and_trains_them_with_bop(tmp_path):
    """Fast: the example up to the conversion, on a few large batches."""
    import torch

    code, _ = own_model_example()
    assert len(code.strip().splitlines()) <= 30  # a handful of lines, as promised
    training = code.split("x, y = ")[0].replace("batch_size=50", "batch_size=1000")
    _, namespace = _exec_in(training, tmp_path)
    kernels = namespace["optimizer"].binary_kernels
    assert list(kernels) == ["w", "fc"]
    assert all(bool((k.abs() == 1).all()) for k in kernels.values())
    assert isinstance(namespace["model"](torch.zeros(2, 1, 28, 28)), torch.Tensor)


@pytest.mark.slow
@pytest.mark.long  # one epoch, a conversion through TensorFlow and a benchmark: ~1 min
@pytest.mark.filterwarnings("ignore")
def test_readme_own_model_example_runs_to_a_bench_number(tmp_path):
    import json
    import shlex

    from support.cli import run_in_process

    code, commands = own_model_example()
    printed, _ = _exec_in(code, tmp_path)
    expected = re.search(r"# (.*)$", code.strip().splitlines()[-1]).group(1)
    assert printed.strip().splitlines()[-1] == expected
    assert [c.split()[:2] for c in commands] == [["bnnexport", "bench"]]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = run_in_process(*shlex.split(commands[0])[1:], "--runs", "5")
    finally:
        os.chdir(cwd)
    assert result.returncode == 0, result.stderr
    bench = json.loads((tmp_path / "mine-arm64-bench.json").read_text())
    lce = next(b for b in bench["backends"] if b["name"] == "lce")
    assert lce["top1"] > 0.5 and lce["latency_ms"]["mean"] > 0  # chance is 0.1


def test_the_papers_to_cite_are_in_citation_cff_and_the_readme():
    """Bop's paper is the one to cite, Bop2ndOrder's beside it for `--optimizer bop2`, Larq
    Compute Engine's and larq's for what rests on them (CITATION.cff was checked against the
    CFF 1.2.0 schema with cffconvert 2.0.0 --validate)."""
    cff = (README.parent / "CITATION.cff").read_text()
    preferred, _, references = cff.partition("\nreferences:\n")
    assert "cff-version: 1.2.0" in cff and "preferred-citation:" in preferred
    assert 'value: "arXiv:1906.02107"' in preferred and "Latent Weights Do Not Exist" in preferred
    assert 'value: "arXiv:2104.05124"' in references and "A Bop and Beyond" in references
    assert 'value: "arXiv:2011.09398"' in references and "MLSys 2021" in references
    assert 'doi: "10.21105/joss.01746"' in references and "Larq: An Open-Source" in references
    # every reference is a list item with a type, a title, authors and a year
    items = ("\n" + references).split("\n  - type: ")[1:]
    assert len(items) == 3 and all("\n    title: " in i and "\n    year: " in i for i in items)
    cite = README.read_text().partition("\n## Cite\n")[2].partition("\n## ")[0]
    assert "https://arxiv.org/abs/1906.02107" in cite and "bop2" in cite and "zoo list" in cite
    entries = re.findall(r"@(?:inproceedings|article)\{(\w+),(.*?)\n\}", cite, re.S)
    eprints = [re.search(r"(?:eprint|doi)\s*=\s*\{([\w./]+)\}", body).group(1)
               for _, body in entries]  # fmt: skip
    assert eprints == ["1906.02107", "2104.05124", "2011.09398", "10.21105/joss.01746"]
    assert all(body.count("{") == body.count("}") for _, body in entries)
