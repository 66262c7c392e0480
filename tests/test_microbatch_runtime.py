"""Micro-batched plans trained for real: against eager gradient accumulation, and eager training without batch norm."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from placer.algorithms import place
from placer.algorithms.common import placement_units
from placer.capture.zoo.registry import ZOO
from placer.cli import main
from placer.cluster import load_cluster
from placer.errors import InvalidPlanError, OptionError
from placer.plan import Plan
from placer.runtime.check import state_difference, train_accumulated
from placer.runtime.program import compile_program
from placer.runtime.replicas import batch_coupled, replica_steps
from placer.transform.microbatch import microbatch_graph
from placer.transform.split import split_operation

from .training import TOLERANCE, assert_equal, distributed_training, eager_training, placed_training, tiny

pytestmark = pytest.mark.usefixtures("one_thread")


def accumulated(model, inputs, captured, rows, steps=2):
    model = copy.deepcopy(model)
    optimizer = captured.optimizer.eager(model.parameters())
    train_accumulated(model, inputs, optimizer, steps, rows)
    return model, optimizer


def rows_of(plan):
    return [tuple(r) for r in plan.rewritten_graph.extra["microbatches"]["rows"]]


def assert_trains_as_accumulation(plan, model, inputs, captured, optimizer: str, double: bool) -> None:
    """The local executor's training of ``plan`` equals eager gradient accumulation over its micro-batches, and,
    where no operation couples the samples, eager training on the whole batch."""
    trained = placed_training(plan, model, inputs, captured)
    # Adam moves a parameter by about lr whatever its gradient's size: rounding shows at lr's scale.
    tolerance = 1e-12 if double else TOLERANCE if optimizer == "sgd" else 1e-4
    assert_equal(trained, accumulated(model, inputs, captured, rows_of(plan)), tolerance, at_least=6)
    if not batch_coupled(captured.gm):
        assert_equal(trained, eager_training(model, inputs, captured), tolerance, at_least=6)


@pytest.mark.parametrize(
    "name, batch, cluster, algorithm, microbatches, optimizer, double",
    [
        ("lenet", 6, "2xcpu", "gpipe", 3, "sgd", False),
        ("lenet", 7, "4xcpu", "1f1b", 4, "adam", False),  # uneven: 2, 2, 2 and 1 samples
        ("resnet50", 6, "2xcpu", "gpipe", 2, "sgd", False),  # batch norm: statistics per micro-batch
        # Uneven, batch norm over 2 samples: float32 rounding grows to 5e-5 in two steps, float64's stays at 1e-13.
        ("resnet50", 5, "2xcpu", "m_etf", 2, "sgd", True),
        ("rnnlm", 5, "2xcpu", "1f1b", 2, "adam", False),  # LSTM cells
        ("transformer", 4, "2xcpu", "heft", 2, "sgd", False),  # attention, tied embeddings
        ("gpt2", 6, "2xcpu", "gpipe", 3, "adam", False),
    ],
)
def test_microbatched_plans_train_as_gradient_accumulation(
    name, batch, cluster, algorithm, microbatches, optimizer, double
):
    """The local executor's training equals eager gradient accumulation over the plan's micro-batches, and,
    where no operation couples the samples, eager training on the whole batch."""
    model, inputs, captured = tiny(name, batch, optimizer, double)
    plan = place(captured.graph, load_cluster(cluster), algorithm, microbatches=microbatches)
    assert plan.rewritten_graph.extra["microbatches"]["count"] == microbatches
    assert_trains_as_accumulation(plan, model, inputs, captured, optimizer, double)


def test_batch_norm_sees_each_micro_batch_alone():
    """With batch norm, a micro-batched plan is not eager training on the whole batch (the oracle would pass
    a runtime that ignored the micro-batches): the difference is well above the tolerance."""
    model, inputs, captured = tiny("resnet50", 6)
    assert batch_coupled(captured.gm)
    plan = place(captured.graph, load_cluster("2xcpu"), "gpipe", microbatches=2)
    worst, _, _ = state_difference(
        *placed_training(plan, model, inputs, captured), *eager_training(model, inputs, captured)
    )
    assert worst > 100 * TOLERANCE


@pytest.mark.parametrize("name, batch", [("lenet", 5), ("resnet50", 6)])
def test_distributed_microbatches_equal_gradient_accumulation(name, batch):
    """One process per device over gloo, a 1F1B pipeline: the ranks' training equals eager accumulation."""
    model, inputs, captured = tiny(name, batch)
    cluster = load_cluster("2xcpu")
    plan = place(captured.graph, cluster, "1f1b", microbatches=2)
    trained, _ = distributed_training(plan, cluster, model, inputs, captured)
    reference = accumulated(model, inputs, captured, rows_of(plan))
    assert_equal(trained, reference, at_least=6)


def test_a_split_operation_of_a_micro_batch_runs():
    """OS-DPOS's splits apply to a micro-batch's copy of an operation: a batch split of micro-batch 1's
    convolution backward and a weight gradient, placed at random, trains as gradient accumulation."""
    model, inputs, captured = tiny("lenet", 6)
    graph = captured.graph
    micro = microbatch_graph(graph, 2).graph
    conv = next(i for i in micro.ids if i.startswith("mb1/") and "convolution_backward" in i)
    target = split_operation(micro, conv, "batch", 2)
    cluster = load_cluster("2xcpu")
    unit_of, units = placement_units(target)
    device_of = np.random.default_rng(0).integers(0, 2, len(units))[unit_of]
    plan = Plan.from_arrays(
        graph, cluster, device_of, placed_graph=target, splits=[{"node": conv, "dim": "batch", "parts": 2}]
    )
    program = compile_program(
        captured.gm, graph, plan, cluster, carrier=captured.carrier, replica_steps=replica_steps(captured, plan)
    )
    assert {f"{conv}@part0", f"{conv}@part1"} <= {program.node_id(v) for v in program.schedule}
    assert_equal(
        placed_training(plan, model, inputs, captured),
        accumulated(model, inputs, captured, rows_of(plan)),
        at_least=6,
    )


def test_replicas_of_a_micro_batched_step_are_refused_by_place():
    _, _, captured = tiny("lenet", 6)
    with pytest.raises(OptionError, match="micro-batches; replicas of a micro-batched step do not run"):
        place(captured.graph, load_cluster("2xcpu"), "data_parallel", microbatches=2)
    plan = place(captured.graph, load_cluster("2xcpu"), "os_dpos", microbatches=2, time_limit=5)
    assert "data_parallel" not in plan.rewritten_graph.extra


def test_a_micro_batch_the_model_traces_differently_on_is_refused_naming_it():
    """gpt2 traced on one sample squeezes what it keeps on more: its 1-sample micro-batch is refused."""
    _, _, captured = tiny("gpt2", 5)
    plan = place(captured.graph, load_cluster("2xcpu"), "gpipe", microbatches=3)  # 2, 2 and 1 samples
    with pytest.raises(InvalidPlanError, match="a micro-batch of 1 samples cannot run.*fewer replicas or micro"):
        replica_steps(captured, plan)


def test_a_micro_batched_plan_for_another_batch_is_refused_before_training():
    _, _, captured = tiny("lenet", 6)
    plan = place(captured.graph, load_cluster("2xcpu"), "gpipe", microbatches=2)
    _, _, other = tiny("lenet", 8)
    with pytest.raises(InvalidPlanError):
        compile_program(other.gm, other.graph, plan, load_cluster("2xcpu"), carrier=other.carrier)


def test_run_verify_compares_a_pipeline_with_gradient_accumulation(tmp_path, capsys):
    """`placer run --verify` on a GPipe plan of a batch-norm model names its oracle and passes."""
    spec = "zoo:resnet50?" + "&".join(f"{k}={v}" for k, v in ZOO["resnet50"].tiny.items())
    graph, plan = tmp_path / "g.json", tmp_path / "p.json"
    assert main(["capture", spec, "--batch", "6", "--optimizer", "sgd", "-o", str(graph)]) == 0
    cluster = "2xcpu"
    args = ["plan", str(graph), "--cluster", cluster, "--algorithm", "gpipe", "--microbatches", "2", "-o", str(plan)]
    assert main(args) == 0
    capsys.readouterr()
    run = ["run", spec, "--plan", str(plan), "--cluster", cluster, "--batch", "6", "--optimizer", "sgd"]
    assert main([*run, "--steps", "2", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "equal eager gradient accumulation over the plan's 2 micro-batches" in out
    assert "eager training on" not in out  # batch norm couples the samples: the whole batch is no oracle


def test_tune_measures_and_replans_a_micro_batched_plan(tmp_path, capsys):
    """`placer tune --microbatches` runs the micro-batched plan, feeds the copies' measured times back as the
    whole nodes' and keeps a micro-batched plan."""
    out = tmp_path / "tuned.json"
    args = ["tune", "zoo:lenet", "--cluster", "2xcpu", "--batch", "6", "--algorithm", "gpipe", "--microbatches", "2"]
    assert main([*args, "--rounds", "1", "--steps", "2", "--optimizer", "sgd", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "round 1: replanned on measured costs" in said
    assert Plan.load(out).extra["microbatches"] == 2


def test_measured_times_of_copies_estimate_the_whole_batch():
    """A micro-batch's or a replica's copy on n of B samples estimates its node at t * B / n; what works on the
    whole (the optimizer) counts as measured; added nodes are left out."""
    from placer.generate import training_graph
    from placer.harness.feedback import measured_graph, whole_batch_times

    graph = training_graph(layers=1, branches=1, batch=3).replace(extra={"batch_size": 3})
    cluster = load_cluster("2xcpu")
    micro = place(graph, cluster, "gpipe", microbatches=3).bind(graph, cluster)  # 1 sample each
    seconds = {f"mb{k}/block0.b0.fwd": 1.0 + k for k in range(3)} | {"block0.b0.update": 0.5}
    seconds |= {i: 9.0 for i in micro.graph.ids if i.endswith(".accumulate")}
    times = whole_batch_times(micro, graph, seconds)
    assert times["block0.b0.fwd"].seconds == pytest.approx(6.0)  # (3 + 6 + 9) / 3
    assert times["block0.b0.update"].seconds == 0.5
    assert set(times) == {"block0.b0.fwd", "block0.b0.update"}
    replicated = place(graph, cluster, "data_parallel").bind(graph, cluster)  # 2 and 1 samples
    times = whole_batch_times(replicated, graph, {"r0/block0.b0.fwd": 2.0, "r1/block0.b0.fwd": 1.0})
    assert times["block0.b0.fwd"].seconds == pytest.approx(3.0)
    kind = cluster.devices[0].kind
    assert measured_graph(graph, replicated, cluster, {"r0/block0.b0.fwd": 2.0}).compute_s_by_kind[
        graph.index["block0.b0.fwd"]
    ][kind] == pytest.approx(3.0)


# ------------------------------------------------------------ replica groups of pipelines (DP x PP)
@pytest.mark.parametrize(
    "name, batch, schedule, microbatches, optimizer, double",
    [
        ("lenet", 8, "1f1b", 4, "sgd", False),
        ("lenet", 7, "gpipe", 6, "adam", False),  # uneven: the first micro-batches one sample more
        # Batch norm: its running statistics, and their writers, on group 0. The groups' sums add the gradients
        # in another order than one chain: in float32, 4e-4 apart after two steps; in float64, 4e-14.
        ("resnet50", 8, "1f1b", 4, "sgd", True),
        ("transformer", 8, "1f1b", 4, "sgd", False),  # attention, tied embeddings
    ],
)
def test_replica_groups_of_pipelines_train_as_gradient_accumulation(
    name, batch, schedule, microbatches, optimizer, double
):
    """Two groups of two devices, each a pipeline over half the micro-batches, their gradients summed per
    group and then across: the local executor's training equals eager gradient accumulation."""
    model, inputs, captured = tiny(name, batch, optimizer, double)
    cluster = load_cluster("4xcpu")
    plan = place(captured.graph, cluster, schedule, microbatches=microbatches, replicas=2)
    groups = plan.extra["groups"]
    assert plan.extra["replicas"] == 2 and len(groups) == 2 and not set(groups[0]) & set(groups[1])
    target = plan.rewritten_graph
    assert target.extra["microbatches"]["groups"] == 2
    per_group = microbatches // 2
    placed_on = {}
    for node_id, extra in zip(target.ids, target.node_extra):
        k = extra.get("microbatch")
        if k is not None and target.colocation[target.index[node_id]] is None:
            placed_on.setdefault(k // per_group, set()).add(plan.placement[node_id])
    assert placed_on[0] <= set(groups[0]) and placed_on[1] <= set(groups[1]), placed_on
    assert_trains_as_accumulation(plan, model, inputs, captured, optimizer, double)


def test_distributed_replica_groups_equal_gradient_accumulation():
    """Four gloo ranks, two pipelines of two: the ranks' training equals eager accumulation."""
    model, inputs, captured = tiny("lenet", 8)
    cluster = load_cluster("4xcpu")
    plan = place(captured.graph, cluster, "1f1b", microbatches=4, replicas=2)
    trained, _ = distributed_training(plan, cluster, model, inputs, captured)
    assert_equal(trained, accumulated(model, inputs, captured, rows_of(plan)), at_least=6)


def test_groups_sum_their_own_micro_batches_then_each_other():
    """Each group's chain adds only its own micro-batches' gradients; one add per later group joins the sums."""
    _, _, captured = tiny("lenet", 8)
    graph = captured.graph
    mb = microbatch_graph(graph, 6, groups=3).graph
    index = mb.index
    ptr, eids = mb.in_edges
    joins = [i for i, extra in enumerate(mb.node_extra) if "joins" in extra.get("accumulate", {})]
    adds = [i for i, extra in enumerate(mb.node_extra) if "accumulate" in extra]
    gradients = {mb.node_extra[i]["accumulate"]["gradient"] for i in adds}
    assert len(adds) == 5 * len(gradients) and len(joins) == 2 * len(gradients)
    for i in adds:
        k = mb.node_extra[i]["microbatch"]
        feeding = {mb.node_extra[int(u)].get("microbatch") for u in mb.src[eids[ptr[i] : ptr[i + 1]]]}
        if i in joins:  # group k // 2's sum: the add of its second micro-batch, and the sum before it
            assert k % 2 == 0 and mb.node_extra[i]["accumulate"]["joins"] == k // 2
            assert feeding == {k + 1, k - 2 if k > 2 else 1}, (mb.ids[i], feeding)
        else:  # micro-batch k's gradient into its group's first
            assert feeding == {k - 1, k}, (mb.ids[i], feeding)
    # What the batch reads from the parameters alone (LeNet's weight transposes) each later group computes
    # itself, and only its own micro-batches (or its own such copies) read that copy.
    ptr, eids = mb.out_edges

    def readers(u: int) -> set:
        extras = [mb.node_extra[int(w)] for w in mb.dst[eids[ptr[u] : ptr[u + 1]]]]
        return {e.get("microbatch", ("group", e.get("group"))) for e in extras}

    copies = {i: extra for i, extra in enumerate(mb.node_extra) if "group_copy_of" in extra}
    assert copies and {extra["group"] for extra in copies.values()} == {1, 2}
    for i, extra in copies.items():
        g = extra["group"]
        assert mb.op[i] == graph.op[graph.index[extra["group_copy_of"]]]
        assert readers(i) <= {2 * g, 2 * g + 1, ("group", g)}, (mb.ids[i], readers(i))
    for u in {index[extra["group_copy_of"]] for extra in copies.values()}:
        assert readers(u) <= {0, 1, ("group", None)}, (mb.ids[u], readers(u))
    with pytest.raises(OptionError, match="groups must be an integer >= 1 that divides the 6 micro-batches"):
        microbatch_graph(graph, 6, groups=4)
    with pytest.raises(OptionError, match="5 micro-batches do not divide into 2 replica groups"):
        place(graph, load_cluster("4xcpu"), "1f1b", microbatches=5, replicas=2)
    with pytest.raises(OptionError, match="option replicas must be an integer from 1 to the 4 devices"):
        place(graph, load_cluster("4xcpu"), "gpipe", replicas=5)


def test_auto_tries_replica_groups_where_devices_allow():
    """On four devices auto also runs each pipeline in two groups of two, and may keep one; on two it does not."""
    _, _, captured = tiny("lenet", 8)
    plan = place(captured.graph, load_cluster("4xcpu"), "auto", microbatches=4, time_limit=30)
    ran = plan.extra["auto"]["ran"]
    assert any("(2 replica groups, 4 micro-batches)" in label for label in ran), ran
    plan = place(captured.graph, load_cluster("2xcpu"), "auto", microbatches=4, time_limit=30)
    assert not any("replica groups" in label for label in plan.extra["auto"]["ran"])
