"""pesto: the optimum on tiny DAGs (checked by enumerating every plan), never slower than its warm start."""

import itertools

import numpy as np
import pytest

from placer import OpGraph, place, simulate
from placer.cluster import Channel, Cluster, Device, load_cluster
from placer.errors import InvalidPlanError, OptionError
from placer.generate import training_graph
from placer.plan import check_placement
from placer.sim.simulator import simulate_plan


def tiny_case(seed: int, n: int, n_dev: int, shared: bool):
    """A random DAG with integer times and bytes (so that simulated times are exact) on 2-3 devices."""
    rng = np.random.default_rng(seed)
    src, dst = [], []
    for v in range(1, n):
        for u in range(v):
            if rng.random() < 0.45:
                src.append(u)
                dst.append(v)
    m = len(src)
    graph = OpGraph(
        [f"n{i}" for i in range(n)],
        rng.integers(1, 5, n).astype(float),
        src,
        dst,
        rng.integers(0, 4, m),
        rng.integers(0, 2, m),
        name=f"tiny-{seed}",
    )
    devices = [Device(f"d{j}", "X", 1 << 40, speed=[1.0, 2.0, 1.0][j]) for j in range(n_dev)]
    names = [d.name for d in devices]
    if shared:  # one outgoing link per device, shared by its destinations
        channels = [Channel(f"{a}->*", 1.0, 0.5, tuple((a, b) for b in names if b != a)) for a in names]
    else:
        channels = [Channel(f"{a}->{b}", 1.0, 0.5, ((a, b),)) for a in names for b in names if a != b]
    return graph, Cluster(f"tiny-{n_dev}", devices, channels)


def linear_extensions(graph: OpGraph):
    preds = [set(graph.predecessors(v).tolist()) for v in range(graph.num_nodes)]

    def extend(done, seq):
        if len(seq) == graph.num_nodes:
            yield tuple(seq)
            return
        for v in range(graph.num_nodes):
            if v not in done and preds[v] <= done:
                yield from extend(done | {v}, seq + [v])

    yield from extend(frozenset(), [])


def brute_force_optimum(graph: OpGraph, cluster: Cluster) -> float:
    """The smallest reference makespan over every valid placement and every per-device order."""
    extensions = list(linear_extensions(graph))
    best = np.inf
    for placement in itertools.product(range(cluster.num_devices), repeat=graph.num_nodes):
        device_of = np.array(placement)
        try:
            check_placement(graph, cluster, device_of)
        except InvalidPlanError:
            continue
        orders = {
            tuple(tuple(v for v in ext if placement[v] == d) for d in range(cluster.num_devices)) for ext in extensions
        }
        for order in orders:
            span = simulate(graph, cluster, device_of, [list(o) for o in order], check=False).makespan_s
            best = min(best, span)
    return best


@pytest.mark.parametrize(
    "seed,n,n_dev,shared",
    [(1, 6, 2, False), (2, 7, 2, False), (3, 6, 2, True), (4, 5, 3, True), (5, 6, 3, False), (6, 8, 2, True)],
)
def test_exact_model_finds_the_optimum_of_every_placement_and_order(seed, n, n_dev, shared):
    graph, cluster = tiny_case(seed, n, n_dev, shared)
    optimum = brute_force_optimum(graph, cluster)
    plan = place(graph, cluster, "pesto", time_limit=60)
    report = plan.extra["pesto"]
    assert report["model"] == "exact" and report["coarse_nodes"] == n
    assert report["solver_status"] == "OPTIMAL"
    assert plan.predicted["makespan_s"] == pytest.approx(optimum, rel=1e-9)
    # The solver's own objective is the reference makespan of its plan, and the proven gap closes.
    assert report["solver_objective_s"] == pytest.approx(optimum, rel=1e-9)
    assert report["gap"] == pytest.approx(0.0, abs=1e-6)


def test_exact_model_keeps_colocation_and_kinds_and_stays_optimal():
    graph, cluster = tiny_case(7, 6, 3, False)
    kinds = ["A", "X", "X"]
    cluster = Cluster(
        cluster.name,
        [Device(d.name, k, d.memory_bytes, d.speed) for d, k in zip(cluster.devices, kinds)],
        cluster.channels,
    )
    graph = graph.replace(
        colocation=["g", None, None, "g", None, None], device_kinds=[None, ("A",), None, None, ("X",), None]
    )
    plan = place(graph, cluster, "pesto")
    assert plan.placement["n0"] == plan.placement["n3"]
    assert plan.placement["n1"] == "d0" and plan.placement["n4"] != "d0"
    assert plan.predicted["makespan_s"] == pytest.approx(brute_force_optimum(graph, cluster), rel=1e-9)


def test_coarsened_plan_is_valid_never_slower_than_the_warm_start_and_maps_back():
    graph = training_graph(layers=10, branches=2, seed=3)
    cluster = load_cluster("4xGPU-pcie")
    plan = place(graph, cluster, "pesto", time_limit=20, target=30)
    report = plan.extra["pesto"]
    assert report["coarse_nodes"] <= 30 and report["model"] == "relaxed"
    assert set(plan.placement) == set(graph.ids)
    assert sorted(i for seq in plan.order.values() for i in seq) == sorted(graph.ids)
    result = simulate_plan(plan, graph, cluster)
    assert result.fits
    assert plan.predicted["makespan_s"] == pytest.approx(result.makespan_s, rel=1e-9)
    assert plan.predicted["makespan_s"] <= report["warm_start_makespan_s"] * (1 + 1e-12)
    assert 0.0 <= report["solver_gap"] <= 1.0 and 0.0 <= report["gap"] <= 1.0
    assert report["lower_bound_s"] <= plan.predicted["makespan_s"]
    assert report["resolution_s"] > 0


def test_the_warm_start_tries_every_cheap_algorithm_on_a_big_graph(monkeypatch):
    # m-ETF and m-SCT once took minutes on 8k operations and were skipped beyond 2,000: then pesto kept
    # DPOS's 200.27 ms on ResNet-50 over 2 V100s, where m-SCT plans 194.19 ms in a second.
    import placer.algorithms.pesto as pesto_module

    tried = []

    def recording_place(graph, cluster, name, **options):
        tried.append(name)
        return place(graph, cluster, name, **options)

    monkeypatch.setattr(pesto_module, "place", recording_place)
    graph = training_graph(layers=140, branches=3, seed=3)
    assert graph.num_nodes > 2000
    plan = place(graph, load_cluster("2xV100-nvlink"), "pesto", time_limit=60, target=30)
    assert tried == list(pesto_module.WARM_START_ALGORITHMS)
    assert plan.extra["pesto"]["warm_start_failures"] == {}


def test_warm_starts_left_out_for_time_are_reported():
    # Those not started once the warm start's share was spent were missing from warm_start_failures: the
    # report read as if pesto had tried them.
    from placer.algorithms.pesto import WARM_START_ALGORITHMS, _warm_start

    failures = {}
    name, plan = _warm_start(training_graph(layers=2, seed=1), load_cluster("2xV100-nvlink"), 0, 0.0, failures)
    assert name == WARM_START_ALGORITHMS[0] and plan is not None
    assert failures == {
        other: "not started: the warm start's share of the time limit was spent" for other in WARM_START_ALGORITHMS[1:]
    }


def test_congestion_keeps_transfers_apart():
    # Two producers on d0 feed two consumers; one shared outgoing link: the model must queue the transfers.
    g = OpGraph(["a", "b", "c", "d"], [1.0, 1.0, 1.0, 1.0], [0, 1], [2, 3], [4, 4])
    devices = [Device("d0", "X", 1 << 40), Device("d1", "X", 1 << 40)]
    cluster = Cluster(
        "c", devices, [Channel("d0->d1", 1.0, 0.0, (("d0", "d1"),)), Channel("d1->d0", 1.0, 0.0, (("d1", "d0"),))]
    )
    plan = place(g, cluster, "pesto")
    assert plan.predicted["makespan_s"] == pytest.approx(brute_force_optimum(g, cluster))


@pytest.mark.parametrize("bad", [{"target": -1}, {"workers": 0}, {"model": "fast"}, {"target": 1.5}])
def test_bad_options_raise_option_error(bad):
    graph, cluster = tiny_case(0, 4, 2, False)
    with pytest.raises(OptionError):
        place(graph, cluster, "pesto", **bad)


def test_same_seed_and_limit_give_the_same_plan_after_a_search_that_works(monkeypatch):
    # Under a 5 s limit, a ResNet-26 over 4 GPUs once gave 2.839 / 3.159 / 3.159 / 3.159 ms in four runs
    # while the plan said the wall clock had not cut the solver: the search stopped on wall time.
    import placer.algorithms.pesto_lns as lns

    monkeypatch.setattr(lns, "WORK_PER_ROUND", 0.05)  # few small rounds, so that a busy machine has room
    monkeypatch.setattr(lns, "ROUNDS_PER_SECOND", 0.1)  # 6 rounds in a limit long enough for a loaded machine
    graph = training_graph(layers=10, branches=2, seed=3)
    cluster = load_cluster("4xGPU-pcie")
    plans = [place(graph, cluster, "pesto", time_limit=60, target=60, seed=5) for _ in range(2)]
    reports = [p.extra["pesto"] for p in plans]
    for report in reports:
        assert report["cut_by_wall_clock"] is False and report["wall_clock_cuts"] == []
        assert report["solver_status"] == "FEASIBLE"  # not closed by the first solve: the rounds run
        assert report["lns_rounds"] == report["lns_rounds_planned"] == 6
        assert report["lns_accepted"] >= 1 and report["solver_work"] > 0
    assert plans[0].placement == plans[1].placement and plans[0].order == plans[1].order
    assert plans[0].predicted["makespan_s"] == plans[1].predicted["makespan_s"]
    for key in ("lns_accepted", "lns_improved", "solver_work", "refine_accepted", "returned"):
        assert reports[0][key] == reports[1][key]


def test_the_plan_says_when_the_wall_clock_cut_the_search(monkeypatch):
    import placer.algorithms.pesto_lns as lns

    monkeypatch.setattr(lns, "ROUNDS_PER_SECOND", 10_000.0)  # far more rounds than 3 s can run
    graph = training_graph(layers=10, branches=2, seed=3)
    cluster = load_cluster("4xGPU-pcie")
    plan = place(graph, cluster, "pesto", time_limit=3, target=60)
    report = plan.extra["pesto"]
    assert report["cut_by_wall_clock"] is True
    assert report["lns_rounds"] < report["lns_rounds_planned"]
    assert any(cut.startswith("search:") for cut in report["wall_clock_cuts"]), report
    assert simulate_plan(plan, graph, cluster).fits


def test_the_search_improves_on_a_warm_start_known_to_be_slow(monkeypatch):
    # One device for a graph of three parallel branches over two GPUs: the search must spread it, in its
    # rounds (the first solve of the whole model is given almost no work).
    import placer.algorithms.pesto as pesto_module
    import placer.algorithms.pesto_lns as lns

    monkeypatch.setattr(pesto_module, "WARM_START_ALGORITHMS", ("single",))
    monkeypatch.setattr(lns, "FIRST_SOLVE_ROUNDS", 0)
    monkeypatch.setattr(pesto_module, "REFINE_PER_SECOND", 0.0)
    graph = training_graph(layers=6, branches=3, seed=2)
    cluster = load_cluster("2xV100-nvlink")
    single = place(graph, cluster, "single").predicted["makespan_s"]
    plan = place(graph, cluster, "pesto", time_limit=20, target=48)
    report = plan.extra["pesto"]
    assert report["warm_start"] == "single" and report["warm_start_makespan_s"] == pytest.approx(single)
    assert report["lns_improved"] >= 1 and report["returned"].startswith("search")
    assert plan.predicted["makespan_s"] < 0.9 * single
    assert simulate_plan(plan, graph, cluster).makespan_s == pytest.approx(plan.predicted["makespan_s"], rel=1e-9)
    assert report["lower_bound_s"] <= plan.predicted["makespan_s"]
    assert report["gap"] == pytest.approx(1 - report["lower_bound_s"] / plan.predicted["makespan_s"])


def test_ortools_leaves_ctrl_c_to_placer_and_takes_any_seed():
    graph, cluster = tiny_case(1, 6, 2, False)
    plan = place(graph, cluster, "pesto", seed=2**31 - 1)  # the largest seed place() takes
    assert plan.extra["pesto"]["solver_status"] == "OPTIMAL"
    from placer.algorithms.pesto import _CpModel, _Problem

    status, solver = _CpModel(_Problem.build(graph, cluster, 1.0), True).solve(2**40, 1, 5.0, 1.0)
    assert solver.parameters.catch_sigint_signal is False


def test_the_coarsening_follows_the_graph_not_the_warm_start(monkeypatch):
    # Merging only what the warm start kept together left the solver unable to move what mattered.
    import placer.algorithms.pesto as pesto_module
    from placer.transform.coarsen import coarsen

    calls = []

    def recording_coarsen(graph, target, **options):
        calls.append(options)
        return coarsen(graph, target, **options)

    monkeypatch.setattr(pesto_module, "coarsen", recording_coarsen)
    graph = training_graph(layers=10, branches=2, seed=3)
    cluster = load_cluster("2xV100-nvlink")
    groups = []
    for warm in (("single",), ("dpos",)):
        monkeypatch.setattr(pesto_module, "WARM_START_ALGORITHMS", warm)
        calls.clear()
        plan = place(graph, cluster, "pesto", time_limit=3, target=40)
        assert calls and all(options.get("labels") is None for options in calls)
        groups.append(plan.extra["pesto"]["coarse_nodes"])
    assert groups[0] == groups[1] == 40


def test_a_rewritten_warm_start_is_searched_on_its_own_graph_and_binds_to_the_model():
    # Data parallelism wins on this small, compute-heavy step: pesto must search the replicated graph
    # (replicas, collective steps as nodes) rather than fall back to a placement of the model's own graph.
    graph = training_graph(layers=4, branches=1, param_mib=0.5, flop_s=1e12)
    cluster = load_cluster("2xV100-nvlink")
    placements = min(place(graph, cluster, name).predicted["makespan_s"] for name in ("dpos", "m_sct", "single"))
    replicated = place(graph, cluster, "sharded_data_parallel", collective="best").predicted["makespan_s"]
    assert replicated < 0.8 * placements
    plan = place(graph, cluster, "pesto", time_limit=20)
    report = plan.extra["pesto"]
    assert report["searched_graph"].startswith("rewritten by ")
    assert report["warm_start"] in ("data_parallel", "sharded_data_parallel", "os_dpos")
    searched = plan.rewritten_graph
    assert searched is not None and report["searched_nodes"] == searched.num_nodes > graph.num_nodes
    assert set(plan.placement) == set(searched.ids)
    assert sorted(i for seq in plan.order.values() for i in seq) == sorted(searched.ids)
    result = simulate_plan(plan, graph, cluster)  # binds to the model's graph as the warm start's plan does
    assert result.fits and result.makespan_s == pytest.approx(plan.predicted["makespan_s"], rel=1e-9)
    assert plan.predicted["makespan_s"] <= min(report["warm_start_makespan_s"], replicated) * (1 + 1e-12)
    assert report["lower_bound_s"] <= plan.predicted["makespan_s"]


def test_schedule_tails_end_every_chain_at_the_makespan_and_the_critical_path_there():
    from placer.sim.critical import critical_path, schedule_tails

    graph = training_graph(layers=8, branches=3, seed=4)
    cluster = load_cluster("4xGPU-pcie")
    result = simulate_plan(place(graph, cluster, "round_robin"), graph, cluster)
    tails, xtails = schedule_tails(result)
    span = result.makespan_s
    assert np.all(tails >= result.finish - result.start - 1e-15)
    assert np.all(result.start + tails <= span * (1 + 1e-9))  # no chain outlasts the step
    assert np.all(result.transfers.start + xtails <= span * (1 + 1e-9))
    path = critical_path(result)
    last = path[0].node  # the operation that ends the step: nothing after it
    assert tails[last] == pytest.approx(result.finish[last] - result.start[last])
    assert float(np.max(result.start + tails)) == pytest.approx(span, rel=1e-9)
    # Along the path, a link that waited for nothing but its cause (no channel queue) keeps the chain tight.
    xf = result.transfers
    for link in path:
        if link.kind == "transfer" and xf.start[link.transfer] > xf.queued[link.transfer]:
            break
        assert result.start[link.node] + tails[link.node] == pytest.approx(span, rel=1e-9)


def test_window_rounds_on_a_big_graph_improve_a_slow_start_and_repeat_for_a_seed(monkeypatch):
    # Round robin over two GPUs: every edge crosses. Window rounds (the graph counts as big here) must
    # shorten the step, each accepted round by the simulator's word, and a seed must give one plan.
    import placer.algorithms.pesto as pesto_module

    monkeypatch.setattr(pesto_module, "WARM_START_ALGORITHMS", ("round_robin",))
    import placer.algorithms.pesto_window as window

    monkeypatch.setattr(pesto_module, "WINDOW_MIN_NODES", 20)
    monkeypatch.setattr(window, "ROUNDS_PER_SECOND", 0.15)  # 6 rounds, room to spare on a loaded machine
    monkeypatch.setattr(window, "WORK_PER_ROUND", 0.1)
    graph = training_graph(layers=6, branches=3, seed=2)
    cluster = load_cluster("2xV100-nvlink")
    plans = [place(graph, cluster, "pesto", time_limit=40, seed=3) for _ in range(2)]
    reports = [p.extra["pesto"] for p in plans]
    for plan, report in zip(plans, reports):
        assert report["model"] == "window" and report["warm_start"] == "round_robin"
        assert report["window_rounds"] == report["window_rounds_planned"] == 6
        assert report["cut_by_wall_clock"] is False, report["wall_clock_cuts"]
        assert report["window_improved"] >= 1 and report["returned"] == "window search"
        assert plan.predicted["makespan_s"] < report["warm_start_makespan_s"] * (1 - 1e-9)
        result = simulate_plan(plan, graph, cluster)
        assert result.fits and result.makespan_s == pytest.approx(plan.predicted["makespan_s"], rel=1e-9)
        assert report["lower_bound_s"] <= plan.predicted["makespan_s"]
    assert plans[0].placement == plans[1].placement and plans[0].order == plans[1].order
    assert reports[0]["window_improved"] == reports[1]["window_improved"]


def test_a_window_round_is_kept_only_when_the_whole_step_gets_shorter():
    from placer.algorithms.pesto_window import WindowSearch

    graph = training_graph(layers=6, branches=3, seed=2)
    cluster = load_cluster("2xV100-nvlink")
    start = simulate_plan(place(graph, cluster, "round_robin"), graph, cluster)
    search = WindowSearch(graph, cluster, start, seed=1)
    spans = [start.makespan_s]
    for r in range(12):
        better = search.round(r + 1, 0.2, float("inf"))
        now = search.incumbent.result
        assert (now.makespan_s < spans[-1]) == better and now.makespan_s <= spans[-1]
        assert simulate(graph, cluster, now.device_of, now.device_orders()).makespan_s == pytest.approx(now.makespan_s)
        spans.append(now.makespan_s)
    assert spans[-1] < spans[0]
