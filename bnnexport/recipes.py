"""The paper's training recipes (docs/LCE_NOTES.md §5), by name: `bnnexport train --recipe NAME`.

A recipe states its schedules in **epochs** (as the paper does); `recipe_config` resolves them to
optimizer steps, the unit of `TrainConfig`, once the data set and batch size fix the number of
steps per epoch. A run shorter than the recipe's (`--epochs`) compresses every schedule by the
same factor, so γ still decays x0.1 five times over a 500-epoch recipe run for 50 epochs (every
10 epochs). Explicit arguments override the recipe; an explicit `gamma`, `threshold` or `lr` is
taken as given (in steps, like the `train` flags).

Example:
    >>> from bnnexport.recipes import recipe_config
    >>> config = recipe_config("paper-cifar10-bop", steps_per_epoch=1000, epochs=50)
    >>> config.gamma, config.threshold, config.batch_size
    ('step:0.0001,0.1,10000', 1e-08, 50)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bnnexport.errors import DataError
from bnnexport.schedules import Constant, LinearDecay, Schedule, StepDecay, parse_schedule
from bnnexport.train import TrainConfig


@dataclass(frozen=True)
class Recipe:
    """A named training setting; `gamma`, `threshold`, `lr` in the schedule text form, counted
    in epochs."""

    name: str
    description: str
    model: str
    dataset: str
    optimizer: str
    epochs: int
    batch_size: int
    gamma: str
    threshold: str
    lr: str
    reference: str  # what the paper reports for it
    model_kwargs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in [
        Recipe(
            name="paper-cifar10-bop",
            description="BinaryNet on CIFAR-10 with Bop; Adam for the real-valued parameters",
            model="binarynet", dataset="cifar10", optimizer="bop", epochs=500, batch_size=50,
            gamma="step:1e-4,0.1,100", threshold="1e-8", lr="1e-2",
            reference="Helwegen et al. 2019, Table 2: 91.3 % test accuracy",
        ),
        Recipe(
            name="paper-cifar10-latent",
            description="BinaryNet on CIFAR-10, the latent-weight baseline: Adam on everything, "
            "latent weights clipped to [-1, 1] (the Bop recipe's Adam settings; "
            "docs/LCE_NOTES.md §5 gives no other)",
            model="binarynet", dataset="cifar10", optimizer="adam-latent", epochs=500,
            batch_size=50, gamma="1e-4", threshold="1e-8", lr="1e-2",
            reference="Helwegen et al. 2019, Table 2: 90.9 % test accuracy",
        ),
        Recipe(
            name="paper-imagenet-bop",
            description="BinaryAlexNet on ImageNet (--dataset imagefolder) with Bop; γ and "
            "Adam's lr decay linearly over the run",
            model="binary-alexnet", dataset="imagefolder", optimizer="bop", epochs=150,
            batch_size=1024, gamma="linear:1e-4,1e-6,150", threshold="1e-8",
            lr="linear:2.5e-3,5e-6,150",
            reference="Helwegen et al. 2019, Table 3: 41.1 % top-1",
        ),
    ]
}  # fmt: skip


def get_recipe(name: str) -> Recipe:
    """The recipe `name`; DataError naming the known recipes otherwise."""
    if name not in RECIPES:
        raise DataError(f"unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


def schedule_text(schedule: Schedule) -> float | str:
    """The text form `parse_schedule` reads (a plain number for a constant)."""
    if isinstance(schedule, Constant):
        return schedule.value
    if isinstance(schedule, StepDecay):
        return f"step:{schedule.initial:g},{schedule.factor:g},{schedule.every}"
    if isinstance(schedule, LinearDecay):
        return f"linear:{schedule.start:g},{schedule.end:g},{schedule.steps}"
    raise TypeError(f"not a schedule: {schedule!r}")


def resolve_schedule(text: str, steps_per_epoch: int, factor: float = 1.0) -> float | str:
    """An epoch-based schedule in steps, compressed by `factor` (run epochs / recipe epochs)."""
    return schedule_text(parse_schedule(text).scaled(steps_per_epoch * factor))


def epoch_steps(dataset: str, data_dir: str | None, batch_size: int) -> int:
    """Optimizer steps per epoch, as `train` counts them (the last batch may be short)."""
    from bnnexport.datasets import load_dataset

    data = load_dataset(dataset, data_dir)
    return max(1, -(-len(data.train) // batch_size))


def recipe_config(name: str, steps_per_epoch: int | None = None, **overrides: Any) -> TrainConfig:
    """The TrainConfig of recipe `name`, with `overrides` (TrainConfig fields) applied.

    `steps_per_epoch` is computed from the (possibly overridden) data set and batch size when
    not given. `epochs` shorter or longer than the recipe's scales its schedules; explicit
    `gamma`, `threshold` or `lr` replace the recipe's and are not rescaled.
    """
    recipe = get_recipe(name)
    unknown = set(overrides) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise TypeError(f"not TrainConfig fields: {', '.join(sorted(unknown))}")
    settings: dict[str, Any] = {
        "model": recipe.model, "dataset": recipe.dataset, "optimizer": recipe.optimizer,
        "epochs": recipe.epochs, "batch_size": recipe.batch_size,
        "model_kwargs": dict(recipe.model_kwargs), "out": f"runs/{recipe.name}",
    }  # fmt: skip
    settings.update({k: v for k, v in overrides.items() if v is not None})
    if steps_per_epoch is None:
        steps_per_epoch = epoch_steps(
            settings["dataset"], settings.get("data_dir"), settings["batch_size"]
        )
    factor = settings["epochs"] / recipe.epochs
    for key in ("gamma", "threshold", "lr"):
        if overrides.get(key) is None:
            settings[key] = resolve_schedule(getattr(recipe, key), steps_per_epoch, factor)
    return TrainConfig(**settings)
