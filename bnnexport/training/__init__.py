"""Training: the trainer, the resume rules, the Bop family, and the studies built on them.

- `train.py` (the stage, `train(config) -> TrainReport`), `config.py` (`TrainConfig` and its
  checks), `trainer.py` (one job's model, optimizer, data and epochs), `resume.py` (what a
  resumed run keeps or changes, what Ctrl-C says);
- `bop.py` (Bop, Bop2ndOrder, BopNormalized, the scheduled Adam), `composite.py` (Bop for the
  binary kernels, Adam for the rest; `OPTIMIZERS`, the registry of optimizers and the
  hyperparameters each declares), `flips.py` (flip counts, π_t), `schedules.py`;
- `distributed.py` (torchrun), `recipes.py` (the paper's settings), `metrics.py`, `plots.py`;
- `sweep.py` and `compare.py`: the paper's γ/τ analysis, runs side by side.

In: a `TrainConfig`, a model and a data set. Out: a run directory (checkpoint with the record
of binary kernels, metrics, plots). It may import `bnnexport.nn`, `bnnexport.run`,
`bnnexport.models`, `bnnexport.datasets` and the verify stage (a run ends verified); never
bench, the other stages or the CLI.
"""
