"""`bnnexport recipes`."""

from __future__ import annotations

import json

import click

from bnnexport.cli.common import handle_errors, json_option


@click.command("recipes")
@json_option
@handle_errors
def recipes_command(as_json: bool) -> None:
    """The paper's training recipes that `bnnexport train --recipe NAME` loads.

    Schedules are listed in epochs ('step:G0,FACTOR,EVERY_EPOCHS', 'linear:START,END,EPOCHS');
    train resolves them to optimizer steps for the data set and batch size it runs with, and
    scales them when --epochs differs, keeping their shape. Each recipe names its source, the
    number published for it, where each hyperparameter comes from (the file and line of
    the authors' code, plumerai/rethinking-bnn-optimization; `sources` in --json), the model
    options and BatchNorm evaluation it trains with, and every way it departs from that code
    or assumes what the code does not say, each with its line (`assumptions` in --json).
    """
    from bnnexport.datasets.imagefolder import IMAGENET
    from bnnexport.training.recipes import CODE, RECIPES

    if as_json:
        click.echo(json.dumps({"recipes": [r.to_json() for r in RECIPES.values()]}))
        return
    for recipe in RECIPES.values():
        click.echo(f"{recipe.name}: {recipe.description}")
        click.echo(
            f"    {recipe.model} on {recipe.dataset}, {recipe.optimizer}, {recipe.epochs} epochs, "
            f"batch {recipe.batch_size}; γ {recipe.gamma}, τ {recipe.threshold}, lr {recipe.lr}"
        )
        if recipe.dataset_options.get("image_size") == IMAGENET:
            click.echo("    images: ImageNet's random-resized 224 crops (--image-size imagenet)")
        options = {"bn_eval": recipe.bn_eval, **recipe.dataset_options, **recipe.model_kwargs}
        options.pop("image_size", None)
        click.echo("    trains with: " + ", ".join(f"{k}={v}" for k, v in options.items()))
        click.echo(f"    published: {recipe.published} ({recipe.source})")
        for assumption in recipe.assumptions:
            click.echo(f"    differs or assumed: {assumption}")
        for key, source in recipe.sources.items():
            click.echo(f"    {key}: {source.replace(CODE, '')}")
    click.echo(f"(file:line in {CODE.split()[0]}, {CODE.split()[1]})")
