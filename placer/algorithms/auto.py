"""``auto``: the best plan the registered algorithms can give, then improved by local search.

Users should not have to pick among a dozen algorithms. ``auto`` runs the
portfolio, keeps the fastest plan that fits, and hill-climbs on its
placement: it moves whole layers and single placement units to other devices
and swaps units between devices, concentrating on the critical path of the
current schedule, and keeps a move only if the reference simulation gets
faster and still fits. It never returns a plan slower than any portfolio
member, and finds a fitting plan whenever any member does.
"""

from __future__ import annotations

import time

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, PlacerError
from ..graph import OpGraph
from ..plan import Plan
from ..sim.simulator import SimResult, simulate
from .baselines import layer_labels
from .common import placement_units, unit_allowed
from .registry import available_algorithms, failure_message, get_algorithm, place, register

__all__ = ["auto", "critical_path_nodes"]

#: Algorithms auto leaves out of its portfolio: itself, and searches that need minutes.
SLOW_ALGORITHMS = {"auto", "pesto", "placeto"}
DEFAULT_TIME_LIMIT = 60.0


def critical_path_nodes(result: SimResult) -> np.ndarray:
    """Nodes on the chain that determined the makespan of a simulated schedule.

    Walking back from the last node to finish, each step goes to whatever made
    the node start when it did: the input that arrived last (its producer), or
    the node the device ran just before it.
    """
    g = result.graph
    if g.num_nodes == 0:
        return np.zeros(0, dtype=np.int64)
    previous = np.full(g.num_nodes, -1)
    for seq in result.device_orders():
        previous[seq[1:]] = seq[:-1]
    arrival = result.finish[g.src].copy()
    xf = result.transfers
    if len(xf):
        cross = result.device_of[g.src] != result.device_of[g.dst]
        key = {(p, t, d): x for x, (p, t, d) in enumerate(zip(xf.producer.tolist(), xf.tensor.tolist(),
                                                               xf.dst_device.tolist()))}
        for e in np.flatnonzero(cross).tolist():
            arrival[e] = xf.end[key[(int(g.src[e]), int(g.edge_tensor[e]), int(result.device_of[g.dst[e]]))]]
    ptr, eids = g.in_edges
    chain = []
    node = int(np.argmax(result.finish))
    while node >= 0:
        chain.append(node)
        inputs = eids[ptr[node]:ptr[node + 1]]
        start = result.start[node]
        cause = -1
        if inputs.size:
            last = inputs[np.argmax(arrival[inputs])]
            if arrival[last] >= start:
                cause = int(g.src[last])
        if cause < 0 and previous[node] >= 0 and result.finish[previous[node]] >= start:
            cause = int(previous[node])
        node = cause
    return np.asarray(chain[::-1], dtype=np.int64)


@register("auto")
def auto(graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None,
         max_evaluations: int = 300, portfolio: str = "") -> Plan:
    """The fastest fitting plan of the registered algorithms, improved by local search.

    Parameters
    ----------
    graph, cluster
    seed : int
        Seeds the portfolio members and the choice of moves.
    time_limit : float, optional
        Seconds for the whole search (default 60). Searches that need minutes
        (pesto, placeto) join the portfolio only with a limit of 60 s or more,
        each getting a third of the time left.
    max_evaluations : int
        Simulations the local search may spend. When this budget, not the
        time limit, ends the search, the result is deterministic for a seed.
    portfolio : str
        Comma-separated algorithm names to run instead of the default portfolio.

    Returns
    -------
    Plan
        Never slower than any portfolio member's plan; its ``extra["auto"]``
        says which member it started from and what local search gained.

    Raises
    ------
    InfeasibleError
        If no portfolio member finds a plan that fits.
    """
    began = time.perf_counter()
    limit = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    deadline = began + limit
    if portfolio:
        members = [name.strip() for name in portfolio.split(",") if name.strip()]
        for name in members:
            get_algorithm(name)
    else:
        members = [name for name in available_algorithms() if name not in SLOW_ALGORITHMS]
        if time_limit is not None and time_limit >= 60:
            members += [name for name in ("pesto", "placeto") if name in available_algorithms()]
    best: tuple[float, str, Plan] | None = None
    failures = []
    for name in members:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        try:
            plan = place(graph, cluster, name, seed=seed,
                         time_limit=max(1.0, left / 3) if name in SLOW_ALGORITHMS else None)
        except PlacerError as exc:
            failures.append(failure_message(name, exc))
            continue
        span = plan.predicted["makespan_s"]
        if best is None or span < best[0]:
            best = (span, name, plan)
    if best is None:
        raise InfeasibleError("auto: no algorithm found a plan that fits (" + "; ".join(failures[:3]) + ")")
    span, origin, plan = best
    if plan.rewritten_graph is not None:   # split graphs are searched by their own algorithm
        plan.extra["auto"] = {"start": origin, "local_search_gain": 0.0}
        return plan
    device_of = np.array([cluster.device_index[plan.placement[i]] for i in graph.ids], dtype=np.int64)
    improved, improved_span, evaluations, interrupted = _local_search(graph, cluster, device_of, seed,
                                                                      max_evaluations, deadline)
    if improved_span < span:
        result = Plan.from_arrays(graph, cluster, improved)
        result.extra["auto"] = {"start": origin, "start_makespan_s": span, "evaluations": evaluations,
                                "local_search_gain": 1 - improved_span / span, "interrupted": interrupted}
        return result
    plan.extra["auto"] = {"start": origin, "start_makespan_s": span, "evaluations": evaluations,
                          "local_search_gain": 0.0, "interrupted": interrupted}
    return plan


def _local_search(graph: OpGraph, cluster: Cluster, device_of: np.ndarray, seed: int, max_evaluations: int,
                  deadline: float) -> tuple[np.ndarray, float, int, bool]:
    """Hill-climb on the placement; the earliest-ready order of the reference model runs each candidate.

    Ctrl-C ends the search early with the best placement so far (the last
    value says whether that happened).
    """
    rng = np.random.default_rng(seed)
    n_dev = cluster.num_devices
    granularities = []
    for labels in (layer_labels(graph, min_layers=8 * n_dev), None):
        unit_of, units = placement_units(graph, labels)
        granularities.append((unit_of, units, unit_allowed(graph, cluster, units)))
    current = device_of.copy()
    result = simulate(graph, cluster, current, check=False)
    current_span = result.makespan_s if result.fits else np.inf
    evaluations = 0
    try:
        while evaluations < max_evaluations and time.perf_counter() < deadline and n_dev > 1:
            current, current_span, result = _try_move(graph, cluster, granularities[evaluations % 2], rng,
                                                      current, current_span, result)
            evaluations += 1
    except KeyboardInterrupt:
        return current, current_span, evaluations, True
    return current, current_span, evaluations, False


def _try_move(graph: OpGraph, cluster: Cluster, granularity, rng: np.random.Generator, current: np.ndarray,
              current_span: float, result: SimResult):
    """One move or swap of a unit on the critical path; the new state if it is faster and fits."""
    unit_of, units, allowed = granularity
    critical = critical_path_nodes(result)
    node = int(critical[rng.integers(critical.size)]) if critical.size else int(rng.integers(graph.num_nodes))
    u = int(unit_of[node])
    here = int(current[units[u][0]])
    options = np.flatnonzero(allowed[u])
    options = options[options != here]
    if options.size == 0:
        return current, current_span, result
    there = int(options[rng.integers(options.size)])
    candidate = current.copy()
    candidate[units[u]] = there
    if rng.random() < 0.5:   # a swap: send back a unit of the target device that may run here
        residents = np.unique(unit_of[candidate == there])
        residents = residents[(residents != u) & allowed[residents, here]]
        if residents.size:
            candidate[units[int(residents[rng.integers(residents.size)])]] = here
    trial = simulate(graph, cluster, candidate, check=False)
    if trial.fits and trial.makespan_s < current_span:
        return candidate, trial.makespan_s, trial
    return current, current_span, result
