"""The contract every registered algorithm must honour, as runnable checks.

Like scikit-learn's ``check_estimator``: :func:`check_algorithm` runs every
check in :data:`CHECKS` on one algorithm by name, and the test suite runs
them on every registered algorithm, so a new family is held to the same
rules the moment it is registered:

- its plans are valid (rule 8) and fit memory, and ``predicted`` equals a
  fresh reference simulation of the plan read back from its file;
- it keeps colocation groups together and nodes on allowed device kinds;
- on a problem too big for one device, and on random valid problems, it
  returns a fitting plan or raises :class:`InfeasibleError`, nothing else;
- on devices in a line (the ends have no channel between them) it returns a
  valid plan or refuses, never a plan that sends where no channel goes;
- it is deterministic for a seed;
- it rejects unknown options and bad values with :class:`OptionError`.

Each check takes the algorithm name and extra options (every algorithm
accepts ``time_limit``; the checks pass a short one).
"""

from __future__ import annotations

import json

import numpy as np

from ..cluster import Channel, Cluster, Device, load_cluster
from ..errors import InfeasibleError, InvalidPlanError, OptionError
from ..generate import contract_cases, random_dag, training_graph, with_device_kinds
from ..graph import OpGraph
from ..plan import Plan
from ..sim.simulator import simulate, simulate_plan
from ..sim.validation import validate
from ..transform.bind import target_graph
from .registry import checked_options, get_algorithm, place

__all__ = [
    "CHECKS",
    "check_algorithm",
    "contract_cases",
    "random_cases",
    "check_valid_plans",
    "check_constraints",
    "check_memory_pressure",
    "check_random_cases",
    "check_partially_linked",
    "check_determinism",
    "check_option_validation",
]

GiB = 1 << 30
CHECK_TIME_LIMIT = 10.0


def _check_plan(plan: Plan, graph: OpGraph, cluster: Cluster, label: str) -> None:
    # Read the plan back from its file form: what a user gets must simulate to what it predicts.
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict(), allow_nan=False)))  # as Plan.save writes it
    result = simulate_plan(again, graph, cluster)
    assert result.fits, f"{label}: plan does not fit memory"
    predicted = plan.predicted["makespan_s"]
    assert np.isclose(predicted, result.makespan_s, rtol=1e-6, atol=0), (
        f"{label}: predicted makespan {predicted} but the reference model gives {result.makespan_s}"
    )
    for name, peak in plan.predicted["peak_memory_bytes"].items():
        j = cluster.device_index[name]
        assert peak == int(result.peak_memory_bytes[j]), f"{label}: predicted peak memory of {name} differs"
    assert again.order is not None, f"{label}: plan has no per-device order"
    bound = plan.predicted["lower_bound_s"]
    assert bound <= predicted * (1 + 1e-9), f"{label}: makespan {predicted} under its lower bound {bound}"


def check_valid_plans(name: str, **options) -> None:
    """Plans on every contract case are valid, fit, and predict what the reference model gives."""
    for label, graph, cluster in contract_cases():
        plan = place(graph, cluster, name, time_limit=CHECK_TIME_LIMIT, **options)
        _check_plan(plan, graph, cluster, f"{name} on {label}")


def check_constraints(name: str, **options) -> None:
    """Colocation groups share a device and restricted nodes sit on allowed kinds."""
    for label, graph, cluster in contract_cases():
        plan = place(graph, cluster, name, time_limit=CHECK_TIME_LIMIT, **options)
        target = target_graph(plan, graph)
        kinds = {d.name: d.kind for d in cluster.devices}
        for key, members in target.colocation_groups.items():
            devices = {plan.placement[target.ids[i]] for i in members}
            assert len(devices) == 1, f"{name} on {label}: colocation group {key!r} split over {devices}"
        for i, allowed in enumerate(target.device_kinds):
            if allowed is not None:
                assert kinds[plan.placement[target.ids[i]]] in allowed, (
                    f"{name} on {label}: node {target.ids[i]!r} on a forbidden kind"
                )


def check_memory_pressure(name: str, **options) -> None:
    """Where no single device holds the step, a plan that fits comes out, or InfeasibleError."""
    graph = training_graph(layers=6, branches=2, param_mib=1500, activation_mib=100, seed=5)
    cluster = load_cluster("4xV100-nvlink")
    try:
        plan = place(graph, cluster, name, time_limit=CHECK_TIME_LIMIT, **options)
    except InfeasibleError:
        return
    _check_plan(plan, graph, cluster, f"{name} under memory pressure")


def random_cases(count: int = 6, seed: int = 0) -> list[tuple[str, OpGraph, Cluster]]:
    """Random valid problems: random DAGs with colocation and kinds, clusters of random size and memory."""
    rng = np.random.default_rng(seed)
    cases = []
    for k in range(count):
        n_dev = int(rng.integers(2, 5))
        kinds = ["V100", "A100"]
        devices = [
            Device(f"d{j}", kinds[j % 2], int(rng.integers(1, 8)) * (64 << 20), float(rng.uniform(0.5, 2)))
            for j in range(n_dev)
        ]
        names = [d.name for d in devices]
        channels = [
            Channel(f"{a}->{b}", float(rng.uniform(1e9, 5e10)), float(rng.uniform(0, 1e-4)), ((a, b),))
            for a in names
            for b in names
            if a != b
        ]
        graph = random_dag(
            int(rng.integers(5, 60)),
            edge_prob=float(rng.uniform(0.1, 0.8)),
            seed=int(rng.integers(1 << 30)),
            max_bytes=16 << 20,
            colocation_groups=int(rng.integers(0, 4)),
        )
        graph = graph.replace(device_kinds=[("V100",) if rng.random() < 0.1 else None for _ in range(graph.num_nodes)])
        cases.append((f"random-{k}", graph, Cluster(f"random-{k}", devices, channels)))
    return cases


def check_random_cases(name: str, **options) -> None:
    """On random valid problems: a plan that passes validation, or InfeasibleError, nothing else."""
    for label, graph, cluster in random_cases():
        try:
            plan = place(graph, cluster, name, time_limit=CHECK_TIME_LIMIT, **options)
        except InfeasibleError:
            continue
        _check_plan(plan, graph, cluster, f"{name} on {label}")


def _line_case() -> tuple[OpGraph, Cluster]:
    """A random DAG with kinds and colocation over an A100 and two V100s in a line (channels both ways between
    neighbours only: a0 cannot send to v1), each holding 60% of a one-device run: the step needs two devices."""
    graph = with_device_kinds(random_dag(40, edge_prob=0.15, colocation_groups=3, seed=8, max_bytes=8 << 20))
    memory = int(
        0.6
        * simulate(
            graph, Cluster("one", [Device("one", "V100", 1 << 50)], []), np.zeros(graph.num_nodes, dtype=np.int64)
        ).peak_memory_bytes[0]
    )
    devices = [Device("a0", "A100", memory, 1.3), Device("v0", "V100", memory), Device("v1", "V100", memory)]
    return graph, Cluster(
        "line-3",
        devices,
        [
            Channel(f"{a}->{b}", 12e9, 1e-5, ((a, b),))
            for x, y in (("a0", "v0"), ("v0", "v1"))
            for a, b in ((x, y), (y, x))
        ],
    )


def check_partially_linked(name: str, **options) -> None:
    """On devices not all linked, the algorithm itself (before :func:`place` validates what it returns)
    gives a valid plan that fits, or refuses: InfeasibleError, or InvalidPlanError from its own check of
    what a fixed rule built (which place() reports as InfeasibleError)."""
    graph, cluster = _line_case()
    alg = get_algorithm(name)
    opts = checked_options(alg, {"time_limit": CHECK_TIME_LIMIT, **options})
    if alg.prepare is not None:
        alg.prepare(opts)
    try:
        plan = alg.func(graph, cluster, **opts)
    except (InfeasibleError, InvalidPlanError):
        return
    try:
        validate(plan, graph, cluster)
    except InvalidPlanError as exc:
        raise AssertionError(f"{name} on a line of devices returned an invalid plan: {exc}") from None


def check_determinism(name: str, **options) -> None:
    """The same inputs and seed give the same placement and order."""
    label, graph, cluster = contract_cases()[1]
    first = place(graph, cluster, name, seed=7, time_limit=CHECK_TIME_LIMIT, **options)
    second = place(graph, cluster, name, seed=7, time_limit=CHECK_TIME_LIMIT, **options)
    assert first.placement == second.placement, f"{name}: placement differs between two runs with one seed"
    assert first.order == second.order, f"{name}: order differs between two runs with one seed"


def check_option_validation(name: str, **options) -> None:
    """Unknown options and bad seeds or time limits raise OptionError before any work."""
    _, graph, cluster = contract_cases()[0]
    for bad in ({"no_such_option": 1}, {"seed": -1}, {"seed": "x"}, {"time_limit": 0}, {"time_limit": float("nan")}):
        try:
            place(graph, cluster, name, **{**options, **bad})
        except OptionError:
            continue
        raise AssertionError(f"{name}: option {bad} was accepted")


CHECKS = (
    check_valid_plans,
    check_constraints,
    check_memory_pressure,
    check_random_cases,
    check_partially_linked,
    check_determinism,
    check_option_validation,
)


def check_algorithm(name: str, **options) -> None:
    """Run every contract check on the algorithm registered as ``name``; AssertionError on failure."""
    for check in CHECKS:
        check(name, **options)
