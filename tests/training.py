"""Tiny zoo models trained placed (in process or on gloo ranks) and eagerly, and the comparison of what they end with: shared by the
tests of replicated and micro-batched plans."""

from __future__ import annotations

import copy

import torch

from placer.api import apply
from placer.capture import capture
from placer.capture.spec import in_float64, load_model
from placer.capture.zoo.registry import ZOO
from placer.runtime.check import state_difference, train_eager
from placer.runtime.distributed import run_distributed
from placer.runtime.replicas import replica_steps

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
        model, inputs = in_float64(model, inputs)
    return model, inputs, capture(copy.deepcopy(model), inputs, optimizer=optimizer, lr=0.01)


def placed_training(plan, model, inputs, captured, steps=2):
    """Train a copy of ``model`` with ``placer.apply``; the model and its optimizer."""
    model = copy.deepcopy(model)
    optimizer = captured.optimizer.eager(model.parameters())
    step = apply(plan, model, optimizer)
    for _ in range(steps):
        step(*inputs)
    return model, optimizer


def distributed_training(plan, cluster, model, inputs, captured, steps=2, timeout_s=120, **options):
    """Train a copy of ``model`` by ``plan`` on a process per device of ``cluster`` over gloo (the replicas'
    and micro-batches' steps traced on their rows): ``((model, optimizer), result)``, the run's
    :class:`~placer.runtime.distributed.DistributedResult` beside them. ``options`` go to ``run_distributed``
    (``start_method``)."""
    model = copy.deepcopy(model)
    optimizer = captured.optimizer.eager(model.parameters())
    flat = captured.step_inputs(model, inputs, optimizer)
    result = run_distributed(
        captured.gm,
        captured.graph,
        plan,
        cluster,
        flat,
        steps=steps,
        carrier=captured.carrier,
        timeout_s=timeout_s,
        replica_steps=replica_steps(captured, plan),
        **options,
    )
    captured.write_back([result.state.get(k, v) for k, v in enumerate(flat)], model, optimizer)
    return (model, optimizer), result


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
