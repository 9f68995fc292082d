"""Training: the loop the train stage runs, its resume rules, and the papers' recipes.

- `config.py` (`TrainConfig` and its checks), `loop.py` (one job's model, optimizer, data and
  epochs), `resume.py` (what a resumed run keeps or changes, what Ctrl-C says);
- `distributed.py` (torchrun), `metrics.py` (per-step records, TensorBoard), `flips.py` (flip
  counts, π_t);
- `recipes.py` (the papers' settings) and `deviations.py` (where a recipe departs from the
  authors' code, file and line).

In: a `TrainConfig`, a model and a data set. Out: trained weights, metrics, checkpoints. It
may import `bnnexport.optim`, `bnnexport.nn`, `bnnexport.run`, `bnnexport.models` and
`bnnexport.datasets`; never the stages (the train stage, `bnnexport.stages.train`, drives it)
or the CLI.
"""
