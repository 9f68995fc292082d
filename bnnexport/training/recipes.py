"""The paper's training recipes by name: `bnnexport train --recipe NAME`, `bnnexport recipes`.

Each recipe names its source (the section of Helwegen et al., "Latent Weights Do Not Exist",
NeurIPS 2019, and of its authors' code; for larq-zoo's models, the larq-zoo training task that
trained its published weights), the number published for it and, per hyperparameter, the file
and line of the authors' code it comes from (`sources`), and states its schedules in
**epochs**, as the paper does. `recipe_config` resolves them to optimizer steps,
the unit of `TrainConfig`, once the data set and batch size fix the steps per epoch. A run
shorter (or longer) than the recipe's (`--epochs`) scales every schedule by the same factor,
so the schedule keeps its shape: γ still decays x0.1 five times when the 500-epoch CIFAR-10
recipe runs 50 epochs (every 10 epochs), and the CLI says so in one line on stderr.
Explicit arguments override the recipe; an explicit `gamma`, `threshold` or `lr` is taken as
given (in steps, like the `train` flags). The recipe's name and the overrides are recorded
in config.json (`recipe`, `recipe_overrides`). Settings docs/LCE_NOTES.md "Paper recipes" does not
give are listed in the recipe's `assumptions`.

Example:
    >>> from bnnexport.training.recipes import recipe_config
    >>> config = recipe_config("paper-cifar10-bop", steps_per_epoch=1000, epochs=50)
    >>> config.gamma, config.threshold, config.batch_size, config.recipe
    ('step:0.0001,0.1,10000', 1e-08, 50, 'paper-cifar10-bop')
    >>> config.recipe_overrides
    {'epochs': 50}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bnnexport.datasets.imagefolder import IMAGENET as IMAGENET_CROPS
from bnnexport.errors import DataError
from bnnexport.optim.schedules import (
    Constant,
    CosineDecay,
    LinearDecay,
    Piecewise,
    Schedule,
    StepDecay,
    as_schedule,
    parse_schedule,
)
from bnnexport.training import deviations
from bnnexport.training.config import TrainConfig, config_keys


@dataclass(frozen=True)
class Recipe:
    """A named training setting; `gamma`, `threshold`, `lr` in the schedule text form, counted
    in epochs. `sources` names, for every hyperparameter (`SOURCED`), where the value comes
    from: a file and line of the authors' code, or a section of the paper."""

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
    source: str  # where the setting is published
    published: str  # the number published for it
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    # the data set loader's options, applied on the recipe's own data set (ImageNet's crops)
    dataset_options: dict[str, Any] = field(default_factory=dict)
    l2_first_last: float = 0.0  # L2 on the first and last layers' weights (XNOR-Net)
    # settings the sources do not give and where the recipe departs from the code that
    # published its number, each with that code's line (bnnexport.training.deviations)
    assumptions: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)  # hyperparameter: where it is from
    # how evaluation gets BatchNorm's statistics (TrainConfig.bn_eval): Keras' moving averages
    bn_eval: str = "moving"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# the hyperparameters every recipe gives a source for (l2_first_last where it sets one)
SOURCED = ("epochs", "batch_size", "gamma", "threshold", "lr")
PAPER = "Helwegen et al. 2019"
# The authors' code (docs/LCE_NOTES.md "Paper recipes"): its models' `bop*` hyperparameter sets
CODE = "plumerai/rethinking-bnn-optimization@2823525 bnn_optimization/models/"
NO_BOP = "unused: adam-latent has no γ or τ"
# ImageNet's random-resized 224 crops (the data set's default is the images' own size)
CROPS = {"image_size": IMAGENET_CROPS}
# the authors' ImageNet pixels: (x - mean) / std per channel (data/imagenet.py:13-14, in 0-255)
AUTHORS_PIXELS = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
IMAGENET = dict(dataset="imagefolder", optimizer="bop", batch_size=1024, threshold="1e-8",
                dataset_options={**CROPS, **AUTHORS_PIXELS})  # fmt: skip
# BinaryNet as the authors train it: BatchNorm after each max-pool in training (exported in
# LCE's order, the same function), Keras' BatchNorm ε and momentum (binarynet.py:26, :30-31)
AUTHORS_BINARYNET = {"pool_first": True, "bn_eps": 1e-3, "bn_momentum": 0.01}
IMAGENET_NOTE = "γ and Adam's lr decay linearly over the whole run"
# larq-zoo trains its models with Adam on latent weights (larq_zoo/training/*_experiments.py);
# γ and τ are Bop's and unused by adam-latent
LARQ_ZOO = dict(dataset="imagefolder", optimizer="adam-latent", gamma="1e-4", threshold="1e-8",
                dataset_options=CROPS)  # fmt: skip
BASIC = "larq-zoo, training/basic_experiments.py"
# larq-zoo's training tasks (docs/LCE_NOTES.md "larq-zoo's models"), each file at a commit
ZOO_BASIC = "larq/zoo@0c6c299 larq_zoo/training/basic_experiments.py:"
ZOO_SOTA = "larq/zoo@16ae5f0 larq_zoo/training/sota_experiments.py:"
ZOO_STAGES = "larq/zoo@511ce59 larq_zoo/training/multi_stage_experiments.py:"
# its CosineDecayWithWarmup decays over decay_steps - warmup_steps (- 1) steps after the warm-up
ZOO_COSINE = "larq/zoo@16ae5f0 larq_zoo/training/learning_schedules.py:62"


def zoo_sources(epochs: str, batch_size: str, lr: str) -> dict[str, str]:
    """A larq-zoo recipe's sources: its task's lines, and no γ or τ (Adam on latent weights)."""
    return {"epochs": epochs, "batch_size": batch_size, "gamma": NO_BOP, "threshold": NO_BOP,
            "lr": lr}  # fmt: skip


DENSENET28_SOURCES = zoo_sources(f"{ZOO_BASIC}87", f"{ZOO_BASIC}88",
                                 f"{ZOO_BASIC}90-92, x0.1 at each step (:94-100)")  # fmt: skip


def latent_clip(theirs: str) -> str:
    """The assumption every larq-zoo recipe makes about clipping latent weights."""
    return f"latent weights clipped to [-1, 1] (bnnexport's adam-latent; larq-zoo: {theirs})"


CLIP_13 = latent_clip("±1.3")
DENSENET_LR = "piecewise:4e-3,100,4e-4,110,4e-5"  # 4e-3, x0.1 at epochs 100 and 110


def imagenet_sources(file: str, first: int, decay: int) -> dict[str, str]:
    """The ImageNet sets share one layout: epochs at line `first`, batch, τ, γ and lr below
    it, both decays linear (power 1) over epochs x 1,281,167 images / batch steps."""
    line = f"{CODE}{file}:"
    over = f"linear over the whole run (:{decay})"
    return {
        "epochs": f"{line}{first}", "batch_size": f"{line}{first + 1}",
        "threshold": f"{line}{first + 3}", "gamma": f"{line}{first + 5}-{first + 6}, {over}",
        "lr": f"{line}{first + 8}-{first + 9}, Adam, {over}",
    }  # fmt: skip


RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in [
        Recipe(
            name="paper-cifar10-bop",
            description="BinaryNet on CIFAR-10 with Bop; Adam for the real-valued parameters",
            model="binarynet", dataset="cifar10", optimizer="bop", epochs=500, batch_size=50,
            gamma="step:1e-4,0.1,100", threshold="1e-8", lr="1e-2",
            model_kwargs=AUTHORS_BINARYNET, assumptions=deviations.cifar_binarynet("bop_sec52"),
            source=f"{PAPER}, Section 5.2", published="91.3 % test accuracy",
            sources={
                "epochs": f"{CODE}binarynet.py:93", "batch_size": f"{CODE}binarynet.py:94",
                "threshold": f"{CODE}binarynet.py:97",
                "gamma": f"{CODE}binarynet.py:98-100,107-109: x0.1 (staircase) every "
                         "50,000 / 50 x 100 steps = 100 epochs",
                "lr": f"{CODE}binarynet.py:105: Adam, constant",
            },
        ),
        Recipe(
            name="paper-cifar10-latent",
            description="BinaryNet on CIFAR-10, the latent-weight baseline: Adam on everything, "
            "latent weights clipped to [-1, 1], with the authors' default BinaryNet settings",
            model="binarynet", dataset="cifar10", optimizer="adam-latent", epochs=100,
            batch_size=256, gamma="1e-4", threshold="1e-8", lr="5e-3",
            model_kwargs=AUTHORS_BINARYNET,
            source=f"{PAPER}, Section 5.2 (the latent-weight baseline it compares with)",
            published="90.9 % test accuracy",
            sources={
                "epochs": f"{CODE}binarynet.py:64 (`default`)",
                "batch_size": f"{CODE}binarynet.py:68",
                "lr": f"{CODE}binarynet.py:69: Adam, constant; clipping to [-1, 1]: :71",
                "gamma": NO_BOP, "threshold": NO_BOP,
            },
            assumptions=("published: that Section 5.2's 90.9 % was trained with these "
                         "settings is our reading (the code's only latent-weight set for "
                         "BinaryNet); the paper does not list them",
                         *deviations.cifar_binarynet("default")),
        ),
        Recipe(
            name="paper-cifar10-sweep",
            description="The γ/τ study's base setting: BinaryNet on CIFAR-10 with Bop; sweep γ "
            "and τ around it (`bnnexport sweep`)",
            model="binarynet", dataset="cifar10", optimizer="bop", epochs=100, batch_size=100,
            gamma="1e-3", threshold="1e-6", lr="1e-2",
            model_kwargs=AUTHORS_BINARYNET, assumptions=deviations.cifar_binarynet("bop"),
            source=f"{PAPER}, Section 5.1 (hyperparameter analysis, flip-rate curves)",
            published="no single number: accuracy and flip-rate curves per (γ, τ)",
            sources={
                "epochs": f"{CODE}binarynet.py:64 (`bop` takes `default`'s)",
                "batch_size": f"{CODE}binarynet.py:76", "threshold": f"{CODE}binarynet.py:79",
                "gamma": f"{CODE}binarynet.py:80", "lr": f"{CODE}binarynet.py:85: Adam, constant",
            },
        ),
        Recipe(
            name="paper-imagenet-bop",
            description=f"BinaryAlexNet on ImageNet (--dataset imagefolder) with Bop; "
            f"{IMAGENET_NOTE}",
            model="binary-alexnet", epochs=150, gamma="linear:1e-4,1e-6,150",
            lr="linear:2.5e-3,5e-6,150", **IMAGENET,
            source=f"{PAPER}, Section 5.3", published="41.1 % top-1",
            assumptions=deviations.BINARY_ALEXNET,
            sources=imagenet_sources("binary_alexnet.py", 65, decay=78),
        ),
        Recipe(
            name="paper-imagenet-xnornet",
            description=f"XNOR-Net on ImageNet with Bop, L2 5e-7 on the first and last "
            f"layers; {IMAGENET_NOTE}",
            model="xnornet", epochs=100, gamma="linear:1e-4,1e-6,100",
            lr="linear:2.5e-3,5e-6,100", l2_first_last=5e-7, **IMAGENET,
            source=f"{PAPER}, Section 5.3", published="45.9 % top-1",
            assumptions=deviations.XNORNET,
            sources={**imagenet_sources("xnor.py", 62, decay=81),
                     "l2_first_last": f"{CODE}xnor.py:73, on the layers of :25 and :53"},
        ),
        Recipe(
            name="paper-imagenet-birealnet",
            description=f"Bi-Real-Net 18 on ImageNet with Bop (approx_sign activations, "
            f"BatchNorm momentum 0.8, as the model builds them); {IMAGENET_NOTE}",
            model="birealnet18", epochs=300, gamma="linear:1e-4,1e-6,300",
            lr="linear:2.5e-3,5e-6,300", **IMAGENET,
            source=f"{PAPER}, Section 5.3", published="56.6 % top-1",
            assumptions=deviations.BIREALNET,
            sources=imagenet_sources("birealnet.py", 74, decay=87),
        ),
        Recipe(
            name="larq-zoo-binary-densenet28",
            description="BinaryDenseNet-28 on ImageNet as larq-zoo trains it: Adam on latent "
            "weights, lr 4e-3, x0.1 at epochs 100 and 110",
            model="binary-densenet28", epochs=120, batch_size=256, lr=DENSENET_LR, **LARQ_ZOO,
            source=f"{BASIC}, TrainBinaryDenseNet28", published="60.91 % top-1 (larq-zoo)",
            sources=DENSENET28_SOURCES,
            assumptions=(deviations.larq_zoo("densenet.py"), CLIP_13,),
        ),
        Recipe(
            name="larq-zoo-binary-densenet37",
            description="BinaryDenseNet-37 on ImageNet as larq-zoo trains it (BinaryDenseNet-28's "
            "schedule at batch 192)",
            model="binary-densenet37", epochs=120, batch_size=192, lr=DENSENET_LR, **LARQ_ZOO,
            source=f"{BASIC}, TrainBinaryDenseNet37", published="62.89 % top-1 (larq-zoo)",
            sources={**DENSENET28_SOURCES, "batch_size": f"{ZOO_BASIC}110"},
            assumptions=(deviations.larq_zoo("densenet.py"), CLIP_13,),
        ),
        Recipe(
            name="larq-zoo-binary-densenet45",
            description="BinaryDenseNet-45 on ImageNet as larq-zoo trains it: lr 8e-3, x0.1 at "
            "epochs 80 and 100",
            model="binary-densenet45", epochs=125, batch_size=384,
            lr="piecewise:8e-3,80,8e-4,100,8e-5", **LARQ_ZOO,
            source=f"{BASIC}, TrainBinaryDenseNet45", published="64.59 % top-1 (larq-zoo)",
            sources=zoo_sources(f"{ZOO_BASIC}124", f"{ZOO_BASIC}125",
                                f"{ZOO_BASIC}126-127, x0.1 (:91) at each step"),
            assumptions=(deviations.larq_zoo("densenet.py"), CLIP_13,),
        ),
        Recipe(
            name="larq-zoo-meliusnet22",
            description="MeliusNet-22 on ImageNet with BinaryDenseNet-28's larq-zoo schedule",
            model="meliusnet22", epochs=120, batch_size=256, lr=DENSENET_LR, **LARQ_ZOO,
            source=f"{BASIC}, TrainBinaryDenseNet28 (larq-zoo has no training task for "
            "MeliusNet-22)",
            sources=DENSENET28_SOURCES,
            published="62.4 % top-1 (larq-zoo's weights, trained by a setting it does not "
            "publish)",
            assumptions=(deviations.larq_zoo("meliusnet.py"),
                "the whole setting: that of BinaryDenseNet-28, by the same authors and of the "
                "same blocks",
                CLIP_13,
            ),
        ),
        Recipe(
            name="larq-zoo-binary-resnet-e18",
            description="BinaryResNetE-18 on ImageNet as larq-zoo trains it: lr 4e-3, x0.3 at "
            "epochs 70, 90 and 110",
            model="binary-resnet-e18", epochs=120, batch_size=1024,
            lr="piecewise:4e-3,70,1.2e-3,90,3.6e-4,110,1.08e-4", **LARQ_ZOO,
            source=f"{BASIC}, TrainBinaryResNetE18", published="58.32 % top-1 (larq-zoo)",
            sources=zoo_sources(f"{ZOO_BASIC}63", f"{ZOO_BASIC}64",
                                f"{ZOO_BASIC}66-68, x0.3 at each step (:70-76)"),
            assumptions=(deviations.larq_zoo("resnet_e.py"), latent_clip("±1.25"),),
        ),
        Recipe(
            name="larq-zoo-dorefanet",
            description="DoReFa-Net on ImageNet as larq-zoo trains it: lr 2e-4, x0.2 at epochs "
            "60 and 75, then x0.1 every 2 epochs from epoch 82",
            model="dorefanet", epochs=90, batch_size=256,
            lr="piecewise:2e-4,60,4e-5,75,8e-6,82,8e-7,84,8e-8,86,8e-9,88,8e-10", **LARQ_ZOO,
            source=f"{BASIC}, TrainDoReFaNet", published="53.39 % top-1 (larq-zoo)",
            sources=zoo_sources(f"{ZOO_BASIC}171", f"{ZOO_BASIC}172",
                                f"{ZOO_BASIC}174-177, :179-192"),
            assumptions=(deviations.larq_zoo("dorefanet.py"),
                "Adam's ε: torch's 1e-8 (larq-zoo: 1e-5)",
                "kernels: sign(w) in the forward pass, clipped STE (larq-zoo: mean|w| x sign(w) "
                "with an identity gradient; BatchNorm follows each, so the scale cancels)",
                latent_clip("not clipped"),
            ),
        ),
        Recipe(
            name="larq-zoo-real-to-binary-net",
            description="Real-to-Binary Net on ImageNet with the optimizer of larq-zoo's last "
            "training stage: Adam, lr warmed up to 2e-4 over 10 epochs, a cosine decay over 55 "
            "epochs (larq-zoo subtracts the warm-up twice), then 0",
            model="real-to-binary-net", epochs=75, batch_size=256, lr="cosine:2e-4,10,55",
            **LARQ_ZOO,
            source="larq-zoo, training/multi_stage_experiments.py, TrainR2BBNNAlternative (stage "
            "3 of TrainR2B)",
            sources=zoo_sources(f"{ZOO_STAGES}93 (TrainR2BBFP)", f"{ZOO_STAGES}94 (TrainR2BBFP)",
                                f"{ZOO_STAGES}133, :151-158; {ZOO_COSINE}"),
            published="65.01 % top-1 (larq-zoo, after all four stages)",
            assumptions=(deviations.larq_zoo("real_to_binary.py"),
                "the three stages before it (a float ResNet-18 teacher, float and "
                "binary-activation students) and its distillation from the binary-activation "
                "model are not reproduced: this recipe trains from scratch",
            ),
        ),
        Recipe(
            name="larq-zoo-quicknet-large",
            description="QuickNet-Large on ImageNet as larq-zoo trains it: Adam, lr warmed up to "
            "1e-2 over 5 epochs, cosine decay over the other 595",
            model="quicknet-large", epochs=600, batch_size=2048, lr="cosine:1e-2,5,595",
            **LARQ_ZOO,
            source="larq-zoo, training/sota_experiments.py, TrainQuickNetLarge",
            sources=zoo_sources(f"{ZOO_SOTA}17 (TrainQuickNet)", f"{ZOO_SOTA}18",
                                f"{ZOO_SOTA}22-27, {ZOO_COSINE}"),
            published="66.9 % top-1 (larq-zoo v1.0)",
            assumptions=(deviations.larq_zoo("quicknet.py"),
                "the float parameters: Adam with the same lr (larq-zoo: SGD, momentum 0.9, "
                "cosine from 0.1 with the same warm-up, sota_experiments.py:29-36)",
                latent_clip("±1.25"),
            ),
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
    if isinstance(schedule, Piecewise):
        pairs = zip(schedule.boundaries, schedule.values[1:], strict=True)
        return "piecewise:" + ",".join(
            [f"{schedule.values[0]:g}"] + [f"{b},{v:g}" for b, v in pairs]
        )
    if isinstance(schedule, CosineDecay):
        return f"cosine:{schedule.peak:g},{schedule.warmup},{schedule.steps}"
    raise TypeError(f"not a schedule: {schedule!r}")


def resolve_schedule(text: str, steps_per_epoch: int, factor: float = 1.0) -> float | str:
    """An epoch-based schedule in steps, compressed by `factor` (run epochs / recipe epochs)."""
    return schedule_text(parse_schedule(text).scaled(steps_per_epoch * factor))


def epoch_steps(
    dataset: str, data_dir: str | None, batch_size: int, options: dict[str, Any] | None = None
) -> int:
    """Optimizer steps per epoch, as `train` counts them (the last batch may be short);
    `options`: the data set loader's (TrainConfig.dataset_options)."""
    from bnnexport.datasets import load_dataset

    data = load_dataset(dataset, data_dir, **(options or {}))
    return max(1, -(-len(data.train) // batch_size))


def recipe_config(name: str, steps_per_epoch: int | None = None, **overrides: Any) -> TrainConfig:
    """The TrainConfig of recipe `name`, with `overrides` (TrainConfig fields) applied.

    `steps_per_epoch` is computed from the (possibly overridden) data set and batch size when
    not given. `epochs` shorter or longer than the recipe's scales its schedules; explicit
    `gamma`, `threshold` or `lr` replace the recipe's and are not rescaled. The recipe's
    `dataset_options` apply on its own data set; `dataset_options` given add to them and win.
    """
    recipe = get_recipe(name)
    unknown = set(overrides) - set(config_keys())
    if unknown:
        raise TypeError(f"not TrainConfig fields: {', '.join(sorted(unknown))}")
    settings: dict[str, Any] = {
        "model": recipe.model, "dataset": recipe.dataset, "optimizer": recipe.optimizer,
        "epochs": recipe.epochs, "batch_size": recipe.batch_size,
        "out": f"runs/{recipe.name}", "l2_first_last": recipe.l2_first_last,
        "bn_eval": recipe.bn_eval,
    }  # fmt: skip
    given = {k: v for k, v in overrides.items() if v is not None}
    settings.update(given)
    own = recipe.dataset_options if settings["dataset"] == recipe.dataset else {}
    settings["dataset_options"] = {**own, **given.get("dataset_options", {})}
    # the recipe's model options go with its own model (another model has other options)
    own = recipe.model_kwargs if settings["model"] == recipe.model else {}
    settings["model_kwargs"] = {**own, **given.get("model_kwargs", {})}
    if "dataset_options" in given:  # an override is what the options became
        given["dataset_options"] = settings["dataset_options"]
    if steps_per_epoch is None:
        data = (settings["dataset"], settings.get("data_dir"))
        steps_per_epoch = epoch_steps(*data, settings["batch_size"], settings["dataset_options"])
    factor = settings["epochs"] / recipe.epochs
    for key in ("gamma", "threshold", "lr"):
        if overrides.get(key) is None:
            settings[key] = resolve_schedule(getattr(recipe, key), steps_per_epoch, factor)
    # what the user changed (where to write and how to show progress are not the recipe's)
    changed = {k: v for k, v in given.items() if k not in RUN_PLACE and v != settings_of(recipe, k)}
    return TrainConfig.from_json({**settings, "recipe": recipe.name, "recipe_overrides": changed})


RUN_PLACE = ("out", "device", "precision", "num_workers", "log_every", "eval_every",
             "metrics_csv", "data_dir")  # fmt: skip


def settings_of(recipe: Recipe, key: str) -> Any:
    """The recipe's own value of a TrainConfig field (None where it sets none)."""
    return getattr(recipe, key, None)


def rescale_on_resume(
    config: TrainConfig, changes: dict[str, list], steps_per_epoch: int, step: int
) -> str | None:
    """A resumed recipe run given another `--epochs`: the recipe's schedules the user did not
    set (at the start, `recipe_overrides`, or now, `changes`) rescaled to the new length, as a
    new run of that length has them, so `compression_note` stays true and no step decay runs
    on below the recipe's floor. Each one rescaled goes into `config` and `changes` (old,
    new); returns one line saying what each is at the next step (`step` steps are done; the
    metrics number that step `step` + 1), or None.

    Example:
        >>> config = recipe_config("paper-cifar10-bop", steps_per_epoch=4, epochs=2)
        >>> changes = {"epochs": [2, 3]}
        >>> config.epochs = 3
        >>> note = rescale_on_resume(config, changes, steps_per_epoch=4, step=8)
        >>> note.partition(": ")[0], note.partition(" (")[2]
        ('recipe paper-cifar10-bop, --epochs 2 -> 3', 'gamma at step 9: 1e-08 -> 1e-06)')
        >>> changes["gamma"]
        ['step:0.0001,0.1,2', 'step:0.0001,0.1,3']
    """
    if config.recipe is None or "epochs" not in changes:
        return None
    recipe = get_recipe(config.recipe)
    factor = int(config.epochs or recipe.epochs) / recipe.epochs
    moved = {}
    for key in ("gamma", "threshold", "lr"):
        if key in config.recipe_overrides or key in changes:
            continue  # the user's own value: never rescaled
        old = getattr(config, key)
        new = resolve_schedule(getattr(recipe, key), steps_per_epoch, factor)
        if as_schedule(old) != as_schedule(new):
            setattr(config, key, new)
            changes[key] = [old, new]
            moved[key] = f"{as_schedule(old)(step):g} -> {as_schedule(new)(step):g}"
    if not moved:
        return None
    return (
        f"recipe {recipe.name}, --epochs {changes['epochs'][0]} -> {config.epochs}: its "
        f"{', '.join(moved)} schedule{'s are' if len(moved) > 1 else ' is'} the recipe's over "
        f"{config.epochs} of its {recipe.epochs} epochs from step {step + 1} on, as a new run's ("
        + "; ".join(f"{key} at step {step + 1}: {values}" for key, values in moved.items())
        + ")"
    )


def compression_note(config: TrainConfig) -> str | None:
    """One line when `config` runs its recipe's schedules over a different number of epochs
    (scaled, keeping their shape), else None."""
    if config.recipe is None:
        return None
    recipe = get_recipe(config.recipe)
    if config.epochs in (None, recipe.epochs):
        return None
    scaled = [k for k in ("gamma", "threshold", "lr") if k not in config.recipe_overrides
              and not isinstance(parse_schedule(getattr(recipe, k)), Constant)]  # fmt: skip
    if not scaled:
        return None
    return (
        f"recipe {recipe.name}: {config.epochs} of its {recipe.epochs} epochs, so the "
        f"{', '.join(scaled)} schedule(s) run x{config.epochs / recipe.epochs:g} as fast "
        "(same shape, fewer steps); its published number is for the full run"
    )
