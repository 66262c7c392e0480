"""Data-parallel, sharded and hybrid plans trained for real, against eager PyTorch and torch's own DDP."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from placer.algorithms import place
from placer.api import apply
from placer.capture import capture
from placer.cli import main
from placer.cluster import load_cluster
from placer.errors import InvalidPlanError, OptionError
from placer.plan import Plan
from placer.runtime.ddp import run_ddp
from placer.runtime.program import compile_program
from placer.runtime.replicas import batch_coupled, replica_steps
from placer.transform.replicate import data_parallel_graph

from .training import TOLERANCE, assert_equal, distributed_training, eager_training, placed_training, tiny

pytestmark = pytest.mark.usefixtures("one_thread")


def ddp_training(model, inputs, captured, replicas, steps=2, zero=False):
    result = run_ddp(model, inputs, captured.optimizer, replicas, steps=steps, zero=zero, timeout_s=60)
    model = copy.deepcopy(model)
    model.load_state_dict(result.model_state)
    optimizer = captured.optimizer.eager(model.parameters())
    optimizer.load_state_dict(result.optimizer_state)
    return model, optimizer


@pytest.mark.parametrize(
    "name, batch, cluster, algorithm, collective, optimizer",
    [
        ("lenet", 6, "2xcpu", "data_parallel", "ring", "sgd"),
        ("lenet", 5, "2xcpu", "data_parallel", "ring", "adam"),  # uneven: 3 and 2 samples
        ("lenet", 7, "4xcpu", "data_parallel", "direct", "sgd"),
        ("lenet", 6, "2xcpu", "sharded_data_parallel", "ring", "adam"),
        ("lenet", 7, "4xcpu", "sharded_data_parallel", "direct", "adam"),
        ("rnnlm", 5, "2xcpu", "data_parallel", "ring", "adam"),  # LSTM cells
        ("transformer", 4, "2xcpu", "sharded_data_parallel", "ring", "sgd"),  # attention, tied embeddings
        ("gpt2", 5, "2xcpu", "data_parallel", "best", "adam"),
    ],
)
def test_replicated_plans_train_as_eager_pytorch(name, batch, cluster, algorithm, collective, optimizer):
    """Without batch norm, the replicas' weighted gradients are the whole batch's: eager training is the oracle,
    whether the batch divides or not."""
    model, inputs, captured = tiny(name, batch, optimizer)
    assert not batch_coupled(captured.gm)
    plan = place(captured.graph, load_cluster(cluster), algorithm, collective=collective)
    assert plan.rewritten_graph.extra["data_parallel"]["replicas"] == load_cluster(cluster).num_devices
    # Adam moves a parameter by about lr whatever its gradient's size: rounding shows at lr's scale.
    assert_equal(
        placed_training(plan, model, inputs, captured),
        eager_training(model, inputs, captured),
        tolerance=TOLERANCE if optimizer == "sgd" else 1e-4,
    )


@pytest.mark.parametrize("algorithm", ["data_parallel", "sharded_data_parallel"])
def test_distributed_replicas_equal_torch_ddp_and_zero(algorithm):
    """One process per replica over gloo, against DDP (with ZeroRedundancyOptimizer) on the same ranks."""
    model, inputs, captured = tiny("lenet", 6, "adam")
    cluster = load_cluster("2xcpu")
    plan = place(captured.graph, cluster, algorithm)
    trained, result = distributed_training(plan, cluster, model, inputs, captured, timeout_s=60)
    reference = ddp_training(model, inputs, captured, 2, zero=algorithm == "sharded_data_parallel")
    assert_equal(trained, reference)
    first = eager_training(model, inputs, captured, 1)[0]
    assert abs(float(result.outputs[0]) - float(first(*inputs).detach())) < 1e-5


def test_batch_norm_replicas_equal_ddp_and_keep_rank_zeros_buffers():
    """Batch norm sees a replica's rows, as under DDP: its training (running statistics included) is DDP's."""
    model, inputs, captured = tiny("resnet50", 16)
    assert batch_coupled(captured.gm)
    plan = place(captured.graph, load_cluster("2xcpu"), "data_parallel")
    assert_equal(
        placed_training(plan, model, inputs, captured), ddp_training(model, inputs, captured, 2), tolerance=1e-5
    )


def test_replicas_with_split_operations_run_as_planned():
    """OS-DPOS started from replicas splits operations of a replica: the plan runs and trains as DDP does."""
    model, inputs, captured = tiny("resnet50", 16)
    plan = place(captured.graph, load_cluster("2xV100-nvlink"), "os_dpos", data_parallel_start=True)
    target = plan.rewritten_graph
    assert "data_parallel" in target.extra and any("split_of" in extra for extra in target.node_extra)
    assert_equal(
        placed_training(plan, model, inputs, captured), ddp_training(model, inputs, captured, 2), tolerance=1e-5
    )


def test_distributed_replicas_with_splits_reduce_with_torch_collectives_as_ddp():
    """One process per replica: each bucket is one torch.distributed all-reduce, started when it is packed."""
    from placer.runtime.replicas import all_reduce_start

    model, inputs, captured = tiny("resnet50", 16)
    cluster = load_cluster("2xV100-nvlink")
    plan = place(captured.graph, cluster, "os_dpos", data_parallel_start=True)
    steps = replica_steps(captured, plan)
    program = compile_program(
        captured.gm, captured.graph, plan, cluster, carrier=captured.carrier, replica_steps=steps, collectives="torch"
    )
    buckets = plan.rewritten_graph.extra["data_parallel"]["buckets"]
    assert sum(v.target is all_reduce_start for v in program.schedule) == 2 * buckets
    trained, _ = distributed_training(plan, cluster, model, inputs, captured, timeout_s=60)
    assert_equal(trained, ddp_training(model, inputs, captured, 2), tolerance=1e-5)


def test_auto_plans_are_applied_whatever_they_replicate():
    model, inputs, captured = tiny("lenet", 8)
    plan = place(captured.graph, load_cluster("4xV100-nvlink"), "auto", time_limit=5)
    assert_equal(placed_training(plan, model, inputs, captured), eager_training(model, inputs, captured))


def test_a_replicated_step_needs_the_replicas_traced_steps():
    model, inputs, captured = tiny("lenet", 6)
    cluster = load_cluster("2xcpu")
    plan = place(captured.graph, cluster, "data_parallel")
    with pytest.raises(InvalidPlanError, match=r"traced on 3 samples was not given \(replica_steps"):
        compile_program(captured.gm, captured.graph, plan, cluster, carrier=captured.carrier)
    program = compile_program(
        captured.gm,
        captured.graph,
        plan,
        cluster,
        carrier=captured.carrier,
        replica_steps=replica_steps(captured, plan),
    )
    assert program.num_flat == len([v for v in captured.gm.graph.nodes if v.op == "placeholder"])
    assert [feed.rows for feed in program.feeds if feed.rows] == [(0, 3), (0, 3), (3, 6), (3, 6)]


def test_inputs_without_a_leading_batch_are_refused_naming_the_input():
    class TimeMajor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 1)

        def forward(self, x, y):  # x: (time, batch, features), y: (batch,)
            return ((self.linear(x).mean(0).squeeze(1) - y) ** 2).mean()

    model = TimeMajor()
    inputs = (torch.randn(5, 4, 3), torch.randn(4))  # the capture takes the first input's 5 as the batch
    captured = capture(model, inputs, optimizer="sgd")
    graph = captured.graph
    replicated = data_parallel_graph(graph, 2).graph
    plan = Plan.from_arrays(
        graph, load_cluster("2xcpu"), np.zeros(replicated.num_nodes, dtype=int), placed_graph=replicated
    )
    with pytest.raises(
        InvalidPlanError,
        match=r"input 'input_1' of the step has shape \(4,\), which does not "
        r"lead with the batch \(5 samples\)",
    ):
        apply(plan, model, torch.optim.SGD(model.parameters(), lr=0.1))(*inputs)


def test_a_model_that_traces_otherwise_on_fewer_rows_is_refused():
    model, inputs, captured = tiny("gpt2", 5)
    plan = place(captured.graph, load_cluster("4xcpu"), "data_parallel")  # 2, 1, 1, 1 samples
    with pytest.raises(InvalidPlanError, match="traced on 1 of its 5 samples has other operations"):
        replica_steps(captured, plan)


def test_run_verify_names_its_oracle_and_refuses_a_case_without_one(tmp_path, capsys):
    from placer.capture import capture_spec

    spec = "zoo:lenet"
    graph = tmp_path / "g.json"
    capture_spec(spec, 6, optimizer="sgd").graph.save(graph)
    assert (
        main(
            ["plan", str(graph), "--cluster", "2xcpu", "--algorithm", "data_parallel", "-o", str(tmp_path / "dp.json")]
        )
        == 0
    )
    capsys.readouterr()
    code = main(
        [
            "run",
            spec,
            "--batch",
            "6",
            "--optimizer",
            "sgd",
            "--plan",
            str(tmp_path / "dp.json"),
            "--backend",
            "distributed",
            "--steps",
            "2",
            "--verify",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "equal torch DDP on 2 ranks within 1e-06" in out and "equal eager training on cpu" in out
    spec = "zoo:resnet50?depth=14&image_size=32&width=4&classes=10"
    capture_spec(spec, 5, optimizer="sgd").graph.save(graph)
    assert (
        main(
            ["plan", str(graph), "--cluster", "2xcpu", "--algorithm", "data_parallel", "-o", str(tmp_path / "bn.json")]
        )
        == 0
    )
    capsys.readouterr()
    code = main(
        [
            "run",
            spec,
            "--batch",
            "5",
            "--optimizer",
            "sgd",
            "--plan",
            str(tmp_path / "bn.json"),
            "--steps",
            "1",
            "--verify",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--verify has no oracle for this plan" in err and "training 1 steps" not in err


def test_ddp_refuses_a_batch_smaller_than_its_replicas():
    model, inputs, captured = tiny("lenet", 2)
    with pytest.raises(OptionError, match="at least 4 samples"):
        run_ddp(model, inputs, captured.optimizer, 4)


def _torchrun_rank(rank: int, port: int, model, inputs, captured, plan, out: str) -> None:
    """One rank as torchrun starts it: only the environment says who it is."""
    import os

    from placer.runtime.distributed import run_under_torchrun

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
    )
    model = copy.deepcopy(model)
    flat = captured.step_inputs(model, inputs, captured.optimizer.eager(model.parameters()))
    result = run_under_torchrun(
        captured.gm,
        captured.graph,
        plan,
        load_cluster("2xcpu"),
        flat,
        steps=2,
        carrier=captured.carrier,
        timeout_s=30,
        replica_steps=replica_steps(captured, plan),
    )
    if result is not None:
        torch.save(result.state, out)


def test_ranks_started_by_torchrun_train_a_sharded_plan(tmp_path):
    import torch.multiprocessing as mp

    from placer.runtime.distributed import free_port

    model, inputs, captured = tiny("lenet", 5, "adam")
    plan = place(captured.graph, load_cluster("2xcpu"), "sharded_data_parallel")
    out = str(tmp_path / "state.pt")
    mp.start_processes(
        _torchrun_rank, args=(free_port(), model, inputs, captured, plan, out), nprocs=2, start_method="fork"
    )
    trained = copy.deepcopy(model)
    optimizer = captured.optimizer.eager(trained.parameters())
    flat = captured.step_inputs(trained, inputs, optimizer)
    state = torch.load(out, weights_only=False)
    captured.write_back([state.get(k, v) for k, v in enumerate(flat)], trained, optimizer)
    assert_equal((trained, optimizer), eager_training(model, inputs, captured), tolerance=1e-4)
