"""The zoo's registry: :class:`ZooEntry` records and the :func:`zoo_model` decorator.

A zoo factory is a plain function ``factory(batch_size, **size_options) -> (model, inputs)``
whose keyword defaults are the paper configuration. The decorator validates the batch
size and option values against those defaults, seeds torch inside a forked RNG state
(so building is deterministic and leaves the caller's RNG untouched) and records the
entry in :data:`ZOO`.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ...errors import OptionError

__all__ = ["ZOO", "ZooEntry", "zoo_model", "require", "SEED"]

SEED = 0
"""Seed of torch's RNG while a factory builds its model and inputs."""

Factory = Callable[..., tuple[nn.Module, tuple]]


@dataclass(frozen=True)
class ZooEntry:
    """One model of the zoo.

    Attributes
    ----------
    name : str
        Registry key (``zoo:NAME`` in model specs).
    factory : callable
        ``factory(batch_size, **size_options) -> (model, inputs)``; ``model(*inputs)`` is the
        scalar training loss (the loss function and labels are part of model and inputs).
    paper_batch : int
        Batch size the placement papers use for this model (see ``reference``).
    description : str
        One line on the architecture at its default size.
    size_options : Mapping[str, Any]
        Option names and their defaults (the paper configuration).
    tiny : Mapping[str, Any]
        Options giving a small configuration that trains in well under a second on a CPU.
    reference : str
        Where the default size and ``paper_batch`` come from.
    """

    name: str
    factory: Factory
    paper_batch: int
    description: str
    size_options: Mapping[str, Any]
    tiny: Mapping[str, Any]
    reference: str


ZOO: dict[str, ZooEntry] = {}
"""Every zoo model by name."""


def zoo_model(
    name: str, *, paper_batch: int, description: str, reference: str, tiny: Mapping[str, Any]
) -> Callable[[Factory], Factory]:
    """Register ``factory`` in :data:`ZOO` under ``name``; its keyword defaults are the size options."""

    def register(factory: Factory) -> Factory:
        defaults = {p.name: p.default for p in list(inspect.signature(factory).parameters.values())[1:]}
        unknown = sorted(set(tiny) - set(defaults))
        if unknown:
            raise TypeError(f"zoo model {name!r}: tiny configuration names unknown options {unknown}")

        def build(batch_size: int, **options: Any) -> tuple[nn.Module, tuple]:
            _check_batch(name, batch_size)
            _check_options(name, defaults, options)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(SEED)
                return factory(batch_size, **options)

        build.__name__ = factory.__name__
        build.__doc__ = factory.__doc__
        build.__wrapped__ = factory
        ZOO[name] = ZooEntry(
            name, build, paper_batch, description, MappingProxyType(defaults), MappingProxyType(dict(tiny)), reference
        )
        return build

    return register


def _check_batch(name: str, batch_size: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise OptionError(f"zoo model {name!r}: batch size must be a positive integer, got {batch_size!r}")


def _check_options(name: str, defaults: Mapping[str, Any], options: Mapping[str, Any]) -> None:
    """Each option must be known and of its default's kind: int > 0, float in [0, 1), bool."""
    for key, value in options.items():
        if key not in defaults:
            listed = ", ".join(f"{k}={v!r}" for k, v in defaults.items())
            raise OptionError(f"zoo model {name!r} has no size option {key!r}; its options: {listed}")
        default = defaults[key]
        if isinstance(default, bool):
            ok, want = isinstance(value, bool), "true or false"
        elif isinstance(default, float):
            ok = (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and 0.0 <= value < 1.0
            )
            want = "a number in [0, 1)"
        else:  # int, or None meaning "derived from the other options"
            ok = (value is None and default is None) or (
                isinstance(value, int) and not isinstance(value, bool) and value > 0
            )
            want = "a positive integer"
        if not ok:
            raise OptionError(f"zoo model {name!r}: size option {key!r} must be {want}, got {value!r}")


def require(name: str, condition: bool, message: str) -> None:
    """Raise :class:`OptionError` about zoo model ``name`` unless ``condition`` holds."""
    if not condition:
        raise OptionError(f"zoo model {name!r}: {message}")
