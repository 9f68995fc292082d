"""Helpers shared by the benchmark scripts: side-by-side timing, tables, machine identity, output.

Timings on a shared machine are noisy, so every script measures its contenders interleaved in one
process: `interleaved(calls, rounds, runs)` times each contender `runs` times per round
(through `bnnexport.stages.bench.host.time_calls`, the latency measurement the bench stage uses),
rotates the order of the contenders every round, and reports the median over rounds of each
round's median. Ratios taken from those medians are what docs/BENCHMARKS.md reports.

Example:
    >>> from _common import interleaved
    >>> times = interleaved({"a": lambda: None, "b": lambda: None}, rounds=3, runs=5, warmup=1)
    >>> sorted(times)
    ['a', 'b']
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python benchmarks/x.py` from a checkout
    sys.path.insert(0, str(ROOT))


def interleaved(
    calls: dict[str, Callable[[], Any]], rounds: int, runs: int, warmup: int = 2
) -> dict[str, dict[str, float]]:
    """Time every contender side by side; {name: {"median": ms, "min": ms, "rounds": n}}.

    Each round calls every contender `runs` times (after `warmup` untimed calls in the first
    round only) in an order rotated by one every round, so no contender always runs first.
    """
    from bnnexport.stages.bench.host import time_calls

    names = list(calls)
    medians: dict[str, list[float]] = {n: [] for n in names}
    minima: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            stats = time_calls(calls[name], runs, warmup if r == 0 else 0)
            medians[name].append(stats["median"])
            minima[name].append(stats["min"])
    return {
        n: {
            "median": statistics.median(medians[n]),
            "min": min(minima[n]),
            "rounds": rounds,
            "runs_per_round": runs,
        }
        for n in names
    }


def machine() -> dict[str, Any]:
    """Where the numbers came from: uname, CPU model, cores, load average at the time."""
    from bnnexport.stages.bench.host import host_cpu

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "uname": " ".join(platform.uname()),
        "cpu_model": host_cpu(),
        "cores": os.cpu_count(),
        "load_average": [round(v, 2) for v in load] if load else None,
        "python": platform.python_version(),
    }


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table; floats with 4 significant digits, None as '-'."""

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    text = [[str(h) for h in head]] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in text]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with `--json`; the description is the script's docstring."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    return p


def emit(result: dict[str, Any], text: str, as_json: bool) -> None:
    """Print the JSON object (and nothing else on stdout) or the human table."""
    if as_json:
        print(json.dumps(result, indent=None, sort_keys=False, default=float))
    else:
        print(text)


def log(message: str) -> None:
    """Progress goes to stderr, so `--json` keeps stdout to one object."""
    print(message, file=sys.stderr, flush=True)


# --- the larq side: its own virtual environment -----------------------------------------------

# BNNEXPORT_LARQ_VENV names another place (e.g. one venv outside several checkouts)
LARQ_VENV = Path(os.environ.get("BNNEXPORT_LARQ_VENV") or ROOT / "benchmarks" / ".venv-larq")
# docs/LCE_NOTES.md "Dependency stack": the stack of the main venv (minus torch), plus larq;
# tf-keras without its deps.
LARQ_STACK = [
    "numpy<2",
    "ml-dtypes==0.5.4",
    "tensorflow-cpu==2.21.0",
    "larq-compute-engine==0.16.0",
    "larq==0.14.0",
]
LARQ_NO_DEPS = ["tf-keras==2.21.0"]


def larq_python(create: bool = True) -> Path:
    """benchmarks/.venv-larq/bin/python, created on first use (python3 -m venv + pip).

    Raises RuntimeError with pip's last lines when the installation fails.
    """
    import subprocess

    python = LARQ_VENV / "bin" / "python"
    if python.is_file() or not create:
        return python
    log(f"creating {LARQ_VENV} (first use; a few minutes)")
    steps = [
        [sys.executable, "-m", "venv", str(LARQ_VENV)],
        [str(python), "-m", "pip", "install", "-q", *LARQ_STACK],
        [str(python), "-m", "pip", "install", "-q", "--no-deps", *LARQ_NO_DEPS],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise RuntimeError(f"`{' '.join(step)}` failed:\n{tail}")
    return python


# larq-zoo and tf2onnx for `larq_zoo_tf2onnx.py` (docs/BENCHMARKS.md "larq-zoo via tf2onnx"), added
# to the same venv on first use. larq-zoo 2.4.0 and zookeeper pin protobuf<3.21 and
# tensorflow-datasets<4.9, which TensorFlow 2.21 (protobuf 7) cannot share, so they go in without
# their deps; zookeeper's import of tensorflow_datasets needs 4.9.9 (protos regenerated for protobuf
# 7) and its small deps.
LARQ_ZOO_NO_DEPS = [
    "larq-zoo==2.4.0",
    "zookeeper==1.4.0",
    "tensorflow-datasets==4.9.9",
    "tf2onnx==1.17.0",
]
LARQ_ZOO_DEPS = [
    "onnx==1.23.2",
    "click==8.5.1",
    "typeguard==4.6.0",
    "etils[epath,epy]==1.15.0",
    "dm-tree==0.1.10",
    "toml==0.10.2",
    "promise==2.3",
    "tensorflow-metadata==1.21.0",
    "immutabledict==4.3.1",
]


def larq_zoo_python(tf2onnx: bool = True) -> Path:
    """The larq venv's Python with larq-zoo (and `tf2onnx`) installed (added on first use).

    Raises RuntimeError with pip's last lines when the installation fails.
    """
    import subprocess

    python = larq_python()
    probe = [str(python), "-c", "import larq_zoo" + (", tf2onnx" if tf2onnx else "")]
    if subprocess.run(probe, capture_output=True, env=larq_env()).returncode == 0:
        return python
    log(f"adding larq-zoo and tf2onnx to {LARQ_VENV} (first use)")
    for step in (
        [str(python), "-m", "pip", "install", "-q", "--no-deps", *LARQ_ZOO_NO_DEPS],
        [str(python), "-m", "pip", "install", "-q", *LARQ_ZOO_DEPS],
    ):
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise RuntimeError(f"`{' '.join(step)}` failed:\n{tail}")
    return python


# bnnexport's zoo models that larq-zoo builds: bnnexport name -> larq-zoo's (larq_side.py)
LARQ_ZOO_NAMES = {
    "binary-alexnet": "BinaryAlexNet",
    "birealnet18": "BiRealNet",
    "binary-densenet28": "BinaryDenseNet28",
    "binary-densenet37": "BinaryDenseNet37",
    "binary-densenet45": "BinaryDenseNet45",
    "binary-resnet-e18": "BinaryResNetE18",
    "dorefanet": "DoReFaNet",
    "meliusnet22": "MeliusNet22",
    "quicknet": "QuickNet",
    "quicknet-small": "QuickNetSmall",
    "quicknet-large": "QuickNetLarge",
    "real-to-binary-net": "RealToBinaryNet",
    "xnornet": "XNORNet",
}


def native_flatbuffer(model: str, size: int, out: Path, python: Path) -> dict[str, Any]:
    """larq-zoo's `model` (bnnexport's name) at size x size through LCE's `convert_keras_model`
    in the larq venv (`larq_side.py native`: weights=None, seed 0, random BatchNorm, softmax
    removed), written to `out`; the side's answer (conversion seconds, bytes, versions), or
    {"error": its last line} when larq-zoo cannot build the model at that size."""
    args = ["native", "--model", LARQ_ZOO_NAMES[model], "--size", str(size), "--out", str(out)]
    try:
        return larq_json(args, timeout=3600, python=python)
    except RuntimeError as error:  # its exit code and the error line (not a last warning)
        lines = [ln for ln in str(error).splitlines() if ln.strip()]
        errors = [ln for ln in lines if "Error" in ln]
        code = lines[0].split("(")[-1].split(")")[0] if lines else "?"
        if not errors and code.startswith("-"):  # e.g. -11: LCE's converter crashed
            said = [ln for ln in lines if not ln[0].isspace()]  # the last message, not its code
            errors = [f"killed by signal {code[1:]} after: {said[-1].strip()[:200]}"]
        return {"error": f"larq side exit code {code}: {(errors or lines[-1:] or [''])[-1]}"}


def larq_env() -> dict[str, str]:
    """Environment for the larq subprocess: legacy Keras (tf-keras), quiet TensorFlow."""
    env = dict(os.environ)
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    return env


def larq_json(
    args: Sequence[str], timeout: float = 900, python: Path | None = None
) -> dict[str, Any]:
    """Run `larq_side.py ARGS` in the larq venv (or `python`); its last stdout line, parsed."""
    import subprocess

    python = python or larq_python()
    done = subprocess.run(
        [str(python), str(ROOT / "benchmarks" / "larq_side.py"), *args],
        capture_output=True,
        text=True,
        env=larq_env(),
        timeout=timeout,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"larq side failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])


# --- the bnnexport side: init -> export -> convert through the library ------------------------


def synthetic_dataset(input_shape: Sequence[int], num_classes: int, samples: int = 64) -> str:
    """Register (once) a data set of uniform [-1, 1] images for `input_shape`; its name.

    Export writes its test samples from the run's data set; zoo models at CIFAR or ImageNet
    shape have no shipped one, and latency, size and conversion do not depend on the pixels.
    """
    import torch

    from bnnexport.datasets import DatasetSplits, list_datasets, register_dataset

    shape = tuple(int(v) for v in input_shape)
    name = f"synthetic-{'x'.join(map(str, shape))}-{num_classes}"
    if name in list_datasets():
        return name

    def loader(data_dir: Any = None, augment: bool = True) -> DatasetSplits:
        generator = torch.Generator().manual_seed(0)
        x = torch.rand((samples, *shape), generator=generator) * 2 - 1
        y = torch.randint(0, num_classes, (samples,), generator=generator)
        data = torch.utils.data.TensorDataset(x, y)
        return DatasetSplits(name, data, data, num_classes, shape)

    register_dataset(name, loader)
    return name


def register_binarynet_convs() -> str:
    """`binarynet-convs`: BinaryNet's six convs (BN, max-pools) and flatten, no dense layers."""
    from torch import nn

    from bnnexport.models import list_models, register_model
    from bnnexport.models.binarynet import BinaryNet

    name = "binarynet-convs"
    if name not in list_models():

        @register_model(name, num_classes=4608, input_shape=(3, 32, 32))
        def binarynet_convs(num_classes: int = 4608, **kwargs: Any) -> nn.Module:
            """BinaryNet without its classifier (benchmarks only)."""
            return nn.Sequential(BinaryNet(**kwargs).features, nn.Flatten())

    return name


def torch_pipeline(
    model: str,
    out: Path,
    input_shape: Sequence[int] | None = None,
    samples: int = 16,
    fmt: str = "lce",
    grid_inputs: bool = False,
) -> dict[str, Any]:
    """init -> export -> convert of an initialised `model` in `out`; reports and seconds.

    Export checks on `samples` uniform [-1, 1] images (`synthetic_dataset`), or with
    `grid_inputs` on the run's default samples (no data set: inputs on a 1/64 grid,
    `bnnexport.stages.export.run_test_samples`)."""
    import time

    from bnnexport.models import model_info
    from bnnexport.stages.convert import convert_run
    from bnnexport.stages.export import export_onnx
    from bnnexport.stages.init import init_run

    info = model_info(model)
    shape = tuple(input_shape) if input_shape else info.input_shape
    dataset = None if grid_inputs else synthetic_dataset(shape, info.num_classes, samples)
    start = time.perf_counter()
    init = init_run(model, input_shape=shape, out=out, force=True, dataset=dataset)
    t_init = time.perf_counter()
    export = export_onnx(out, samples=samples)
    t_export = time.perf_counter()
    convert = convert_run(out, target="arm64", fmt=fmt)
    t_convert = time.perf_counter()
    return {
        "init": init,
        "export": export,
        "convert": convert,
        "seconds": {
            "init": t_init - start,
            "export": t_export - t_init,
            "convert": t_convert - t_export,
        },
    }


def lce_caller(flatbuffer: Path, threads: int = 1) -> Callable[[], Any]:
    """One batch-1 inference in LCE's interpreter (indirect BGEMM, docs/LCE_NOTES.md "Running
    flatbuffers"), random input."""
    import numpy as np
    from bnnexport.converters.runtimes import open_model

    model = open_model("lce", flatbuffer, threads)
    x = np.random.default_rng(0).uniform(-1, 1, model.input_shape).astype(np.float32)
    return lambda: model.run_one(x)
