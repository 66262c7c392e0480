"""``auto``: the best plan the registered algorithms can give, then improved by local search.

Users should not have to pick among a dozen algorithms. ``auto`` runs the
portfolio (one-pass list schedulers first, the searches when time allows),
each member boxed in the time left, keeps the fastest plan that fits, and
hill-climbs on its placement: it moves whole layers and single placement
units off the critical path, to the device of a neighbour (saving a
transfer) or to the least loaded device (balancing work), and swaps units,
keeping a move only if the reference simulation gets faster and still fits.
It never returns a plan slower than any member it ran, and finds a fitting
plan whenever any member does. A member whose cheap lower bound shows it
cannot win (data parallelism) is skipped.
"""

from __future__ import annotations

import time
import warnings
from functools import partial

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, InvalidPlanError, OptionError, PlacerError, TimeLimitError
from ..graph import OpGraph
from ..plan import Plan
from ..sim.simulator import SimResult, simulate
from .baselines import layer_labels
from .common import placement_units, unit_allowed
from .data_parallel import data_parallel_lower_bound
from .registry import available_algorithms, failure_message, get_algorithm, place, register
from .timebox import TimeBox, frugal

__all__ = ["auto", "critical_path_nodes"]

#: Searches that need minutes: in the portfolio only with a time limit of at least a minute.
SLOW_ALGORITHMS = ("pesto", "placeto")
#: Members that search until their ``time_limit``: each gets a share of the time left. The others get
#: all of it (m-SCT's LP solver stops at half its limit).
SEARCHES = ("os_dpos",) + SLOW_ALGORITHMS
#: Members in the order they run first; the others follow in registry order, the searches last. The expert
#: split comes first: it is the quickest to find a plan that fits where memory is tight, and once auto has a
#: plan it can box every later member in the time left. Data parallelism next, the sharded optimizer's first
#: (the same ring traffic, 1/n of the update): where a replica fits it often beats every placement, and its
#: lower bound skips it where it cannot win. Then the cheap one-pass members, fastest first, so that each
#: runs before a slower one can use up the time; the searches last.
FAST_FIRST = (
    "expert",
    "sharded_data_parallel",
    "data_parallel",
    "single",
    "metis",
    "celeritas",
    "order_place",
    "m_sct",
    "m_topo",
    "dpos",
    "heft",
)
#: Members that place the step as micro-batches, which the runtime does not run yet: in the portfolio only
#: where ``portfolio`` names them, so that a plan auto picks by default runs.
MICROBATCHED = ("gpipe", "1f1b")
#: Options auto gives members: data parallelism reduces its gradients with whichever collective is faster
#: for the case (the ring or direct exchanges within and between hosts).
MEMBER_OPTIONS = {"data_parallel": {"collective": "best"}, "sharded_data_parallel": {"collective": "best"}}
#: Members whose makespan has a cheap lower bound (for the options above): one whose bound is no better than
#: the best plan so far cannot win and does not run. Data parallelism's bound costs far less than its plan and
#: is tightest where the all-reduce dominates.
LOWER_BOUNDS = {
    "data_parallel": partial(data_parallel_lower_bound, **MEMBER_OPTIONS["data_parallel"]),
    "sharded_data_parallel": partial(
        data_parallel_lower_bound, shard_optimizer=True, **MEMBER_OPTIONS["sharded_data_parallel"]
    ),
}
#: What ``runnable=True`` (auto's and ``placer.plan``'s, deprecated) warns.
RUNNABLE_DEPRECATED = "runnable is deprecated and has no effect: every plan runs"


DEFAULT_TIME_LIMIT = 60.0
#: Share of the time limit the portfolio may use: a member is worth more than the local search, which
#: gains little on large graphs in seconds; the rest leaves time for placer's check of the plan.
PORTFOLIO_SHARE = 0.9


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
        key = xf.rows()
        for e in np.flatnonzero(cross).tolist():
            arrival[e] = xf.end[key[(int(g.src[e]), int(g.edge_tensor[e]), int(result.device_of[g.dst[e]]))]]
    ptr, eids = g.in_edges
    chain = []
    node = int(np.argmax(result.finish))
    while node >= 0:
        chain.append(node)
        inputs = eids[ptr[node] : ptr[node + 1]]
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
def auto(
    graph: OpGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    max_evaluations: int = 300,
    portfolio: str = "",
    runnable: bool = False,
) -> Plan:
    """The fastest fitting plan of the registered algorithms, improved by local search.

    Parameters
    ----------
    graph, cluster
    seed : int
        Seeds the portfolio members and the choice of moves.
    time_limit : float, optional
        Seconds for the whole search (default 60). The portfolio may use 90% of
        it, each member boxed in the time left (searches get a third of it as
        their own limit); pesto and placeto join only with a limit of 60 s or
        more. The local search uses what remains.
    max_evaluations : int
        Simulations the local search may spend. When this budget, not the
        time limit, ends the search, the result is deterministic for a seed.
    portfolio : str
        Comma-separated algorithm names to run instead of the default portfolio.
    runnable : bool
        Deprecated, no effect (every plan runs): ``True`` warns with a
        DeprecationWarning. To be removed in the next release.

    Returns
    -------
    Plan
        Never slower than any portfolio member's plan. ``extra["auto"]`` says
        which member it started from, which members ran, were cut off, failed,
        or were skipped by their lower bound (``cannot_win``), and what local
        search gained.

    Raises
    ------
    OptionError
        An unknown algorithm in ``portfolio`` or none at all, or a negative ``max_evaluations``.
    InfeasibleError
        If no portfolio member finds a plan that fits.

    Examples
    --------
    >>> from placer.algorithms import place
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> plan = place(training_graph(layers=3), load_cluster("2xV100-nvlink"), "auto", max_evaluations=20)
    >>> plan.predicted["fits"]
    True

    References
    ----------
    The members' papers are cited in their modules. The local search is a
    first-improvement hill climb on the critical path of the reference
    simulation, as in the placement refinement baselines of Mirhoseini et al.
    and Addanki et al.
    """
    began = time.perf_counter()
    limit = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    deadline = began + limit
    if runnable:
        # place() -> auto: the warning points at place()'s caller.
        warnings.warn(RUNNABLE_DEPRECATED, DeprecationWarning, stacklevel=3)
    if max_evaluations < 0:
        raise OptionError(f"option max_evaluations of 'auto' must be >= 0, got {max_evaluations!r}")
    if portfolio:
        members = [name.strip() for name in portfolio.split(",") if name.strip()]
        if not members:
            raise OptionError(f"option portfolio of 'auto' names no algorithm: {portfolio!r}")
        for name in members:
            get_algorithm(name)
    else:
        members = default_portfolio(time_limit)
    best, log, interrupted, check_s = _run_portfolio(
        graph, cluster, members, seed, began + PORTFOLIO_SHARE * limit, deadline, MEMBER_OPTIONS
    )
    if best is None:
        # Every member's reason, one a line: the first few seldom include the one that came closest.
        reasons = log["failed"] + ([f"out of time: {', '.join(log['out_of_time'])}"] if log["out_of_time"] else [])
        raise InfeasibleError("auto: no algorithm found a plan that fits:\n  " + "\n  ".join(reasons))
    span, origin, plan = best
    info = {
        "start": origin,
        "start_makespan_s": span,
        **log,
        "evaluations": 0,
        "local_search_gain": 0.0,
        "interrupted": interrupted,
    }
    # Split graphs are searched by their own algorithm; the search needs time for a few simulations.
    if plan.rewritten_graph is not None or interrupted or deadline - time.perf_counter() < 3 * check_s:
        plan.extra["auto"] = info
        return plan
    device_of = np.array([cluster.device_index[plan.placement[i]] for i in graph.ids], dtype=np.int64)
    improved, improved_span, info["evaluations"], info["interrupted"] = _local_search(
        graph, cluster, device_of, seed, max_evaluations, deadline
    )
    if improved_span < span:
        plan = Plan.from_arrays(graph, cluster, improved)
        info["local_search_gain"] = 1 - improved_span / span
    plan.extra["auto"] = info
    return plan


def default_portfolio(time_limit: float | None) -> list[str]:
    """The registered algorithms auto runs, in order: fast one-pass ones first, searches last.

    Pesto and placeto join only when a limit of at least a minute is given; the pipelines
    (:data:`MICROBATCHED`) only by name.
    """
    registered = [name for name in available_algorithms() if name != "auto" and name not in MICROBATCHED]
    first = [name for name in FAST_FIRST if name in registered]
    searches = [
        name
        for name in SEARCHES
        if name in registered
        and name not in first
        and (name not in SLOW_ALGORITHMS or (time_limit is not None and time_limit >= 60))
    ]
    rest = [name for name in registered if name not in first and name not in SEARCHES]
    return first + rest + searches


def _run_portfolio(
    graph: OpGraph,
    cluster: Cluster,
    members: list[str],
    seed: int,
    end: float,
    deadline: float,
    options: dict[str, dict],
):
    """Run ``members`` (each with its ``options``) in order until ``end``.

    Returns the fastest fitting plan (span, name, plan) or None, a log, whether
    Ctrl-C stopped it, and the time placer took to check the best plan.

    Each member is boxed in the time left, except while no plan has been found
    (so that auto fits whenever a member does); members that search until a
    limit get a third of the time left. The portfolio ends early enough before
    ``deadline`` for placer to check the plan it returns.
    """
    best: tuple[float, str, Plan] | None = None
    log: dict[str, list[str]] = {"ran": [], "out_of_time": [], "failed": [], "cannot_win": []}
    check_s = 0.0
    for name in members:
        began = time.perf_counter()
        left = min(end, deadline - check_s) - began
        if left <= 0 and best is not None:
            log["out_of_time"].append(name)
            continue
        if name in LOWER_BOUNDS and best is not None:
            with TimeBox(left) as box:  # seconds on a big graph: within the time left, which it then shortens
                bound = LOWER_BOUNDS[name](graph, cluster)
            left = min(end, deadline - check_s) - time.perf_counter()
            if box.expired or left <= 0:
                log["out_of_time"].append(name)
                continue
            if bound >= best[0]:
                log["cannot_win"].append(f"{name} (at least {bound:.4g} s)")
                continue
        searches = name in SEARCHES
        try:
            with frugal(), TimeBox(left if best is not None else None) as box:
                plan = place(
                    graph,
                    cluster,
                    name,
                    seed=seed,
                    time_limit=max(1.0, left / 3) if searches else (left if best is not None else None),
                    **options.get(name, {}),
                )
            if box.expired:
                log["out_of_time"].append(name)
                continue
        except TimeLimitError:
            log["out_of_time"].append(name)
            continue
        except PlacerError as exc:
            log["failed"].append(failure_message(name, exc))
            continue
        except KeyboardInterrupt:
            if best is None:
                raise
            return best, log, True, check_s
        log["ran"].append(name)
        span = plan.predicted["makespan_s"]
        if best is None or span < best[0]:
            best = (span, name, plan)
            # Only the plan auto returns is checked again: a slower member's big split graph is not.
            check_s = time.perf_counter() - began - plan.search_time_s
    return best, log, False, check_s


def _local_search(
    graph: OpGraph, cluster: Cluster, device_of: np.ndarray, seed: int, max_evaluations: int, deadline: float
) -> tuple[np.ndarray, float, int, bool]:
    """Hill-climb on the placement; the earliest-ready order of the reference model runs each candidate.

    A candidate is simulated only if it and placer's final check of the plan end
    before ``deadline``. Ctrl-C ends the search early with the best placement so
    far (the last value says whether that happened).
    """
    rng = np.random.default_rng(seed)
    n_dev = cluster.num_devices
    granularities = []
    for labels in (layer_labels(graph, min_layers=8 * n_dev), None):
        unit_of, units = placement_units(graph, labels)
        granularities.append((unit_of, units, unit_allowed(graph, cluster, units)))
    began = time.perf_counter()
    state = _State(device_of.copy(), simulate(graph, cluster, device_of, check=False))
    step = time.perf_counter() - began  # seconds per simulation, a running mean
    seen = {device_of.tobytes()}
    evaluations = 0
    try:
        while (
            evaluations < max_evaluations
            and time.perf_counter() + 2 * step < deadline
            and n_dev > 1
            and graph.num_nodes
        ):
            candidate = _propose(graph, granularities[evaluations % 2], rng, state)
            evaluations += 1
            if candidate is None or candidate.tobytes() in seen:
                continue
            seen.add(candidate.tobytes())
            began = time.perf_counter()
            try:
                trial = _State(candidate, simulate(graph, cluster, candidate, check=False))
            except InvalidPlanError:  # a move to a device no channel reaches from a neighbour
                continue
            step = 0.5 * step + 0.5 * (time.perf_counter() - began)
            if trial.key < state.key:
                state = trial
    except KeyboardInterrupt:
        return state.device_of, state.key[0], evaluations, True
    return state.device_of, state.key[0], evaluations, False


class _State:
    """A placement and its simulation; ``key`` orders states: makespan (inf unless it fits), then mean finish.

    The mean finish breaks ties so that the climb can cross plateaus where a
    move shortens every chain but the longest.
    """

    def __init__(self, device_of: np.ndarray, result: SimResult):
        self.device_of = device_of
        self.result = result
        mean_finish = float(result.finish.mean()) if result.finish.size else 0.0
        self.key = (result.makespan_s, mean_finish) if result.fits else (np.inf, np.inf)
        self._critical = None

    @property
    def critical(self) -> np.ndarray:
        """The critical path (computed once: many moves are proposed from one state)."""
        if self._critical is None:
            self._critical = critical_path_nodes(self.result)
        return self._critical


def _propose(graph: OpGraph, granularity, rng: np.random.Generator, state: _State) -> np.ndarray | None:
    """A move (or swap) of the unit of a random critical node, or None where it has nowhere to go.

    The target is, with equal chances, the device of one of the node's
    producers or consumers elsewhere (the move saves that transfer), the
    least busy device (it balances work), or any device.
    """
    unit_of, units, allowed = granularity
    current, result = state.device_of, state.result
    critical = state.critical
    node = int(critical[rng.integers(critical.size)]) if critical.size else int(rng.integers(graph.num_nodes))
    u = int(unit_of[node])
    here = int(current[units[u][0]])
    options = np.flatnonzero(allowed[u])
    options = options[options != here]
    if options.size == 0:
        return None
    kind = rng.integers(3)
    if kind == 0:
        ptr_in, e_in = graph.in_edges
        ptr_out, e_out = graph.out_edges
        neighbours = np.concatenate(
            [graph.src[e_in[ptr_in[node] : ptr_in[node + 1]]], graph.dst[e_out[ptr_out[node] : ptr_out[node + 1]]]]
        )
        near = np.intersect1d(current[neighbours], options)
        if near.size:
            options = near
    elif kind == 1:
        busy = np.bincount(current, weights=result.finish - result.start, minlength=allowed.shape[1])
        options = options[busy[options] == busy[options].min()]
    there = int(options[rng.integers(options.size)])
    candidate = current.copy()
    candidate[units[u]] = there
    if rng.random() < 0.5:  # a swap: send back a unit of the target device that may run here
        residents = np.unique(unit_of[candidate == there])
        residents = residents[(residents != u) & allowed[residents, here]]
        if residents.size:
            candidate[units[int(residents[rng.integers(residents.size)])]] = here
    return candidate
