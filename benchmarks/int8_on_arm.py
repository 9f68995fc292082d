"""Where LCE's aarch64 build and its x86 host build part on an int8 flatbuffer: every tensor of a
few samples on both (docs/LCE_NOTES.md "int8 on ARM", docs/BENCHMARKS.md "Device accuracy").

The flatbuffer is rewritten with every op's output as a model output (TensorFlow's
`flatbuffer_utils`; the kernels are the same, the arena keeps every tensor), run on the emulated
aarch64 device by `lce_benchmark_model --output_filepath` (all outputs, concatenated) and on this
host by LCE's interpreter (its default kernels and indirect BGEMM), and by the tests' NumPy
reference interpreter (tests/support/lce_reference.py) with the x86 build's requantization
rounding and with the ARM build's. Per op: how many values differ from the device's, and by how
many steps of the tensor's scale (int8), words (bit-packed int32) or how much (float32). And
per binarization of an int8 tensor, how many of the device's signs are not `q < z` of its own
int8 tensor (the `DEQUANTIZE` on the way, where LCE's converter leaves one, may flip them).

    sudo .venv/bin/python benchmarks/int8_on_arm.py runs/mnist/model-arm64-int8.tflite \\
        --benchmark-binary PATH/lce_benchmark_model --samples 0,1,2,3
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from _common import ROOT, emit, log, machine, parser, table

sys.path.insert(0, str(ROOT / "tests"))  # the reference interpreter is the tests' stand-in's

TYPES = {0: np.float32, 2: np.int32, 9: np.int8}


def every_tensor(flatbuffer: Path, out: Path) -> list[dict[str, Any]]:
    """Write `flatbuffer` with each op's output a model output; each op's type, output dtype,
    shape and scale, in execution order."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(flatbuffer))
    graph = model.subgraphs[0]
    graph.outputs = np.array([op.outputs[0] for op in graph.operators], np.int32)
    flatbuffer_utils.write_model(model, str(out))
    builtins = {v: k for k, v in vars(schema.BuiltinOperator).items() if isinstance(v, int)}
    ops = []
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        name = code.customCode.decode() if code.customCode else builtins[
            max(code.builtinCode, code.deprecatedBuiltinCode)]  # fmt: skip
        tensor = graph.tensors[op.outputs[0]]
        quantization = tensor.quantization
        scale = None
        if quantization is not None and quantization.scale is not None and len(quantization.scale):
            scale = float(quantization.scale[0])
        shape = [int(d) for d in tensor.shape]
        ops.append({"op": name, "dtype": TYPES[tensor.type], "shape": shape, "scale": scale})
    return ops


def on_device(client: Any, flatbuffer: Path, inputs: np.ndarray, binary: Path) -> list[bytes]:
    """The tool's raw outputs (every tensor, concatenated) per sample."""
    raw = []
    with tempfile.TemporaryDirectory() as local, client.workdir() as work:
        client.put(binary, f"{work}/tool")
        client.run(["chmod", "+x", f"{work}/tool"])
        client.put(flatbuffer, f"{work}/all.tflite")
        for k, sample in enumerate(inputs):
            path = Path(local) / f"in{k}.f32"
            sample[None].astype("<f4").tofile(path)
            client.put(path, f"{work}/in.f32")
            shape = ",".join(str(d) for d in (1, *sample.shape))
            client.run([f"{work}/tool", f"--graph={work}/all.tflite", "--num_runs=1",
                        "--warmup_runs=0", "--warmup_min_secs=0", "--min_secs=0",
                        "--input_layer=x", f"--input_layer_shape={shape}",
                        f"--input_layer_value_files=x:{work}/in.f32",
                        f"--output_filepath={work}/out.bin"], timeout=1800)  # fmt: skip
            client.get(f"{work}/out.bin", Path(local) / "out.bin")
            raw.append((Path(local) / "out.bin").read_bytes())
    return raw


def split(raw: bytes, ops: list[dict[str, Any]]) -> list[np.ndarray]:
    """The concatenated outputs as one array per op."""
    arrays, at = [], 0
    for op in ops:
        size = int(np.prod(op["shape"])) * np.dtype(op["dtype"]).itemsize
        arrays.append(np.frombuffer(raw[at : at + size], op["dtype"]).reshape(op["shape"]))
        at += size
    if at != len(raw):
        raise ValueError(f"the device wrote {len(raw)} bytes, the tensors hold {at}")
    return arrays


def on_host(flatbuffer: Path, inputs: np.ndarray) -> dict[str, list[list[np.ndarray]]]:
    """Every tensor per sample: LCE's interpreter (both kernels) and the reference (both
    roundings)."""
    from larq_compute_engine.tflite.python.interpreter import Interpreter
    from support import lce_reference

    found: dict[str, list[list[np.ndarray]]] = {}
    for kernel, indirect in (("host default", False), ("host indirect", True)):
        interpreter = Interpreter(
            flatbuffer.read_bytes(), num_threads=1, use_indirect_bgemm=indirect
        )
        found[kernel] = [[np.asarray(t) for t in interpreter.predict(x[None])] for x in inputs]
    for rounding in lce_reference.ROUNDINGS:
        model = lce_reference.load(flatbuffer, rounding)
        found[f"reference {rounding}"] = [reference_tensors(model, x[None]) for x in inputs]
    return found


def reference_tensors(model: Any, x: np.ndarray) -> list[np.ndarray]:
    """Every op's output of the reference interpreter, in execution order."""
    model.run(x)  # checks every op first
    return [model.last_values[op.outputs[0]] for op in model.ops]


def difference(device: np.ndarray, other: np.ndarray, op: dict[str, Any]) -> str:
    other = np.asarray(other).reshape(device.shape)
    if op["dtype"] == np.float32:
        diff = np.abs(device - other)
        steps = f" ({diff.max() / op['scale']:.1f} steps)" if op["scale"] else ""
        return f"{int((diff > 0).sum())}, max {diff.max():.2g}{steps}"
    differing = device != other
    if op["dtype"] == np.int32:
        return f"{int(differing.sum())} words"
    return f"{int(differing.sum())}, max {int(np.abs(device.astype(int) - other).max())} steps"


def binarization_signs(flatbuffer: Path, device: list[np.ndarray]) -> list[list[Any]]:
    """Per `LceQuantize` of an int8 tensor (reading it, or a DEQUANTIZE of it) in one sample's
    device tensors: how it reads it, the zero point, how many values sit there, and how many of
    the device's sign bits differ from `q < z` of the device's own int8 tensor (docs/LCE_NOTES.md
    "int8 on ARM": ARM's DEQUANTIZE makes the zero point a residue of either sign)."""
    from support import lce_reference

    model = lce_reference.load(flatbuffer)
    made_by = {op.outputs[0]: n for n, op in enumerate(model.ops)}
    rows = []
    for n, op in enumerate(model.ops):
        source, how = made_by.get(op.inputs[0]), "int8"
        if op.name != "LceQuantize" or source is None:
            continue
        if model.ops[source].name == "DEQUANTIZE":
            source, how = made_by.get(model.ops[source].inputs[0]), "DEQUANTIZE"
        tensor = model.tensors[model.ops[source].outputs[0]] if source is not None else None
        if tensor is None or tensor.type != 9:  # a float tensor's binarization
            continue
        q, zero = device[source], int(tensor.zero_point[0])
        words = device[n].reshape(*q.shape[:-1], -1).view(np.uint32)
        bits = (words[..., None] >> np.arange(32, dtype=np.uint32)) & 1
        negative = bits.reshape(*q.shape[:-1], -1)[..., : q.shape[-1]] == 1
        rows.append([n, how, zero, int((q == zero).sum()), int((negative != (q < zero)).sum())])
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("flatbuffer", type=Path)
    p.add_argument("--benchmark-binary", type=Path, required=True)
    p.add_argument("--samples", default="0", help="indices into the run's samples.npz")
    args = p.parse_args(argv)
    samples_file = args.flatbuffer.parent / "samples.npz"
    if not args.flatbuffer.is_file() or not samples_file.is_file():
        p.error(f"{args.flatbuffer}: needs the flatbuffer and its run's samples.npz")
    from bnnexport.converters.flatbuffer import input_layout, to_input_layout
    from bnnexport.deploy.emulator import default_cache, ensure_rootfs, running_device

    with np.load(samples_file) as data:
        inputs = data["inputs"][[int(k) for k in args.samples.split(",")]]
    # NCHW samples in the layout the flatbuffer declares, as bench feeds the device
    inputs = to_input_layout(inputs, input_layout(args.flatbuffer))
    folder = Path(tempfile.mkdtemp(prefix="int8-on-arm-"))
    ops = every_tensor(args.flatbuffer, folder / "all.tflite")
    with running_device(folder / "session", ensure_rootfs(default_cache(), log)[0]) as device:
        raw = on_device(device.client(), folder / "all.tflite", inputs, args.benchmark_binary)
    host = on_host(folder / "all.tflite", inputs)
    rows, signs = [], []
    for k, blob in enumerate(raw):
        device_tensors = split(blob, ops)
        sample = args.samples.split(",")[k]
        for n, op in enumerate(ops):
            found = [difference(device_tensors[n], host[h][k][n], op) for h in host]
            rows.append([sample, n, op["op"], np.dtype(op["dtype"]).name, *found])
        signs += [[sample, *row] for row in binarization_signs(args.flatbuffer, device_tensors)]
    head = ["sample", "op", "type", "dtype", *(f"vs {h}" for h in host)]
    sign_head = ["sample", "LceQuantize", "reads", "zero point", "values there", "signs not q < z"]
    result = {"machine": machine(), "flatbuffer": str(args.flatbuffer), "head": head, "rows": rows,
              "sign_head": sign_head, "signs": signs}  # fmt: skip
    emit(result, f"values differing from the device's\n{table(head, rows)}\n\nbinarizations "
         f"of int8 tensors on the device\n{table(sign_head, signs)}", args.json)  # fmt: skip
    return result


if __name__ == "__main__":
    main()
