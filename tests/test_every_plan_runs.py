"""Every plan any registered algorithm returns trains, with and without micro-batches, equal to its oracle.

The contract behind ``place``: a plan it returns runs (issue "Every plan runs"). A small convolutional
network without batch norm, so that eager training on the whole batch is every plan's oracle: replicas
weight their gradients by their rows, micro-batches accumulate theirs, splits sum or join their parts.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from placer.algorithms import available_algorithms, place
from placer.api import apply
from placer.capture import capture
from placer.cluster import load_cluster
from placer.errors import OptionError
from placer.runtime.check import state_difference, train_eager

pytestmark = pytest.mark.usefixtures("one_thread")

#: Algorithms that replicate the step: a micro-batched step is not replicated (``place`` refuses it).
REPLICATING = ("data_parallel", "sharded_data_parallel")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.fc1 = nn.Linear(4 * 6 * 6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x, y):
        h = torch.relu(self.conv(x)).flatten(1)
        return nn.functional.cross_entropy(self.fc2(torch.tanh(self.fc1(h))), y)


@pytest.fixture(scope="module")
def step():
    torch.manual_seed(0)
    model = Net()
    inputs = (torch.randn(7, 2, 6, 6), torch.randint(0, 3, (7,)))  # 7 samples: no even share
    return model, inputs, capture(copy.deepcopy(model), inputs, optimizer="sgd", lr=0.05)


def _trains_as_eager(plan, model, inputs, captured):
    trained = copy.deepcopy(model)
    optimizer = captured.optimizer.eager(trained.parameters())
    plan.context["captured"] = captured
    placed = apply(plan, trained, optimizer)
    for _ in range(2):
        placed(*inputs)
    reference = copy.deepcopy(model)
    reference_optimizer = captured.optimizer.eager(reference.parameters())
    train_eager(reference, inputs, reference_optimizer, 2)
    worst, where, _ = state_difference(trained, optimizer, reference, reference_optimizer)
    assert worst <= 1e-6, f"{plan.algorithm}: {where} differs from eager training by {worst}"


@pytest.mark.parametrize("microbatches", [None, 3])
@pytest.mark.parametrize("algorithm", available_algorithms())
def test_every_plan_trains_as_eager(step, algorithm, microbatches):
    model, inputs, captured = step
    cluster = load_cluster("2xcpu")
    if microbatches and algorithm in REPLICATING:
        with pytest.raises(OptionError, match="replicas of a micro-batched step do not run"):
            place(captured.graph, cluster, algorithm, microbatches=microbatches)
        return
    plan = place(captured.graph, cluster, algorithm, time_limit=4, seed=0, microbatches=microbatches)
    if microbatches:
        assert plan.rewritten_graph.extra["microbatches"]["count"] == microbatches
    _trains_as_eager(plan, model, inputs, captured)
