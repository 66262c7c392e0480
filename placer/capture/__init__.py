"""Capture PyTorch training steps as operation graphs.

:func:`capture` turns one training step (forward, loss, backward, optimizer update) of an
``nn.Module`` into a :class:`CapturedStep`: an aten-level ``OpGraph`` with costs, and the
fx module that runs it.
"""

from .optim import OPTIMIZERS, OptimizerSpec, optimizer_spec
from .trace import CapturedStep, StepLayout, capture

__all__ = ["capture", "CapturedStep", "StepLayout", "OPTIMIZERS", "OptimizerSpec", "optimizer_spec"]
