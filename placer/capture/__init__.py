"""Capture PyTorch training steps as operation graphs.

:func:`capture` turns one training step (forward, loss, backward, optimizer update) of an
``nn.Module`` into a :class:`CapturedStep`: an aten-level ``OpGraph`` with costs, and the
fx module that runs it. :func:`capture_spec` and :func:`load_model` take a model spec
(``zoo:NAME`` or ``path/to/file.py:FACTORY``).

Names load lazily so that importing this package (the ``placer`` command does) does
not import torch.
"""

from importlib import import_module
from typing import Any

__all__ = [
    "capture",
    "capture_spec",
    "load_model",
    "in_float64",
    "parse_spec",
    "spec_label",
    "step_name",
    "CapturedStep",
    "StepLayout",
    "OPTIMIZERS",
    "OptimizerSpec",
    "optimizer_spec",
]

_HOME = {
    "capture": "trace",
    "CapturedStep": "trace",
    "StepLayout": "trace",
    "step_name": "trace",
    "capture_spec": "spec",
    "load_model": "spec",
    "in_float64": "spec",
    "parse_spec": "spec",
    "spec_label": "spec",
    "OPTIMIZERS": "optim",
    "OptimizerSpec": "optim",
    "optimizer_spec": "optim",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
