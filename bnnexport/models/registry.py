"""Model registry, timm-style: `@register_model` on a factory, `create_model(name, ...)`.

A factory takes `num_classes` and `input_shape` (C, H, W) keyword arguments (plus its own) and
returns an `nn.Module`. `create_model` records how the model was built in `model.bnnexport_config`
so a checkpoint can rebuild it.

Example:
    >>> from bnnexport.models import create_model, list_models
    >>> "mnist-bnn" in list_models()
    True
    >>> model = create_model("mnist-bnn")
    >>> model.bnnexport_config["input_shape"]
    [1, 28, 28]
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from bnnexport.errors import ConfigError
from bnnexport.imports import call_with_accepted, import_object, is_import_string


@dataclass(frozen=True)
class ModelInfo:
    """What the registry knows about a model before building it."""

    name: str
    factory: Callable[..., nn.Module]
    num_classes: int
    input_shape: tuple[int, int, int]
    description: str
    top1: float | None = None  # the published top-1 accuracy (%) of the architecture
    top1_source: str = ""  # where `top1` is published
    # layout arguments the factory gained after checkpoints of the model existed: name ->
    # (what a new model is built with, what a checkpoint that does not record it was built
    # with). `create_model` records the first, `model_kwargs_of` assumes the second
    layout: dict[str, tuple[Any, Any]] = field(default_factory=dict)


_MODELS: dict[str, ModelInfo] = {}


def register_model(
    name: str,
    *,
    num_classes: int,
    input_shape: tuple[int, int, int],
    top1: tuple[float, str] | None = None,
    layout: dict[str, tuple[Any, Any]] | None = None,
) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator registering a model factory with its native number of classes and input shape,
    `top1`: (the published top-1 accuracy in %, where it is published), and `layout`:
    {argument: (value for new models, value of checkpoints that do not record it)}."""

    def decorate(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        doc = (factory.__doc__ or "").strip().splitlines()
        accuracy, source = top1 if top1 is not None else (None, "")
        _MODELS[name] = ModelInfo(
            name, factory, num_classes, tuple(input_shape), doc[0] if doc else "",
            accuracy, source, dict(layout or {}),
        )  # fmt: skip
        return factory

    return decorate


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a shell-style pattern."""
    return sorted(n for n in _MODELS if fnmatch.fnmatch(n, pattern))


def model_info(name: str) -> ModelInfo:
    """The registry entry of `name`; ValueError naming the known models when unknown."""
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(list_models())}")
    return _MODELS[name]


def create_model(
    name: str,
    num_classes: int | None = None,
    input_shape: tuple[int, int, int] | list[int] | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build a registered model; defaults are the model's native classes and input shape.

    `name` may also be an import string, `module:factory` (`bnnexport.imports`): a factory of
    your own, given `num_classes`, `input_shape` and `kwargs` as far as its signature takes
    them (ConfigError when it does not import or does not return an `nn.Module`).
    """
    if is_import_string(name):
        return _create_imported(name, num_classes, input_shape, **kwargs)
    info = model_info(name)
    kwargs = {**{k: now for k, (now, _) in info.layout.items()}, **kwargs}  # recorded below
    num_classes = info.num_classes if num_classes is None else int(num_classes)
    shape = tuple(int(v) for v in (input_shape or info.input_shape))
    if len(shape) != 3:
        raise ValueError(f"input_shape must be (channels, height, width), got {shape}")
    model = info.factory(num_classes=num_classes, input_shape=shape, **kwargs)
    model.bnnexport_config = {
        "name": name,
        "num_classes": num_classes,
        "input_shape": list(shape),
        **kwargs,
    }
    return model


def recorded_kwargs(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments a checkpoint's model was built with: its recorded `kwargs`, and for each
    `ModelInfo.layout` argument it does not record, the value models had before it was
    recorded, so an old run rebuilds the model it trained (`bnnexport.run.checkpoint`).

    Example:
        >>> recorded_kwargs("birealnet18", {"num_classes": 10})["padding_style"]
        'torch'
    """
    if is_import_string(name) or name not in _MODELS:
        return dict(kwargs)
    return {**{k: before for k, (_, before) in _MODELS[name].layout.items()}, **kwargs}


def _create_imported(
    name: str,
    num_classes: int | None,
    input_shape: tuple[int, int, int] | list[int] | None,
    **kwargs: Any,
) -> nn.Module:
    factory = import_object(name, "--model")
    given: dict[str, Any] = dict(kwargs)
    if num_classes is not None:
        given["num_classes"] = int(num_classes)
    if input_shape is not None:
        given["input_shape"] = tuple(int(v) for v in input_shape)
    model = call_with_accepted(factory, f"--model {name}", **given)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"--model {name} returned {type(model).__name__}, not an nn.Module")
    # what a checkpoint needs to build it again; the shape is known only from the data
    config = {"name": name, **kwargs}
    if num_classes is not None:
        config["num_classes"] = int(num_classes)
    if input_shape is not None:
        config["input_shape"] = [int(v) for v in input_shape]
    model.bnnexport_config = config
    return model
