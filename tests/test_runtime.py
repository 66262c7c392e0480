"""The runtime: placed training equals eager training, in one process and one process per device."""

from __future__ import annotations

import copy
import os
import random
import re
import signal
import textwrap
import threading
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import placer
from placer.algorithms import place
from placer.algorithms.common import placement_units
from placer.api import apply, validate
from placer.capture import capture
from placer.capture.layout import dense_strides
from placer.capture.spec import capture_spec, load_model
from placer.cli import main
from placer.cluster import Cluster, load_cluster
from placer.errors import FormatError, InvalidPlanError, OptionError
from placer.harness.feedback import measured_cluster, measured_graph, own_times
from placer.plan import Plan
from placer.runtime.check import exact_float32, state_difference, train_eager
from placer.runtime.distributed import (
    RunError,
    float32_precision,
    free_port,
    run_distributed,
    run_under_torchrun,
    under_torchrun,
)
from placer.runtime.local import LocalExecutor
from placer.runtime.program import (
    bind_call,
    call_node,
    compile_program,
    copy_to,
    message_bytes,
    pack,
    random_nodes,
    receive_buffer,
    unpack,
    value_spec,
)
from placer.sim.messages import MessageCost, messages_graph
from placer.transform.split import split_operation

from .processes import outliving, terminate_once_ranks_run
from .reference_model import random_valid_order
from .training import distributed_training

STEPS = 3
TOLERANCE = 1e-6

MODEL_FILE = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):
        """Conv, batch norm (running statistics written in place), a linear head."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.head = nn.Linear(4 * 6 * 6, 5)

        def forward(self, x, y):
            h = torch.relu(self.bn(self.conv(x)))
            return nn.functional.cross_entropy(self.head(h.flatten(1)), y)


    def make(batch_size):
        torch.manual_seed(0)
        return Net(), (torch.randn(batch_size, 3, 6, 6), torch.randint(0, 5, (batch_size,)))
''')


pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass
class Case:
    spec: str
    model: torch.nn.Module  # initial weights (never trained)
    inputs: tuple
    captured: object
    reference: torch.nn.Module  # after STEPS eager steps
    reference_optimizer: torch.optim.Optimizer

    def fresh(self):
        model = copy.deepcopy(self.model)
        return model, self.captured.optimizer.eager(model.parameters())

    def assert_matches(self, model, optimizer):
        worst, where, count = state_difference(model, optimizer, self.reference, self.reference_optimizer)
        assert count > 10
        assert worst <= TOLERANCE, f"{where} differs from eager training by {worst}"


def _case(spec: str, batch: int) -> Case:
    model, inputs = load_model(spec, batch)
    captured = capture_spec(spec, batch)
    reference = copy.deepcopy(model)
    reference_optimizer = captured.optimizer.eager(reference.parameters())
    train_eager(reference, inputs, reference_optimizer, STEPS)
    return Case(spec, model, inputs, captured, reference, reference_optimizer)


@pytest.fixture(scope="module")
def file_case(tmp_path_factory):
    """A model from a file with the factory contract."""
    path = tmp_path_factory.mktemp("models") / "net.py"
    path.write_text(MODEL_FILE)
    return _case(f"{path}:make", 4)


@pytest.fixture(scope="module")
def zoo_case():
    """A model of the zoo (LeNet-5 at its paper size, small batch)."""
    return _case("zoo:lenet", 2)


@pytest.fixture(params=["file", "zoo"])
def case(request):
    return request.getfixturevalue(f"{request.param}_case")


def random_plan(graph, cluster, seed: int) -> Plan:
    """Colocation units on random devices, each device's nodes in a random topological order."""
    rng = np.random.default_rng(seed)
    unit_of, units = placement_units(graph)
    device_of = rng.integers(0, cluster.num_devices, len(units))[unit_of]
    order = random_valid_order(graph, cluster.num_devices, device_of, random.Random(seed))
    return Plan.from_arrays(graph, cluster, device_of, order, algorithm="random")


def make_plan(how: str, graph, cluster) -> Plan:
    if how == "random":
        return random_plan(graph, cluster, seed=cluster.num_devices)
    return place(graph, cluster, how)


PLACEMENTS = ("random", "expert", "metis")
CLUSTERS = ("2xcpu", "4xcpu")


def _check_spread(plan: Plan) -> None:
    used = set(plan.placement.values())
    assert len(used) >= 2, f"the {plan.algorithm} plan uses only {used}: nothing placed across devices"


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("how", PLACEMENTS)
def test_local_executor_trains_like_eager(case, how, cluster_name):
    cluster = load_cluster(cluster_name)
    plan = make_plan(how, case.captured.graph, cluster)
    _check_spread(plan)
    plan.context["captured"] = case.captured
    model, optimizer = case.fresh()
    step = apply(plan, model, optimizer)
    losses = [float(step(*case.inputs)) for _ in range(STEPS)]
    case.assert_matches(model, optimizer)
    assert losses[0] > 0


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("how", PLACEMENTS)
def test_distributed_executor_trains_like_eager(case, how, cluster_name):
    cluster = load_cluster(cluster_name)
    captured = case.captured
    plan = make_plan(how, captured.graph, cluster)
    (model, optimizer), result = distributed_training(plan, cluster, case.model, case.inputs, captured, STEPS, 30)
    assert len(result.step_s) == STEPS and all(s > 0 for s in result.step_s)
    assert all(src != dst and nbytes > 0 and seconds > 0 for src, dst, nbytes, seconds in result.transfer_s)
    assert how != "random" or result.transfer_s  # some rank waited for some message
    assert result.predicted_s == pytest.approx(plan.predicted.get("makespan_s", result.predicted_s))
    case.assert_matches(model, optimizer)


def test_spawned_ranks_get_the_step_by_pickle_and_train_like_eager(zoo_case):
    # NCCL needs fresh processes, which get their job by pickle; a captured GraphModule does not pickle.
    cluster = load_cluster("2xcpu")
    captured = zoo_case.captured
    plan = make_plan("random", captured.graph, cluster)
    (model, optimizer), _ = distributed_training(
        plan, cluster, zoo_case.model, zoo_case.inputs, captured, STEPS, 60, start_method="spawn"
    )
    zoo_case.assert_matches(model, optimizer)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), devices=st.sampled_from(CLUSTERS))
def test_any_placement_and_order_trains_exactly_like_eager(file_case, seed, devices):
    """Whatever the devices and the per-device orders (colocation and dependencies kept), the result is eager's."""
    cluster = load_cluster(devices)
    plan = random_plan(file_case.captured.graph, cluster, seed)
    plan.context["captured"] = file_case.captured
    model, optimizer = file_case.fresh()
    step = apply(plan, model, optimizer)
    for _ in range(STEPS):
        step(*file_case.inputs)
    worst, where, _ = state_difference(model, optimizer, file_case.reference, file_case.reference_optimizer)
    assert worst == 0.0, f"{where} differs by {worst}"


# ------------------------------------------------------------------ failures
def _kill_rank_1(rank: int) -> None:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def _raise_on_rank_1(rank: int) -> None:
    if rank == 1:
        raise ValueError("injected failure")


def _hang_rank_1(rank: int) -> None:
    if rank == 1:
        time.sleep(600)


def _exit_rank_1(rank: int) -> None:
    if rank == 1:
        os._exit(3)  # no exception, no signal: only its exit status tells


@pytest.mark.parametrize(
    "hook, message",
    [
        (_kill_rank_1, "rank 1 was killed by signal SIGKILL"),
        (_raise_on_rank_1, "rank 1 failed: ValueError: injected failure"),
        (_hang_rank_1, r"rank 0 failed: .*rank\(s\) \[1\] were still running"),  # rank 0 gives up waiting
        (_exit_rank_1, "^rank 1 exited with status 3;"),  # not rank 0's echo of its death
    ],
)
def test_a_failing_rank_stops_the_run_with_an_error(file_case, hook, message):
    cluster = load_cluster("2xcpu")
    captured = file_case.captured
    plan = random_plan(captured.graph, cluster, seed=1)
    flat = captured.step_inputs(*file_case.fresh()[:1], file_case.inputs)
    before = [t.clone() for t in flat]
    with pytest.raises(RunError, match=message):
        run_distributed(
            captured.gm, captured.graph, plan, cluster, flat, steps=2, carrier=captured.carrier, timeout_s=3, hook=hook
        )
    assert all(torch.equal(a, b) for a, b in zip(flat, before))  # ranks train copies: nothing half-written


def _kill_rank_1_in_its_steps(rank: int) -> None:
    if rank == 1:  # a second into the run, whatever it is doing then
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGKILL)).start()


def test_a_rank_killed_while_it_trains_stops_the_run(file_case):
    # The other failures strike before the first step; this one in the middle of the steps.
    cluster = load_cluster("2xcpu")
    captured = file_case.captured
    flat = captured.step_inputs(*file_case.fresh()[:1], file_case.inputs)
    with pytest.raises(RunError, match="rank 1 was killed by signal SIGKILL"):
        run_distributed(
            captured.gm,
            captured.graph,
            random_plan(captured.graph, cluster, seed=1),
            cluster,
            flat,
            steps=10**7,
            carrier=captured.carrier,
            timeout_s=10,
            hook=_kill_rank_1_in_its_steps,
        )


def _stop_rank_1(rank: int) -> None:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # as a debugger or a job control stop leaves it


def test_a_stopped_rank_is_ended_without_waiting_out_the_grace(file_case, monkeypatch):
    # A stopped process acts on SIGTERM only once continued: the run waited the whole grace (5 s a rank,
    # one after another) before killing it. Here the grace is far longer than the run could otherwise take.
    from placer.runtime import distributed

    monkeypatch.setattr(distributed, "STOP_GRACE_S", 300.0)
    cluster = load_cluster("2xcpu")
    captured = file_case.captured
    flat = captured.step_inputs(*file_case.fresh()[:1], file_case.inputs)
    began = time.monotonic()
    with pytest.raises(RunError, match=r"rank 0 failed: .*rank\(s\) \[1\] were still running"):
        run_distributed(
            captured.gm,
            captured.graph,
            random_plan(captured.graph, cluster, seed=1),
            cluster,
            flat,
            steps=2,
            carrier=captured.carrier,
            timeout_s=3,
            hook=_stop_rank_1,
        )
    assert time.monotonic() - began < 150


def _state(model, optimizer) -> dict[str, torch.Tensor]:
    """Copies of the model's parameters and buffers and of the optimizer's state, by name."""
    state = {f"model.{name}": t.clone() for name, t in model.state_dict().items()}
    for index, tensors in optimizer.state_dict()["state"].items():
        state.update({f"optimizer.{index}.{name}": torch.as_tensor(t).clone() for name, t in tensors.items()})
    return state


@pytest.mark.parametrize("failing_step", [1, 2])
@pytest.mark.parametrize("fails", ["after batch norm", "last update"])
def test_an_atomic_step_that_fails_part_way_leaves_the_model_and_optimizer_as_they_were(
    file_case, monkeypatch, failing_step, fails
):
    """An operation fails after the plan's order has run writes of the step's new state (batch norm's
    running statistics, new parameters and optimizer state): in an atomic step none of them reaches the
    model or the optimizer, and training goes on as if the failed step had not been tried; by default
    the error says that the state is partly written."""
    import placer.runtime.local as local

    captured, cluster = file_case.captured, load_cluster("2xcpu")
    plan = random_plan(captured.graph, cluster, seed=3)
    plan.context["captured"] = captured
    program = compile_program(captured.gm, captured.graph, plan, cluster, carrier=captured.carrier)
    position = {v.name: k for k, v in enumerate(program.schedule)}
    batch_norm = next(v.name for v in program.schedule if "batch_norm" in str(v.target))
    others = [v.name for v in program.schedule if v not in program.writes]
    failing = (
        next(n for n in others if position[n] > position[batch_norm]) if fails == "after batch norm" else others[-1]
    )
    assert min(position[v.name] for v in program.writes) < position[failing]  # writes were in its way
    run, bind = local.call_node, local.bind_call
    armed = []  # while it holds anything, ``failing`` raises, called bound or through call_node

    def call_node(v, *args):
        if armed and v.name == failing:
            raise RuntimeError("injected failure")
        return run(v, *args)

    def bind_call(v, device):
        call = bind(v, device)
        return (lambda values: call_node(v) if armed else call(values)) if v.name == failing else call

    monkeypatch.setattr(local, "call_node", call_node)
    monkeypatch.setattr(local, "bind_call", bind_call)
    model, optimizer = file_case.fresh()
    step = apply(plan, model, optimizer)
    armed.append(True)
    with pytest.raises(RuntimeError, match="injected failure") as failed:
        step(*file_case.inputs)
    assert "atomic=True" in "".join(failed.value.__notes__)
    armed.clear()

    model, optimizer = file_case.fresh()
    step = apply(plan, model, optimizer, atomic=True)
    for _ in range(failing_step - 1):
        step(*file_case.inputs)
    before = _state(model, optimizer)
    armed.append(True)
    with pytest.raises(RuntimeError, match="injected failure") as failed:
        step(*file_case.inputs)
    assert not getattr(failed.value, "__notes__", None)
    after = _state(model, optimizer)
    assert after.keys() == before.keys()
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert not changed, f"the failed step wrote {changed}"
    armed.clear()
    for _ in range(STEPS - failing_step + 1):
        step(*file_case.inputs)
    file_case.assert_matches(model, optimizer)


@pytest.mark.parametrize("which", ["file", "zoo:gnmt?layers=2&hidden=16&vocab=50&seq_len=4&dropout=0"])
def test_a_bound_call_computes_what_call_node_does_on_every_node_of_a_step(file_case, which):
    """bind_call's contract, node by node on real steps (batch norm, attention, ``cat`` and ``stack`` of a list of
    tensors, keyword arguments, in-place writes of the new state): the same values as call_node."""
    if which == "file":
        captured, model, inputs = file_case.captured, *file_case.fresh()[:1], file_case.inputs
    else:
        captured, (model, inputs) = capture_spec(which, 2), load_model(which, 2)
    flat = captured.step_inputs(model, inputs)
    gm, cpu = captured.gm, torch.device("cpu")
    placeholders = [v for v in gm.graph.nodes if v.op == "placeholder"]
    env, random = dict(zip(placeholders, flat)), set(random_nodes(gm))
    kinds = set()
    for v in gm.graph.nodes:
        if v.op not in ("call_function", "get_attr") or v in random:
            continue
        writes = getattr(v.target, "_schema", None) is not None and v.target._schema.is_mutable
        # A write's reference runs on copies of its inputs: writing twice would not be the same write.
        inputs = {
            a: env[a].clone() if writes and isinstance(env[a], torch.Tensor) else env[a] for a in v.all_input_nodes
        }
        reference = call_node(v, inputs, cpu)
        bound = bind_call(v, cpu)(env)
        assert type(bound) is type(reference), v.name
        for got, want in zip(torch.utils._pytree.tree_leaves(bound), torch.utils._pytree.tree_leaves(reference)):
            if isinstance(want, torch.Tensor):
                assert torch.equal(got, want), v.name
            else:
                assert got == want, v.name
        nested = any(isinstance(a, (list, tuple)) and any(isinstance(b, torch.fx.Node) for b in a) for a in v.args)
        kinds.add("nested" if nested else "writes" if writes else "flat")
        env[v] = bound
    assert {"flat", "writes"} <= kinds and (which == "file" or "nested" in kinds), kinds


# ------------------------------------------------------------ plan checks
def _split_plan(case: Case, cluster, parts: int = 2) -> Plan:
    """The first three splittable operations split along the batch, the result placed at random."""
    graph = case.captured.graph
    names = [graph.ids[i] for i, s in enumerate(graph.splittable) if s and s[0]["dim"] == "batch"][:3]
    target = graph
    for name in names:
        target = split_operation(target, name, "batch", parts)
    unit_of, units = placement_units(target)
    device_of = np.random.default_rng(0).integers(0, cluster.num_devices, len(units))[unit_of]
    return Plan.from_arrays(
        graph,
        cluster,
        device_of,
        placed_graph=target,
        splits=[{"node": n, "dim": "batch", "parts": parts} for n in names],
    )


def _assert_split_plan_trains_like_eager(case, plan, cluster, backend: str) -> None:
    """``STEPS`` steps of ``plan``, which splits operations, with ``backend`` equal eager training (its parts ran)."""
    model, optimizer = case.fresh()
    if backend == "local":
        plan.context["captured"] = case.captured
        step = apply(plan, model, optimizer)
        for _ in range(STEPS):
            step(*case.inputs)
    else:
        captured = case.captured
        flat = captured.step_inputs(model, case.inputs, optimizer)
        result = run_distributed(
            captured.gm, captured.graph, plan, cluster, flat, steps=STEPS, carrier=captured.carrier, timeout_s=30
        )
        captured.write_back([result.state.get(k, v) for k, v in enumerate(flat)], model, optimizer)
        assert any("@part" in node_id for node_id in result.op_s)
    case.assert_matches(model, optimizer)


@pytest.mark.parametrize("backend", ["local", "distributed"])
def test_split_operations_run_as_slices_parts_and_concat(zoo_case, backend):
    """OS-DPOS's splits: each part computes its rows on its device, the concat joins them.

    Parts multiply fewer rows than the whole operation, so the sums may round
    differently: equal to eager training within the tolerance, not bit for bit.
    """
    cluster = load_cluster("2xcpu")
    plan = _split_plan(zoo_case, cluster)
    program = compile_program(
        zoo_case.captured.gm, zoo_case.captured.graph, plan, cluster, carrier=zoo_case.captured.carrier
    )
    parts = [program.device_of[v] for v in program.schedule if (program.node_id(v) or "").count("@part")]
    assert len(parts) == 6 and len(set(parts)) == 2  # the parts really are spread
    _assert_split_plan_trains_like_eager(zoo_case, plan, cluster, backend)


@pytest.mark.parametrize("dim", ["channel", "height"])
def test_splits_the_runtime_cannot_execute_are_refused_naming_the_node(zoo_case, dim):
    cluster = load_cluster("2xcpu")
    plan = _split_plan(zoo_case, cluster)
    target = plan.rewritten_graph
    extra = [dict(e) for e in target.node_extra]
    victim = next(i for i, e in enumerate(extra) if "part" in e)
    extra[victim]["dim"] = dim  # one part of a batch split claims another dimension
    plan.rewritten_graph = target.replace(node_extra=extra)
    with pytest.raises(InvalidPlanError, match=f"{target.ids[victim]}.*batch and channel splits only"):
        compile_program(zoo_case.captured.gm, zoo_case.captured.graph, plan, cluster, carrier=zoo_case.captured.carrier)


@pytest.fixture(scope="module")
def batch1_case():
    """LeNet-5 at one sample: nothing to split along the batch, its layers split along their channels (not the
    file model: under its batch norm the convolution's bias gets a gradient of rounding noise alone, which Adam
    scales up to the learning rate whatever the order of the sums)."""
    return _case("zoo:lenet", 1)


def _channel_plan(case: Case, cluster) -> Plan:
    """Every operation the capture declares channel-splittable split along its channels (the forward
    convolution in 3 parts, the rest in 2), the result placed at random."""
    graph = case.captured.graph
    names = [graph.ids[i] for i, s in enumerate(graph.splittable) if s and any(e["dim"] == "channel" for e in s)]
    ops = {graph.op[graph.index[n]] for n in names}
    assert {"aten.convolution", "aten.addmm", "aten.mm"} <= ops, ops
    target = graph
    splits = []
    for name in names:
        parts = 3 if graph.op[graph.index[name]] == "aten.convolution" else 2
        target = split_operation(target, name, "channel", parts)
        splits.append({"node": name, "dim": "channel", "parts": parts})
    unit_of, units = placement_units(target)
    device_of = np.random.default_rng(1).integers(0, cluster.num_devices, len(units))[unit_of]
    return Plan.from_arrays(graph, cluster, device_of, placed_graph=target, splits=splits)


@pytest.mark.parametrize("backend", ["local", "distributed"])
def test_channel_splits_of_a_convolution_and_a_linear_layer_train_as_eager(batch1_case, backend):
    """Parts compute their own output channels from slices of the weights and bias, the concat joins them
    along axis 1: at one sample (no batch split possible) the step equals eager training."""
    case, cluster = batch1_case, load_cluster("2xcpu")
    assert not any(e["dim"] == "batch" and e["size"] > 1 for s in case.captured.graph.splittable if s for e in s)
    plan = _channel_plan(case, cluster)
    program = compile_program(case.captured.gm, case.captured.graph, plan, cluster, carrier=case.captured.carrier)
    parts = {
        program.node_id(v): program.device_of[v] for v in program.schedule if "@part" in (program.node_id(v) or "")
    }
    assert {"convolution@part2", "addmm@part1"} <= parts.keys() and len(set(parts.values())) == 2
    _assert_split_plan_trains_like_eager(case, plan, cluster, backend)


def test_channel_splits_of_arguments_the_capture_did_not_record_are_refused_naming_the_node(batch1_case):
    case, cluster = batch1_case, load_cluster("2xcpu")
    plan = _channel_plan(case, cluster)
    target = plan.rewritten_graph
    for args, message in (([[0, 0]], "is not an argument that the capture recorded"), (None, "none recorded")):
        extra = [dict(e) for e in target.node_extra]
        victim = next(i for i, e in enumerate(extra) if e.get("role") == "split" and e["split_of"] == "convolution")
        extra[victim]["args"] = args
        plan.rewritten_graph = target.replace(node_extra=extra)
        with pytest.raises(InvalidPlanError, match=f"{target.ids[victim]}.*{message}"):
            compile_program(case.captured.gm, case.captured.graph, plan, cluster, carrier=case.captured.carrier)


def test_a_distributed_run_reports_each_messages_host_time_and_each_ops_share_of_it(file_case):
    cluster = load_cluster("2xcpu")
    captured = file_case.captured
    plan = random_plan(captured.graph, cluster, seed=1)
    flat = captured.step_inputs(*file_case.fresh()[:1], file_case.inputs)
    result = run_distributed(
        captured.gm, captured.graph, plan, cluster, flat, steps=3, carrier=captured.carrier, timeout_s=30
    )
    program = compile_program(captured.gm, captured.graph, plan, cluster, carrier=captured.carrier)
    sent = [x for x in program.transfers if message_bytes(value_spec(x.node)) > 0]  # empty tensors are not
    assert sent
    assert len(result.message_s) == 2 * len(sent)  # every message, after the first step
    for src, dst, nbytes, sending, receiving in result.message_s:
        assert src != dst and nbytes > 0 and sending > 0 and receiving > 0
    assert set(result.op_message_s) <= set(result.op_s)
    assert all(0 <= result.op_message_s[k] <= result.op_s[k] for k in result.op_message_s)
    assert sum(result.op_message_s.values()) > 0


def test_message_cost_fits_a_line_per_side_never_below_zero():
    line = [(0, 1, n, 20e-6 + n * 1e-9, 5e-6 + n * 2e-10) for n in (1_000, 10_000, 100_000)]
    cost = MessageCost.fit(line)
    assert cost.send_s(50_000) == pytest.approx(70e-6) and cost.receive_s(50_000) == pytest.approx(15e-6)
    one_size = MessageCost.fit([(0, 1, 4096, 10e-6, 1e-6), (1, 0, 4096, 30e-6, 3e-6)])
    assert (one_size.send_fixed_s, one_size.send_per_byte_s) == (pytest.approx(20e-6), 0.0)
    falling = MessageCost.fit([(0, 1, 1_000, 30e-6, 0.0), (0, 1, 2_000, 10e-6, 0.0)])
    assert (falling.send_fixed_s, falling.send_per_byte_s) == (pytest.approx(20e-6), 0.0)
    through_zero = MessageCost.fit([(0, 1, 1_000, 0.0, 0.0), (0, 1, 2_000, 1e-6, 0.0)])
    assert through_zero.send_fixed_s == 0.0 and through_zero.send_s(2_000) > 0
    with pytest.raises(ValueError, match="at least one message"):
        MessageCost.fit([])


def test_messages_graph_charges_a_plans_messages_to_their_producer_and_first_consumer():
    from placer.graph import OpGraph

    # a's one output goes to b and c on the other device (one message, of the larger edge), and to d beside it.
    graph = OpGraph(["a", "b", "c", "d"], [1.0, 1.0, 1.0, 1.0], [0, 0, 0], [1, 2, 3], [100, 300, 50], name="fan-out")
    cluster = load_cluster("2xcpu")
    cost = MessageCost(send_fixed_s=0.1, send_per_byte_s=1e-3, receive_fixed_s=0.2, receive_per_byte_s=0.0)
    plan = Plan.from_arrays(graph, cluster, [0, 1, 1, 0], order=[[0, 3], [2, 1]])
    costed = messages_graph(graph, plan.bind(graph, cluster), cluster, {"a": 0.5, "b": 0.25}, cost)
    assert costed.durations(cluster)[:, 0].tolist() == pytest.approx([0.5 + 0.1 + 0.3, 0.25, 1.0 + 0.2, 1.0])
    # Another order, another first consumer; no order: the graph's.
    for order in ([[0, 3], [1, 2]], None):
        plan = Plan.from_arrays(graph, cluster, [0, 1, 1, 0], order=order)
        costed = messages_graph(graph, plan.bind(graph, cluster), cluster, {}, cost)
        assert costed.durations(cluster)[:, 1].tolist() == pytest.approx([1.4, 1.2, 1.0, 1.0])


def test_the_operation_after_a_nodes_messages_is_charged_once_per_node_and_side():
    from placer.graph import OpGraph

    # a sends two tensors to device 1 (two messages), which b receives both of; c receives one from b.
    graph = OpGraph(
        ["a", "b", "c"], [1.0, 1.0, 1.0], [0, 0, 1], [1, 1, 2], [64, 64, 64], edge_tensor=[0, 1, 0], name="two-messages"
    )
    cluster = load_cluster("2xcpu")
    cost = MessageCost(0.1, 0.0, 0.2, 0.0, after_send_s=0.01, after_receive_s=0.02)
    plan = Plan.from_arrays(graph, cluster, [0, 1, 0])
    costed = messages_graph(graph, plan.bind(graph, cluster), cluster, {}, cost)
    # a: two sends and one operation after them; b: two receives and one after, then a send; c: a receive.
    assert costed.durations(cluster)[:, 0].tolist() == pytest.approx(
        [1.0 + 2 * 0.1 + 0.01, 1.0 + 2 * 0.2 + 0.02 + 0.1 + 0.01, 1.0 + 0.2 + 0.02]
    )
    assert MessageCost.from_dict(cost.to_dict()) == cost
    assert "after_send_s" not in MessageCost(0.1, 0.0, 0.2, 0.0).to_dict()


def test_a_runs_own_times_give_back_the_operation_after_its_messages_for_another_plan():
    from placer.sim.messages import spread_over_gaps, without_after_message

    graph, cluster, bound = _ping_pong()  # a -> b -> c over two devices: a sends, b both, c receives
    cost = MessageCost(0.0, 0.0, 0.0, 0.0, after_send_s=0.01, after_receive_s=0.02)
    own = {"a": 1.0, "b": 1.0, "c": 1.0}
    plain = without_after_message(own, bound, cost)
    assert plain == pytest.approx({"a": 0.99, "b": 0.97, "c": 0.98})
    # Charged again for the plan that ran, the run's own times; on one device, none.
    assert messages_graph(graph, bound, cluster, plain, cost).durations(cluster)[:, 0].tolist() == pytest.approx(
        [1.0, 1.0, 1.0]
    )
    alone = Plan.from_arrays(graph, cluster, [0, 0, 0]).bind(graph, cluster)
    assert messages_graph(graph, alone, cluster, plain, cost).durations(cluster)[:, 0].tolist() == pytest.approx(
        [0.99, 0.97, 0.98]
    )
    assert without_after_message(own, bound, MessageCost(0.0, 0.0, 0.0, 0.0)) is own
    # A run's fitted cost takes the calibration's charge with its shape over gaps.
    calibrated = replace(cost, by_gap=((0.0, 0.05, 0.05), (1.0, 0.5, 0.25)))
    spread = spread_over_gaps(MessageCost(0.02, 0.0, 0.01, 0.0), calibrated, bound, own)
    assert (spread.after_send_s, spread.after_receive_s) == (0.01, 0.02)


def test_what_the_operations_after_a_runs_messages_lost_is_fitted_by_role():
    from placer.sim.messages import fit_after_message

    graph, cluster, bound = _ping_pong()  # a -> b -> c over two devices: a sends, b both, c receives
    assert bound.placed_durations().tolist() == [1.0, 1.0, 1.0]
    cost = MessageCost(0.1, 0.0, 0.2, 0.0, by_gap=((0.0, 0.1, 0.2),), after_send_s=0.5, after_receive_s=0.5)
    fitted = fit_after_message(bound, {"a": 1.01, "b": 1.03, "c": 1.02}, cost)
    assert (fitted.after_send_s, fitted.after_receive_s, fitted.after_wait_s) == pytest.approx((0.01, 0.02, 0.02))
    assert replace(fitted, after_send_s=0.5, after_receive_s=0.5, after_wait_s=0.0) == cost  # the rest kept
    # A role that ran faster than its profile is charged nothing; without a timed node that sends or receives,
    # there is nothing to fit.
    assert fit_after_message(bound, {"a": 0.9, "b": 1.0, "c": 1.1}, cost).after_send_s == 0.0
    with pytest.raises(ValueError, match="needs a timed node"):
        fit_after_message(bound, {}, cost)


def test_a_receive_the_rank_waited_for_costs_the_operation_after_it_more():
    from placer.sim import simulate_bound
    from placer.sim.messages import simulate_with_messages, waiting_nodes, without_after_message

    graph, cluster, bound = _ping_pong()  # a -> b -> c over two devices: b and c wait for a message
    plain = simulate_bound(bound)
    assert waiting_nodes(plain, bound.order if bound.order is not None else plain.device_orders()) == {1, 2}
    cost = MessageCost(0.0, 0.0, 0.0, 0.0, after_receive_s=0.02, after_wait_s=0.5)
    durations = messages_graph(graph, bound, cluster, {}, cost, waited={1}).durations(cluster)[:, 0].tolist()
    assert durations == pytest.approx([1.0, 1.5, 1.02])
    # Simulated in passes: the first charges no wait, the next the waits of the one before (b's and c's).
    step = simulate_with_messages(bound, cost).makespan_s
    assert step == pytest.approx(simulate_bound(bound).makespan_s + 2 * 0.5)
    # A run's own times give it back where the run, as they and the cost simulate it, waited.
    own = {"a": 1.0, "b": 1.5, "c": 1.5}
    assert without_after_message(own, bound, cost) == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0})
    assert MessageCost.from_dict(cost.to_dict()) == cost


def test_a_message_costs_what_its_gap_on_its_rank_gives():
    cost = MessageCost(0.1, 1e-3, 0.2, 0.0, by_gap=((0.0, 0.01, 0.02), (1.0, 0.05, 0.06)))
    assert (cost.send_s(10), cost.receive_s(10)) == (pytest.approx(0.11), 0.2)  # alone
    assert (cost.send_s(10, 0.5), cost.receive_s(10, 0.5)) == (pytest.approx(0.04), pytest.approx(0.04))
    assert (cost.send_s(0, 9.0), cost.receive_s(0, 0.0)) == (pytest.approx(0.05), pytest.approx(0.02))
    assert MessageCost.from_dict(cost.to_dict()) == cost
    assert "by_gap" not in MessageCost(0.1, 0.0, 0.2, 0.0).to_dict()
    doc = MessageCost(0.1, 0.0, 0.2, 0.0).to_dict()
    with pytest.raises(FormatError, match="'by_gap': point #1 must be"):
        MessageCost.from_dict({**doc, "by_gap": [[0, 1e-5, 1e-5], [1e-3, 1e-5]]}, "cal.json")
    with pytest.raises(FormatError, match="cal.json: field 'by_gap': gaps must ascend"):
        MessageCost.from_dict({**doc, "by_gap": [[1e-3, 1e-5, 1e-5], [0, 1e-5, 1e-5]]}, "cal.json")


def _ping_pong():
    """a (device 0) -> b (device 1) -> c (device 0): two messages, 1 s operations over ``2xcpu``."""
    from placer.graph import OpGraph

    graph = OpGraph(["a", "b", "c"], [1.0, 1.0, 1.0], [0, 1], [1, 2], [64, 64], name="ping-pong")
    cluster = load_cluster("2xcpu")
    return graph, cluster, Plan.from_arrays(graph, cluster, [0, 1, 0]).bind(graph, cluster)


def test_message_gaps_are_the_time_since_the_ranks_previous_message():
    from types import SimpleNamespace

    from placer.sim.messages import message_gaps, plan_messages

    graph, _, bound = _ping_pong()
    messages = plan_messages(graph, bound)
    assert messages == [(0, 1, 64), (1, 2, 64)]
    # a ends at 1.0 and b starts at 1.5; b ends at 2.5 and c starts at 3.0; the step takes 4.
    schedule = SimpleNamespace(start=np.array([0.0, 1.5, 3.0]), finish=np.array([1.0, 2.5, 4.0]), makespan_s=4.0)
    # Device 0: a's send at 1.0 follows c's receive of the step before (3.0 - 4); c's receive follows it by 2.
    # Device 1: b's receive at 1.5 follows its send of the step before (2.5 - 4); its send follows it by 1.
    assert message_gaps(messages, bound, schedule) == [(2.0, 3.0), (1.0, 2.0)]


def test_simulate_with_messages_charges_each_message_at_its_gap():
    from placer.sim import simulate_bound
    from placer.sim.messages import simulate_with_messages

    graph, cluster, bound = _ping_pong()
    alone = MessageCost(0.5, 0.0, 0.25, 0.0)

    def step(**gaps_given) -> float:
        costed = messages_graph(graph, bound, cluster, {}, curve, **gaps_given)
        return simulate_bound(Plan.from_arrays(costed, cluster, [0, 1, 0]).bind(costed, cluster)).makespan_s

    curve = alone
    assert simulate_with_messages(bound, alone).makespan_s == pytest.approx(step())
    # Without measured gaps, or with a flat curve at the cost alone, the same step.
    curve = replace(alone, by_gap=((0.0, 0.5, 0.25),))
    assert simulate_with_messages(bound, curve).makespan_s == pytest.approx(step())
    # Cheap in a stream, dear once a second apart: the first pass charges each message as in a stream,
    # the next at the gaps it left (over a second each), then they stay.
    curve = replace(alone, by_gap=((0.0, 0.05, 0.05), (1.0, 0.5, 0.25)))
    streamed = step(gaps=[(0.0, 0.0)] * 2)
    assert simulate_with_messages(bound, curve, passes=1).makespan_s == pytest.approx(streamed)
    assert simulate_with_messages(bound, curve).makespan_s == pytest.approx(step())
    assert step() > streamed
    with pytest.raises(OptionError, match="passes"):
        simulate_with_messages(bound, curve, passes=0)


def test_spread_over_gaps_gives_a_runs_cost_the_calibrations_shape():
    from placer.sim.messages import message_gaps, plan_messages, simulate_with_messages, spread_over_gaps

    graph, _, bound = _ping_pong()
    fitted = MessageCost(0.02, 1e-3, 0.01, 0.0)
    alone = MessageCost(0.5, 0.0, 0.25, 0.0)
    assert spread_over_gaps(fitted, alone, bound, {}) is fitted  # no shape to give
    curve = replace(alone, by_gap=((0.0, 0.05, 0.05), (10.0, 0.15, 0.25)))
    spread = spread_over_gaps(fitted, curve, bound, {"a": 0.5})
    # At the gaps the run's messages had (its plan with the fitted cost), the shaped cost averages the run's.
    gaps = message_gaps(plan_messages(graph, bound), bound, simulate_with_messages(bound, fitted, {"a": 0.5}))
    assert np.mean([spread.send_s(0, send) for send, _ in gaps]) == pytest.approx(0.02)
    assert np.mean([spread.receive_s(0, receive) for _, receive in gaps]) == pytest.approx(0.01)
    # Each side keeps the calibration's shape, and the run's per-byte parts.
    (_, send_0, receive_0), (_, send_10, receive_10) = spread.by_gap
    assert (send_10 / send_0, receive_10 / receive_0) == (pytest.approx(3.0), pytest.approx(5.0))
    assert [gap for gap, _, _ in spread.by_gap] == [0.0, 10.0] and spread.send_per_byte_s == 1e-3


def test_measured_transfers_set_the_links_latency_to_their_mean_excess():
    # In a running step messages of a few similar sizes take about the same time, whatever the size.
    cluster = load_cluster("2xcpu")
    bandwidth = cluster.channels[0].bandwidth_bytes_per_s
    transfers = [(0, 1, n, t) for n, t in ((32_768, 210e-6), (65_536, 190e-6), (262_144, 400e-6))] + [
        (1, 0, 65_536, 150e-6)
    ]
    fitted = measured_cluster(cluster, transfers)
    expected = np.mean([t - n / bandwidth for _, _, n, t in transfers])
    for ch in fitted.channels:
        assert ch.bandwidth_bytes_per_s == bandwidth and ch.latency_s == pytest.approx(expected, rel=1e-12)
    # Named as measured (a plan made on it named the preset), once however often it is measured again.
    assert fitted.name == measured_cluster(fitted, transfers).name == "2xcpu-measured"
    assert measured_cluster(cluster, []) is cluster
    # Faster than the bandwidth allows (clock noise): no negative latency.
    assert measured_cluster(cluster, [(0, 1, 10**9, 1e-3)]).channels[0].latency_s == 0.0
    # A cluster file whose channels name no link type: each channel takes its own transfers' (none was
    # measured before, whatever the run sent).
    doc = cluster.to_dict()
    for channel in doc["channels"]:
        channel.pop("link", None)
    unnamed = Cluster.from_dict(doc)
    assert all(ch.extra.get("link") is None for ch in unnamed.channels)
    fitted = measured_cluster(unnamed, transfers)
    by_direction = {
        (0, 1): np.mean([t - n / bandwidth for _, _, n, t in transfers[:3]]),
        (1, 0): 150e-6 - 65_536 / bandwidth,
    }
    for (src, dst), expected in by_direction.items():
        assert fitted.channels[unnamed.channel_index[src, dst]].latency_s == pytest.approx(expected, rel=1e-12)


def _two_kinds(path) -> str:
    """A 2xcpu cluster file whose second device is of another kind."""
    doc = load_cluster("2xcpu").to_dict()
    doc["devices"][1]["kind"] = "slowcpu"
    Cluster.from_dict(doc).save(path)
    return str(path)


def test_a_runs_times_as_a_profile_give_the_graph_what_measured_graph_gives(file_case, tmp_path):
    from placer.cost.profile import apply_profile, load_profile
    from placer.harness.feedback import measured_profile, profile_kind

    graph, cluster = file_case.captured.graph, load_cluster("2xcpu")
    bound = random_plan(graph, cluster, seed=1).bind(graph, cluster)
    seconds = {node: 1e-4 * (k + 1) for k, node in enumerate(graph.ids)} | {"not_a_node": 1.0}
    measured_profile(bound, seconds, source="a test").save(tmp_path / "p.json")
    profile = load_profile(tmp_path / "p.json", graph)
    assert profile.device_kind == "cpu" and profile.meta == {"source": "a test"}
    assert "not_a_node" not in profile.node_seconds
    assert (
        apply_profile(graph, profile).compute_s_by_kind
        == measured_graph(graph, bound, cluster, seconds).compute_s_by_kind
    )
    # One file holds one kind's times: a run over two kinds is refused, naming them.
    mixed = load_cluster(_two_kinds(tmp_path / "mixed.json"))
    with pytest.raises(OptionError, match=r"one device kind, .* of 2 \('cpu', 'slowcpu'\)"):
        measured_profile(random_plan(graph, mixed, seed=1).bind(graph, mixed), seconds)
    assert profile_kind(mixed, [1]) == "slowcpu"


def test_a_split_plans_run_gives_a_profile_of_the_captured_graph(file_case):
    # The profile was of the plan's rewritten graph under the captured graph's name: `placer cost` refused it for
    # the captured graph ("made for graph 'x' ..., not for graph 'x'"). The ops the plan split ran only as parts.
    from placer.cost.profile import apply_profile
    from placer.harness.feedback import measured_profile
    from placer.transform.split import split_operation

    graph, cluster = file_case.captured.graph, load_cluster("2xcpu")
    name = next(graph.ids[i] for i, dims in enumerate(graph.splittable) if any(d["dim"] == "batch" for d in dims or []))
    split = split_operation(graph, name, "batch", 2)
    from placer.algorithms.common import placement_units

    unit_of, _ = placement_units(split)
    plan = Plan.from_arrays(
        graph, cluster, unit_of % 2, placed_graph=split, splits=[{"node": name, "dim": "batch", "parts": 2}]
    )
    bound = plan.bind(graph, cluster)
    seconds = {node: 1e-4 for node in bound.graph.ids}
    profile = measured_profile(bound, seconds, graph)
    assert (profile.graph_name, profile.graph_digest) == (graph.name, graph.digest())
    assert set(profile.node_seconds) == set(graph.ids) - {name}
    i = graph.index[name]
    assert apply_profile(graph, profile).compute_s_by_kind[i] == graph.compute_s_by_kind[i]


def test_a_distributed_run_records_each_ranks_timeline_in_plan_order(file_case):
    captured = file_case.captured
    cluster = load_cluster("2xcpu")
    plan = random_plan(captured.graph, cluster, seed=5)
    model, optimizer = file_case.fresh()
    flat = captured.step_inputs(model, file_case.inputs, optimizer)
    result = run_distributed(captured.gm, captured.graph, plan, cluster, flat, steps=2, carrier=captured.carrier)
    graph = captured.graph
    assert sorted(result.timeline) == [0, 1]
    for rank, ops in result.timeline.items():
        # Every operation the plan gives the rank (its inputs, placeholders, are not run), in plan order.
        ran = [name for name, *_ in ops if name in graph.index]
        assert ran == [v for v in plan.order[cluster.devices[rank].name] if graph.op[graph.index[v]] != "placeholder"]
        ends = [0.0] + [ended for *_, ended in ops]
        for (name, began, waited, ended), before in zip(ops, ends):
            assert before <= began and waited >= 0 and began + waited <= ended
    assert min(ops[0][1] for ops in result.timeline.values()) >= 0.0
    # Every node has a measured time, the placeholders their rank's share of its work before its first op.
    assert set(result.op_s) == set(graph.ids) and all(s > 0 for s in result.op_s.values())
    # The ops' times (the last step's, with two steps) tile their rank's span: each counts from the
    # previous op's end, so the executor's own work between two ops is busy time; only waits are not.
    for ops in result.timeline.values():
        busy = sum(result.op_s[name] for name, *_ in ops if name in graph.index)
        waits = sum(waited for _, _, waited, _ in ops)
        span = ops[-1][3] - ops[0][1]
        assert span - 1e-9 <= busy + waits <= span + 1e-2
    # What the step spent after the last operation (its barrier) is measured, and is part of the step.
    assert 0.0 < result.tail_s < result.step_s[-1]


def test_placer_run_writes_the_measured_timeline(file_case, tmp_path, capsys):
    import json

    plan = random_plan(file_case.captured.graph, load_cluster("2xcpu"), seed=3)
    plan.save(tmp_path / "plan.json")
    args = [
        "run",
        file_case.spec,
        "--plan",
        str(tmp_path / "plan.json"),
        "--steps",
        "2",
        "--trace",
        str(tmp_path / "run.json"),
    ]
    assert main(args + ["--backend", "distributed"]) == 0
    out = capsys.readouterr().out
    assert "timeline of the last step" in out
    assert re.search(r"messages: \d+ per step took the ranks \d+% of their busy time", out)
    assert re.search(r"a step ended \d+\.\d{3} ms after its last operation", out)
    events = json.loads((tmp_path / "run.json").read_text())["traceEvents"]
    graph = file_case.captured.graph
    ran = {e["name"] for e in events if e.get("cat") == "op"} & set(graph.ids)
    assert ran == {v for v, op in zip(graph.ids, graph.op) if op != "placeholder"}
    assert main(args) == 2
    assert "--trace needs --backend distributed" in capsys.readouterr().err
    # Refused before any training (an unwritable trace was found only after it).
    plan_args = args[:6]
    for extra, message in [
        (["--trace", str(tmp_path / "run.json" / "t.json")], "trace file"),
        (["--warmup", "-1"], "--warmup must be >= 0"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--timeout", "0.001"], "--timeout must be at least 1 second"),
        (["--devices", "cpu,cpu"], "--devices is for --backend local"),
    ]:
        assert main(plan_args + ["--backend", "distributed", *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and "training" not in err, err


def test_a_plan_for_another_graph_is_refused(file_case):
    other = capture(*load_model(file_case.spec, 2))
    cluster = load_cluster("2xcpu")
    plan = place(other.graph, cluster, "expert")
    with pytest.raises(InvalidPlanError, match="made for graph 'Net-bs2-adam'"):
        compile_program(file_case.captured.gm, file_case.captured.graph, plan, cluster)


def test_placer_run_refuses_a_plan_for_another_batch_before_training(file_case, tmp_path, capsys):
    # It said "training 2 steps of ..." first, then refused.
    other = capture(*load_model(file_case.spec, 2))
    place(other.graph, load_cluster("2xcpu"), "expert").save(tmp_path / "bs2.json")
    code = main(["run", file_case.spec, "--plan", str(tmp_path / "bs2.json"), "--batch", "4", "--steps", "2"])
    out, err = capsys.readouterr()
    assert code == 2 and "training" not in out + err
    assert f"{tmp_path / 'bs2.json'}: the plan was made for graph 'Net-bs2-adam'" in err


def test_an_optimizer_the_capture_cannot_reproduce_is_refused(file_case):
    plan = place(file_case.captured.graph, load_cluster("2xcpu"), "expert")
    model = copy.deepcopy(file_case.model)
    with pytest.raises(OptionError, match="dampening=0.5 with momentum is not supported"):
        apply(plan, model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5))
    with pytest.raises(OptionError, match="amsgrad=True is not supported by capture"):
        apply(plan, model, torch.optim.Adam(model.parameters(), amsgrad=True))
    with pytest.raises(OptionError, match="foreach=True is not supported by capture"):
        apply(plan, model, torch.optim.Adam(model.parameters(), foreach=True))
    with pytest.raises(OptionError, match="differentiable=True is not supported by capture"):
        apply(plan, model, torch.optim.SGD(model.parameters(), lr=0.1, differentiable=True))
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    others = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    with pytest.raises(OptionError, match="2 parameter groups"):
        apply(plan, model, torch.optim.SGD([{"params": weights}, {"params": others}], lr=0.1, momentum=0.9))
    with pytest.raises(OptionError, match="RMSprop is not supported"):
        apply(plan, model, torch.optim.RMSprop(model.parameters()))


OPTIMIZER_SETTINGS = {
    "sgd-momentum-wd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-4)),
    "sgd-nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    "adam-betas-wd": (torch.optim.Adam, dict(lr=1e-3, betas=(0.8, 0.99), weight_decay=0.01)),
}


@pytest.mark.parametrize("settings", sorted(OPTIMIZER_SETTINGS))
def test_a_placed_step_trains_with_the_optimizers_settings_like_eager(file_case, settings):
    """placer.apply reads the optimizer's settings and captures the step with them (the plan made for that
    step); every parameter, buffer and optimizer state (momentum buffers, Adam's moments) equals eager."""
    torch_class, given = OPTIMIZER_SETTINGS[settings]
    model, reference = copy.deepcopy(file_case.model), copy.deepcopy(file_case.model)
    optimizer = torch_class(model.parameters(), **given)
    reference_optimizer = torch_class(reference.parameters(), foreach=False, **given)
    plan = placer.plan(model, file_case.inputs, cluster="2xcpu", algorithm="round_robin", optimizer=optimizer)
    _check_spread(plan)
    del plan.context["captured"]  # apply captures the step itself, from the optimizer's settings
    step = apply(plan, model, optimizer)
    for _ in range(STEPS):
        step(*file_case.inputs)
    train_eager(reference, file_case.inputs, reference_optimizer, STEPS)
    worst, where, count = state_difference(model, optimizer, reference, reference_optimizer)
    assert worst <= TOLERANCE, f"{where} differs from eager training by {worst}"
    names = {key for state in optimizer.state.values() for key in state}
    assert names == ({"momentum_buffer"} if torch_class is torch.optim.SGD else {"step", "exp_avg", "exp_avg_sq"})
    assert count == len(reference.state_dict()) + len(names) * len(list(reference.parameters()))


LR_SCHEDULED = {
    "sgd": ("sgd", 0.1, {}),
    "sgd-momentum": ("sgd", 0.1, dict(momentum=0.9)),
    "adam": ("adam", 1e-3, {}),
    "adamw": ("adamw", 1e-3, dict(weight_decay=0.01)),
}


def _scheduled(file_case, name):
    """A fresh model, its optimizer with a StepLR halving lr every step, and the same for eager training."""
    optimizer_name, lr, given = LR_SCHEDULED[name]
    model, reference = copy.deepcopy(file_case.model), copy.deepcopy(file_case.model)
    torch_class = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer_name]
    optimizer = torch_class(model.parameters(), lr=lr, **given)
    reference_optimizer = torch_class(reference.parameters(), lr=lr, foreach=False, **given)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (optimizer, reference_optimizer)]
    return model, optimizer, reference, reference_optimizer, schedulers


@pytest.mark.parametrize("name", sorted(LR_SCHEDULED))
def test_a_placed_step_follows_a_learning_rate_scheduler_like_eager(file_case, name):
    """The learning rate is an input of the captured step, read from the optimizer at every call: a
    scheduler stepping between placed steps trains exactly as it does eager training."""
    model, optimizer, reference, reference_optimizer, (scheduler, reference_scheduler) = _scheduled(file_case, name)
    optimizer_name, lr, given = LR_SCHEDULED[name]
    captured = capture(model, file_case.inputs, optimizer=optimizer_name, lr=lr, settings=given)
    plan = random_plan(captured.graph, load_cluster("2xcpu"), seed=3)
    _check_spread(plan)
    plan.context["captured"] = captured
    step = apply(plan, model, optimizer)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(STEPS):
            step(*file_case.inputs)
            scheduler.step()
    assert not [w for w in seen if "lr_scheduler.step()" in str(w.message)]  # no word of a skipped optimizer.step()
    for _ in range(STEPS):
        train_eager(reference, file_case.inputs, reference_optimizer, 1)
        reference_scheduler.step()
    assert optimizer.param_groups[0]["lr"] == lr * 0.5**STEPS
    worst, where, _ = state_difference(model, optimizer, reference, reference_optimizer)
    assert worst == 0.0, f"{where} differs from eager training by {worst}"


# run_distributed is not optimizer.step(), whose call a scheduler looks for (PlacedStep marks it; this runs below it)
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
def test_distributed_runs_of_a_step_each_follow_a_learning_rate_scheduler_like_eager(file_case):
    """The distributed executor runs its steps with the flat inputs it is given, their lr one number: a
    run per step, its inputs read from the optimizer anew, follows a scheduler."""
    model, optimizer, reference, reference_optimizer, (scheduler, reference_scheduler) = _scheduled(file_case, "adam")
    captured = capture(model, file_case.inputs, optimizer="adam")
    cluster = load_cluster("2xcpu")
    plan = random_plan(captured.graph, cluster, seed=3)
    for _ in range(2):
        flat = captured.step_inputs(model, file_case.inputs, optimizer)
        result = run_distributed(
            captured.gm, captured.graph, plan, cluster, flat, steps=1, carrier=captured.carrier, timeout_s=30
        )
        captured.write_back([result.state.get(k, v) for k, v in enumerate(flat)], model, optimizer)
        scheduler.step()
        train_eager(reference, file_case.inputs, reference_optimizer, 1)
        reference_scheduler.step()
    worst, where, _ = state_difference(model, optimizer, reference, reference_optimizer)
    assert worst == 0.0, f"{where} differs from eager training by {worst}"


def test_a_placed_step_refuses_optimizer_settings_changed_since_its_capture(file_case):
    model = copy.deepcopy(file_case.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    plan = placer.plan(model, file_case.inputs, cluster="2xcpu", algorithm="round_robin", optimizer=optimizer)
    step = apply(plan, model, optimizer)
    step(*file_case.inputs)
    optimizer.param_groups[0]["momentum"] = 0.8
    with pytest.raises(
        OptionError,
        match=r"settings changed since the step was captured: momentum 0.8 \(captured "
        r"with 0.9\).*apply the plan again",
    ):
        step(*file_case.inputs)
    apply(plan, model, optimizer)(*file_case.inputs)  # the same graph, another constant: captured anew
    optimizer.param_groups[0]["weight_decay"] = 1e-4  # another graph (the decay's operations): plan again
    with pytest.raises(
        InvalidPlanError,
        match=r"made for a training step with SGD \(lr 0.1, momentum 0.9\), but "
        r"the optimizer is SGD \(lr 0.1, momentum 0.8, weight_decay 0.0001\)",
    ):
        apply(plan, model, optimizer)(*file_case.inputs)


# --------------------------------------------------------- tensor layouts
def _views():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    heads = torch.arange(480.0).reshape(4, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)[0]  # (batch, head, token, dim)
    return {
        "dense": base,
        "transposed": base.t(),
        "gapped": base[:, ::2],
        "offset": base[1:, 2:],
        "expanded": torch.arange(3.0).reshape(3, 1).expand(3, 5),
        "empty": base[:0],
        "heads": heads,
    }


@pytest.mark.parametrize("name", list(_views()))
def test_transfers_keep_values_and_strides(name):
    t = _views()[name]
    moved = copy_to(t, torch.device("cpu"))
    assert moved.stride() == t.stride() and torch.equal(moved, t)
    assert moved.numel() == 0 or moved.data_ptr() != t.data_ptr()

    class Node:  # what value_spec reads of an fx node
        name = "v"
        meta = {"val": t}

    spec = value_spec(Node)
    buf = pack(t, spec, torch.device("cpu"), snapshot=True)
    received = receive_buffer(spec, torch.device("cpu"))
    if buf is not None:
        received.copy_(buf)
    out = unpack(received, spec, torch.device("cpu"))
    assert out.stride() == t.stride() and torch.equal(out, t)


@pytest.mark.parametrize("name", list(_views()))
def test_compact_transfers_send_a_view_with_gaps_as_its_elements_alone(name):
    """Where the step reads no strides (:attr:`Program.compact_views`), a view with gaps travels as the bytes
    the graph's edge counts, dense with its dimensions in their order (attention heads stay token-major, as
    they were traced); the others keep their layout (an ``expand`` its shorter span)."""
    t = _views()[name]
    gapped = name in ("gapped", "offset", "heads")

    class Node:
        name = "v"
        meta = {"val": t}

    spec = value_spec(Node, compact=True)
    for out in (
        copy_to(t, torch.device("cpu"), compact=True),
        unpack(pack(t, spec, torch.device("cpu"), snapshot=True), spec, torch.device("cpu")),
    ):
        assert torch.equal(out, t)
        assert out.stride() == (dense_strides(t.shape, t.stride()) if gapped else t.stride())
    assert name != "heads" or dense_strides(t.shape, t.stride()) == (40, 4, 8, 1)
    assert message_bytes(spec) == (t.numel() * 4 if gapped else message_bytes(value_spec(Node)))


class _Gates(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = torch.nn.Linear(16, 64), torch.nn.Linear(16, 3)

    def forward(self, x, y):
        keep, write = self.fc(x).chunk(4, dim=1)[:2]
        return torch.nn.functional.cross_entropy(self.out(keep.sigmoid() * write.tanh()), y)


class _Strided(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(torch.as_strided(self.fc(x), (4, 4), (8, 1)), y)


class _Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.fc(x), y)


def test_a_view_taken_of_a_received_copy_keeps_the_copy_held_for_its_readers():
    """A weight's transpose and its reader on another device than the weight: the transpose is a view of the
    copy received there, which its reader keeps held; the graph says so with an edge (0 bytes) from every node
    a view was taken through to the view's readers."""
    torch.manual_seed(0)
    captured = capture(_Wide(), (torch.randn(4, 256), torch.randint(0, 256, (4,))), optimizer="sgd")
    graph, gm = captured.graph, captured.gm
    (view,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.t.default and n.args[0].op == "placeholder"]
    moved = {view.name, *(reader.name for reader in view.users)}
    plan = Plan({node_id: "cpu1" if node_id in moved else "cpu0" for node_id in graph.ids}, graph_name=graph.name)
    cluster = load_cluster("2xcpu")
    executor = LocalExecutor(compile_program(gm, graph, plan, cluster, carrier=captured.carrier), track_memory=True)
    executor.run(captured.example_args())
    assert executor.peak_bytes[1] == validate(plan, graph, cluster).peak_memory_bytes[1] > 256 * 256 * 4


def test_a_gate_read_on_another_device_holds_there_what_the_graph_counts():
    """An LSTM-like gate (a view with gaps of one projection) read on another device: the copy there holds
    the gate's own bytes, as the reference model counts the received copy, not the projection it spans."""
    torch.manual_seed(0)
    captured = capture(_Gates(), (torch.randn(256, 16), torch.randint(0, 3, (256,))), optimizer="sgd")
    graph, cluster = captured.graph, load_cluster("2xcpu")
    readers = {
        graph.index[n.name]
        for n in captured.gm.graph.nodes
        if str(n.target) in ("aten.sigmoid.default", "aten.tanh.default")
    }
    placement = {node_id: "cpu1" if i in readers else "cpu0" for i, node_id in enumerate(graph.ids)}
    plan = Plan(placement, graph_name=graph.name)
    program = compile_program(captured.gm, graph, plan, cluster, carrier=captured.carrier)
    assert program.compact_views
    executor = LocalExecutor(program, track_memory=True)
    executor.run(captured.example_args())
    assert executor.peak_bytes[1] == validate(plan, graph, cluster).peak_memory_bytes[1] > 0
    strided = capture(_Strided(), (torch.randn(4, 8), torch.randint(0, 4, (4,))), optimizer="sgd")
    assert not compile_program(
        strided.gm, strided.graph, place(strided.graph, cluster, "single"), cluster, carrier=strided.carrier
    ).compact_views


class _Broadcast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x, y):
        h = self.fc(x)
        return torch.nn.functional.cross_entropy(h.mean(0, keepdim=True).expand(512, 256) * h, y)


def test_an_expand_read_on_another_device_carries_and_holds_its_span_alone():
    """An ``expand`` travels as the storage it spans (one row here), not its repeats: the graph's edge says
    so, and the reference model's peak on the reader's device is what the copy there holds."""
    torch.manual_seed(0)
    captured = capture(_Broadcast(), (torch.randn(512, 256), torch.randint(0, 256, (512,))), optimizer="sgd")
    graph, cluster = captured.graph, load_cluster("2xcpu")
    wide = next(n for n in captured.gm.graph.nodes if n.target is torch.ops.aten.expand.default)  # the forward's
    readers = {reader.name for reader in wide.users}
    for e in np.flatnonzero(graph.src == graph.index[wide.name]):
        assert graph.edge_bytes[e] == 256 * 4
    plan = Plan({node_id: "cpu1" if node_id in readers else "cpu0" for node_id in graph.ids}, graph_name=graph.name)
    executor = LocalExecutor(
        compile_program(captured.gm, graph, plan, cluster, carrier=captured.carrier), track_memory=True
    )
    executor.run(captured.example_args())
    assert executor.peak_bytes[1] == validate(plan, graph, cluster).peak_memory_bytes[1] > 0


@pytest.mark.parametrize("model, batch", [(_Gates, (256, 16, 3)), (_Broadcast, (512, 256, 256)), (_Strided, (4, 8, 4))])
def test_every_edge_carries_what_the_runtime_sends_for_it(model, batch):
    """Between devices the runtime sends each tensor as :func:`message_bytes` says (an ``expand``'s span, a
    gapped view's elements unless the step reads strides); the graph's edge from it counts the same bytes."""
    torch.manual_seed(0)
    rows, features, classes = batch
    captured = capture(model(), (torch.randn(rows, features), torch.randint(0, classes, (rows,))), optimizer="sgd")
    graph = captured.graph
    program = compile_program(
        captured.gm,
        graph,
        place(graph, load_cluster("2xcpu"), "single"),
        load_cluster("2xcpu"),
        carrier=captured.carrier,
    )
    fx_node = {v.name: v for v in captured.gm.graph.nodes}
    checked = 0
    for src, b in zip(graph.src.tolist(), graph.edge_bytes.tolist()):
        v = fx_node[graph.ids[src]]
        if b and isinstance(v.meta.get("val"), torch.Tensor):
            assert b == message_bytes(value_spec(v, program.compact_views)), v.name
            checked += 1
    assert checked > 10


@pytest.mark.parametrize("value", [0.1 + 0.2, 7, True])
def test_python_scalars_travel_exactly(value):
    class Node:
        name = "s"
        meta = {"val": value}

    spec = value_spec(Node)
    out = unpack(pack(value, spec, torch.device("cpu"), snapshot=False), spec, torch.device("cpu"))
    assert out == value and type(out) is type(value)


# ----------------------------------------------------------------- the CLI
def test_placer_run_verifies_against_eager_training(file_case, tmp_path, capsys):
    plan = random_plan(file_case.captured.graph, load_cluster("2xcpu"), seed=3)
    plan.save(tmp_path / "plan.json")
    code = main(["run", file_case.spec, "--plan", str(tmp_path / "plan.json"), "--steps", "2", "--verify"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "equal eager training" in out and "simulator predicts" in out


def test_placer_run_predicts_from_a_profile_it_is_given(file_case, tmp_path, capsys):
    from placer.cost.profile import Profile, apply_profile
    from placer.sim.simulator import simulate_plan

    graph, cluster = file_case.captured.graph, load_cluster("2xcpu")
    plan = random_plan(graph, cluster, seed=3)
    plan.save(tmp_path / "plan.json")
    # Every operation 2 ms: the prediction is the plan's step on those times, not the analytic ones.
    profile = Profile(graph.name, graph.digest(), "cpu", dict.fromkeys(graph.ids, 2e-3))
    profile.save(tmp_path / "p.json")
    args = ["run", file_case.spec, "--plan", str(tmp_path / "plan.json"), "--steps", "2"]
    assert main([*args, "--profile", str(tmp_path / "p.json")]) == 0
    expected = simulate_plan(plan, apply_profile(graph, profile), cluster).makespan_s
    assert f"simulator predicts {expected * 1e3:.3f} ms (the times of {tmp_path / 'p.json'})" in capsys.readouterr().out
    assert main(args) == 0
    assert "ms (analytic costs)" in capsys.readouterr().out
    # A profile of another graph is refused before training, naming the file.
    Profile("other", "0" * 16, "cpu", {}).save(tmp_path / "other.json")
    assert main([*args, "--profile", str(tmp_path / "other.json")]) == 2
    err = capsys.readouterr().err
    assert "other.json" in err and "made for graph 'other'" in err


def _recording_runs(monkeypatch) -> list:
    """The Measurement of every run the CLI makes from now on."""
    import placer.cli.run as runtime_cli

    runs, measure_plan = [], runtime_cli.measure_plan

    def measure(*args, **kwargs):
        runs.append(measure_plan(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(runtime_cli, "measure_plan", measure)
    return runs


def test_placer_run_writes_its_measured_times_as_a_profile_placer_cost_applies(zoo_case, tmp_path, capsys, monkeypatch):
    from placer.graph import OpGraph

    runs = _recording_runs(monkeypatch)
    graph = zoo_case.captured.graph
    graph.save(tmp_path / "g.json")
    random_plan(graph, load_cluster("2xcpu"), seed=2).save(tmp_path / "plan.json")
    profile, cluster = tmp_path / "run" / "p.json", tmp_path / "c.json"
    code = main(
        [
            "run",
            zoo_case.spec,
            "--plan",
            str(tmp_path / "plan.json"),
            "--steps",
            "3",
            "--backend",
            "local",
            "--profile-output",
            str(profile),
            "--cluster-output",
            str(cluster),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    (m,) = runs
    times = own_times(m.op_s, m.op_message_s)  # every operation's (the local run times no placeholder)
    assert f"measured times of {len(times)} nodes on 'cpu' devices -> {profile}" in out
    assert set(times) <= set(graph.ids) and sum(times.values()) > 0
    assert main(["cost", str(tmp_path / "g.json"), "--profile", str(profile), "-o", str(tmp_path / "gc.json")]) == 0
    costed = OpGraph.load(tmp_path / "gc.json")
    assert {node: costed.compute_s_by_kind[costed.index[node]]["cpu"] for node in times} == times
    # The run's copies set the links' latency; the file is a cluster the other commands load.
    measured = load_cluster(cluster)
    assert measured.channels[0].extra["latency_from"] == "measured in a placed run"
    assert measured.digest() == measured_cluster(load_cluster("2xcpu"), m.transfer_s).digest()
    assert f"cluster '2xcpu-measured' (links' latency from {len(m.transfer_s)} measured transfers)" in out
    # A plan made on it names it, not the preset it was measured from.
    assert main(["plan", str(tmp_path / "g.json"), "--cluster", str(cluster), "-o", str(tmp_path / "p2.json")]) == 0
    assert Plan.load(tmp_path / "p2.json").cluster_name == "2xcpu-measured"


def test_placer_run_and_tune_refuse_a_measurement_file_they_cannot_write_before_any_work(
    file_case, tmp_path, capsys, monkeypatch
):
    import placer.cli.run as runtime_cli

    def no_capture(*args, **kwargs):
        raise AssertionError("captured before the outputs were checked")

    monkeypatch.setattr(runtime_cli, "_load", no_capture)
    graph = file_case.captured.graph
    random_plan(graph, load_cluster("2xcpu"), seed=3).save(tmp_path / "plan.json")
    (tmp_path / "a_file").write_text("")
    mixed = _two_kinds(tmp_path / "mixed.json")
    run = ["run", file_case.spec, "--plan", str(tmp_path / "plan.json"), "--steps", "1"]
    tune = ["tune", file_case.spec, "--batch", "4", "-o", str(tmp_path / "tuned.json")]
    for command, flags, message in (
        (run, ["--profile-output", str(tmp_path / "a_file" / "p.json")], "cannot write profile file"),
        (run, ["--cluster-output", str(tmp_path / "a_file" / "c.json")], "cannot write cluster file"),
        (run, ["--profile-output", str(tmp_path / "plan.json")], "is the input file"),
        (
            run,
            ["--cluster", mixed, "--profile-output", str(tmp_path / "p.json")],
            "--profile-output: a placer.profile/1 file holds the times of one device kind",
        ),
        (tune + ["--cluster", mixed], ["--profile-output", str(tmp_path / "p.json")], "of one device kind"),
        (
            tune + ["--cluster", "2xcpu"],
            ["--cluster-output", str(tmp_path / "a_file" / "c.json")],
            "cannot write cluster file",
        ),
        # Two outputs at one path: the second would replace the first.
        (
            run,
            ["--profile-output", str(tmp_path / "p.json"), "--cluster-output", str(tmp_path / "p.json")],
            "--profile-output and --cluster-output are both",
        ),
        (
            tune + ["--cluster", "2xcpu"],
            ["--profile-output", str(tmp_path / "tuned.json")],
            "--output and --profile-output are both",
        ),
    ):
        code = main(command + flags)
        err = capsys.readouterr().err
        assert code == 2 and message in err, err
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "tuned.json").exists()


def test_placer_run_verifies_sgd_with_momentum_against_eager_training(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    settings = ["--optimizer", "sgd", "--momentum", "0.9", "--weight-decay", "1e-4"]
    assert (
        main(
            [
                "plan",
                "zoo:lenet",
                "--batch",
                "2",
                "--cluster",
                "2xcpu",
                "--algorithm",
                "round_robin",
                "-o",
                str(plan),
                *settings,
            ]
        )
        == 0
    )
    capsys.readouterr()
    code = main(["run", "zoo:lenet", "--plan", str(plan), "--lr", "0.05", "--steps", "3", "--verify", *settings])
    out = capsys.readouterr().out
    assert code == 0, out
    # parameters, and a momentum buffer each
    assert "verify: 20 tensors (parameters, buffers, optimizer state) equal eager training" in out
    # The plan's step has momentum buffers and the decay's operations: without them it is another graph.
    assert main(["run", "zoo:lenet", "--plan", str(plan), "--steps", "1", "--optimizer", "sgd"]) == 2
    assert "optimizer settings that add operations or state (--momentum, --weight-decay" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--optimizer", "adam", "--momentum", "0.9"], "--momentum is for --optimizer sgd, not adam"),
        (["--optimizer", "sgd", "--betas", "0.8,0.99"], "--betas is for --optimizer adam or adamw, not sgd"),
        (["--optimizer", "sgd", "--momentum", "-1"], r"momentum must be a finite number >= 0, got -1.0 \(--momentum\)"),
        (["--optimizer", "sgd", "--nesterov"], "nesterov=True needs momentum > 0"),
        (["--optimizer", "adam", "--betas", "0.9,1.5"], r"betas\[1\] must be a finite number in \[0, 1\)"),
        (["--optimizer", "adam", "--weight-decay", "-0.1"], "weight_decay must be a finite number >= 0"),
        # Only the flag that is wrong is named (both were), and a bad --lr is told as itself.
        (
            ["--optimizer", "sgd", "--momentum", "0.9", "--weight-decay", "-1"],
            r"weight_decay must be a finite number >= 0, got -1.0 \(--weight-decay\)$",
        ),
        (["--optimizer", "sgd", "--lr", "-1", "--momentum", "0.9"], r"lr must be a finite number >= 0, got -1.0$"),
    ],
)
def test_placer_run_refuses_bad_optimizer_settings_naming_them_before_any_work(flags, message, tmp_path, capsys):
    code = main(["run", "zoo:lenet", "--plan", str(tmp_path / "missing.json"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and re.search(message, err), err
    assert main(["capture", "zoo:lenet", "--batch", "2", "-o", str(tmp_path / "g.json"), *flags]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "g.json").exists()


def test_verify_trains_the_eager_reference_where_the_plans_first_device_ran(monkeypatch):
    # A GPU run compared with eager training on the CPU would differ by the kernels (TF32 and all).
    from placer.cli.run import _first_device

    assert _first_device("local", ["cpu", "cpu"], 2) == torch.device("cpu")
    assert _first_device("local", ["cuda:1", "cuda:0"], 2) == torch.device("cuda", 1)
    assert _first_device("distributed", None, 2) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert _first_device("local", None, 2) == torch.device("cuda", 0)
    assert _first_device("local", None, 4) == torch.device("cpu")  # too few GPUs: every device is the CPU


def test_placer_run_verify_fails_beyond_the_tolerance_and_says_why(file_case, tmp_path, capsys, monkeypatch):
    import placer.runtime.check as check

    plan = random_plan(file_case.captured.graph, load_cluster("2xcpu"), seed=3)
    plan.save(tmp_path / "plan.json")
    monkeypatch.setattr(check, "state_difference", lambda *args, **kwargs: (3e-3, "parameter 'w'", 4))
    args = ["run", file_case.spec, "--plan", str(tmp_path / "plan.json"), "--steps", "1", "--verify"]
    assert main(args + ["--tolerance", "1e-3"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: parameter 'w' differs from eager training on cpu by 0.003 (> --tolerance 0.001)" in out
    assert "--optimizer sgd" in out
    assert main(args + ["--tolerance", "4e-3"]) == 0
    assert "equal eager training on cpu within 0.004" in capsys.readouterr().out
    assert main(args + ["--tolerance", "-1"]) != 0
    assert "--tolerance must be >= 0, got -1.0" in capsys.readouterr().err
    # A momentum buffer (a running sum of gradients) differing is told as such (an H200 run: 1.3e-05 there,
    # its parameters within 1e-6).
    monkeypatch.setattr(check, "state_difference", lambda *args, **kwargs: (1.3e-5, "conv1.weight:momentum_buffer", 4))
    sgd = [
        "run",
        "zoo:lenet",
        "--plan",
        str(tmp_path / "sgd.json"),
        "--steps",
        "1",
        "--verify",
        "--optimizer",
        "sgd",
        "--momentum",
        "0.9",
    ]
    assert (
        main(
            [
                "plan",
                "zoo:lenet",
                "--batch",
                "2",
                "--cluster",
                "2xcpu",
                "--algorithm",
                "round_robin",
                "--optimizer",
                "sgd",
                "--momentum",
                "0.9",
                "-o",
                str(tmp_path / "sgd.json"),
            ]
        )
        == 0
    )
    assert main(sgd) == 1
    out = capsys.readouterr().out
    assert "a momentum buffer holds a running sum of gradients" in out and "--optimizer sgd" not in out


def test_placer_run_verify_catches_an_executor_that_computes_wrong(file_case, tmp_path, capsys, monkeypatch):
    # Not a stubbed comparison: one operation's result, off by a part in a million, reaches the parameters.
    import placer.runtime.local as local

    real_bind = local.bind_call
    perturbed = []

    def off(v, device):
        call = real_bind(v, device)

        def perturbing(values):
            out = call(values)
            if not perturbed and isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() > 1:
                perturbed.append(v.name)
                return out * (1 + 1e-6)
            return out

        return perturbing if "addmm" in str(v.target) else call

    monkeypatch.setattr(local, "bind_call", off)
    random_plan(file_case.captured.graph, load_cluster("2xcpu"), seed=3).save(tmp_path / "plan.json")
    code = main(
        ["run", file_case.spec, "--plan", str(tmp_path / "plan.json"), "--steps", "2", "--verify", "--tolerance", "0"]
    )
    assert perturbed and code == 1
    assert "FAILED: " in capsys.readouterr().out


def test_extra_optimizer_state_counts_as_a_difference():
    # State eager training does not have (an update of a parameter without a gradient) went unnoticed.
    model, reference = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    reference.load_state_dict(model.state_dict())
    optimizer, reference_optimizer = torch.optim.Adam(model.parameters()), torch.optim.Adam(reference.parameters())
    assert state_difference(model, optimizer, reference, reference_optimizer)[0] == 0.0
    optimizer.state[model.bias]["exp_avg"] = torch.zeros(2)
    assert state_difference(model, optimizer, reference, reference_optimizer)[:2] == (float("inf"), "bias:exp_avg")


def test_placer_run_refuses_a_tolerance_without_verify(file_case, tmp_path, capsys):
    # Without --verify nothing is compared: a --tolerance there would be silently ignored.
    plan = random_plan(file_case.captured.graph, load_cluster("2xcpu"), seed=3)
    plan.save(tmp_path / "plan.json")
    code = main(["run", file_case.spec, "--plan", str(tmp_path / "plan.json"), "--steps", "1", "--tolerance", "1e-3"])
    captured = capsys.readouterr()
    assert code == 2
    assert "--tolerance needs --verify" in captured.err and "simulator predicts" not in captured.out


def test_a_verified_run_trains_both_ways_in_full_float32_and_restores_the_setting(file_case, tmp_path, monkeypatch):
    # GPUs' default TF32 convolutions turn last-bit differences into 1e-3 (seen on an H200).
    import placer.runtime.check as check

    seen = []
    train = check.train_eager
    monkeypatch.setattr(check, "train_eager", lambda *args: seen.append(float32_precision()) or train(*args))
    plan = random_plan(file_case.captured.graph, load_cluster("2xcpu"), seed=3)
    plan.save(tmp_path / "plan.json")
    before = float32_precision()
    assert before[0] == "tf32"  # torch's default for cuDNN convolutions
    assert main(["run", file_case.spec, "--plan", str(tmp_path / "plan.json"), "--steps", "1", "--verify"]) == 0
    assert seen == [("ieee", "ieee")]
    assert float32_precision() == before


def _expect_exact_float32(rank: int) -> None:
    if float32_precision() != ("ieee", "ieee"):
        raise ValueError(f"rank {rank} runs with float32 precision {float32_precision()}")


def test_spawned_ranks_take_the_launchers_float32_precision(file_case):
    cluster = load_cluster("2xcpu")
    captured = file_case.captured
    plan = random_plan(captured.graph, cluster, seed=1)
    flat = captured.step_inputs(*file_case.fresh()[:1], file_case.inputs)
    with exact_float32():
        run_distributed(
            captured.gm,
            captured.graph,
            plan,
            cluster,
            flat,
            steps=1,
            carrier=captured.carrier,
            timeout_s=30,
            hook=_expect_exact_float32,
        )
    with pytest.raises(RunError, match="float32 precision"):
        run_distributed(
            captured.gm,
            captured.graph,
            plan,
            cluster,
            flat,
            steps=1,
            carrier=captured.carrier,
            timeout_s=30,
            hook=_expect_exact_float32,
        )


def _expect_deterministic_cudnn(rank: int) -> None:
    if not torch.backends.cudnn.deterministic:
        raise ValueError(f"rank {rank} lets cuDNN pick nondeterministic algorithms")


def test_spawned_ranks_take_the_launchers_choice_of_cudnn_algorithms(file_case, monkeypatch):
    # A spawned rank starts with torch's defaults; one that let cuDNN choose otherwise than the
    # launcher trained 7.9e-4 apart from it on an H200.
    cluster = load_cluster("2xcpu")
    captured = file_case.captured
    plan = random_plan(captured.graph, cluster, seed=1)
    flat = captured.step_inputs(*file_case.fresh()[:1], file_case.inputs)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    run_distributed(
        captured.gm,
        captured.graph,
        plan,
        cluster,
        flat,
        steps=1,
        carrier=captured.carrier,
        timeout_s=60,
        hook=_expect_deterministic_cudnn,
        start_method="spawn",
    )


def _calibration_file(path, by_gap=((0.0, 2e-5, 1e-5), (1e-3, 8e-5, 6e-5))):
    from placer.harness.calibrate import Calibration, LinkFit

    cost = MessageCost(1e-4, 0.0, 1e-4, 0.0, by_gap=by_gap, after_send_s=5e-6, after_receive_s=1e-5)
    Calibration({"gloo": LinkFit(3e-5, 4e9, 1.0)}, {}, cost).save(path)
    return str(path)


def test_placer_tune_keeps_the_faster_measured_plan(file_case, tmp_path, capsys):
    out_path = tmp_path / "tuned.json"
    code = main(
        [
            "tune",
            file_case.spec,
            "--cluster",
            "2xcpu",
            "--batch",
            "4",
            "--rounds",
            "1",
            "--steps",
            "2",
            "--message-cost",
            _calibration_file(tmp_path / "cal.json"),
            "-o",
            str(out_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "round 1:" in out and ("kept" in out or "rolled back" in out)
    assert "ms with its messages' host cost" in out
    tuned = Plan.load(out_path)
    tuned.bind(file_case.captured.graph, load_cluster("2xcpu"))
    assert tuned.extra["measured_step_s"] > 0


def test_placer_tune_with_the_local_backend_feeds_its_transfers_back_and_writes_the_kept_run(
    tmp_path, capsys, monkeypatch
):
    from placer.cost.profile import load_profile
    from placer.runtime.check import step_times

    runs = _recording_runs(monkeypatch)
    # The local executor's copies were timed and then dropped: only the distributed run's refined the links.
    code = main(
        [
            "tune",
            "zoo:lenet",
            "--cluster",
            "2xcpu",
            "--batch",
            "4",
            "--rounds",
            "1",
            "--steps",
            "2",
            "--backend",
            "local",
            "-o",
            str(tmp_path / "tuned.json"),
            "--profile-output",
            str(tmp_path / "p.json"),
            "--cluster-output",
            str(tmp_path / "c.json"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"round 1: \d+ measured op times, [1-9]\d* measured transfers; gloo link now", out), out
    # The files hold the kept plan's run, not the last one's.
    tuned = Plan.load(tmp_path / "tuned.json")
    (kept,) = [m for m in runs if step_times(m.step_s, 1).median_s == tuned.extra["measured_step_s"]]
    assert load_profile(tmp_path / "p.json").node_seconds == own_times(kept.op_s, kept.op_message_s)
    measured = measured_cluster(load_cluster("2xcpu"), kept.transfer_s)
    assert load_cluster(tmp_path / "c.json").digest() == measured.digest()
    # The plan names the cluster it runs on, the measured file its own.
    assert (tuned.cluster_name, load_cluster(tmp_path / "c.json").name) == ("2xcpu", "2xcpu-measured")
    # The next tune starts from those measured times (a run's profile closes the loop across commands).
    code = main(
        [
            "tune",
            "zoo:lenet",
            "--cluster",
            "2xcpu",
            "--batch",
            "4",
            "--rounds",
            "1",
            "--steps",
            "2",
            "--backend",
            "local",
            "--algorithm",
            "m_etf",
            "--profile",
            str(tmp_path / "p.json"),
            "-o",
            str(tmp_path / "again.json"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    from placer.capture import capture_spec
    from placer.cost.profile import apply_profile

    profiled = apply_profile(capture_spec("zoo:lenet", 4).graph, load_profile(tmp_path / "p.json"))
    first = place(profiled, load_cluster("2xcpu"), "m_etf", seed=0)
    assert (
        f"round 0: m_etf on the measured times of {tmp_path / 'p.json'}: measured " in out
        and f"predicted {first.predicted['makespan_s'] * 1e3:.3f} ms" in out
    ), out
    code = main(
        [
            "tune",
            "zoo:lenet",
            "--cluster",
            "4xV100-nvlink",
            "--batch",
            "4",
            "--profile",
            str(tmp_path / "p.json"),
            "-o",
            str(tmp_path / "x.json"),
        ]
    )
    assert code == 2 and "a profile of device kind 'cpu', which cluster '4xV100-nvlink'" in capsys.readouterr().err


def test_placer_tune_refuses_a_calibration_without_costs_by_gap(file_case, tmp_path, capsys):
    calibration = _calibration_file(tmp_path / "cal.json", by_gap=())
    code = main(
        [
            "tune",
            file_case.spec,
            "--cluster",
            "2xcpu",
            "--batch",
            "4",
            "--message-cost",
            calibration,
            "-o",
            str(tmp_path / "tuned.json"),
        ]
    )
    assert code == 2
    assert f"calibration {calibration} has no message cost by gap" in capsys.readouterr().err
    assert not (tmp_path / "tuned.json").exists()


def _torchrun_rank(rank: int, port: int, case: Case, plans: list[Plan], out: str) -> None:
    """One rank as torchrun starts it: only the environment says who it is. Rank 1 builds its model
    unseeded (other weights and inputs than rank 0's) and reads ``plans[1]``."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
    )
    assert under_torchrun()
    captured, plan = case.captured, plans[rank]
    model, optimizer = case.fresh()
    flat = captured.step_inputs(model, case.inputs, optimizer)
    if rank == 1:
        flat = [x + torch.randn_like(x) if x.is_floating_point() else x for x in flat]
    result = run_under_torchrun(
        captured.gm,
        captured.graph,
        plan,
        load_cluster("2xcpu"),
        flat,
        steps=STEPS,
        carrier=captured.carrier,
        timeout_s=30,
    )
    assert (result is None) == (rank != 0)
    if result is not None:
        torch.save(result.state, out)


def test_ranks_started_by_torchrun_run_the_plan_together_from_rank_0s_state(file_case, tmp_path):
    # Each rank builds the model itself: an unseeded one gave rank 1 other weights and inputs, which the
    # step mixed with rank 0's, silently.
    import torch.multiprocessing as mp

    plan = place(file_case.captured.graph, load_cluster("2xcpu"), "expert")
    out = str(tmp_path / "state.pt")
    mp.start_processes(_torchrun_rank, args=(free_port(), file_case, [plan, plan], out), nprocs=2, start_method="fork")
    model, optimizer = file_case.fresh()
    flat = file_case.captured.step_inputs(model, file_case.inputs, optimizer)
    state = torch.load(out, weights_only=False)
    file_case.captured.write_back([state.get(k, v) for k, v in enumerate(flat)], model, optimizer)
    file_case.assert_matches(model, optimizer)


def test_torchrun_ranks_with_another_plan_than_rank_0s_stop_with_an_error(file_case, tmp_path):
    import torch.multiprocessing as mp

    cluster = load_cluster("2xcpu")
    plans = [place(file_case.captured.graph, cluster, name) for name in ("expert", "round_robin")]
    with pytest.raises(
        mp.ProcessRaisedException,
        match=r"rank\(s\) \[1\] have another plan or captured step "
        r"than rank 0",
    ):
        mp.start_processes(
            _torchrun_rank, args=(free_port(), file_case, plans, str(tmp_path / "x.pt")), nprocs=2, start_method="fork"
        )


def test_placer_run_under_torchrun_trains_and_rank_0_alone_speaks(tmp_path):
    # The command line as docs/running.md gives it, two ranks launched by torchrun itself.
    import subprocess
    import sys

    plan = tmp_path / "plan.json"
    assert (
        main(["plan", "zoo:lenet", "--batch", "4", "--cluster", "2xcpu", "--algorithm", "round_robin", "-o", str(plan)])
        == 0
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "placer",
            "run",
            "zoo:lenet",
            "--batch",
            "4",
            "--plan",
            str(plan),
            "--backend",
            "distributed",
            "--steps",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("training 3 steps of lenet-bs4-adam as the plan places it (distributed)") == 1
    assert done.stdout.count("lenet-bs4-adam on 2xcpu (distributed, 2 devices): 3 steps") == 1


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_terminated_distributed_run_stops_its_ranks_and_says_so(tmp_path):
    import signal

    plan = tmp_path / "plan.json"
    assert (
        main(["plan", "zoo:lenet", "--batch", "4", "--cluster", "2xcpu", "--algorithm", "round_robin", "-o", str(plan)])
        == 0
    )
    code, err, ranks = terminate_once_ranks_run(
        ["run", "zoo:lenet", "--batch", "4", "--plan", str(plan), "--backend", "distributed", "--steps", "1000000"],
        2,
        b"multiprocessing",
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert code == -signal.SIGTERM
    assert err.splitlines()[-1] == "placer: terminated: the run's processes were stopped and nothing was written"
    assert not outliving(ranks), "a rank outlived placer"
    assert not list(tmp_path.glob("placer-run-*")), "the ranks' directory was left behind"


# ------------------------------------------------- what a placed step may not change
class _TwoDropouts(torch.nn.Module):
    """Two independent dropouts: the loss is exactly 0 only if both draw the same mask."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 32), torch.nn.Linear(4, 32)
        self.d1, self.d2 = torch.nn.Dropout(0.5), torch.nn.Dropout(0.5)

    def forward(self, x):
        ones = torch.ones(x.shape[0], 32)
        return (self.d1(ones + self.a(x)) - self.d2(ones + self.b(x))).pow(2).mean()


def test_random_operations_draw_their_own_streams_the_same_on_both_backends():
    torch.manual_seed(0)
    model, inputs = _TwoDropouts(), (torch.randn(2, 4),)
    captured = capture(model, inputs, optimizer="sgd")
    cluster = load_cluster("2xcpu")
    plan = place(captured.graph, cluster, "round_robin")
    program = compile_program(captured.gm, captured.graph, plan, cluster, carrier=captured.carrier)
    assert sorted(program.device_of[v] for v in program.random) == [0, 1]  # one dropout per rank
    flat = captured.step_inputs(model, inputs)
    torch.manual_seed(1)
    local = LocalExecutor(program)
    local_flat = [t.clone() for t in flat]
    losses = [float(local.run(local_flat)[0]) for _ in range(2)]
    torch.manual_seed(1)  # the same base seed: the same draws, whatever the backend
    result = run_distributed(
        captured.gm, captured.graph, plan, cluster, flat, steps=2, carrier=captured.carrier, timeout_s=30
    )
    assert losses[0] > 0.1 and losses[0] != losses[1]  # independent masks, new ones every step
    assert float(result.outputs[0]) == losses[1]
    for k, value in result.state.items():
        assert torch.equal(value, local_flat[k])


class _FusedAttention(torch.nn.Module):
    """Heads as views of one projection into ``scaled_dot_product_attention``, as timm's ViT makes them."""

    def __init__(self, dropout_p: float = 0.0):
        super().__init__()
        self.qkv, self.dropout_p = torch.nn.Linear(8, 24), dropout_p

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p)
        return a.transpose(1, 2).reshape(b, n, c).pow(2).mean()  # traced as a view where it may be one


@pytest.mark.parametrize("backend", ["local", "distributed"])
def test_attention_heads_received_on_another_device_keep_the_layout_a_later_view_needs(backend):
    """Heads sent to another device as their elements alone, then attention there: CPU attention lays its
    result out after its query's, which the ``view`` after it needs as traced (a contiguous copy of the
    heads made the local step fail: "view size is not compatible with input tensor's size and stride")."""
    torch.manual_seed(0)
    model, x = _FusedAttention(), torch.randn(4, 5, 8)
    eager = copy.deepcopy(model)
    captured = capture(model, (x,), optimizer="sgd")
    cluster = load_cluster("2xcpu")
    graph = captured.graph
    attention = {
        graph.colocation[graph.index[n.name]]
        for n in captured.gm.graph.nodes
        if "attention" in str(n.target) and "backward" not in str(n.target)
    }  # with its outputs
    plan = Plan(
        {node_id: "cpu1" if graph.colocation[i] in attention else "cpu0" for i, node_id in enumerate(graph.ids)},
        graph_name=graph.name,
    )
    flat = captured.step_inputs(model, (x,))
    if backend == "local":
        outputs = LocalExecutor(
            compile_program(captured.gm, captured.graph, plan, cluster, carrier=captured.carrier)
        ).run(flat)
    else:
        outputs = run_distributed(
            captured.gm, captured.graph, plan, cluster, flat, steps=1, carrier=captured.carrier, timeout_s=30
        ).outputs
    assert float(outputs[0]) == float(eager(x).detach())


@pytest.mark.parametrize("dropout_p", [0.0, 0.5])
def test_attention_draws_random_numbers_only_with_dropout(dropout_p):
    from placer.runtime.program import random_nodes

    # scaled_dot_product_attention's kernels are tagged random whatever their dropout_p: --verify refused
    # every transformer, dropout 0 or not.
    captured = capture(_FusedAttention(dropout_p), (torch.randn(3, 2, 8),), optimizer="sgd")
    assert bool(random_nodes(captured.gm)) == (dropout_p > 0)


def test_verify_refuses_a_step_that_draws_random_numbers_naming_them(tmp_path, capsys):
    path = tmp_path / "drop.py"
    path.write_text(
        textwrap.dedent("""
        import torch
        from torch import nn

        def make(batch_size):
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))
            class Loss(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.net = model
                def forward(self, x):
                    return self.net(x).pow(2).mean()
            return Loss(), (torch.randn(batch_size, 4),)
    """)
    )
    captured = capture_spec(f"{path}:make", 2)
    place(captured.graph, load_cluster("2xcpu"), "round_robin").save(tmp_path / "plan.json")
    args = ["run", f"{path}:make", "--plan", str(tmp_path / "plan.json"), "--steps", "1"]
    assert main(args + ["--verify"]) == 2
    err = capsys.readouterr().err
    assert "--verify cannot compare" in err and "'bernoulli' (aten.bernoulli in net.1)" in err
    assert main(args) == 0  # training is fine


class _Scaled(torch.nn.Module):
    """Linear, batch norm, a mean over ``x.shape[0]`` (a number in the capture) and a non-tensor argument."""

    def __init__(self):
        super().__init__()
        self.l1, self.bn, self.l2 = torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 3)

    def forward(self, x, y, scale):
        logits = self.l2(torch.relu(self.bn(self.l1(x)))) * scale
        return torch.nn.functional.cross_entropy(logits, y, reduction="sum") / x.shape[0]


def _scaled_step(batch=4):
    import placer

    torch.manual_seed(0)
    model = _Scaled()
    inputs = (torch.randn(batch, 8), torch.randint(0, 3, (batch,)), 1.0)
    plan = placer.plan(model, inputs, cluster="2xcpu", algorithm="round_robin")
    optimizer = torch.optim.Adam(model.parameters())
    return model, optimizer, plan, inputs


def test_a_placed_step_refuses_inputs_unlike_the_captured_ones_before_running():
    model, optimizer, plan, (x, y, scale) = _scaled_step()
    step = apply(plan, model, optimizer)
    step(x, y, scale)
    before = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
    with pytest.raises(OptionError, match=r"input 0: .* shape \(4, 8\), got .* shape \(8, 8\)"):
        step(torch.randn(8, 8), torch.randint(0, 3, (8,)), scale)
    with pytest.raises(OptionError, match="input 1: .* torch.int64 .* got a torch.int32"):
        step(x, y.int(), scale)
    with pytest.raises(OptionError, match="input 2: the step was captured with 1.0 there, got 5.0"):
        step(x, y, 5.0)
    with pytest.raises(OptionError, match=r"takes its inputs by position, .*; got keyword inputs 'scale'"):
        step(x, y, scale=scale)
    after = (model.state_dict(), optimizer.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(before[0].values(), after[0].values()))
    assert [float(s["step"]) for s in after[1]["state"].values()] == [1.0] * len(after[1]["state"])
    # Another layout of the same values is the same input.
    reference = copy.deepcopy((model, optimizer))
    loss = step(x.t().contiguous().t(), y, scale)
    assert loss == apply(plan, *reference)(x, y, scale)


def test_a_placed_step_takes_a_changed_learning_rate_and_refuses_a_changed_mode_or_optimizer():
    model, optimizer, plan, inputs = _scaled_step()
    step = apply(plan, model, optimizer)
    step(*inputs)
    optimizer.param_groups[0]["lr"] = 1e-4  # what a learning-rate scheduler does: an input of the step
    step(*inputs)
    apply(plan, model, optimizer)(*inputs)  # the plan's capture, taken with another lr
    optimizer.param_groups[0]["lr"] = 0.0  # as torch.optim does, and a warm-up may start
    step(*inputs)
    optimizer.param_groups[0]["lr"] = torch.tensor(1e-3)
    with pytest.raises(OptionError, match="the optimizer's lr is a tensor"):
        step(*inputs)
    optimizer.param_groups[0]["lr"] = 1e-3
    model.bn.eval()
    with pytest.raises(OptionError, match="module 'bn' is in eval mode, but the step was captured in training mode"):
        step(*inputs)
    model.train()
    step(*inputs)
    model.eval()  # before the first call too: the plan's capture was made in training mode
    with pytest.raises(OptionError, match="the model is in eval mode"):
        apply(plan, model, optimizer)(*inputs)
    model.train()
    with pytest.raises(OptionError, match="made for a training step with Adam, but the optimizer is SGD"):
        apply(plan, model, torch.optim.SGD(model.parameters(), lr=0.1))(*inputs)


class _Constants(torch.nn.Module):
    """A tensor made in forward and a plain (not registered) tensor attribute: constants of the step."""

    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 3)
        self.shift = torch.tensor([0.5, -0.5, 0.0])

    def forward(self, x, y):
        weight = torch.tensor([1.0, 2.0, 0.5])
        return torch.nn.functional.cross_entropy(self.l(x) + self.shift, y, weight=weight)


@pytest.mark.parametrize("backend", ["local", "distributed"])
def test_tensor_constants_of_the_step_run_where_the_plan_puts_them(backend):
    torch.manual_seed(0)
    model, inputs = _Constants(), (torch.randn(4, 8), torch.randint(0, 3, (4,)))
    captured = capture(model, inputs, optimizer="sgd")
    constants = [v.name for v in captured.gm.graph.nodes if v.op == "get_attr"]
    assert len(constants) == 2
    cluster = load_cluster("2xcpu")
    plan = random_plan(captured.graph, cluster, seed=0)
    _check_spread(plan)
    reference = copy.deepcopy(model)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=1e-3)
    train_eager(reference, inputs, reference_optimizer, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    if backend == "local":
        plan.context["captured"] = captured
        step = apply(plan, model, optimizer)
        for _ in range(2):
            step(*inputs)
    else:
        flat = captured.step_inputs(model, inputs, optimizer)
        result = run_distributed(
            captured.gm, captured.graph, plan, cluster, flat, steps=2, carrier=captured.carrier, timeout_s=30
        )
        captured.write_back([result.state.get(k, v) for k, v in enumerate(flat)], model, optimizer)
    worst, where, _ = state_difference(model, optimizer, reference, reference_optimizer)
    assert worst <= TOLERANCE, f"{where} differs by {worst}"


class _Tokens(torch.nn.Module):
    """Linear layers over (batch, seq, features): their matrix products have batch x seq rows."""

    def __init__(self):
        super().__init__()
        self.emb, self.fc, self.out = torch.nn.Embedding(20, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 20)

    def forward(self, tokens, labels):
        logits = self.out(torch.relu(self.fc(self.emb(tokens))))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def test_splits_of_batch_times_sequence_rows_run():
    torch.manual_seed(0)
    model, inputs = _Tokens(), (torch.randint(0, 20, (3, 4)), torch.randint(0, 20, (3, 4)))
    captured = capture(model, inputs, optimizer="sgd")
    graph, cluster = captured.graph, load_cluster("2xcpu")
    names = [graph.ids[i] for i, s in enumerate(graph.splittable) if s and s[0]["size"] == 12]
    assert names
    target = graph
    for name in names:
        target = split_operation(target, name, "batch", 3)
    unit_of, units = placement_units(target)
    device_of = np.random.default_rng(0).integers(0, 2, len(units))[unit_of]
    plan = Plan.from_arrays(
        graph, cluster, device_of, placed_graph=target, splits=[{"node": n, "dim": "batch", "parts": 3} for n in names]
    )
    plan.context["captured"] = captured
    reference = copy.deepcopy(model)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=1e-3)
    train_eager(reference, inputs, reference_optimizer, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = apply(plan, model, optimizer)
    for _ in range(2):
        step(*inputs)
    worst, where, _ = state_difference(model, optimizer, reference, reference_optimizer)
    assert worst <= TOLERANCE, f"{where} differs by {worst}"


def test_verify_counts_nan_against_nan_as_equal():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with torch.no_grad():
        for m in (a, b):
            m.weight.copy_(torch.tensor([[float("nan"), 1.0], [float("inf"), 2.0]]))
            m.bias.fill_(0.5)
    assert state_difference(a, None, b, None)[0] == 0.0
    with torch.no_grad():
        b.weight[0, 1] = float("nan")
    assert state_difference(a, None, b, None)[:2] == (float("inf"), "weight")


# ---------------------------------------------------------- the launcher's lifetime
LAUNCHER = textwrap.dedent("""
    import os, signal, sys, torch
    from torch import nn
    from placer.algorithms import place
    from placer.capture import capture
    from placer.cluster import load_cluster
    from placer.runtime.distributed import run_distributed

    def hook(rank):
        with open(os.path.join(sys.argv[1], f"rank{rank}.pid"), "w") as f:
            f.write(str(os.getpid()))

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = nn.Linear(4, 4), nn.Linear(4, 1)
        def forward(self, x):
            return self.l2(self.l1(x)).pow(2).mean()

    if sys.argv[2] == "ignore-sigint":        # as a shell's background job does (then torch's own
        signal.signal(signal.SIGINT, signal.SIG_IGN)    # parent-death SIGINT to its ranks does nothing)
    model, inputs = Loss(), (torch.randn(2, 4),)
    captured = capture(model, inputs, optimizer="sgd")
    cluster = load_cluster("2xcpu")
    plan = place(captured.graph, cluster, "round_robin")
    run_distributed(captured.gm, captured.graph, plan, cluster, captured.step_inputs(model, inputs),
                    steps=10**7, carrier=captured.carrier, timeout_s=30, hook=hook)
""")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_ranks_stop_when_the_launcher_is_interrupted_terminated_or_killed(tmp_path, sig):
    import subprocess
    import sys

    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER)
    sigint = "default" if sig == signal.SIGINT else "ignore-sigint"
    launcher = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), sigint],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(ranks) < 2 and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.1)
            ranks = [int(p.read_text()) for p in tmp_path.glob("rank*.pid") if p.read_text()]
        assert len(ranks) == 2, "the ranks did not start"
        os.kill(launcher.pid, sig)
        deadline = time.monotonic() + 15
        while any(map(_running, ranks)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_running, ranks)), f"ranks still running {sig.name} after the launcher got it"
        launcher.wait(timeout=15)
        if sig != signal.SIGKILL:
            assert not list(tmp_path.glob("placer-run-*")), "the launcher left its directory behind"
    finally:
        for pid in ranks + [launcher.pid]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=15)


@pytest.mark.parametrize(
    "devices, message",
    [
        (["cpu", "meta"], "runs on 'cpu' and 'cuda:N'"),
        (["cpu", "cuda:99"], "names a CUDA device"),
        (["cpu", "not-a-device"], "is not a torch device"),
    ],
)
def test_the_local_executor_refuses_devices_it_cannot_run_on(file_case, devices, message):
    cluster = load_cluster("2xcpu")
    program = compile_program(
        file_case.captured.gm, file_case.captured.graph, random_plan(file_case.captured.graph, cluster, 0), cluster
    )
    with pytest.raises(OptionError, match=message):
        LocalExecutor(program, devices)


def test_tune_starts_from_and_may_keep_a_replicated_plan(file_case, tmp_path, capsys):
    # Tune once kept its algorithm to plans without data-parallel replicas (refusing data_parallel): the
    # runtime runs them now, so tune measures and keeps them like any plan.
    from placer.transform.replicate import replicated_node

    out_path = tmp_path / "tuned.json"
    code = main(
        [
            "tune",
            file_case.spec,
            "--cluster",
            "2xcpu",
            "--batch",
            "4",
            "--algorithm",
            "data_parallel",
            "--rounds",
            "1",
            "--steps",
            "2",
            "-o",
            str(out_path),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "round 0: data_parallel" in captured.out
    tuned = Plan.load(out_path)
    assert replicated_node(tuned.rewritten_graph) is not None
    tuned.bind(file_case.captured.graph, load_cluster("2xcpu"))


def test_run_refuses_a_plan_it_cannot_run_before_capturing_the_model(file_case, tmp_path, capsys, monkeypatch):
    import placer.cli.run as runtime_cli

    def no_capture(*args, **kwargs):
        raise AssertionError("captured before the plan was checked")

    monkeypatch.setattr(runtime_cli, "_load", no_capture)
    graph = file_case.captured.graph
    place(graph, load_cluster("4xcpu"), "round_robin").save(tmp_path / "rr4.json")
    for plan, cluster, message in (
        ("rr4.json", "2xcpu", "which cluster '2xcpu' lacks (the plan was made for cluster '4xcpu', not '2xcpu')"),
    ):
        code = main(["run", file_case.spec, "--plan", str(tmp_path / plan), "--cluster", cluster, "--steps", "1"])
        assert code == 2 and message in capsys.readouterr().err


class _Attention(torch.nn.Module):
    """Self-attention whose heads are views of one projection, as transformers make them."""

    def __init__(self, width: int = 64, heads: int = 4, classes: int = 5):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, classes)

    def forward(self, x, y):
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        return torch.nn.functional.cross_entropy(self.out(a.transpose(1, 2).reshape(b, s, w).mean(1)), y)


class _ConvNorm(torch.nn.Module):
    """Convolutions with batch norm and max-pooling: operations with several outputs, read at different times."""

    def __init__(self, classes: int = 5):
        super().__init__()
        nn = torch.nn
        self.a, self.norm_a = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.b, self.norm_b = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 8 * 8, classes)

    def forward(self, x, y):
        h = torch.nn.functional.max_pool2d(self.norm_a(self.a(x)).relu(), 2)
        return torch.nn.functional.cross_entropy(self.fc(self.norm_b(self.b(h)).relu().flatten(1)), y)


@pytest.mark.parametrize("algorithm", ["single", "m_etf"])
@pytest.mark.parametrize("model", ["attention", "convnorm", "lenet"])
def test_simulated_peak_memory_is_what_the_executor_holds(model, algorithm):
    """The reference model's peak (FORMATS.md, rule 6) against the storage the local executor holds at once,
    on each device, within 1%. Capture keeps a view's base held while the view is read (the attention's
    heads), adds no ordering edge that a path implies and holds an ordering edge's source only until the
    first node that leads to the write (either would hold an activation until its weight's update), and
    holds each output of a multi-output op until its own readers end (batch norm's output is read at once,
    its saved statistics in the backward pass); the executor counts the step's inputs for the whole step,
    as the caller holds them."""
    torch.manual_seed(0)
    if model == "attention":
        captured = capture(_Attention(), (torch.randn(16, 32, 64), torch.randint(0, 5, (16,))), optimizer="sgd")
    elif model == "convnorm":
        captured = capture(_ConvNorm(), (torch.randn(16, 3, 16, 16), torch.randint(0, 5, (16,))), optimizer="sgd")
    else:
        captured = capture_spec("zoo:lenet", 8)
    cluster = load_cluster("2xcpu")
    plan = place(captured.graph, cluster, algorithm)
    executor = LocalExecutor(
        compile_program(captured.gm, captured.graph, plan, cluster, carrier=captured.carrier), track_memory=True
    )
    executor.run(captured.example_args())
    simulated = validate(plan, captured.graph, cluster).peak_memory_bytes
    used = simulated > 0
    assert (executor.peak_bytes[~used] == 0).all()
    assert np.allclose(simulated[used] / executor.peak_bytes[used], 1, atol=0.01)


class _Unreached(torch.nn.Module):
    """An auxiliary head the loss does not read, and a step counter replaced (not updated in place) in forward."""

    def __init__(self):
        super().__init__()
        self.body, self.aux = torch.nn.Linear(8, 4), torch.nn.Linear(8, 2)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count = self.count + 1
        return self.body(x).pow(2).mean() / self.count


@pytest.mark.parametrize("backend", ["local", "distributed"])
def test_a_parameter_the_loss_does_not_reach_and_a_replaced_buffer_train_as_eager(backend):
    # torch.optim skips a parameter whose grad stays None: AdamW's weight decay shrank the unreached head
    # and Adam gave it state; a buffer the forward replaced kept its captured value.
    import placer

    torch.manual_seed(0)
    model, inputs = _Unreached(), (torch.randn(4, 8),)
    reference = copy.deepcopy(model)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=0.1)
    train_eager(reference, inputs, reference_optimizer, STEPS)
    plan = placer.plan(model, inputs, cluster="2xcpu", algorithm="round_robin", optimizer="adamw", lr=0.1)
    captured = plan.context["captured"]
    assert captured.layout.unreached == ("aux.weight", "aux.bias")
    assert not any(name.startswith("s_") and "aux" in name for name in captured.graph.ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    if backend == "local":
        step = apply(plan, model, optimizer)
        for _ in range(STEPS):
            step(*inputs)
    else:
        flat = captured.step_inputs(model, inputs, optimizer)
        result = run_distributed(
            captured.gm,
            captured.graph,
            plan,
            load_cluster("2xcpu"),
            flat,
            steps=STEPS,
            carrier=captured.carrier,
            timeout_s=30,
        )
        captured.write_back([result.state.get(k, v) for k, v in enumerate(flat)], model, optimizer)
    assert float(model.count) == float(reference.count) == STEPS
    assert not optimizer.state.get(model.aux.weight)
    assert state_difference(model, optimizer, reference, reference_optimizer)[0] <= TOLERANCE


def test_a_buffer_replaced_by_another_shape_is_refused_at_capture():
    class Grows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(4, 1)
            self.register_buffer("seen", torch.zeros(1))

        def forward(self, x):
            self.seen = torch.cat([self.seen, x.sum().reshape(1).detach()])
            return self.l(x).mean()

    with pytest.raises(FormatError, match=r"assigns a torch.float32 tensor of shape \(2,\) to buffer 'seen'"):
        capture(Grows(), (torch.randn(2, 4),), optimizer="sgd")


def test_a_placed_step_refuses_an_optimizer_without_every_trained_parameter_and_a_parameter_frozen_since():
    model, optimizer, plan, inputs = _scaled_step()
    with pytest.raises(
        OptionError, match="the optimizer does not hold parameter 'l1.weight' \\(and 1 more\\), which requires grad"
    ):
        apply(plan, model, torch.optim.Adam(list(model.bn.parameters()) + list(model.l2.parameters())))(*inputs)
    step = apply(plan, model, optimizer)
    step(*inputs)
    model.l1.weight.requires_grad_(False)  # fine-tuning: freezing a layer after the step was made
    with pytest.raises(OptionError, match="parameter 'l1.weight' does not require grad now, but it was trained"):
        step(*inputs)
    with pytest.raises(OptionError, match="parameter 'l1.weight' does not require grad now"):
        apply(plan, model)(*inputs)  # the default optimizer's step checks it too
