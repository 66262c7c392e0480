"""Micro-batched plans against torch.distributed.pipelining running the same stages: the oracle for batch norm.

A small convolutional network with batch norm, as ``nn.Sequential``: placer's
``gpipe`` and ``1f1b`` plans over two gloo ranks, their cut given
(``stages=``), train as ``ScheduleGPipe`` and ``Schedule1F1B`` do over the
same two stages and micro-batches: each micro-batch normalised by its own
statistics, the running statistics updated once per micro-batch.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from placer.algorithms import place
from placer.capture import capture
from placer.cluster import load_cluster
from placer.errors import OptionError
from placer.runtime.check import state_difference
from placer.runtime.pipelining import run_pipelining

from .training import distributed_training

pytest.importorskip("torch.distributed.pipelining", reason="this torch has no torch.distributed.pipelining")

TOLERANCE = 1e-6
BATCH = 6
STEPS = 2
#: The layer that starts the second stage.
CUT = "conv2"

pytestmark = pytest.mark.usefixtures("one_thread")


class Classifier(nn.Module):
    """``cross_entropy(body(images), labels)``: the step placer captures; torch's stages cut ``body``."""

    def __init__(self, body: nn.Sequential):
        super().__init__()
        self.body = body

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.body(images), labels)


def network() -> Classifier:
    torch.manual_seed(0)
    return Classifier(
        nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(3, 4, 3, padding=1),
                bn1=nn.BatchNorm2d(4),
                relu1=nn.ReLU(),
                conv2=nn.Conv2d(4, 8, 3, padding=1, stride=2),
                bn2=nn.BatchNorm2d(8),
                relu2=nn.ReLU(),
                flatten=nn.Flatten(),
                fc=nn.Linear(8 * 4 * 4, 5),
            )
        )
    )


def torch_stages(body: nn.Sequential, first: str) -> list[nn.Sequential]:
    """``body`` in two stages, the second from layer ``first`` on: each a copy with the other stage's
    layers made identities, so that its state keeps ``body``'s names."""
    names = list(body._modules)
    cut = names.index(first)
    stages = []
    for kept in (names[:cut], names[cut:]):
        stage = copy.deepcopy(body)
        for name in names:
            if name not in kept:
                setattr(stage, name, nn.Identity())
        stages.append(stage)
    return stages


@pytest.mark.parametrize("schedule, microbatches", [("gpipe", 3), ("1f1b", 3), ("1f1b", 2)])
def test_a_micro_batched_plan_trains_as_torch_pipelining(schedule, microbatches):
    torch.manual_seed(1)
    images, labels = torch.randn(BATCH, 3, 8, 8), torch.randint(5, (BATCH,))
    model = network()
    captured = capture(copy.deepcopy(model), (images, labels), optimizer="sgd", lr=0.1)
    cluster = load_cluster("2xcpu")
    plan = place(captured.graph, cluster, schedule, microbatches=microbatches, stages=f"body.{CUT}")
    placed = plan.rewritten_graph
    devices: dict[str, set[str]] = {}
    for node, layer in zip(placed.ids, placed.layer):
        devices.setdefault(layer, set()).add(plan.placement[node])
    assert devices["body.conv1"] == devices["body.bn1"] == {"cpu0"}
    assert devices["body.conv2"] == devices["body.bn2"] == devices["body.fc"] == {"cpu1"}

    (trained, optimizer), _ = distributed_training(plan, cluster, model, (images, labels), captured, steps=STEPS)

    theirs = run_pipelining(
        torch_stages(model.body, CUT),
        (images,),
        labels,
        F.cross_entropy,
        captured.optimizer,
        microbatches,
        schedule=schedule,
        steps=STEPS,
        timeout_s=120,
    )
    names = list(model.body._modules)
    reference = copy.deepcopy(model)
    state = {}
    for stage, kept in zip(theirs.states, (names[: names.index(CUT)], names[names.index(CUT) :])):
        state.update({f"body.{k}": v for k, v in stage.items() if k.split(".")[0] in kept})
    assert set(state) == set(reference.state_dict())
    # torch's pipelining counts batch norm's batches once per micro-batch, a placed step once per step; the
    # counter moves nothing here (momentum is set), every other tensor must agree.
    for name, value in state.items():
        if name.endswith("num_batches_tracked"):
            assert int(value) == STEPS * microbatches
            assert int(trained.state_dict()[name]) == STEPS
            state[name] = trained.state_dict()[name]
    reference.load_state_dict(state)
    worst, where, count = state_difference(trained, None, reference, None)
    assert count == len(state) >= 12
    assert worst <= TOLERANCE, f"{where} differs by {worst}"
    # The oracle is not blind: batch norm over the whole batch trains otherwise.
    eager = copy.deepcopy(model)
    eager_optimizer = captured.optimizer.eager(eager.parameters())
    for _ in range(STEPS):
        eager_optimizer.zero_grad(set_to_none=True)
        eager(images, labels).backward()
        eager_optimizer.step()
    assert state_difference(trained, None, eager, None)[0] > 100 * TOLERANCE


@pytest.mark.parametrize(
    "stages, message",
    [
        ("body.nope", "names 'body.nope', which is no layer of the step"),
        ("body.fc,body.conv2", "gives 3 stages, but the cluster has 2 devices"),
        ("body.conv1", "must name layers in forward order"),
        ("body.conv2,", "must be layer names separated by commas"),
    ],
)
def test_a_given_cut_that_names_no_stages_is_refused(stages, message):
    """A cut the step does not have is one clear line, before any planning."""
    captured = capture(network(), (torch.randn(4, 3, 8, 8), torch.randint(5, (4,))), optimizer="sgd", lr=0.1)
    with pytest.raises(OptionError, match=message):
        place(captured.graph, load_cluster("2xcpu"), "1f1b", microbatches=2, stages=stages)
