"""The stages: each one `artifact in -> artifact out + a report`, the run directory between them.

- `train.py` (`train(config) -> TrainReport`), `verify.py`, `pack.py`, `export.py`,
  `convert.py` (`convert_run`), `bench/` (host and device rows; a room of its own),
  `summary.py`, `init.py` (a run from a model of yours or the zoo), `zoo.py`;
- `convert_any.py`: `convert_module`, any `nn.Module` to a flatbuffer in one call;
  `convert_report.py`: what the two convert paths share (`ConvertSettings`, `ConvertReport`);
- `pipeline.py`: train -> verify -> pack -> export -> convert -> bench, the demo;
- `sweep.py`, `compare.py`, `plots.py`: the paper's γ/τ studies, runs side by side, the
  training curves;
- `torch_probe.py`: PyTorch as the conversion gate's sign probe (read and impose
  binarizations: through bnnexport's `Quantizer` hooks or a model of your own's traced
  ones; a quantization-aware model's int8 activations), for the export and convert gates;
- `report.py` (`Report`, the base of every stage's report, and its JSON and figures) and
  `progress.py` (step lines on a terminal).

In: run directories and options. Out: run directories and reports. It may import every room
below it (`training`, `optim`, `nn`, `run`, `models`, `datasets`) and, inside the functions
that need them, `converters` and `deploy`; only the CLI imports it.
"""
