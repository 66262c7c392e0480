"""auto and micro-batches: the pipelines in its portfolio, its search of micro-batch counts, steps that fit only
in micro-batches, the memory no micro-batch count shrinks, and micro-batch counts refused or said uneven."""

import warnings

import numpy as np
import pytest

from placer.algorithms import auto as auto_module
from placer.algorithms import place
from placer.algorithms.auto import PIPELINES, default_portfolio
from placer.capture.spec import capture_spec
from placer.capture.zoo import ZOO
from placer.cluster import Channel, Cluster, Device, load_cluster
from placer.errors import InfeasibleError, OptionError, PlacerError
from placer.feasibility import diagnose, live_memory_bound, smallest_microbatch
from placer.generate import training_graph
from placer.graph import OpGraph, static_footprint
from placer.sim.bounds import microbatch_lower_bound
from placer.sim.simulator import simulate, simulate_plan
from placer.transform.microbatch import microbatch_graph

from .test_microbatch import _step


def _cluster(devices: int, memory: float) -> Cluster:
    """``devices`` V100s of ``memory`` bytes each, every pair joined by a channel of its own."""
    names = [f"g{i}" for i in range(devices)]
    return Cluster(
        "tight",
        [Device(n, "V100", int(memory)) for n in names],
        [Channel(f"{a}->{b}", 2.5e10, 1e-5, ((a, b),)) for a in names for b in names if a != b],
    )


def _solo_peak(graph: OpGraph) -> int:
    """The step's peak on one device with room for anything."""
    big = _cluster(1, 1 << 50)
    return int(simulate(graph, big, np.zeros(graph.num_nodes, dtype=np.int64), check=False).peak_memory_bytes[0])


@pytest.fixture(scope="module")
def lenet():
    """LeNet at its tiny size, batch 64 (Adam, meta device): 309 operations."""
    spec = "zoo:lenet?" + "&".join(f"{k}={v}" for k, v in ZOO["lenet"].tiny.items())
    graph = capture_spec(spec, 64, optimizer="adam", fake=True).graph
    return graph, _solo_peak(graph)


@pytest.fixture(scope="module")
def activations():
    """A generated step of large activations and small weights, recording a batch of 32 samples."""
    graph = training_graph(layers=6, branches=1, param_mib=1, activation_mib=100, seed=3).replace(
        extra={"batch_size": 32}
    )
    return graph, _solo_peak(graph)


def _whole_members() -> list[str]:
    return [name for name in default_portfolio(20) if name not in PIPELINES]


def _fits_by_itself(plan, graph, cluster) -> None:
    """The plan read back fits every device under a simulation of its own, and places micro-batches."""
    result = simulate_plan(plan, graph, cluster)
    assert result.fits and np.all(result.peak_memory_bytes <= cluster.memory)
    assert result.makespan_s == pytest.approx(plan.predicted["makespan_s"])
    assert plan.extra["microbatches"] > 1


def test_the_pipelines_are_in_the_default_portfolio():
    for limit in (20, 120):
        members = default_portfolio(limit)
        assert {"1f1b", "gpipe"} <= set(members)
        assert members.index("m_sct") < members.index("1f1b") < members.index("gpipe") < members.index("heft")


@pytest.mark.parametrize("share", [0.4, 0.3])
def test_a_captured_step_that_no_algorithm_fits_whole_fits_in_micro_batches(lenet, share):
    """Devices of 40% (30%) of LeNet's one-device peak: every member placing the step whole overflows (at 30%
    no plan of the step whole can fit), and auto's pipelines fit."""
    graph, solo = lenet
    cluster = _cluster(2, share * solo)
    if share == 0.4:
        diagnose(graph, cluster)  # nothing proves that no plan fits
    else:
        with pytest.raises(InfeasibleError, match="any plan holds at least"):
            diagnose(graph, cluster)
    for name in _whole_members():
        with pytest.raises(PlacerError):
            place(graph, cluster, name, time_limit=2)
    plan = place(graph, cluster, "auto", time_limit=10, max_evaluations=5)
    _fits_by_itself(plan, graph, cluster)
    assert plan.extra["auto"]["start"].split()[0] in PIPELINES


def test_a_generated_step_below_every_whole_plan_fits_and_the_search_keeps_the_fastest_count(activations):
    graph, solo = activations
    cluster = _cluster(2, 0.5 * solo)
    diagnose(graph, cluster)
    for name in _whole_members():
        with pytest.raises(PlacerError):
            place(graph, cluster, name, time_limit=2)
    plan = place(graph, cluster, "auto", time_limit=20, max_evaluations=5)
    _fits_by_itself(plan, graph, cluster)
    info = plan.extra["auto"]
    assert info["microbatches"], info  # it searched other counts than the pipelines' own (2 x devices)
    # Never slower than a pipeline at any count it tried, each planned here by itself.
    for count in [4] + info["microbatches"]:
        for schedule in PIPELINES:
            try:
                span = place(graph, cluster, schedule, microbatches=count).predicted["makespan_s"]
            except InfeasibleError:
                continue
            assert plan.predicted["makespan_s"] <= span * (1 + 1e-12), (schedule, count)


def test_the_search_is_deterministic(activations):
    graph, solo = activations
    cluster = _cluster(2, 0.5 * solo)
    first, second = (place(graph, cluster, "auto", time_limit=60, max_evaluations=5) for _ in range(2))
    assert first.placement == second.placement and first.order == second.order
    assert first.extra["auto"]["microbatches"] == second.extra["auto"]["microbatches"]


def test_no_count_is_searched_where_a_replica_fits_or_the_batch_records_no_samples(activations):
    graph, _ = activations
    roomy = load_cluster("4xV100-nvlink")
    plan = place(graph, roomy, "auto", time_limit=20, max_evaluations=5)
    assert plan.extra["auto"]["microbatches"] == []
    assert "data_parallel" in plan.extra["auto"]["ran"]
    unknown = graph.replace(extra={})  # no sample count: the pipelines cut the batch in their own 2 x devices
    plan = place(unknown, _cluster(2, 0.5 * _solo_peak(unknown)), "auto", time_limit=20, max_evaluations=5)
    assert plan.extra["auto"]["microbatches"] == [] and plan.extra["microbatches"] == 4


def test_memory_no_micro_batch_count_shrinks_is_refused_before_any_member(monkeypatch):
    """The hand-made step of tests/test_microbatch.py at 4 samples: while the loss runs, any plan holds the
    1000 B weight and, of one sample, x (1000 B) and h (2000 B), read by the backward pass: 4000 B and two
    bytes of the loss's. Below that nothing fits at any count; with room for one-sample micro-batches'
    accumulated gradients (7002 B under 1F1B) auto fits."""

    def no_member(*args, **kwargs):
        raise AssertionError("a member ran")

    graph = _step(4)
    bound, node = live_memory_bound(smallest_microbatch(graph), _cluster(1, 1 << 40))
    assert (bound, graph.ids[node]) == (1000 + 1000 + 2000 + 2, "loss")
    with monkeypatch.context() as patched:
        patched.setattr(auto_module, "place", no_member)
        with pytest.raises(InfeasibleError, match=r"^while node 'loss' runs, any plan holds at least 4,002 bytes "):
            place(graph, _cluster(1, 4000), "auto")
    whole = place(graph, _cluster(1, 1 << 20), "single").predicted["peak_memory_bytes"]["g0"]
    plan = place(graph, _cluster(1, 8000), "auto", time_limit=20)
    assert whole > 8000
    _fits_by_itself(plan, graph, _cluster(1, 8000))


def test_an_operation_too_big_for_any_micro_batch_is_named(monkeypatch, lenet):
    graph, _ = lenet
    small = smallest_microbatch(graph)
    need = static_footprint(small)
    biggest = int(np.argmax(need))
    cluster = _cluster(4, need[biggest] - 1)
    monkeypatch.setattr(auto_module, "place", lambda *a, **k: pytest.fail("a member ran"))
    with pytest.raises(InfeasibleError, match=f"node '{graph.ids[biggest]}' needs .* even in micro-batches of one"):
        place(graph, cluster, "auto")


def _random_placements(graph: OpGraph, n_dev: int, rng: np.random.Generator, count: int):
    """One device for everything, then random placements that keep colocation groups whole."""
    yield np.zeros(graph.num_nodes, dtype=np.int64)
    for _ in range(count):
        device_of = rng.integers(0, n_dev, graph.num_nodes)
        for members in graph.colocation_groups.values():
            device_of[members] = device_of[members[0]]
        yield device_of


@pytest.mark.parametrize("which", ["generated", "lenet"])
def test_the_bounds_hold_for_every_placement_at_every_count(which, lenet):
    """What any plan of the micro-batched step holds: over all devices at its peak, at least the live bound of
    the smallest micro-batch; on some device, at least the largest smallest footprint. It takes at least
    microbatch_lower_bound. Checked on random placements of the step cut into 1, 2, 3 and more micro-batches,
    by the simulator."""
    if which == "lenet":
        graph, counts = lenet[0], (1, 2, 3, 16)
    else:
        graph = training_graph(layers=3, branches=2, seed=4, activation_mib=50).replace(extra={"batch_size": 6})
        counts = (1, 2, 4, 5, 6)
    cluster = load_cluster("4xV100-nvlink")
    small = smallest_microbatch(graph)
    live, _ = live_memory_bound(small, cluster)
    footprint = int(static_footprint(small).max())
    assert live > graph.param_bytes.sum()  # the bound counts activations, not the parameters alone
    rng = np.random.default_rng(0)
    for m in counts:
        cut = microbatch_graph(graph, m).graph if m > 1 else graph
        floor = microbatch_lower_bound(graph, cluster, m)
        for device_of in _random_placements(cut, cluster.num_devices, rng, 3):
            result = simulate(cut, cluster, device_of, check=False)
            assert result.peak_memory_bytes.sum() >= live, m
            assert result.peak_memory_bytes.max() >= footprint, m
            assert result.makespan_s >= floor * (1 - 1e-12), m


# ----------------------------------------------------------------- a count given, refused or uneven


def test_auto_with_a_count_places_every_member_micro_batched():
    graph, cluster = training_graph(layers=4, branches=2, seed=1), load_cluster("2xV100-nvlink")
    members = "expert,heft,1f1b"
    plan = place(graph, cluster, "auto", portfolio=members, microbatches=3, max_evaluations=10)
    assert plan.extra["microbatches"] == 3 and plan.rewritten_graph.extra["microbatches"]["count"] == 3
    assert plan.extra["auto"]["microbatches"] == []
    assert plan.predicted["makespan_s"] == pytest.approx(simulate_plan(plan, graph, cluster).makespan_s)
    for name in members.split(","):
        assert plan.predicted["makespan_s"] <= place(graph, cluster, name, microbatches=3).predicted["makespan_s"]


def test_a_count_the_batch_cannot_take_is_refused_in_one_line_before_any_member(monkeypatch):
    monkeypatch.setattr(auto_module, "place", lambda *a, **k: pytest.fail("a member ran"))
    with pytest.raises(OptionError) as refused:
        place(_step(4), load_cluster("2xV100-nvlink"), "auto", microbatches=5)
    assert str(refused.value) == (
        "auto: 5 micro-batches of a batch of 4 samples (graph 'step'): at most 4, one sample each"
    )
    no_batch = OpGraph(["w", "f"], [0.0, 1.0], [0], [1], [8], param_bytes=[8, 0], op=["placeholder", "aten.t"])
    with pytest.raises(OptionError, match="^auto: graph '' has no batch input to cut into micro-batches"):
        place(no_batch, load_cluster("2xV100-nvlink"), "auto", microbatches=2)


def test_the_command_line_says_when_micro_batches_are_uneven(tmp_path, capsys):
    from placer.cli import main
    from placer.plan import Plan

    graph_file = tmp_path / "g.json"
    _step(4).save(graph_file)
    note = (
        "placer: note: 3 micro-batches of a batch of 4 samples are uneven: 1 of 2 samples, then 2 of 1 "
        "(the first ones one more, as replicas share a batch)"
    )
    plan_file = tmp_path / "p.json"
    common = [str(graph_file), "--cluster", "2xV100-nvlink", "--microbatches", "3"]
    assert main(["plan", *common, "--algorithm", "m_etf", "-o", str(plan_file)]) == 0
    assert capsys.readouterr().err.strip() == note
    assert Plan.load(plan_file).rewritten_graph.extra["microbatches"]["rows"] == [[0, 2], [2, 3], [3, 4]]
    assert main(["compare", *common, "--algorithms", "m_etf,1f1b"]) == 0
    assert capsys.readouterr().err.strip() == note
    assert main(["plan", *common[:-1], "4", "--algorithm", "m_etf", "-o", str(plan_file)]) == 0
    assert capsys.readouterr().err == ""


def test_the_command_line_refuses_a_step_without_a_batch_in_one_line(tmp_path, capsys):
    from placer.cli import main

    graph_file = tmp_path / "g.json"
    OpGraph(["w", "f"], [0.0, 1.0], [0], [1], [8], param_bytes=[8, 0], op=["placeholder", "aten.t"]).save(graph_file)
    for command in (["plan", "-o", str(tmp_path / "p.json")], ["compare", "--algorithms", "m_etf,1f1b"]):
        code = main(command[:1] + [str(graph_file), "--cluster", "2xV100-nvlink", "--microbatches", "2"] + command[1:])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and "has no batch input to cut" in err, err


def test_placer_plan_checks_the_count_against_the_batch_before_the_capture(monkeypatch):
    import torch

    import placer
    import placer.capture as capture_package

    monkeypatch.setattr(capture_package, "capture_spec", lambda *a, **k: pytest.fail("captured"))
    monkeypatch.setattr(capture_package, "capture", lambda *a, **k: pytest.fail("captured"))
    with pytest.raises(OptionError, match=r"batch=4, microbatches=8\): 8 micro-batches of a batch of 4 samples"):
        placer.plan("zoo:lenet", batch=4, microbatches=8, cluster="2xcpu")
    model = torch.nn.Linear(3, 1)
    with pytest.raises(OptionError, match="5 micro-batches of a batch of 4 samples: at most 4"):
        placer.plan(model, (torch.zeros(4, 3),), microbatches=5, cluster="2xcpu")
    with pytest.raises(OptionError, match="no input has a batch dimension to cut into micro-batches"):
        placer.plan(model, (torch.tensor(1.0),), microbatches=2, cluster="2xcpu")
    with pytest.raises(OptionError, match=r"micro-batches of a batch of 4 samples \(graph 'step'\): at most 4"):
        placer.plan(_step(4), microbatches=5, cluster="2xcpu", algorithm="m_etf")


def test_placer_plan_warns_that_uneven_micro_batches_are_planned():
    import placer

    with pytest.warns(UserWarning, match="3 micro-batches of a batch of 4 samples are uneven: 1 of 2 samples"):
        plan = placer.plan(_step(4), microbatches=3, cluster="2xV100-nvlink", algorithm="m_etf")
    assert plan.extra["microbatches"] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        placer.plan(_step(4), microbatches=2, cluster="2xV100-nvlink", algorithm="m_etf")
