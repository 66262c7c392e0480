"""The micro-batch transform and the pipeline algorithms, against counts made by hand."""

import numpy as np
import pytest

from placer.cluster import Cluster, Device
from placer.errors import OptionError
from placer.generate import training_graph
from placer.graph import OpGraph
from placer.sim.simulator import simulate
from placer.transform import apply_transform
from placer.transform.microbatch import microbatch_graph

ONE = Cluster("one", [Device("d0", "V100", 1 << 40)], [])


def _step(batch: int = 4) -> OpGraph:
    """A one-layer training step at ``batch`` samples: x (1000 B a sample) -> h = x w (2000 B a sample) ->
    loss (8 B) -> dh (2000 B a sample), saved x -> dw (a gradient of w's 1000 B) -> the in-place update."""
    ids = ["w", "x", "h", "loss", "dh", "dw", "upd"]
    per = {"x": 1000, "h": 2000, "dh": 2000}
    out = [0, per["x"] * batch, per["h"] * batch, 8, per["dh"] * batch, 1000, 0]
    edges = [
        ("x", "h", out[1]),
        ("w", "h", 1000),
        ("h", "loss", out[2]),
        ("loss", "dh", 8),
        ("h", "dh", out[2]),
        ("x", "dw", out[1]),
        ("dh", "dw", out[4]),
        ("dw", "upd", 1000),
    ]
    index = {x: i for i, x in enumerate(ids)}
    return OpGraph(
        ids,
        [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        [index[a] for a, _, _ in edges],
        [index[b] for _, b, _ in edges],
        [b for _, _, b in edges],
        output_bytes=out,
        param_bytes=[1000, 0, 0, 0, 0, 0, 0],
        op=["placeholder", "placeholder", "aten.mm", "aten.sum", "aten.mul", "aten.mm", "aten.copy_"],
        colocation=["state:w", None, None, None, None, None, "state:w"],
        name="step",
        extra={"batch_size": batch},
    )


def _peak(tensors: list[tuple[int, int, int]]) -> int:
    """Peak bytes of a run of one operation at a time, each tensor (bytes, first step, last step) held from
    the step that makes it through the last step that reads it."""
    steps = max(last for _, _, last in tensors) + 1
    return max(sum(b for b, first, last in tensors if first <= i <= last) for i in range(steps))


def _run(graph: OpGraph, names: list[str]):
    """Simulate ``graph`` on one device running ``names`` in that order (the whole nodes w first, upd last)."""
    order = [graph.index[x] for x in ["w"] + names + ["upd"]]
    return simulate(graph, ONE, np.zeros(graph.num_nodes, dtype=np.int64), [order])


def test_each_microbatch_holds_its_activations_from_forward_to_backward():
    g = _step()
    mb = microbatch_graph(g, 2).graph
    acc = "mb1/dw.accumulate"
    # All forwards, then all backwards (GPipe's order on one stage): both micro-batches' activations at once.
    gpipe = ["mb0/x", "mb0/h", "mb0/loss", "mb1/x", "mb1/h", "mb1/loss", "mb0/dh", "mb0/dw", "mb1/dh", "mb1/dw", acc]
    # step:   0        1        2           3        4        5           6         7         8         9        10
    held = [
        (2000, 0, 7),
        (4000, 1, 6),
        (4, 2, 6),
        (2000, 3, 9),
        (4000, 4, 8),
        (4, 5, 8),
        (4000, 6, 7),
        (1000, 7, 10),
        (4000, 8, 9),
        (1000, 9, 10),
        (1000, 10, 11),
    ]
    assert _run(mb, gpipe).peak_memory_bytes[0] == 1000 + _peak(held) == 1000 + 16008
    # Each micro-batch's forward and backward before the next's: one micro-batch's activations at a time.
    serial = ["mb0/x", "mb0/h", "mb0/loss", "mb0/dh", "mb0/dw", "mb1/x", "mb1/h", "mb1/loss", "mb1/dh", "mb1/dw", acc]
    held = [
        (2000, 0, 4),
        (4000, 1, 3),
        (4, 2, 3),
        (4000, 3, 4),
        (1000, 4, 10),
        (2000, 5, 9),
        (4000, 6, 8),
        (4, 7, 8),
        (4000, 8, 9),
        (1000, 9, 10),
        (1000, 10, 11),
    ]
    assert _run(mb, serial).peak_memory_bytes[0] == 1000 + _peak(held) == 1000 + 11004
    # The step without micro-batches holds the whole batch's.
    whole = _run(g, ["x", "h", "loss", "dh", "dw"]).peak_memory_bytes[0]
    assert whole == 1000 + _peak([(4000, 0, 4), (8000, 1, 3), (8, 2, 3), (8000, 3, 4), (1000, 4, 5)]) == 21008


def test_uneven_microbatches_take_their_rows_and_the_gradient_stays_whole():
    mb = microbatch_graph(_step(batch=4), 3)
    assert mb.rows == [(0, 2), (2, 3), (3, 4)]
    g = mb.graph
    assert [int(g.output_bytes[g.index[f"mb{k}/h"]]) for k in range(3)] == [4000, 2000, 2000]
    assert [int(g.output_bytes[g.index[f"mb{k}/dw"]]) for k in range(3)] == [1000] * 3
    assert [float(g.compute_s[g.index[f"mb{k}/h"]]) for k in range(3)] == [0.5, 0.25, 0.25]
    # Two adds in a chain, each reading its micro-batch's gradient; the update reads the last.
    first, second = g.index["mb1/dw.accumulate"], g.index["mb2/dw.accumulate"]
    assert sorted(g.ids[u] for u in g.predecessors(first)) == ["mb0/dw", "mb1/dw"]
    assert sorted(g.ids[u] for u in g.predecessors(second)) == ["mb1/dw.accumulate", "mb2/dw"]
    assert [g.ids[u] for u in g.predecessors(g.index["upd"])] == ["mb2/dw.accumulate"]
    # The weight is read by every micro-batch, whole; the saved input by its own micro-batch's backward.
    reads_w = sorted(
        g.ids[int(v)] for v, b in zip(g.dst[g.src == g.index["w"]], g.edge_bytes[g.src == g.index["w"]]) if b == 1000
    )
    assert reads_w == ["mb0/h", "mb1/h", "mb2/h"]


def test_microbatches_refused_in_one_line():
    with pytest.raises(OptionError, match=r"5 micro-batches of a batch of 4 samples \(graph 'step'\): at most 4"):
        microbatch_graph(_step(), 5)
    no_batch = OpGraph(["w", "f"], [0.0, 1.0], [0], [1], [8], param_bytes=[8, 0], op=["placeholder", "aten.t"])
    with pytest.raises(OptionError, match="no batch input"):
        apply_transform("microbatch", no_batch, microbatches=2)
    with pytest.raises(OptionError, match="integer >= 1"):
        microbatch_graph(_step(), 0)


def test_one_microbatch_is_the_step_and_work_is_conserved():
    g = training_graph(layers=3, branches=2, seed=1)
    assert not apply_transform("microbatch", g, microbatches=1).changed
    r = apply_transform("microbatch", g, microbatches=4)
    kept = ~r.added
    assert np.isclose(r.graph.compute_s[kept].sum(), g.compute_s.sum())
    assert r.graph.param_bytes.sum() == g.param_bytes.sum()
    # Generated forward ops hold their weights: every micro-batch's copy sits with them.
    fwd = g.index["block0.b0.fwd"]
    assert len({r.graph.colocation[v] for v in r.image[fwd].tolist()}) == 1


# ----------------------------------------------------------------- placing the micro-batched step


def _phases(plan, device: str) -> list[tuple[int, str]]:
    """The (micro-batch, F or B) runs of a device's order in a pipeline plan, each run listed once."""
    graph = plan.rewritten_graph
    out: list[tuple[int, str]] = []
    backward = _backward_ids(plan)
    for node in plan.order[device]:
        extra = graph.node_extra[graph.index[node]]
        if "microbatch" not in extra:
            continue
        step = (extra["microbatch"], "B" if node in backward or "accumulate" in extra else "F")
        if not out or out[-1] != step:
            out.append(step)
    return out


def _backward_ids(plan) -> set[str]:
    """Nodes of a micro-batch that read, directly or not, what a node on a later stage computed."""
    graph = plan.rewritten_graph
    stage = {d: s for s, d in enumerate(plan.extra["stages"])}
    later = np.full(graph.num_nodes, -1)
    for v in graph.topological_order.tolist():
        for u in graph.predecessors(v).tolist():
            later[v] = max(later[v], stage[plan.placement[graph.ids[u]]], later[u])
    return {graph.ids[v] for v in range(graph.num_nodes) if later[v] > stage[plan.placement[graph.ids[v]]]}


def test_each_device_runs_the_schedules_order():
    from placer.algorithms import place
    from placer.cluster import load_cluster

    g, c = training_graph(layers=6, branches=1, seed=3), load_cluster("2xV100-nvlink")
    plan = place(g, c, "1f1b", microbatches=4)
    assert plan.extra["stages"] == ["gpu0", "gpu1"]
    assert _phases(plan, "gpu0") == [(0, "F"), (1, "F"), (0, "B"), (2, "F"), (1, "B"), (3, "F"), (2, "B"), (3, "B")]
    plan = place(g, c, "gpipe", microbatches=3)
    assert _phases(plan, "gpu0") == [(0, "F"), (1, "F"), (2, "F"), (0, "B"), (1, "B"), (2, "B")]


def test_1f1b_holds_one_microbatch_where_gpipe_holds_all():
    from placer.algorithms import place

    g = training_graph(layers=6, branches=1, param_mib=1, activation_mib=100, seed=3)
    whole = simulate(g, ONE, np.zeros(g.num_nodes, dtype=np.int64)).peak_memory_bytes[0]
    gp = place(g, ONE, "gpipe", microbatches=8).predicted["peak_memory_bytes"]["d0"]
    one = place(g, ONE, "1f1b", microbatches=8).predicted["peak_memory_bytes"]["d0"]
    # One stage: GPipe runs every forward first and holds the batch's activations, as the whole step does;
    # 1F1B runs each micro-batch's backward after its forward and holds an eighth, give or take transients.
    assert 0.75 * whole <= gp <= whole
    assert one < 0.25 * whole


def test_microbatches_make_a_step_fit_that_does_not_whole():
    from placer.algorithms import place
    from placer.cluster import load_cluster
    from placer.errors import InfeasibleError
    from placer.plan import Plan
    from placer.sim.simulator import simulate_plan

    g = training_graph(layers=3, branches=1, param_mib=1, activation_mib=100, seed=2)
    whole = simulate(g, ONE, np.zeros(g.num_nodes, dtype=np.int64)).peak_memory_bytes[0]
    small = Cluster("small", [Device("d0", "V100", int(whole * 0.6))], [])
    for algorithm in ("single", "1f1b"):
        with pytest.raises(InfeasibleError):
            place(g, small, algorithm, microbatches=1)
    plan = place(g, small, "1f1b", microbatches=4)
    again = Plan.from_dict(plan.to_dict())
    result = simulate_plan(again, g, small)
    assert result.fits and np.isclose(result.makespan_s, plan.predicted["makespan_s"])
    assert again.extra["microbatches"] == 4
    # Any algorithm places the micro-batched step; its plan reads back and validates on the original graph.
    plan = place(g, load_cluster("2xV100-nvlink"), "m_etf", microbatches=3)
    again = Plan.from_dict(plan.to_dict())
    assert np.isclose(simulate_plan(again, g, load_cluster("2xV100-nvlink")).makespan_s, plan.predicted["makespan_s"])


def test_a_count_beyond_the_batch_is_refused_before_any_work():
    from placer.algorithms import place
    from placer.cluster import load_cluster

    c = load_cluster("2xV100-nvlink")
    for algorithm in ("m_etf", "gpipe", "1f1b"):
        with pytest.raises(OptionError, match="5 micro-batches of a batch of 4 samples"):
            place(_step(), c, algorithm, microbatches=5)


def test_the_command_line_plans_micro_batches_and_refuses_too_many(tmp_path, capsys):
    from placer.cli import main
    from placer.plan import Plan

    graph_file, plan_file = tmp_path / "g.json", tmp_path / "p.json"
    _step().save(graph_file)
    code = main(
        [
            "plan",
            str(graph_file),
            "--cluster",
            "2xV100-nvlink",
            "--algorithm",
            "m_etf",
            "--microbatches",
            "3",
            "-o",
            str(plan_file),
        ]
    )
    assert code == 0 and Plan.load(plan_file).extra["microbatches"] == 3
    capsys.readouterr()
    for command in (
        ["plan", "-o", str(tmp_path / "q.json"), "--algorithm", "m_etf"],
        ["compare", "--algorithms", "m_etf,1f1b"],
    ):
        code = main(command[:1] + [str(graph_file), "--cluster", "2xV100-nvlink", "--microbatches", "5"] + command[1:])
        err = capsys.readouterr().err
        assert code != 0 and "5 micro-batches of a batch of 4 samples" in err and len(err.strip().splitlines()) == 1, (
            err
        )


def test_the_stage_cut_is_the_best_of_every_contiguous_cut():
    """The dynamic programme's bottleneck equals the best over every cut into K contiguous stages on
    devices in the cluster's order, enumerated."""
    import itertools

    from placer.algorithms import pipeline
    from placer.cluster import load_cluster
    from placer.transform.replicate import replica_layout

    g, c = training_graph(layers=8, branches=1, seed=4), load_cluster("2x4xV100")
    m = 4
    layout = replica_layout(g, 2)
    grads = {k: b for k, b in layout.grad_bytes.items() if layout.per_batch[k[0]]}
    topo = np.empty(g.num_nodes, dtype=np.int64)
    topo[g.topological_order] = np.arange(g.num_nodes)
    backward = pipeline._backward(g, [u for u, _ in grads])
    units = pipeline._forward_units(g, c.num_devices, ~backward, backward, topo)
    costs = pipeline._Costs(g, c, units, m, layout.per_batch, grads)
    n_units, budget = len(units), np.full(c.num_devices, np.inf)
    assert n_units >= 10

    def bottleneck(bounds, devices):
        worst = max(costs.per_mb[b, d] - costs.per_mb[a, d] for a, b, d in zip(bounds, bounds[1:], devices))
        for i, q, d in zip(bounds[1:-1], devices, devices[1:]):
            slowest = max(costs.inverse_bandwidth[q, d], costs.inverse_bandwidth[d, q])
            worst = max(worst, costs.latency[q, d] + costs.latency[d, q] + costs.crossing[i] * slowest)
        return worst

    for stages in (1, 2, 3):
        best = min(
            bottleneck([0, *cuts, n_units], devices)
            for cuts in itertools.combinations(range(1, n_units), stages - 1)
            for devices in itertools.combinations(range(c.num_devices), stages)
        )
        found = pipeline._cut(costs, c, "gpipe", stages, m, 1.0, budget)
        assert np.isclose(found.bottleneck_s, best, rtol=1e-12), (stages, found.bottleneck_s, best)
        assert np.isclose(bottleneck(found.bounds, found.devices), best, rtol=1e-12)  # the cut it returns
        assert len(found.devices) == stages and found.bounds[0] == 0 and found.bounds[-1] == n_units
