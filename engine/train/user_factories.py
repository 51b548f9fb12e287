"""Calling the user's model and data factories in a rank (``model.factory``, ``data.factory``).

Every failure is one sentence naming the key and its value (a ConfigError, which the rank reports
as its failure): the module cannot be imported, it has no such attribute, the attribute is not
callable, or what it returned is not what the engine trains on.
"""

from __future__ import annotations

import importlib
import inspect
import numbers
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
    except SystemExit as err:  # not an Exception: it would end the rank with no word of why
        raise ConfigError(
            f"{key} = {value!r}: importing {module_name} called sys.exit({err.code!r}); a module "
            "the engine imports must not exit"
        ) from None
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
    arguments = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    try:
        return factory(**kwargs)
    except SystemExit as err:
        raise ConfigError(
            f"{key} = {value!r}: calling it with ({arguments}) called sys.exit({err.code!r})"
        ) from None
    except Exception as err:
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


def user_datasets(config: DataConfig, num_classes: int | None = None) -> tuple[Any, Any]:
    """``data.factory(**data.factory_args)``: (train, test) data sets of (input tensor, label)
    pairs, checked before any training on their first samples (``check_samples``)."""
    factory = load_callable("data.factory", config.factory)
    returned = call_factory("data.factory", config.factory, factory, dict(config.factory_args))
    where = f"data.factory = {config.factory!r}"
    if not (isinstance(returned, (tuple, list)) and len(returned) == 2):
        raise ConfigError(
            f"{where} returned a {type(returned).__name__}; expected (train, test) data sets"
        )
    check_samples(where, returned[0], returned[1], num_classes)
    return returned[0], returned[1]


def check_samples(where: str, train: Any, test: Any, num_classes: int | None) -> None:
    """One sentence naming the key and what it returned, instead of torch's own error deep in a
    DataLoader or the model: each set must have a length and [], and its first two samples must
    be (input tensor, integer label in 0..num_classes-1) pairs whose inputs have one shape."""
    shape = None
    for split, dataset in (("train", train), ("test", test)):
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise ConfigError(f"{where}: its {split} set has no len() and [] (not a data set)")
        if len(dataset) == 0:
            raise ConfigError(f"{where}: its {split} set is empty")
        for index in range(min(2, len(dataset))):
            sample = dataset[index]
            said = f"{where}: its {split} set's sample {index}"
            if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
                raise ConfigError(
                    f"{where}: its {split} set's samples are {type(sample).__name__}; expected "
                    "(input tensor, label) pairs"
                )
            inputs, label = sample
            if not isinstance(inputs, torch.Tensor):
                raise ConfigError(f"{said} has {_kind(inputs)} as its input; expected a tensor")
            if shape is not None and tuple(inputs.shape) != shape:
                raise ConfigError(
                    f"{said} has an input of shape {tuple(inputs.shape)}, the first train sample "
                    f"{shape}; every input must have one shape"
                )
            shape = tuple(inputs.shape)
            _check_label(said, label, num_classes)


def _check_label(said: str, label: Any, num_classes: int | None) -> None:
    if isinstance(label, torch.Tensor):
        if label.numel() != 1 or label.dtype.is_floating_point or label.dtype == torch.bool:
            raise ConfigError(
                f"{said} has a {label.dtype} tensor of shape {tuple(label.shape)} as its label; "
                "expected one integer class"
            )
        value = int(label.item())
    elif isinstance(label, numbers.Integral) and not isinstance(label, bool):
        value = int(label)
    else:  # a float, a str, a bool: what a loss would choke on
        raise ConfigError(f"{said} has {_kind(label)} as its label; expected an integer class")
    if num_classes is not None and not 0 <= value < num_classes:
        raise ConfigError(
            f"{said} has label {value}, outside 0..{num_classes - 1} (model.num_classes = "
            f"{num_classes})"
        )


def _kind(value: Any) -> str:
    """What a value is, in a few words: "a str ('cat')", "a tuple of 2"."""
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    text = repr(value)
    return f"a {type(value).__name__} ({text[:40]}{'…' if len(text) > 40 else ''})"
