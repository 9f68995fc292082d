"""The run directory: the hand-off between stages, and every file format in it.

- `directory.py`: `RunDir` (the paths of one run's artifacts), one writer at a time (`lock_run`);
- `checkpoint.py`: checkpoint.pt, and `open_run_model`: a model read back with its record of
  binary kernels, from a checkpoint or a packed file;
- `packed.py`: model.safetensors, binary kernels at 1 bit;
- `samples.py`: samples.npz, the test samples every later check uses;
- `records.py`: metrics.jsonl and other JSON lines;
- `files.py`, `provenance.py`: what bnnexport wrote (and may replace), its atomic writes, and
  what it was made from;
- `refusals.py`: a gate refusal's diagnostics file.

In: paths. Out: artifacts written atomically, read back checked. It may import `bnnexport.nn`,
`bnnexport.models` (to rebuild a model), `bnnexport.imports` and `converters` (a gate
refusal's diagnostics); never training, bench or the stages.
"""
