"""The optimizers: Bop and its family, the composite that pairs them with Adam, their schedules.

- `bop.py`: Bop, Bop2ndOrder, BopNormalized and the scheduled Adam (the update rules, with
  their math);
- `composite.py`: `CaseOptimizer` (one optimizer for the binary kernels, another for the
  rest) and the registry of optimizers (`OptimizerEntry`, `register_optimizer`): each entry
  declares its hyperparameters, their flags, ranges and schedules;
- `schedules.py`: the schedules a hyperparameter may follow (constant, exponential, step,
  cosine).

In: parameters and hyperparameters. Out: `torch.optim.Optimizer`s. It may import torch,
`bnnexport.nn` and `bnnexport.errors`; never training, the stages or the CLI.
"""
