"""auto: the portfolio's best plan, boxed in the time limit, improved by local search."""

import time

import numpy as np
import pytest

from placer.algorithms import auto as auto_module
from placer.algorithms import place
from placer.algorithms.auto import default_portfolio
from placer.api import validate
from placer.cluster import load_cluster
from placer.errors import OptionError
from placer.generate import training_graph
from placer.sim.messages import MessageCost, simulate_with_messages
from placer.sim.simulator import simulate_plan

MEMBERS = "dpos,heft,expert,single"


@pytest.fixture(scope="module")
def case():
    return training_graph(layers=5, branches=3, seed=2), load_cluster("4xGPU-pcie")


def test_never_slower_than_a_member_and_matches_the_simulator(case):
    graph, cluster = case
    plan = place(graph, cluster, "auto", portfolio=MEMBERS, max_evaluations=40)
    assert plan.extra["auto"]["ran"] == MEMBERS.split(",")
    for name in MEMBERS.split(","):
        assert plan.predicted["makespan_s"] <= place(graph, cluster, name).predicted["makespan_s"]
    assert plan.predicted["makespan_s"] == pytest.approx(simulate_plan(plan, graph, cluster).makespan_s)


def test_local_search_improves_a_poor_start(case):
    graph, cluster = case
    single = place(graph, cluster, "single")
    plan = place(graph, cluster, "auto", portfolio="single", max_evaluations=60)
    assert plan.extra["auto"]["start"] == "single"
    assert plan.extra["auto"]["local_search_gain"] > 0
    assert plan.predicted["makespan_s"] < single.predicted["makespan_s"]
    assert plan.predicted["fits"]


def test_deterministic_for_a_seed(case):
    graph, cluster = case
    first, second = (
        place(graph, cluster, "auto", seed=5, portfolio="round_robin", max_evaluations=40) for _ in range(2)
    )
    assert first.placement == second.placement
    assert first.predicted["makespan_s"] == second.predicted["makespan_s"]


def test_a_member_past_the_time_limit_is_cut_off(case, monkeypatch):
    graph, cluster = case
    real = auto_module.place

    def slow_heft(graph, cluster, name, **options):
        if name == "heft":
            time.sleep(30)
        return real(graph, cluster, name, **options)

    monkeypatch.setattr(auto_module, "place", slow_heft)
    plan = place(graph, cluster, "auto", portfolio="dpos,heft,expert", time_limit=2, max_evaluations=5)
    assert "heft" in plan.extra["auto"]["out_of_time"]
    assert plan.extra["auto"]["ran"][0] == "dpos"
    assert plan.search_time_s < 30


def test_a_slow_lower_bound_keeps_to_the_time_limit_and_the_plan_in_hand(case, monkeypatch):
    graph, cluster = case

    def slow_bound(graph, cluster):
        time.sleep(30)
        return 0.0

    monkeypatch.setitem(auto_module.LOWER_BOUNDS, "data_parallel", slow_bound)
    plan = place(graph, cluster, "auto", portfolio="expert,data_parallel", time_limit=2, max_evaluations=5)
    assert plan.extra["auto"]["start"] == "expert" and "data_parallel" in plan.extra["auto"]["out_of_time"]
    assert plan.search_time_s < 30


def test_ctrl_c_in_the_portfolio_returns_the_best_so_far(case, monkeypatch):
    graph, cluster = case
    real = auto_module.place

    def interrupt_at_heft(graph, cluster, name, **options):
        if name == "heft":
            raise KeyboardInterrupt
        return real(graph, cluster, name, **options)

    monkeypatch.setattr(auto_module, "place", interrupt_at_heft)
    plan = place(graph, cluster, "auto", portfolio="expert,heft,dpos")
    assert plan.extra["auto"]["interrupted"] is True
    assert plan.extra["auto"]["start"] == "expert"
    validate(plan, graph, cluster)
    with pytest.raises(KeyboardInterrupt):
        place(graph, cluster, "auto", portfolio="heft,dpos")


def test_default_portfolio_runs_fast_members_first_and_slow_ones_only_with_time():
    short, long = default_portfolio(20), default_portfolio(120)
    # The cheapest before m-SCT, which may use all the time left (GNMT over two hosts).
    assert short[:8] == [
        "expert",
        "sharded_data_parallel",
        "data_parallel",
        "single",
        "metis",
        "celeritas",
        "order_place",
        "m_sct",
    ]
    assert len(short) == len(set(short))  # m_sct, a search, runs once
    assert "pesto" not in short and "pesto" in long
    assert "auto" not in long
    assert long.index("os_dpos") > long.index("m_etf")


@pytest.mark.parametrize(
    "options",
    [{"portfolio": "dpos,no_such_algorithm"}, {"portfolio": " , "}, {"max_evaluations": -1}, {"runnable": "yes"}],
)
def test_bad_options_are_refused(case, options):
    graph, cluster = case
    with pytest.raises(OptionError):
        place(graph, cluster, "auto", **options)


def test_runnable_is_deprecated_and_keeps_no_member_out():
    # runnable=True once left the data-parallel members out (the runtime ran no replicas): now every plan runs.
    from placer.transform.replicate import replicated_node

    graph = training_graph(layers=4, branches=2, param_mib=0.5, activation_mib=64)  # where replicas win
    cluster = load_cluster("4xGPU-pcie")
    with pytest.warns(DeprecationWarning, match="runnable is deprecated and has no effect: every plan runs"):
        plan = place(graph, cluster, "auto", runnable=True, portfolio="expert,data_parallel", max_evaluations=5)
    assert plan.extra["auto"]["start"] == "data_parallel" and replicated_node(plan.rewritten_graph) is not None
    assert (
        plan.placement == place(graph, cluster, "auto", portfolio="expert,data_parallel", max_evaluations=5).placement
    )
    assert {"data_parallel", "sharded_data_parallel"} <= set(default_portfolio(20))


def test_fits_when_only_some_members_do():
    graph = training_graph(layers=6, branches=2, param_mib=1500, activation_mib=100, seed=5)
    cluster = load_cluster("4xV100-nvlink")
    plan = place(graph, cluster, "auto", portfolio="single,expert,dpos", max_evaluations=20)
    assert plan.predicted["fits"]
    assert any("single" in failure for failure in plan.extra["auto"]["failed"])
    peaks = simulate_plan(plan, graph, cluster).peak_memory_bytes
    assert np.all(peaks <= cluster.memory)


def test_where_no_member_fits_every_reason_is_told():
    # The message named the first three members only: here the three farthest from fitting.
    from placer.cluster import Channel, Cluster, Device
    from placer.errors import InfeasibleError

    names = [f"g{i}" for i in range(4)]
    cluster = Cluster(
        "tight",
        [Device(n, "V100", 100 << 20) for n in names],
        [Channel(f"{a}->{b}", 2.5e10, 1e-5, ((a, b),)) for a in names for b in names if a != b],
    )
    members = ["expert", "single", "m_topo", "dpos", "heft"]
    with pytest.raises(InfeasibleError) as refused:
        place(training_graph(layers=4, branches=2), cluster, "auto", portfolio=",".join(members), time_limit=30)
    reasons = str(refused.value).split("\n")[1:]
    assert [reason.split(":")[0].strip() for reason in reasons] == members
    assert "would need" in reasons[-1]


@pytest.mark.parametrize("param_mib, runs", [(400.0, False), (0.5, True)])
def test_data_parallel_runs_only_where_its_lower_bound_can_beat_the_best_plan(param_mib, runs):
    """400 MiB of gradients per op on PCIe: the all-reduce alone outlasts the expert split, so auto skips it."""
    graph = training_graph(layers=4, branches=2, param_mib=param_mib, activation_mib=64 if runs else 1)
    cluster = load_cluster("4xGPU-pcie")
    plan = place(graph, cluster, "auto", portfolio="expert,data_parallel", max_evaluations=5)
    data_parallel = place(graph, cluster, "data_parallel").predicted["makespan_s"]
    expert = place(graph, cluster, "expert").predicted["makespan_s"]
    assert ("data_parallel" in plan.extra["auto"]["ran"]) is runs
    assert any(skipped.startswith("data_parallel") for skipped in plan.extra["auto"]["cannot_win"]) is not runs
    assert (data_parallel < expert) is runs
    assert plan.predicted["makespan_s"] <= min(data_parallel, expert)


def test_a_members_plan_is_not_checked_again_but_a_changed_one_is(case, monkeypatch):
    from placer.algorithms import registry
    from placer.errors import InfeasibleError

    graph, cluster = case
    checks = []
    validate = registry.validate
    monkeypatch.setattr(registry, "validate", lambda plan, *args: checks.append(plan) or validate(plan, *args))
    plan = place(graph, cluster, "auto", portfolio="expert", max_evaluations=0)
    assert plan.extra["auto"]["start"] == "expert" and plan.algorithm == "auto"
    assert checks == [plan]  # checked once, by the member's place(); auto returned it as it was
    assert plan.predicted["makespan_s"] == pytest.approx(simulate_plan(plan, graph, cluster).makespan_s)

    def tampering(graph, cluster, *, seed=0, time_limit=None):
        """Returns a plan place() checked, then reverses one device's order (against the dependencies)."""
        checked = place(graph, cluster, "expert")
        device = max(checked.order, key=lambda d: len(checked.order[d]))
        checked.order[device].reverse()
        return checked

    monkeypatch.setitem(
        registry._REGISTRY, "tampering", registry.Algorithm("tampering", tampering, {"seed": 0, "time_limit": None}, "")
    )
    with pytest.raises(InfeasibleError, match="tampering found no valid plan"):
        place(graph, cluster, "tampering")


def test_ranks_by_message_host_cost_where_the_cluster_carries_one():
    # Branches spread over devices win under the reference model; at 5 ms of host time a message, one device
    # (no messages) wins, and auto returns it: the plan the process-per-device runtime runs faster.
    graph = training_graph(layers=6, branches=4, seed=2, activation_mib=0.5, flop_s=1e12)
    cluster = load_cluster("4xGPU-pcie")
    plain = place(graph, cluster, "auto", portfolio="heft,single", max_evaluations=0)
    assert plain.extra["auto"]["start"] == "heft" and plain.extra["auto"]["ranked_by"] == "reference model"
    cost = MessageCost(5e-3, 0.0, 5e-3, 0.0)
    cluster.extra["message_cost"] = cost.to_dict()
    plan = place(graph, cluster, "auto", portfolio="heft,single", max_evaluations=20)
    info = plan.extra["auto"]
    assert info["start"] == "single" and info["ranked_by"] == "reference model and message host cost"
    heft = place(graph, cluster, "heft")
    assert heft.predicted["makespan_s"] < plan.predicted["makespan_s"]  # faster without the messages' cost
    with_messages = {
        name: simulate_with_messages(p.bind(graph, cluster), cost).makespan_s
        for name, p in (("auto", plan), ("heft", heft))
    }
    assert with_messages["auto"] < with_messages["heft"]
    single = place(graph, cluster, "single")
    assert info["start_makespan_s"] == pytest.approx(
        simulate_with_messages(single.bind(graph, cluster), cost).makespan_s
    )
    assert with_messages["auto"] <= info["start_makespan_s"] * (1 + 1e-9)  # the climb kept only what won


def test_a_near_tie_under_message_costs_keeps_the_member_tried_first():
    # A message cost at which heft's plan is predicted about 1% faster than one device's: within MESSAGE_TIE,
    # so auto keeps "single", which it tries first (the portfolio's order); further off, the faster one wins.
    from placer.algorithms.auto import MESSAGE_TIE

    graph = training_graph(layers=6, branches=4, seed=2, activation_mib=0.5, flop_s=1e12)
    cluster = load_cluster("4xGPU-pcie")
    heft, single = place(graph, cluster, "heft"), place(graph, cluster, "single")

    def ratio(fixed_s: float) -> float:
        cost = MessageCost(fixed_s, 0.0, fixed_s, 0.0)
        spans = [simulate_with_messages(p.bind(graph, cluster), cost).makespan_s for p in (heft, single)]
        return spans[0] / spans[1]

    low, high = 0.0, 5e-3
    assert ratio(low) < 1 - MESSAGE_TIE and ratio(high) > 1
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if ratio(middle) < 1 - MESSAGE_TIE / 2 else (low, middle)
    assert 1 - MESSAGE_TIE < ratio(low) < 1
    cluster.extra["message_cost"] = MessageCost(low, 0.0, low, 0.0).to_dict()
    assert place(graph, cluster, "auto", portfolio="single,heft", max_evaluations=0).extra["auto"]["start"] == "single"
    # Further from a tie, the faster plan wins.
    cluster.extra["message_cost"] = MessageCost(low / 4, 0.0, low / 4, 0.0).to_dict()
    assert ratio(low / 4) < 1 - MESSAGE_TIE
    assert place(graph, cluster, "auto", portfolio="single,heft", max_evaluations=0).extra["auto"]["start"] == "heft"
