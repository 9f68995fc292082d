"""Recipes resolve to the schedules the paper documents (docs/LCE_NOTES.md "Paper recipes"), in
optimizer steps."""

from __future__ import annotations

import json
import re

import pytest
from support.cli import invoke

from bnnexport.errors import DataError
from bnnexport.optim.schedules import parse_schedule
from bnnexport.training.recipes import RECIPES, SOURCED, compression_note, recipe_config

PAPER_RECIPES = [
    "paper-cifar10-bop", "paper-cifar10-latent", "paper-cifar10-sweep", "paper-imagenet-bop",
    "paper-imagenet-xnornet", "paper-imagenet-birealnet",
]  # fmt: skip
LARQ_ZOO_RECIPES = [
    "larq-zoo-binary-densenet28", "larq-zoo-binary-densenet37", "larq-zoo-binary-densenet45",
    "larq-zoo-meliusnet22", "larq-zoo-binary-resnet-e18", "larq-zoo-dorefanet",
    "larq-zoo-real-to-binary-net", "larq-zoo-quicknet-large",
]  # fmt: skip


def test_every_recipe_names_its_source_and_published_number():
    assert list(RECIPES) == PAPER_RECIPES + LARQ_ZOO_RECIPES
    published = {name: (r.source, r.published) for name, r in RECIPES.items()}
    assert published["paper-cifar10-bop"] == ("Helwegen et al. 2019, Section 5.2",
                                              "91.3 % test accuracy")  # fmt: skip
    assert published["paper-cifar10-latent"][1] == "90.9 % test accuracy"
    assert "Section 5.1" in published["paper-cifar10-sweep"][0]
    assert [published[f"paper-imagenet-{n}"][1] for n in ("bop", "xnornet", "birealnet")] == [
        "41.1 % top-1", "45.9 % top-1", "56.6 % top-1",
    ]  # fmt: skip


def test_section_5_1_sweep_setting():
    config = recipe_config("paper-cifar10-sweep", steps_per_epoch=500)
    assert (config.model, config.optimizer, config.batch_size, config.epochs) == (
        "binarynet", "bop", 100, 100,
    )  # fmt: skip
    assert (config.gamma, config.threshold) == (1e-3, 1e-6)


def test_xnornet_and_birealnet_recipes():
    xnor = recipe_config("paper-imagenet-xnornet", steps_per_epoch=1252)
    assert (xnor.model, xnor.epochs, xnor.batch_size, xnor.l2_first_last) == (
        "xnornet", 100, 1024, 5e-7,
    )  # fmt: skip
    assert parse_schedule(xnor.gamma)(100 * 1252) == pytest.approx(1e-6)
    assert parse_schedule(xnor.lr)(100 * 1252) == pytest.approx(5e-6)
    bireal = recipe_config("paper-imagenet-birealnet", steps_per_epoch=1252)
    assert bireal.model == "birealnet18" and bireal.threshold == 1e-8


def test_birealnet_trains_300_epochs_with_its_decays_over_all_300():
    """As the authors' birealnet.py does (it once ran 150, a guess where no source was known)."""
    config = recipe_config("paper-imagenet-birealnet", steps_per_epoch=1252)
    assert config.epochs == 300
    gamma, lr = parse_schedule(config.gamma), parse_schedule(config.lr)
    assert gamma(150 * 1252) == pytest.approx((1e-4 + 1e-6) / 2)  # halfway at epoch 150
    assert (gamma(300 * 1252), lr(300 * 1252)) == (pytest.approx(1e-6), pytest.approx(5e-6))


def test_the_latent_baseline_takes_the_authors_default_binarynet_settings():
    config = recipe_config("paper-cifar10-latent", steps_per_epoch=195)
    assert (config.optimizer, config.epochs, config.batch_size, config.lr) == (
        "adam-latent", 100, 256, 5e-3,
    )  # fmt: skip
    assert "binarynet.py:69" in RECIPES["paper-cifar10-latent"].sources["lr"]


def test_every_hyperparameter_of_every_recipe_names_its_source():
    for recipe in RECIPES.values():
        needed = set(SOURCED) | ({"l2_first_last"} if recipe.l2_first_last else set())
        assert needed <= set(recipe.sources), recipe.name
        for key, source in recipe.sources.items():  # a file and line, or the paper's section
            cited = re.search(r"\.py:\d+", source) or "Section" in source
            assert cited or source.startswith("unused"), (recipe.name, key, source)


def test_config_records_the_recipe_and_what_was_overridden():
    config = recipe_config("paper-cifar10-bop", steps_per_epoch=1000, epochs=5, batch_size=100,
                           out="runs/x", dataset="cifar10")  # fmt: skip
    assert config.recipe == "paper-cifar10-bop"
    assert config.recipe_overrides == {"epochs": 5, "batch_size": 100}  # not out, not unchanged
    assert config.to_json()["recipe_overrides"] == {"epochs": 5, "batch_size": 100}


def test_a_shorter_run_says_in_one_line_that_its_schedules_are_scaled():
    short = recipe_config("paper-cifar10-bop", steps_per_epoch=1000, epochs=5)
    note = compression_note(short)
    assert "\n" not in note and "5 of its 500 epochs" in note and "gamma" in note
    assert compression_note(recipe_config("paper-cifar10-bop", steps_per_epoch=1000)) is None
    # constant schedules have no shape to keep
    assert (
        compression_note(recipe_config("paper-cifar10-sweep", steps_per_epoch=9, epochs=2)) is None
    )


def test_cifar10_bop_is_the_papers_recipe():
    config = recipe_config("paper-cifar10-bop", steps_per_epoch=1000)  # 50,000 / 50
    assert (config.model, config.dataset, config.optimizer) == ("binarynet", "cifar10", "bop")
    assert (config.epochs, config.batch_size) == (500, 50)
    assert config.threshold == 1e-8 and config.lr == 1e-2
    gamma = parse_schedule(config.gamma)
    assert gamma(0) == 1e-4 and gamma(99_999) == 1e-4
    assert gamma(100_000) == pytest.approx(1e-5) and gamma(499_999) == pytest.approx(1e-8)


def test_cifar10_latent_is_adam_on_latent_weights_with_the_same_net():
    config = recipe_config("paper-cifar10-latent", steps_per_epoch=1000)
    assert (config.model, config.optimizer) == ("binarynet", "adam-latent")


def test_imagenet_bop_decays_gamma_and_lr_linearly_over_the_run():
    config = recipe_config("paper-imagenet-bop", steps_per_epoch=1252)  # 1,281,167 / 1024
    assert (config.model, config.batch_size, config.epochs) == ("binary-alexnet", 1024, 150)
    gamma, lr = parse_schedule(config.gamma), parse_schedule(config.lr)
    total = 150 * 1252
    assert gamma(0) == 1e-4 and gamma(total) == pytest.approx(1e-6)
    assert gamma(total // 2) == pytest.approx((1e-4 + 1e-6) / 2, rel=1e-3)
    assert lr(0) == 2.5e-3 and lr(total) == pytest.approx(5e-6)


def test_shorter_epochs_scale_every_schedule_proportionally():
    config = recipe_config("paper-cifar10-bop", steps_per_epoch=1000, epochs=50)
    gamma = parse_schedule(config.gamma)
    assert gamma(9_999) == 1e-4 and gamma(10_000) == pytest.approx(1e-5)  # every 10 epochs
    short = recipe_config("paper-imagenet-bop", steps_per_epoch=10, epochs=15)
    assert parse_schedule(short.lr)(150) == pytest.approx(5e-6)


def test_explicit_values_override_the_recipe_and_are_not_rescaled():
    config = recipe_config(
        "paper-cifar10-bop", steps_per_epoch=1000, epochs=5, gamma=1e-3, batch_size=100
    )
    assert config.gamma == 1e-3 and config.batch_size == 100 and config.epochs == 5
    assert config.threshold == 1e-8


def test_steps_per_epoch_come_from_the_data_set_and_batch_size():
    config = recipe_config("paper-cifar10-bop", dataset="mnist5k", batch_size=100, epochs=500)
    assert parse_schedule(config.gamma).every == 100 * 40  # 4,000 images / 100 = 40 steps


AUTHORS_PIXELS = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


@pytest.mark.parametrize("name", [n for n in PAPER_RECIPES if "imagenet" in n])
def test_imagenet_recipes_ask_for_imagenets_crops_and_the_authors_pixels(name):
    options = recipe_config(name, steps_per_epoch=1).dataset_options
    assert options == {"image_size": "imagenet", **AUTHORS_PIXELS}


def test_the_recipes_crops_stay_with_its_own_data_set():
    other = recipe_config("paper-imagenet-bop", steps_per_epoch=1, dataset="mnist5k")
    assert other.dataset_options == {}  # mnist5k takes no image size


def test_data_set_options_given_add_to_the_recipes():
    split = recipe_config("paper-imagenet-bop", steps_per_epoch=1,
                          dataset_options={"val_split": 0.2})  # fmt: skip
    assert split.dataset_options == {"image_size": "imagenet", **AUTHORS_PIXELS, "val_split": 0.2}


def test_an_image_size_given_replaces_the_recipes_crops_and_is_recorded_as_an_override():
    resized = recipe_config("paper-imagenet-bop", steps_per_epoch=1,
                            dataset_options={"image_size": 64})  # fmt: skip
    assert resized.dataset_options == {"image_size": 64, **AUTHORS_PIXELS}
    assert resized.recipe_overrides == {"dataset_options": {"image_size": 64, **AUTHORS_PIXELS}}


def test_unknown_recipe_is_a_data_error():
    with pytest.raises(DataError, match="known: .*paper-cifar10-bop"):
        recipe_config("paper-mnist")


def test_recipes_command_lists_them_as_json():
    result = invoke("recipes", "--json")
    assert result.exit_code == 0, result.output
    recipes = json.loads(result.output)["recipes"]
    assert [r["name"] for r in recipes] == PAPER_RECIPES + LARQ_ZOO_RECIPES
    assert recipes[len(PAPER_RECIPES) - 1]["sources"]["epochs"].endswith("models/birealnet.py:74")
    assert recipes[-1]["sources"]["batch_size"].endswith("sota_experiments.py:18")


def test_train_with_a_recipe_and_overrides_records_the_resolved_schedule(tmp_path):
    from support.image_folders import write_image_folder

    # 60 training images of 16x16 at batch 3: an epoch of 20 steps in about a second (the
    # resolved schedule, not the data, is the test)
    data = write_image_folder(tmp_path / "data", per_class=20, size=(16, 16))
    out = tmp_path / "run"
    args = ["train", "--recipe", "paper-cifar10-bop", "--dataset", "imagefolder", "--data-dir",
            data, "--image-size", "16", "--model", "mnist-bnn", "--epochs", "1",
            "--batch-size", "3", "--out", out, "--json"]  # fmt: skip
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["threshold"] == 1e-8 and config["batch_size"] == 3 and config["epochs"] == 1
    # 500-epoch recipe run for 1 epoch: x0.1 every 100/500 epochs = every 4 of 20 steps
    assert config["gamma"] == "step:0.0001,0.1,4"
    assert config["recipe"] == "paper-cifar10-bop"
    assert config["recipe_overrides"] == {"dataset": "imagefolder", "model": "mnist-bnn",
                                          "epochs": 1, "batch_size": 3,
                                          "dataset_options": {"image_size": 16}}  # fmt: skip
    # --json keeps the note a terminal gets: the schedules run x0.002 as fast
    note = json.loads(result.stdout)["notes"]
    assert len(note) == 1 and "1 of its 500 epochs" in note[0] and "gamma" in note[0]
    assert json.loads((out / "train.json").read_text())["notes"] == note


def test_l2_first_last_regularises_the_xnornet_float_first_conv_and_last_dense():
    from torch import nn

    from bnnexport.models import create_model
    from bnnexport.nn.layers import BinaryConv2d, BinaryLinear
    from bnnexport.training.loop import first_and_last_weights

    model = create_model("xnornet", num_classes=10, input_shape=(3, 64, 64))
    first, last = first_and_last_weights(model)
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert first is layers[0].weight and last is layers[-1].weight
    assert not isinstance(layers[0], BinaryConv2d) and not isinstance(layers[-1], BinaryLinear)


@pytest.mark.parametrize("name", LARQ_ZOO_RECIPES)
def test_a_larq_zoo_recipe_trains_its_model_as_larq_zoo_did(name):
    """Adam on latent weights, the ImageNet crops, a larq-zoo training task as the source, and
    the top-1 the zoo lists for the model as the published number."""
    from bnnexport.models import model_info

    recipe = RECIPES[name]
    assert name == f"larq-zoo-{recipe.model}"
    assert (recipe.optimizer, recipe.dataset) == ("adam-latent", "imagefolder")
    assert recipe.source.startswith("larq-zoo, training/") and recipe.assumptions
    assert recipe.published.startswith(f"{model_info(recipe.model).top1} % top-1")
    recipe_config(name, steps_per_epoch=10)  # resolves to a TrainConfig


def test_binary_densenet28_lr_drops_tenfold_at_epochs_100_and_110():
    lr = parse_schedule(recipe_config("larq-zoo-binary-densenet28", steps_per_epoch=1000).lr)
    assert [lr(s) for s in (99_999, 100_000, 109_999, 110_000)] == pytest.approx(
        [4e-3, 4e-4, 4e-4, 4e-5]
    )


def test_real_to_binary_lr_warms_up_for_10_epochs_then_follows_a_cosine():
    config = recipe_config("larq-zoo-real-to-binary-net", steps_per_epoch=100)
    lr = parse_schedule(config.lr)
    assert lr(500) == pytest.approx(1e-4) and lr(1000) == pytest.approx(2e-4)
    # larq-zoo's decay: (75 - 10) epochs less the warm-up again, 55; half way at epoch 37.5
    assert lr(1000 + 2750) == pytest.approx(1e-4)
    assert lr(1000 + 5500) == 0.0 and lr(7499) == 0.0  # then 0 to the end


def test_a_compressed_step_decay_never_decays_below_the_recipes_floor():
    """77 steps per epoch, 1 of the 500 epochs: every 15.4 steps rounded to 15 gave a fifth
    decay at step 75 (γ 1e-9, below the recipe's 1e-8); rounded up, 16 gives the four."""
    config = recipe_config("paper-cifar10-bop", steps_per_epoch=77, epochs=1)
    gamma = parse_schedule(config.gamma)
    assert min(gamma(step) for step in range(77)) == pytest.approx(1e-8)


@pytest.mark.slow
def test_resume_with_more_epochs_rescales_a_recipes_schedules_and_says_so(tmp_path):
    """2 of the 500 epochs (γ x0.1 every 4 of 20 steps), resumed to 3: γ follows the recipe's
    course over 3 epochs (every 6 of 30 steps) from step 21 on, as the note says; kept, it
    decayed twice more, to 1e-10, below the recipe's floor of 1e-8."""
    from support.image_folders import write_image_folder

    data = write_image_folder(tmp_path / "data", per_class=10, size=(16, 16))  # 30 images
    out = tmp_path / "run"
    args = ["train", "--recipe", "paper-cifar10-bop", "--dataset", "imagefolder", "--data-dir",
            data, "--image-size", "16", "--model", "mnist-bnn", "--batch-size", "3",
            "--log-every", "1", "--out", out, "--json"]  # fmt: skip
    assert invoke(*args, "--epochs", "2").exit_code == 0
    resumed = invoke("train", "--out", out, "--resume", "--epochs", "3", "--json")
    assert resumed.exit_code == 0, resumed.output
    config = json.loads((out / "config.json").read_text())
    assert config["gamma"] == "step:0.0001,0.1,6"  # as a new 3-epoch run's
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    gammas = {r["step"]: r["bop.gamma"] for r in rows if r.get("kind") == "step"}
    assert gammas[20] == pytest.approx(1e-8) and gammas[21] == pytest.approx(1e-7)
    assert min(gammas.values()) == pytest.approx(1e-8)  # the recipe's floor, never below
    [resume] = [r for r in rows if r.get("kind") == "resume"]
    assert resume["changed"]["gamma"] == ["step:0.0001,0.1,4", "step:0.0001,0.1,6"]
    notes = json.loads(resumed.stdout)["notes"]
    assert any("its gamma schedule is the recipe's over 3 of its 500 epochs from step 21" in n
               and "gamma at step 21: 1e-09 -> 1e-07" in n for n in notes), notes  # fmt: skip


DEVIATION_TOPICS = {  # what every paper recipe states when it departs from the authors' code
    "padding": "pad", "BatchNorm's ε": "ε", "Bop's tie rule": "w·m equals τ",
}  # fmt: skip
CITED = re.compile(r"bnn_optimization/[\w/]+\.py(:\d+| `\w+`)")


@pytest.mark.parametrize("name", PAPER_RECIPES)
def test_a_paper_recipe_states_each_deviation_from_the_authors_code_with_its_line(name):
    """BinaryNet's pool/BN order and ε are the authors' (model_kwargs), every recipe evaluates
    with moving averages as Keras does; what differs is listed, each with a file and line."""
    recipe, config = RECIPES[name], recipe_config(name, steps_per_epoch=10)
    deviations = [a for a in recipe.assumptions if not a.startswith("published:")]
    assert deviations and all(CITED.search(a) for a in deviations), deviations
    topics = dict(DEVIATION_TOPICS)
    if recipe.model == "binarynet":  # the order and ε trained as the authors'
        assert config.model_kwargs == {"pool_first": True, "bn_eps": 1e-3, "bn_momentum": 0.01}
        topics.pop("BatchNorm's ε")
    else:
        topics["pool/BatchNorm order"] = "max-pool" if recipe.model != "birealnet18" else "ε"
    if recipe.optimizer == "adam-latent":
        topics.pop("Bop's tie rule")
    for topic, word in topics.items():
        assert any(word in a for a in deviations), (name, topic)
    assert config.bn_eval == "moving"


@pytest.mark.parametrize("name", LARQ_ZOO_RECIPES)
def test_a_larq_zoo_recipe_points_to_where_its_model_differs(name):
    assert any("says where it differs from larq-zoo's" in a for a in RECIPES[name].assumptions)
    assert recipe_config(name, steps_per_epoch=10).bn_eval == "moving"


def test_the_recipes_model_options_stay_with_its_own_model():
    other = recipe_config("paper-cifar10-bop", steps_per_epoch=1, model="mnist-bnn")
    assert other.model_kwargs == {}  # mnist-bnn has no pool_first


def test_bn_eval_given_overrides_the_recipes():
    from bnnexport.cli.train import train_command

    result = invoke("recipes", "--json")
    assert all(r["bn_eval"] == "moving" for r in json.loads(result.output)["recipes"])
    assert any(p.name == "bn_eval" for p in train_command.params)
    config = recipe_config("paper-cifar10-bop", steps_per_epoch=1, bn_eval="recalibrate")
    assert config.bn_eval == "recalibrate" and config.recipe_overrides == {"bn_eval": "recalibrate"}
