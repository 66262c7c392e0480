"""Splits of the backward pass: convolution_backward and a linear layer's weight gradient along the batch and
the output channels, their partial results summed by a node of their own (FastT Sec. 5.2)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from placer import load_cluster, place, simulate
from placer.algorithms.common import placement_units
from placer.api import apply
from placer.capture import capture
from placer.capture.spec import capture_spec, in_float64
from placer.capture.spec import load_model as load_spec_model
from placer.cost.analytic import node_time_s
from placer.errors import InvalidPlanError, OptionError
from placer.plan import Plan
from placer.runtime import splits as splits_module
from placer.runtime.check import state_difference, train_eager
from placer.runtime.program import compile_program
from placer.transform import apply_transform
from placer.transform.base import SHARE_AND_WHOLE
from placer.transform.checks import _law_failure
from placer.transform.replicate import data_parallel_graph
from placer.transform.split import split_dims, split_operation

STEPS = 3
TOLERANCE = 1e-6
BACKWARD_OPS = ("aten.convolution_backward", "aten.mm")

pytestmark = pytest.mark.usefixtures("one_thread")


class ConvNet(nn.Module):
    """Two convolutions (the first reads the batch input: no input gradient) and a linear head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.head = nn.Linear(6 * 5 * 5, 5)

    def forward(self, x, y):
        h = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return nn.functional.cross_entropy(self.head(h.flatten(1)), y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 7)
        self.fc3 = nn.Linear(7, 3)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x))))), y)


def _conv_inputs(batch=6):
    torch.manual_seed(0)
    return ConvNet(), (torch.randn(batch, 3, 5, 5), torch.randint(0, 5, (batch,)))


def _mlp_inputs(batch=6):
    torch.manual_seed(0)
    return MLP(), (torch.randn(batch, 6), torch.randint(0, 3, (batch,)))


@pytest.fixture(scope="module")
def conv_step():
    model, inputs = _conv_inputs()
    return model, inputs, capture(copy.deepcopy(model), inputs, optimizer="sgd")


@pytest.fixture(scope="module")
def mlp_step():
    model, inputs = _mlp_inputs()
    return model, inputs, capture(copy.deepcopy(model), inputs, optimizer="sgd")


def _backward(graph, op):
    return [
        graph.ids[i]
        for i in range(graph.num_nodes)
        if graph.op[i] == op and any("join" in e for e in graph.splittable[i] or ())
    ]


def _entry(graph, node, dim):
    return next(e for e in graph.splittable[graph.index[node]] if e["dim"] == dim)


# ------------------------------------------------------------------ capture
def test_capture_declares_backward_convolutions_and_weight_gradients_splittable(conv_step, mlp_step):
    graph = conv_step[2].graph
    convs = _backward(graph, "aten.convolution_backward")
    assert len(convs) == 2
    for node in convs:
        assert split_dims(graph, graph.index[node]) == {"batch": 6, "channel": 6 if node == convs[0] else 4}
        batch, channel = _entry(graph, node, "batch"), _entry(graph, node, "channel")
        # Along the batch: grad_out and input by rows, the input gradient by rows, the others summed.
        assert batch["args"] == [[0, 0], [1, 0]] and batch["join"] == [0, "sum", "sum"]
        # Along the output channels: grad_out's channels and the weight's rows; the input gradient summed.
        assert channel["args"] == [[0, 1], [2, 0]] and channel["join"] == ["sum", 0, 0]
        assert channel["inputs"][1][0].startswith("p_conv") and channel["resize"] == [[3, 0]]
    graph = mlp_step[2].graph
    grads = _backward(graph, "aten.mm")
    assert len(grads) == 3  # every layer's weight gradient
    for node in grads:
        assert _entry(graph, node, "batch")["join"] == ["sum"] and _entry(graph, node, "channel")["join"] == [0]


# ------------------------------------------------------------------ the transform
def test_a_batch_split_sums_whole_partials_in_a_node_of_its_own(conv_step):
    graph = conv_step[2].graph
    node = _backward(graph, "aten.convolution_backward")[0]
    x = graph.index[node]
    out = {int(graph.edge_tensor[e]): int(graph.edge_bytes[e]) for e in np.flatnonzero(graph.src == x)}
    g = split_operation(graph, node, "batch", 3)
    ids = [f"{node}@part{k}" for k in range(3)]
    assert {f"{node}@concat0", f"{node}@sum1", f"{node}@sum2"} <= set(g.ids)
    # Rows 2/2/2 of 6: each part a third of the time; a third of grad_input, the whole of grad_weight and
    # grad_bias (its partials).
    assert np.allclose(g.compute_s[[g.index[i] for i in ids]], graph.compute_s[x] / 3)
    partial = out[1] + out[2]
    share = [
        (graph.output_bytes[x] - partial) * (k + 1) // 3 - (graph.output_bytes[x] - partial) * k // 3 for k in range(3)
    ]
    assert g.output_bytes[[g.index[i] for i in ids]].tolist() == [partial + s for s in share]
    edges = {(g.ids[s], g.ids[d]): b for s, d, b in zip(g.src.tolist(), g.dst.tolist(), g.edge_bytes.tolist())}
    assert [edges[(i, f"{node}@sum1")] for i in ids] == [out[1]] * 3
    assert sum(edges[(i, f"{node}@concat0")] for i in ids) == out[0]
    # The sum reads three partials and writes one, adding two per element, on the roofline.
    s = g.index[f"{node}@sum1"]
    assert g.node_extra[s]["role"] == "sum" and g.output_bytes[s] == out[1]
    assert g.compute_s[s] == pytest.approx(float(node_time_s("V100", 2 * out[1] / 4, 4 * out[1])))
    # The weight goes whole to every part; grad_out and the input in slices.
    weight = next(n for n, _ in _entry(graph, node, "channel")["inputs"] if n.startswith("p_"))
    assert all(edges[(weight, i)] == edges[(weight, i)] > 0 for i in ids)
    assert sum(g.node_extra[g.index[i]].get("role") == "split" for i in g.ids if i.startswith(node)) == 2


def test_a_channel_split_slices_grad_out_and_the_weight_and_sums_the_input_gradient(conv_step):
    graph = conv_step[2].graph
    node = _backward(graph, "aten.convolution_backward")[0]
    g = split_operation(graph, node, "channel", 2)
    splits = {
        g.node_extra[i]["source"]
        for i in range(g.num_nodes)
        if g.node_extra[i].get("split_of") == node and g.node_extra[i].get("role") == "split"
    }
    assert splits == {n for n, _ in _entry(graph, node, "channel")["inputs"]}
    assert f"{node}@sum0" in g.ids and f"{node}@concat1" in g.ids and f"{node}@concat2" in g.ids
    assert g.node_extra[g.index[f"{node}@concat1"]]["axis"] == 0


def test_the_split_transform_states_and_keeps_its_memory_law(conv_step):
    graph = conv_step[2].graph
    node = _backward(graph, "aten.convolution_backward")[0]
    r = apply_transform("split", graph, node=node, dim="batch", parts=2)
    assert _law_failure(SHARE_AND_WHOLE, graph.output_bytes, r.graph.output_bytes, r) is None
    # The law can fail: a part that forgot its partials loses bytes, one that holds twice the whole has more.
    for k, factor in ((r.graph.index[f"{node}@part0"], 0), (r.graph.index[f"{node}@part1"], 3)):
        broken = r.graph.output_bytes.copy()
        broken[k] = broken[k] * factor
        assert _law_failure(SHARE_AND_WHOLE, graph.output_bytes, broken, r) is not None


def test_named_inputs_resolve_in_a_data_parallel_graph_and_after_a_producer_is_split(mlp_step):
    graph = mlp_step[2].graph
    grad = _backward(graph, "aten.mm")[-1]  # the first layer's weight gradient, t(grad) @ x
    dp = data_parallel_graph(graph, 2).graph
    g = split_operation(dp, f"r1/{grad}", "batch", 3)
    assert f"r1/{grad}@sum0" in g.ids

    # A producer split first: its concat feeds the weight gradient, which still finds its input (two linear
    # layers with nothing between: the second's weight gradient reads the first's addmm).
    class Linears(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 5), nn.Linear(5, 2)

        def forward(self, x):
            return self.fc2(self.fc1(x)).pow(2).mean()

    torch.manual_seed(0)
    graph = capture(Linears(), (torch.randn(3, 4),), optimizer="sgd").graph
    grad = next(n for n in _backward(graph, "aten.mm") if _entry(graph, n, "batch")["inputs"][1][0] == "addmm")
    producer = "addmm"
    g = split_operation(split_operation(graph, producer, "batch", 2), grad, "batch", 2)
    split = next(
        i
        for i in range(g.num_nodes)
        if g.node_extra[i].get("split_of") == grad and g.node_extra[i].get("source") == f"{producer}@concat0"
    )
    assert g.node_extra[split]["role"] == "split"
    bad = graph.replace(
        splittable=[
            [{**e, "inputs": [["nowhere", 0]]} if "join" in e else e for e in s] if s else s for s in graph.splittable
        ]
    )
    with pytest.raises(OptionError, match="slices input 'nowhere', which does not feed it"):
        split_operation(bad, grad, "batch", 2)


def test_the_simulator_costs_the_sum_node(conv_step):
    graph = conv_step[2].graph
    node = _backward(graph, "aten.convolution_backward")[0]
    g = split_operation(graph, node, "batch", 2)
    cluster = load_cluster("2xV100-nvlink")
    unit_of, units = placement_units(g)
    device_of = np.zeros(len(units), dtype=np.int64)[unit_of]
    base = simulate(g, cluster, device_of)
    s = g.index[f"{node}@sum1"]
    assert base.finish[s] - base.start[s] == pytest.approx(g.compute_s[s])
    slower = g.compute_s.copy()
    slower[s] += 1.0
    # On one device every node runs in turn: a second more of the sum is a second more of the step.
    assert simulate(g.replace(compute_s=slower), cluster, device_of).makespan_s == pytest.approx(base.makespan_s + 1.0)


# ------------------------------------------------------------------ the runtime
def _plan(graph, splits, cluster, seed=0):
    target = graph
    for node, dim, parts in splits:
        target = split_operation(target, node, dim, parts)
    unit_of, units = placement_units(target)
    device_of = np.random.default_rng(seed).integers(0, cluster.num_devices, len(units))[unit_of]
    return Plan.from_arrays(
        graph, cluster, device_of, placed_graph=target, splits=[{"node": n, "dim": d, "parts": p} for n, d, p in splits]
    )


def _trains_like_eager(model, inputs, captured, plan, tensors=6):
    reference = copy.deepcopy(model)
    reference_optimizer = captured.optimizer.eager(reference.parameters())
    train_eager(reference, inputs, reference_optimizer, STEPS)
    model = copy.deepcopy(model)
    optimizer = captured.optimizer.eager(model.parameters())
    plan.context["captured"] = captured
    step = apply(plan, model, optimizer)
    for _ in range(STEPS):
        step(*inputs)
    worst, where, count = state_difference(model, optimizer, reference, reference_optimizer)
    assert count >= tensors
    assert worst <= TOLERANCE, f"{where} differs from eager training by {worst}"


@pytest.mark.parametrize("dims", [("batch", "channel"), ("channel", "batch")])
def test_split_backward_convolutions_train_as_eager(conv_step, dims):
    """convolution_backward split along the batch (grad_weight and grad_bias summed) and along its output
    channels (grad_input summed, with the first convolution's none), and the head's weight gradient, placed
    at random over two devices: the local executor's training equals eager PyTorch's."""
    model, inputs, captured = conv_step
    graph = captured.graph
    first, second = _backward(graph, "aten.convolution_backward")
    grad = _backward(graph, "aten.mm")[0]
    cluster = load_cluster("2xcpu")
    plan = _plan(graph, [(first, dims[0], 3), (second, dims[1], 2), (grad, "batch", 2)], cluster)
    program = compile_program(captured.gm, graph, plan, cluster, carrier=captured.carrier)
    ran = {program.node_id(v): program.device_of[v] for v in program.schedule if program.node_id(v)}
    assert {f"{first}@part2", f"{second}@part1", f"{grad}@part1", f"{grad}@sum0"} <= ran.keys()
    assert len({ran[f"{first}@part{k}"] for k in range(3)}) == 2
    _trains_like_eager(model, inputs, captured, plan)


def test_split_weight_gradients_of_an_mlp_train_as_eager(mlp_step):
    """Every layer's weight gradient split, along the batch (partial products summed) or its output rows,
    with the input gradients split as before: the local executor's training equals eager PyTorch's."""
    model, inputs, captured = mlp_step
    graph = captured.graph
    grads = _backward(graph, "aten.mm")
    rows = [
        graph.ids[i]
        for i in range(graph.num_nodes)
        if graph.op[i] == "aten.mm" and graph.ids[i] not in grads and graph.splittable[i]
    ]
    splits = [(grads[0], "batch", 4), (grads[1], "channel", 3), (grads[2], "batch", 2), (rows[0], "batch", 2)]
    cluster = load_cluster("2xcpu")
    for seed in (0, 1):
        _trains_like_eager(model, inputs, captured, _plan(graph, splits, cluster, seed))


def test_a_sum_of_an_output_that_the_split_concatenates_is_refused_naming_the_node(conv_step):
    model, inputs, captured = conv_step
    graph = captured.graph
    node = _backward(graph, "aten.convolution_backward")[0]
    cluster = load_cluster("2xcpu")
    plan = _plan(graph, [(node, "batch", 2)], cluster)
    target = plan.rewritten_graph
    extra = [dict(e) for e in target.node_extra]
    victim = target.index[f"{node}@concat0"]
    extra[victim]["role"] = "sum"
    plan.rewritten_graph = target.replace(node_extra=extra)
    with pytest.raises(InvalidPlanError, match=f"{node}@concat0.*does not compute as partial sums"):
        compile_program(captured.gm, graph, plan, cluster, carrier=captured.carrier)


def test_os_dpos_splits_backward_operations_of_a_models_own_graph(conv_step):
    """With compute far above the transfers, OS-DPOS on the model's own graph splits backward operations too,
    and its plan is valid and faster than DPOS's."""
    graph = conv_step[2].graph
    heavy = graph.replace(compute_s=np.where(graph.flops > 0, graph.flops * 1e-6, 1e-7), compute_s_by_kind=None)
    cluster = load_cluster("4xV100-nvlink")
    plan = place(heavy, cluster, "os_dpos", data_parallel_start=False, time_limit=20)
    split = {s["node"] for s in plan.splits}
    assert split & set(_backward(graph, "aten.convolution_backward") + _backward(graph, "aten.mm")), plan.splits
    assert plan.predicted["makespan_s"] < place(heavy, cluster, "dpos").predicted["makespan_s"]


def test_a_convolution_without_bias_splits_its_backward_along_the_channels():
    """Without a bias (ResNet's, Inception's convolutions) the backward declares no bias gradient
    (``bias_sizes`` [0], masked): its channel split slices grad_out and the weight alone, and trains as eager."""

    class NoBias(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
            self.conv2 = nn.Conv2d(4, 5, 3, padding=1, bias=False)

        def forward(self, x):
            return self.conv2(torch.relu(self.conv1(x))).pow(2).mean()

    torch.manual_seed(0)
    model, inputs = NoBias(), (torch.randn(4, 3, 5, 5),)
    captured = capture(copy.deepcopy(model), inputs, optimizer="sgd")
    graph = captured.graph
    convs = _backward(graph, "aten.convolution_backward")
    assert [split_dims(graph, graph.index[n]) for n in convs] == [
        {"batch": 4, "channel": 5},
        {"batch": 4, "channel": 4},
    ]
    assert all("resize" not in _entry(graph, n, "channel") for n in convs)
    plan = _plan(graph, [(convs[0], "channel", 3), (convs[1], "channel", 2)], load_cluster("2xcpu"))
    _trains_like_eager(model, inputs, captured, plan, tensors=2)


# ------------------------------------------------------------------ float64: rounding, not a fault
RESNET50 = "zoo:resnet50?image_size=32&width=4&classes=10"
INCEPTION_V3 = "zoo:inception_v3?image_size=75&width=4&classes=10&aux=false&dropout=0"
#: One float32 rounding, relative.
ULP32 = 2.0**-24


def _scaled_difference(model, reference):
    """Largest over parameters and buffers of max |a - b| / max(1, max |b|), and where."""
    worst, where, _ = state_difference(model, None, reference, None, relative=True)
    return worst, where


def _in_float64(spec, batch):
    torch.manual_seed(0)
    return in_float64(*load_spec_model(spec, batch))


def _placed_training(model, inputs, captured, plan, steps):
    model = copy.deepcopy(model)
    plan.context["captured"] = captured
    step = apply(plan, model, captured.optimizer.eager(model.parameters()))
    for _ in range(steps):
        step(*inputs)
    return model


def _eager_training(model, inputs, captured, steps):
    model = copy.deepcopy(model)
    train_eager(model, inputs, captured.optimizer.eager(model.parameters()), steps)
    return model


def _resnet_stem(graph):
    """OS-DPOS's split of the tiny ResNet-50 (bench/fastt.py --verify): its stem's weight gradient by the batch."""
    return [(_backward(graph, "aten.convolution_backward")[-1], "batch", 2)]


def _inception_by_hand(graph):
    """The tiny Inception-v3's plan by hand (bench/fastt.py --verify): a convolution_backward along the batch,
    the next along its output channels (its input gradient the sum of the channel slices' contributions),
    a weight-gradient mm along the batch."""
    convs, grads = _backward(graph, "aten.convolution_backward"), _backward(graph, "aten.mm")
    grad = next(n for n in grads if "batch" in split_dims(graph, graph.index[n]))
    return [(convs[0], "batch", 2), (convs[1], "channel", 2), (grad, "batch", 2)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec, batch, splits",
    [(RESNET50, 2, _resnet_stem), (INCEPTION_V3, 8, _inception_by_hand)],
    ids=["resnet50", "inception_v3"],
)
def test_zoo_split_plans_that_fail_verify_in_float32_equal_eager_training_in_float64(spec, batch, splits, monkeypatch):
    """The split plans of the tiny ResNet-50 and Inception-v3 that ``placer run --verify`` fails in float32
    (by 102 and 0.003 in a weight) train as eager PyTorch does in float64, within 1e-10 of each tensor's
    size over two SGD steps: the splits compute what the operations do. In float32 these models' eager
    training is itself further than 1e-3 from its float64 training within two steps (batch norm over a few
    values), so a split's rounding (partials added in another order) cannot stay within 1e-6 there. A split
    whose partial sums were off by a single float32 rounding would fail the float64 comparison."""
    model, inputs = _in_float64(spec, batch)
    captured = capture(copy.deepcopy(model), inputs, optimizer="sgd")
    graph = captured.graph
    chosen = splits(graph)
    assert {graph.op[graph.index[n]] for n, _, _ in chosen} <= set(BACKWARD_OPS)
    cluster = load_cluster("2xcpu")
    eager = _eager_training(model, inputs, captured, 2)

    placed = _placed_training(model, inputs, captured, _plan(graph, chosen, cluster), 2)
    worst, where = _scaled_difference(placed, eager)
    assert worst <= 1e-10, f"{where} differs from eager training by {worst} of its size"

    # Eager training in float32 is itself this far from float64's: float32 cannot verify these models to 1e-6.
    single = copy.deepcopy(model).float()
    single_inputs = tuple(t.float() if torch.is_floating_point(t) else t for t in inputs)
    assert _scaled_difference(_eager_training(single, single_inputs, captured, 2), eager)[0] > 1e-3

    # The comparison sees a fault that small: every partial sum off by one float32 rounding fails it.
    exact = splits_module.sum_like

    def off_by_a_rounding(parts, size, stride):
        return exact(parts, size, stride).mul_(1 + ULP32)

    monkeypatch.setattr(splits_module, "sum_like", off_by_a_rounding)
    faulty = _placed_training(model, inputs, captured, _plan(graph, chosen, cluster), 2)
    assert _scaled_difference(faulty, eager)[0] > 1e-10


@pytest.mark.slow
def test_placer_run_verify_float64_passes_a_split_plan_and_catches_a_rounding_fault(tmp_path, capsys, monkeypatch):
    """``placer run --verify --float64`` trains the split ResNet-50 plan and eager PyTorch in double precision:
    equal within 1e-10 of each tensor's size, where float32 rounding, grown by batch norm over two samples,
    fails any useful tolerance; a partial sum off by one float32 rounding fails it."""
    from placer.cli import main

    captured = capture_spec(RESNET50, 2, optimizer="sgd", lr=0.01)
    plan = tmp_path / "plan.json"
    _plan(captured.graph, _resnet_stem(captured.graph), load_cluster("2xcpu")).save(plan)
    argv = ["run", RESNET50, "--plan", str(plan), "--optimizer", "sgd", "--lr", "0.01", "--steps", "2", "--verify"]
    assert main([*argv, "--float64"]) == 0
    out = capsys.readouterr().out
    assert "equal eager training on cpu, both in float64" in out and "within 1e-10" in out

    exact = splits_module.sum_like
    monkeypatch.setattr(splits_module, "sum_like", lambda parts, size, stride: exact(parts, size, stride) * (1 + ULP32))
    assert main([*argv, "--float64"]) == 1
    assert "verify: FAILED" in capsys.readouterr().out


def test_placer_run_refuses_float64_without_verify(tmp_path, capsys):
    from placer.cli import main

    assert main(["run", RESNET50, "--plan", str(tmp_path / "none.json"), "--float64"]) == 2
    assert "--float64 needs --verify" in capsys.readouterr().err
