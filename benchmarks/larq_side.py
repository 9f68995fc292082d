"""The larq (Keras) side of the side-by-side benchmarks; runs inside benchmarks/.venv-larq.

Never imports bnnexport or torch: it is started as a subprocess by `train_throughput.py`,
`native_vs_torch.py` and `larq_zoo_tf2onnx.py` with the larq venv's Python (created by
`_common.larq_python()`, docs/LCE_NOTES.md "Dependency stack": larq 0.14.0 + `pip install --no-deps
tf-keras==2.21.0`, `TF_USE_LEGACY_KERAS=1`). Every answer is one JSON object per line on stdout.

BinaryNet here is bnnexport's layout (bnnexport/models/binarynet.py) written with larq layers:
a 3x3 VALID conv with a ste_sign kernel on the real-valued image, five 3x3 "same" binary convs
padded with +1 (`pad_values=1.0`), BatchNorm(scale=False) after every layer and before each
max-pool, then three binary dense layers 4608-1024-1024-10, each followed by BatchNorm.

Commands:
    python benchmarks/larq_side.py serve-train --batch 50 --threads 1
        prints {"ready": ...}; then reads a number N per line from stdin, runs N training steps
        (`train_on_batch`, Bop for binary kernels + Adam for the rest) and prints {"seconds": s}
    python benchmarks/larq_side.py convert --out model.tflite [--conv-only]
        builds the model, converts it with `larq_compute_engine.convert_keras_model`, writes it
    python benchmarks/larq_side.py zoo --model QuickNet --out DIR [--samples 200]
        builds a larq-zoo model (weights=None: kernels drawn with --seed, random BatchNorm
        statistics; its final softmax removed unless --softmax, so outputs are logits) and
        writes into DIR: native.tflite (`convert_keras_model`), model.onnx (tf2onnx),
        inputs.npy (NHWC samples) and keras.npy (the Keras outputs on them). Needs the extra
        packages `_common.larq_zoo_python()` installs (larq-zoo, tf2onnx).
    python benchmarks/larq_side.py versions
        {"tensorflow": ..., "lce": ..., "larq": ..., "larq_zoo": ..., "tf_keras": ...}
    python benchmarks/larq_side.py native --model QuickNet --size 64 --out FILE.tflite
        the same larq-zoo model (weights=None, --seed, random BatchNorm statistics, softmax
        removed unless --softmax) through `convert_keras_model` only: the native flatbuffer
        written to FILE, and {"seconds": the conversion's time, "bytes", "versions"}; larq-zoo
        is needed, tf2onnx is not (`native_ops.py`, `zoo_latency.py --native`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def say(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def build_binarynet(
    conv_only: bool = False, input_shape: tuple[int, int, int] = (32, 32, 3), num_classes: int = 10
):  # noqa: ANN201 - a tf.keras.Model
    """bnnexport's BinaryNet in larq; `conv_only` stops after the last max-pool (flattened)."""
    import larq as lq
    import tensorflow as tf

    widths, hidden = (128, 128, 256, 256, 512, 512), 1024
    binary = {
        "input_quantizer": "ste_sign",
        "kernel_quantizer": "ste_sign",
        "kernel_constraint": "weight_clip",
        "use_bias": False,
    }

    def bn(x):  # noqa: ANN001, ANN202
        return tf.keras.layers.BatchNormalization(scale=False, momentum=0.9, epsilon=1e-5)(x)

    inputs = tf.keras.Input(input_shape)
    x = lq.layers.QuantConv2D(
        widths[0], 3, kernel_quantizer="ste_sign", kernel_constraint="weight_clip", use_bias=False
    )(inputs)
    x = bn(x)
    for index, cout in enumerate(widths[1:]):
        x = bn(lq.layers.QuantConv2D(cout, 3, padding="same", pad_values=1.0, **binary)(x))
        if index % 2 == 0:
            x = tf.keras.layers.MaxPool2D(2)(x)
    x = tf.keras.layers.Flatten()(x)
    if not conv_only:
        x = bn(lq.layers.QuantDense(hidden, **binary)(x))
        x = bn(lq.layers.QuantDense(hidden, **binary)(x))
        x = bn(lq.layers.QuantDense(num_classes, **binary)(x))
    return tf.keras.Model(inputs, x)


def randomize_batchnorm(model, seed: int = 0) -> None:  # noqa: ANN001
    """Non-trivial BatchNorm statistics, as `bnnexport.stages.init.randomize_batchnorm` draws
    them."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            n = layer.moving_mean.shape[0]
            layer.moving_mean.assign(rng.standard_normal(n).astype("float32") * 0.5)
            layer.moving_variance.assign((rng.random(n) * 1.5 + 0.5).astype("float32"))
            if layer.beta is not None:  # center=False (larq-zoo's QuickNet stem) has none
                layer.beta.assign(rng.standard_normal(n).astype("float32") * 0.1)
            if layer.gamma is not None:  # BinaryNet's have none (scale=False): draws unchanged
                layer.gamma.assign((rng.random(n) + 0.5).astype("float32"))


def set_threads(threads: int) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def serve_train(batch: int, threads: int, gamma: float, threshold: float, lr: float) -> None:
    set_threads(threads)
    import larq as lq
    import numpy as np
    import tensorflow as tf

    model = build_binarynet()
    optimizer = lq.optimizers.CaseOptimizer(
        (lq.optimizers.Bop.is_binary_variable, lq.optimizers.Bop(threshold=threshold, gamma=gamma)),
        default_optimizer=tf.keras.optimizers.legacy.Adam(lr),
    )
    model.compile(
        optimizer=optimizer,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    rng = np.random.default_rng(0)
    x = tf.constant(rng.uniform(-1, 1, (batch, 32, 32, 3)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, batch).astype("int64"))
    binary = sum(
        int(np.prod(v.shape))
        for v in model.trainable_variables
        if lq.optimizers.Bop.is_binary_variable(v)
    )
    say(
        {
            "ready": True,
            "tensorflow": tf.__version__,
            "larq": lq.__version__,
            "parameters": int(model.count_params()),
            "binary_parameters": binary,
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        }
    )
    for line in sys.stdin:
        line = line.strip()
        if not line or line == "quit":
            break
        steps = int(line)
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            model.train_on_batch(x, y)
        say(
            {
                "seconds": time.perf_counter() - start,
                "cpu_seconds": time.process_time() - cpu,
                "steps": steps,
            }
        )


def convert(out: str, conv_only: bool, threads: int) -> None:
    set_threads(threads)
    import larq_compute_engine as lce

    model = build_binarynet(conv_only=conv_only)
    randomize_batchnorm(model)
    start = time.perf_counter()
    flatbuffer = lce.convert_keras_model(model)
    seconds = time.perf_counter() - start
    with open(out, "wb") as handle:
        handle.write(flatbuffer)
    say(
        {
            "output": out,
            "bytes": len(flatbuffer),
            "seconds": seconds,
            "parameters": int(model.count_params()),
            "lce": lce.__version__,
        }
    )


ZOO_MODELS = (
    "QuickNetSmall",
    "QuickNet",
    "QuickNetLarge",
    "BinaryAlexNet",
    "BiRealNet",
    "RealToBinaryNet",
    "XNORNet",
    "BinaryResNetE18",
    "BinaryDenseNet28",
    "BinaryDenseNet37",
    "BinaryDenseNet45",
    "MeliusNet22",
    "DoReFaNet",
)


def zoo_binary_layers(model) -> int:  # noqa: ANN001
    """Keras layers whose input and kernel both have a quantizer: the layers LCE can binarize."""
    return sum(
        1
        for layer in model.layers
        if getattr(layer, "input_quantizer", None) is not None
        and getattr(layer, "kernel_quantizer", None) is not None
    )


def without_softmax(model):  # noqa: ANN001, ANN201 - tf.keras.Model in and out
    """The model up to its logits: a final softmax (Activation or Softmax layer) removed.

    A randomly initialised zoo model saturates its softmax (one-hot outputs), which hides any
    difference but the argmax; the logits show them.
    """
    import tensorflow as tf

    last = model.layers[-1]
    name = getattr(getattr(last, "activation", None), "__name__", None)
    if isinstance(last, tf.keras.layers.Softmax) or name == "softmax":
        return tf.keras.Model(model.inputs, last.input, name=model.name)
    return model


def build_zoo_model(name: str, size: int, seed: int, softmax: bool):  # noqa: ANN201
    """larq-zoo's `name` at size x size (weights=None: kernels drawn with `seed`, random
    BatchNorm statistics), its final softmax removed unless `softmax`."""
    import larq_zoo
    import tensorflow as tf

    factory = getattr(larq_zoo.sota, name, None) or getattr(larq_zoo.literature, name)
    tf.keras.utils.set_random_seed(seed)  # the kernels' random initialisation, reproducible
    model = factory(weights=None, input_shape=(size, size, 3))
    randomize_batchnorm(model, seed)
    return model if softmax else without_softmax(model)


def native(name: str, size: int, out: str, seed: int, threads: int, softmax: bool) -> None:
    """larq-zoo model -> `convert_keras_model` -> `out`; the conversion's seconds."""
    set_threads(threads)
    import larq_compute_engine as lce

    model = build_zoo_model(name, size, seed, softmax)
    start = time.perf_counter()
    flatbuffer = lce.convert_keras_model(model)
    seconds = time.perf_counter() - start
    with open(out, "wb") as handle:
        handle.write(flatbuffer)
    say(
        {
            "model": name,
            "size": size,
            "output": out,
            "bytes": len(flatbuffer),
            "seconds": seconds,
            "softmax": softmax,
            "keras_binary_layers": zoo_binary_layers(model),
            "versions": versions(),
        }
    )


def versions() -> dict[str, str]:
    """TensorFlow, LCE, larq, larq-zoo and tf-keras as installed in this venv."""
    names = {"tensorflow": "tensorflow-cpu", "lce": "larq-compute-engine", "larq": "larq",
             "larq_zoo": "larq-zoo", "tf_keras": "tf-keras"}  # fmt: skip
    return {key: _version(distribution) for key, distribution in names.items()}


def zoo(
    name: str,
    out: str,
    samples: int,
    size: int,
    batch: str,
    opset: int,
    seed: int,
    threads: int,
    softmax: bool,
) -> None:
    """larq-zoo model -> native flatbuffer + tf2onnx ONNX + inputs + Keras outputs (in `out`)."""
    set_threads(threads)
    from pathlib import Path

    import larq_compute_engine as lce
    import numpy as np
    import tensorflow as tf
    import tf2onnx

    model = build_zoo_model(name, size, seed, softmax)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    flatbuffer = lce.convert_keras_model(model)
    native_seconds = time.perf_counter() - start
    (folder / "native.tflite").write_bytes(flatbuffer)
    spec = (
        tf.TensorSpec((1 if batch == "static" else None, size, size, 3), tf.float32, name="input"),
    )
    start = time.perf_counter()
    tf2onnx.convert.from_keras(
        model, input_signature=spec, opset=opset, output_path=str(folder / "model.onnx")
    )
    tf2onnx_seconds = time.perf_counter() - start
    x = np.random.default_rng(seed).standard_normal((samples, size, size, 3)).astype("float32")
    start = time.perf_counter()
    y = model.predict(x, batch_size=16, verbose=0)
    np.save(folder / "inputs.npy", x)
    np.save(folder / "keras.npy", np.asarray(y, dtype="float32"))
    say(
        {
            "model": name,
            "output": str(folder),
            "native_bytes": len(flatbuffer),
            "native_seconds": native_seconds,
            "tf2onnx_seconds": tf2onnx_seconds,
            "keras_seconds": time.perf_counter() - start,
            "onnx_bytes": (folder / "model.onnx").stat().st_size,
            "parameters": int(model.count_params()),
            "keras_binary_layers": zoo_binary_layers(model),
            "samples": samples,
            "softmax": softmax,
            "output_layer": model.layers[-1].name,
            "versions": {
                "tensorflow": tf.__version__,
                "lce": lce.__version__,
                "tf2onnx": tf2onnx.__version__,
                "larq": _version("larq"),
                "larq_zoo": _version("larq-zoo"),
                "opset": opset,
            },
        }
    )


def _version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("serve-train", help="train BinaryNet steps on request")
    t.add_argument("--batch", type=int, default=50)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--gamma", type=float, default=1e-4)
    t.add_argument("--threshold", type=float, default=1e-8)
    t.add_argument("--lr", type=float, default=1e-2)
    c = sub.add_parser("convert", help="BinaryNet -> convert_keras_model -> flatbuffer")
    c.add_argument("--out", required=True)
    c.add_argument("--conv-only", action="store_true")
    c.add_argument("--threads", type=int, default=1)
    z = sub.add_parser("zoo", help="larq-zoo model -> native flatbuffer, tf2onnx ONNX, samples")
    z.add_argument("--model", required=True, choices=ZOO_MODELS)
    z.add_argument("--out", required=True, help="folder for the four files")
    z.add_argument("--samples", type=int, default=200)
    z.add_argument("--size", type=int, default=224)
    z.add_argument(
        "--batch",
        choices=("dynamic", "static"),
        default="dynamic",
        help="the ONNX input's batch dimension (static: 1)",
    )
    z.add_argument("--opset", type=int, default=13)
    z.add_argument("--seed", type=int, default=0)
    z.add_argument("--threads", type=int, default=1)
    z.add_argument("--softmax", action="store_true", help="keep the final softmax")
    n = sub.add_parser("native", help="larq-zoo model -> convert_keras_model -> flatbuffer")
    n.add_argument("--model", required=True, choices=ZOO_MODELS)
    n.add_argument("--size", type=int, default=224)
    n.add_argument("--out", required=True, help="the flatbuffer to write")
    n.add_argument("--seed", type=int, default=0)
    n.add_argument("--threads", type=int, default=1)
    n.add_argument("--softmax", action="store_true", help="keep the final softmax")
    sub.add_parser("versions", help="the versions of the larq venv's packages")
    args = p.parse_args()
    if args.command == "versions":
        say(versions())
    elif args.command == "native":
        native(args.model, args.size, args.out, args.seed, args.threads, args.softmax)
    elif args.command == "zoo":
        zoo(
            args.model,
            args.out,
            args.samples,
            args.size,
            args.batch,
            args.opset,
            args.seed,
            args.threads,
            args.softmax,
        )
    elif args.command == "serve-train":
        serve_train(args.batch, args.threads, args.gamma, args.threshold, args.lr)
    else:
        convert(args.out, args.conv_only, args.threads)


if __name__ == "__main__":
    main()
