"""The words a conversion is asked in, each defined once: target, layer precision, input layout.

Every option that takes one of them (`ConvertOptions`, `bnnexport convert/train/bench`, a
run's config.json) reads the `Literal` and its tuple here; bnnexport imports them from here
too (`deploy/` keeps its own copy of the input layouts: it imports neither package).

Example:
    >>> LAYER_PRECISIONS, TARGETS, INPUT_LAYOUTS
    (('float32', 'int8'), ('arm64', 'arm32'), ('nhwc', 'nchw'))
"""

from __future__ import annotations

from typing import Literal, get_args

# the precision a model's float layers run in (`--float-layers`: int8 is fake-quantized in
# training, quantized in conversion), and of a flatbuffer's inputs and outputs (`--io`); not
# the arithmetic a training step runs in (`--precision`, `bnnexport.nn.precision`)
LayerPrecision = Literal["float32", "int8"]
LAYER_PRECISIONS: tuple[str, ...] = get_args(LayerPrecision)

# the LCE target a flatbuffer is converted for
Target = Literal["arm64", "arm32"]
TARGETS: tuple[str, ...] = get_args(Target)

# how a flatbuffer takes its image input: channels last (TFLite's convention, what a device
# app feeds) or first (PyTorch's and ONNX's); docs/LCE_NOTES.md "Input layout"
InputLayout = Literal["nhwc", "nchw"]
INPUT_LAYOUTS: tuple[str, ...] = get_args(InputLayout)
