"""Tiny zoo models trained placed and eagerly, and the comparison of what they end with: shared by the
tests of replicated and micro-batched plans."""

from __future__ import annotations

import copy

import torch

from placer.api import apply
from placer.capture import capture
from placer.capture.spec import load_model
from placer.capture.zoo.registry import ZOO
from placer.runtime.check import state_difference, train_eager

TOLERANCE = 1e-6


def tiny(name: str, batch: int, optimizer: str = "sgd", double: bool = False, **options):
    """A zoo model at its tiny size (dropout off: a replica or micro-batch draws its own numbers), its inputs
    and its captured step, in float64 where ``double``."""
    sizes = {**ZOO[name].tiny, **options}
    if "dropout" in ZOO[name].size_options:
        sizes["dropout"] = 0.0
    spec = f"zoo:{name}?" + "&".join(f"{k}={v}" for k, v in sizes.items())
    torch.manual_seed(0)
    model, inputs = load_model(spec, batch)
    if double:
        model = model.double()
        inputs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    return model, inputs, capture(copy.deepcopy(model), inputs, optimizer=optimizer, lr=0.01)


def placed_training(plan, model, inputs, captured, steps=2):
    """Train a copy of ``model`` with ``placer.apply``; the model and its optimizer."""
    model = copy.deepcopy(model)
    optimizer = captured.optimizer.eager(model.parameters())
    step = apply(plan, model, optimizer)
    for _ in range(steps):
        step(*inputs)
    return model, optimizer


def eager_training(model, inputs, captured, steps=2):
    """Train a copy of ``model`` eagerly on the whole batch; the model and its optimizer."""
    model = copy.deepcopy(model)
    optimizer = captured.optimizer.eager(model.parameters())
    train_eager(model, inputs, optimizer, steps)
    return model, optimizer


def assert_equal(trained, reference, tolerance=TOLERANCE, at_least=10):
    """Every parameter, buffer and optimizer state of ``trained`` within ``tolerance`` of ``reference``'s, over
    at least ``at_least`` tensors."""
    worst, where, count = state_difference(*trained, *reference)
    assert count >= at_least
    assert worst <= tolerance, f"{where} differs by {worst}"
