"""Calling the user's model and data factories in a rank (``model.factory``, ``data.factory``).

Every failure is one sentence naming the key and its value (a ConfigError, which the rank reports
as its failure): the module cannot be imported, it has no such attribute, the attribute is not
callable, or what it returned is not what the engine trains on.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from engine.core.config.schema import ConfigError, DataConfig, ModelConfig
from engine.core.config.user_code import split_factory


def load_callable(key: str, value: str) -> Callable[..., Any]:
    module_name, attribute = split_factory(value)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # the user's module may raise anything while it imports
        raise ConfigError(
            f"{key} = {value!r}: importing {module_name} failed ({type(err).__name__}: {err})"
        ) from err
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{key} = {value!r}: module {module_name} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(
            f"{key} = {value!r}: {attribute} is a {type(target).__name__}, not something to call"
        )
    return target


def call_factory(key: str, value: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """``factory(**kwargs)``; what it raises becomes one sentence naming the key (the traceback
    keeps the rest)."""
    try:
        return factory(**kwargs)
    except Exception as err:
        arguments = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise ConfigError(
            f"{key} = {value!r}: calling it with ({arguments}) raised {type(err).__name__}: {err}"
        ) from err


def _accepts(function: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind == p.VAR_KEYWORD for p in parameters)


def build_user_model(config: ModelConfig, num_classes: int) -> nn.Module:
    """``model.factory(num_classes=..., **model.factory_args)``, checked to be an nn.Module."""
    factory = load_callable("model.factory", config.factory)
    kwargs = dict(config.factory_args)
    if _accepts(factory, "num_classes"):
        kwargs.setdefault("num_classes", num_classes)
    model = call_factory("model.factory", config.factory, factory, kwargs)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model.factory = {config.factory!r} returned a {type(model).__name__}; expected a "
            "torch.nn.Module"
        )
    return model


def user_datasets(config: DataConfig) -> tuple[Any, Any]:
    """``data.factory(**data.factory_args)``: (train, test) data sets of (input tensor, label)
    pairs, checked on their first sample."""
    factory = load_callable("data.factory", config.factory)
    returned = call_factory("data.factory", config.factory, factory, dict(config.factory_args))
    where = f"data.factory = {config.factory!r}"
    if not (isinstance(returned, (tuple, list)) and len(returned) == 2):
        raise ConfigError(
            f"{where} returned a {type(returned).__name__}; expected (train, test) data sets"
        )
    for split, dataset in zip(("train", "test"), returned, strict=True):
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise ConfigError(f"{where}: its {split} set has no len() and [] (not a data set)")
        if len(dataset) == 0:
            raise ConfigError(f"{where}: its {split} set is empty")
        sample = dataset[0]
        if not (
            isinstance(sample, (tuple, list))
            and len(sample) == 2
            and isinstance(sample[0], torch.Tensor)
        ):
            raise ConfigError(
                f"{where}: its {split} set's samples are {type(sample).__name__}; expected "
                "(input tensor, label) pairs"
            )
    return returned[0], returned[1]
