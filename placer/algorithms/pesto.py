"""``pesto``: joint placement and scheduling as one constraint model, on a coarsened graph.

Pesto's point is that where an operation runs and when it runs must be
decided together, with transfers competing for the links between devices.
The paper writes a big-M ILP for two GPUs and solves it with CPLEX on a
graph coarsened to ~200 nodes (Section 3). Here the same model is a CP-SAT
scheduling model for any number of devices and any channel layout:

- a device literal per node and device it may use (kinds, colocation);
- per device, optional fixed-size intervals of the nodes under no-overlap;
- per (producer, tensor, destination device), one transfer -- as in the
  reference model -- whose optional interval sits on the channel of the
  chosen source and destination devices; every channel (shared ones
  included) is a no-overlap resource;
- precedence: a consumer starts after its producer ends, and after the
  transfer to its device ends when the two sit apart;
- memory: each device's summed static footprint (parameters, outputs,
  workspace, scaled by the liveness ratio of :mod:`.common`) within its memory;
- channels serve transfers first-come-first-served, with the reference
  model's tie rule (between transfers of different producers only while the
  model stays small, ``FIFO_MAX_PAIRS``);
- objective: the makespan. Times are integers of a reported resolution.

With ``model="exact"`` (default for graphs of at most ``EXACT_MAX_NODES``
nodes that need no coarsening) no device or channel may idle while its next
job is ready either. The feasible schedules are then exactly the reference
simulations of all plans (whose memory budget holds and whose times the
resolution represents), so the optimum is the reference optimum over every
placement and order.

The search improves on the best quick plan, whatever graph that plan
places. The cheap registered algorithms warm-start it, among them those
that rewrite the graph (data parallelism, plain and with a sharded
optimizer, and OS-DPOS's operation splits, under a share of the limit).
When the fastest warm start places a rewritten graph (replicas ``r{k}/...``,
split parts, collective steps as nodes), the search places that graph: any
placement and order of its nodes, within the kinds and colocation it states,
is a plan the runtime runs, and the plan binds to the model's graph as the
warm start's does (its ``rewritten_graph`` and ``splits``). Graphs the exact
model solves are searched as given, for their proven optimum. The best warm
start's placement is also tried in DPOS's order (upward rank, insertion),
which may serve its collective steps and critical work sooner. A searched
graph of more than ``WINDOW_MIN_NODES`` nodes (a replicated training step has
tens of thousands), whose coarse model would take the solver most of the
limit to load, is searched by window rounds on the whole graph instead
(:mod:`.pesto_window`): each round frees a few dozen operations of two
devices where the incumbent's step can shrink (its critical path, the
idlest device pair, a transfer that queued), holds the rest as constants and
rigid blocks, and is kept only when the reference simulation of the whole
step is shorter. A smaller searched graph is coarsened by Theorem 3.5's
batch merging to the size the solver handles (about 200 nodes), whatever any
plan does with it. The
warm-start plans of that graph are projected on the coarse graph (each coarse
node where most of its compute ran) and the best projection, by the
reference makespan of the whole graph, is hinted to one solve of the whole
model. A large-neighbourhood search follows (:mod:`.pesto_lns`): each round
frees the placement of a window of the incumbent's schedule, a device pair's
nodes or a subgraph, fixes every other placement, and re-solves with the
incumbent as a complete hint. A solution maps back to every node: placement
from its coarse node, order per device from the solver's start times
(members of a coarse node in topological order); the reference model's own
earliest-ready order for that placement is tried too. A round's plan becomes
the incumbent only if the reference simulation finds it no slower. Last, a
hill climb on the whole graph moves smaller units (a finer coarsening) off
the critical path, keeping the search's order. Rounds, their solver work and
the hill climb's simulations follow from the time limit alone, so that a
seed and a limit give one plan wherever the wall clock lets the work finish;
the plan lists whatever the wall clock cut. The returned plan is never
slower than the warm start under the reference model. When the solver's
plans overflow memory under the reference model, it solves again with a
more conservative memory budget.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace

import numpy as np
from ortools.sat.python import cp_model

from ..cluster import Cluster
from ..errors import InfeasibleError, InvalidPlanError, OptionError, PlacerError
from ..feasibility import static_footprint
from ..graph import OpGraph
from ..plan import Plan
from ..sim.bounds import lower_bound
from ..sim.simulator import SimResult, simulate
from ..transform.coarsen import Coarsening, coarsen
from .common import liveness_ratio
from .fastt import dpos_schedule
from .list_scheduling.retries import rank_ordered_with_memory_retries
from .pesto_lns import REFINE_PER_SECOND, REFINE_UNIT_FACTOR, LnsBudget, Neighbourhoods, refine
from .pesto_window import WindowBudget, WindowSearch
from .registry import available_algorithms, place, register
from .timebox import TimeBox, frugal

__all__ = ["pesto", "WARM_START_ALGORITHMS", "EXACT_MAX_NODES"]

#: Cheap algorithms whose plans warm-start the solver (those registered are run), best value first: on
#: big graphs or a busy machine the later ones may not get their turn (``WARM_START_SHARE``). Data
#: parallelism, with a sharded optimizer and plain, comes first (a few simulations; it fails at once
#: where a replica does not fit a device), then the list schedulers, the expert split and METIS (quick),
#: OS-DPOS's splits under a time limit of its own (``WARM_START_OWN_SHARES``), then m-SCT and m-ETF
#: (slow on big graphs); the plans that rarely win (one device, topological, round robin) come last.
WARM_START_ALGORITHMS = (
    "sharded_data_parallel",
    "data_parallel",
    "dpos",
    "heft",
    "expert",
    "metis",
    "os_dpos",
    "m_sct",
    "m_etf",
    "single",
    "m_topo",
    "round_robin",
)
#: Warm-start algorithms whose plans may place a rewritten graph; left out where the exact model
#: solves the graph as given (at most ``EXACT_MAX_NODES`` nodes), whose optimum pesto then returns.
REWRITING_WARM_STARTS = ("data_parallel", "sharded_data_parallel", "os_dpos")
#: Options of the warm-start algorithms that take some: the data-parallel plans reduce gradients with
#: whichever collective gives the faster step.
WARM_START_OPTIONS = {"data_parallel": {"collective": "best"}, "sharded_data_parallel": {"collective": "best"}}
#: Warm-start algorithms that search: each gets this share of pesto's time limit as its own, which does
#: not count against ``WARM_START_SHARE``.
WARM_START_OWN_SHARES = {"os_dpos": 0.25}
#: Share of its own limit after which such a search counts as cut by the wall clock (OS-DPOS keeps a
#: tenth of its limit for placer's check of its plan).
OWN_LIMIT_USED = 0.8
#: Largest uncoarsened graph the automatic choice solves with the exact (simulator-faithful) model.
EXACT_MAX_NODES = 12
DEFAULT_TIME_LIMIT = 60.0
#: Integer time units per horizon: the resolution is the power of ten giving at least this many.
TIME_STEPS = 10**6
MODELS = ("auto", "exact", "relaxed")
#: Pairs of transfers sharing a channel up to which a relaxed model also keeps channels first-come-first-served.
FIFO_MAX_PAIRS = 20000
#: Share of the time limit after which no further warm-start algorithm starts.
WARM_START_SHARE = 0.3
#: Share of the time limit kept for mapping the solution back and placer's check of the plan.
CHECK_SHARE = 0.1
#: Seconds before the search's end at which the refinement starts no further simulation.
REFINE_MARGIN_S = 0.5
#: Searched graphs of more nodes than this get window rounds on the whole graph (:mod:`.pesto_window`)
#: instead of a model of the coarsened graph.
WINDOW_MIN_NODES = 2000
#: Solves with a growing memory ratio when the solver's plans overflow memory under the reference model.
MEMORY_ATTEMPTS = 3


@register("pesto")
def pesto(
    graph: OpGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    target: int = 0,
    workers: int = 1,
    model: str = "auto",
) -> Plan:
    """Joint placement and schedule from a CP-SAT model of the (coarsened) graph, warm-started.

    Parameters
    ----------
    graph, cluster
    seed : int
        Seeds the solver and the warm-start algorithms.
    time_limit : float, optional
        Seconds for the whole search (default 60). The work follows from it
        alone (:class:`.pesto_lns.LnsBudget`: 0.4 rounds of
        ``WORK_PER_ROUND`` deterministic solver time per second, and
        ``REFINE_PER_SECOND`` simulations of the hill climb per second), so
        that a run is reproducible for a seed unless the wall clock cuts a
        phase short; then ``extra["pesto"]["cut_by_wall_clock"]`` is true and
        ``wall_clock_cuts`` says what was cut. No further warm-start
        algorithm starts after ``WARM_START_SHARE`` of the limit; OS-DPOS
        has a share of its own (``WARM_START_OWN_SHARES``), and one that runs
        to it counts as cut. The solver stops at once when it proves
        optimality.
    target : int
        Nodes of the coarsened graph; 0 picks ``512 / devices`` within
        [24, 200] (the transfer intervals grow with the square of the
        devices). Graphs no larger are not coarsened.
    workers : int
        Solver threads. More than one uses CP-SAT's interleaved search, which
        stays deterministic.
    model : {"auto", "exact", "relaxed"}
        ``exact`` forbids idling, so that the model is the reference model
        (for small graphs); ``relaxed`` lets jobs wait, as scheduling models
        do; ``auto`` picks exact for uncoarsened graphs of at most
        ``EXACT_MAX_NODES`` nodes.

    Returns
    -------
    Plan
        Placement and per-device order of every node of the searched graph:
        the model's own, or the graph the fastest warm start rewrote it into
        (then ``rewritten_graph`` and ``splits`` are that plan's, so that
        the plan binds to ``graph`` as the warm start's does).
        ``extra["pesto"]`` reports the searched graph (``searched_graph``:
        ``"original"`` or ``"rewritten by <algorithm>"``, and
        ``searched_nodes``), the coarse size, model (``"window"``: the
        window rounds of a big graph, with their ``window_*`` counts), time resolution,
        the first solve's status and its proven gap on its model, the
        rounds of the search (planned, run, accepted, improving), the hill
        climb's simulations, the best valid lower bound on the plans of the
        searched graph (``lower_bound_s``) and the gap to it (``gap``),
        where the plan came from (``returned``; ``"reorder"``: the warm
        start's placement in DPOS's order), the warm start, and what the
        wall clock cut.

    Raises
    ------
    OptionError
        A negative ``target``, ``workers`` below 1, or an unknown ``model``.
    InfeasibleError
        Neither the warm-start algorithms nor the solver found a plan that fits.

    Examples
    --------
    >>> from placer.cluster import PRESETS
    >>> g = OpGraph(["a", "b", "c"], [1.0, 1.0, 1.0], [0, 0], [1, 2], [8, 8])
    >>> plan = pesto(g, PRESETS["2xV100-nvlink"]())
    >>> plan.extra["pesto"]["model"], plan.extra["pesto"]["solver_status"]
    ('exact', 'OPTIMAL')

    References
    ----------
    Hafeez, Sun, Gandhi and Liu, "Towards Optimal Placement and Scheduling of
    DNN Operations with Pesto", Middleware 2021: Section 3.2.2 (Pesto ILP,
    congestion constraints), Section 3.3 (coarsening, Theorem 3.5).
    """
    if isinstance(target, bool) or target < 0:
        raise OptionError(f"option target of 'pesto' must be a non-negative integer, got {target!r}")
    if isinstance(workers, bool) or workers < 1:
        raise OptionError(f"option workers of 'pesto' must be at least 1, got {workers!r}")
    if model not in MODELS:
        raise OptionError(f"option model of 'pesto' must be one of {', '.join(MODELS)}, got {model!r}")
    began = time.perf_counter()
    limit = DEFAULT_TIME_LIMIT if time_limit is None else float(time_limit)
    deadline = began + limit
    budget = LnsBudget.for_limit(limit)
    n_dev = cluster.num_devices

    failures: dict[str, str] = {}
    plans: dict[str, Plan] = {}
    # A graph the exact model solves as given gets its proven optimum: no rewritten graph is searched.
    rewrite = not (model == "exact" or (model == "auto" and graph.num_nodes <= EXACT_MAX_NODES))
    warm_name, warm = _warm_start(
        graph, cluster, seed, began + WARM_START_SHARE * limit, failures, plans, limit, rewrite
    )
    # The search places the graph the best warm start places: the model's own, or the one it rewrote.
    searched = _placed_graph(warm, graph)
    starts = {name: plan for name, plan in plans.items() if _placed_graph(plan, graph) is searched}
    n = searched.num_nodes
    goal = target or min(200, max(24, 512 // n_dev))
    warm_done = coarse_done = time.perf_counter()
    report = {
        "warm_start_failures": failures,
        "warm_start": warm_name,
        "warm_start_makespan_s": None if warm is None else warm.predicted["makespan_s"],
        "searched_graph": "original" if searched is graph else f"rewritten by {warm_name}",
        "searched_nodes": n,
        "lns_rounds_planned": budget.rounds,
        "lns_work_per_round": budget.work_per_round,
    }
    best = None if warm is None else _Best(warm.predicted["makespan_s"], "warm_start", warm)
    valid_bound = 0.0
    wall_cuts = [
        f"warm start: {name}" for name, why in failures.items() if why.startswith(("not started", "out of the warm"))
    ]
    for name, share in WARM_START_OWN_SHARES.items():  # a search that ran to its own limit was cut short
        took = plans[name].search_time_s if name in plans else None
        if took is not None and took >= OWN_LIMIT_USED * share * limit:
            wall_cuts.append(f"warm start: {name} ran to its time limit")
    search: _Search | None = None
    status = None
    # With a warm start in hand, coarsening and the search are boxed: what is left of the limit after
    # them maps the solution back and lets placer check the plan. The solver, which the box cannot
    # stop, is given the time to the box's end.
    solve_until = deadline if best is None else deadline - CHECK_SHARE * limit
    windows: WindowSearch | None = None
    window_budget = WindowBudget.for_limit(limit)
    with TimeBox(None if best is None else solve_until - time.perf_counter()) as box:
        best = _reorder(searched, cluster, best)
        report["reorder_makespan_s"] = None if best is None or best.origin != "reorder" else best.makespan_s
        if best is not None and n > WINDOW_MIN_NODES and n_dev > 1 and model != "exact":
            # A graph too big for one model of its own: window rounds on the whole graph.
            windows = WindowSearch(searched, cluster, _simulated(best, searched, cluster), seed, workers)
            windows.run(window_budget, solve_until - REFINE_MARGIN_S)
        else:
            coarse = _coarsen(searched, cluster, goal)
            coarse_done = time.perf_counter()
            exact = model == "exact" or (model == "auto" and coarse.graph.num_nodes == n and n <= EXACT_MAX_NODES)
            report.update(
                coarse_nodes=coarse.graph.num_nodes,
                coarsening_rounds=coarse.rounds,
                model="exact" if exact else "relaxed",
            )
            ratio = liveness_ratio(searched, cluster)
            for attempt in range(1, MEMORY_ATTEMPTS + 1):
                if deadline - time.perf_counter() < 1.0 and best is not None:
                    wall_cuts.append("memory attempts")
                    break
                problem = _Problem.build(coarse.graph, cluster, ratio)
                start = _starting_placement(searched, cluster, coarse, problem, starts)
                if start is not None:
                    problem.admit(start)
                cp = _CpModel(problem, exact)
                budget = LnsBudget.for_limit(limit, len(cp.model.Proto().variables))
                search = _Search(searched, cluster, coarse, cp, seed, workers, solve_until)
                built = time.perf_counter()
                # The exact model (tiny graphs) gets the whole budget in one solve, which proves the optimum.
                work = budget.first_work + (budget.rounds * budget.work_per_round if exact else 0.0)
                status = search.first_solve(start, work)
                report.update(
                    solves=attempt,
                    memory_ratio=ratio,
                    resolution_s=problem.resolution,
                    model_build_s=built - coarse_done,
                    solver_status=status,
                )
                if search.objective is not None:
                    report.update(
                        solver_objective_s=search.objective * problem.resolution,
                        solver_bound_s=search.bound * problem.resolution,
                        solver_gap=search.model_gap,
                    )
                    if cp.is_relaxation(coarse, searched):
                        valid_bound = max(valid_bound, search.bound * problem.resolution - problem.rounding_slack)
                best = search.offer(best)
                if search.first_unfit is not True or ratio >= 1.0 or deadline - time.perf_counter() < 1.0:
                    break
                ratio = min(1.0, ratio * 1.5)  # its plans overflow memory: budget more conservatively
            if search is not None and not exact:
                search.best = best
                if status != "OPTIMAL":  # the optimum of a coarse model: the refinement may still move parts
                    best = search.improve(budget)
                best, refined = _refine(searched, cluster, best, goal, seed, limit, solve_until - REFINE_MARGIN_S)
                report.update(refined)
    if windows is not None:  # the rounds' incumbent, also where the time box ended a round
        found = windows.incumbent.result
        if found.makespan_s < best.makespan_s * (1 - 1e-12):
            best = _Best(found.makespan_s, "window search", found)
        report.update(windows.report(), window_rounds_planned=window_budget.rounds, model="window")
        missing = window_budget.rounds - windows.stats["window_rounds"]
        if missing > 0:
            wall_cuts.append(f"window search: {missing} of {window_budget.rounds} rounds not run")
        elif windows.cut_by_wall_clock:
            wall_cuts.append("window search: a round's solve")
    if search is not None and search.best is not None and (best is None or search.best.makespan_s < best.makespan_s):
        best = search.best  # the time box ended a round: keep what the rounds found
    if report.get("refine_cut_by_wall_clock"):
        wall_cuts.append("refinement")
    if search is not None:
        wall_cuts += search.wall_cuts
        report.update(search.report())
        # Rounds are due unless the first solve closed the model or left nothing to start from.
        planned = 0 if exact or status in ("OPTIMAL", "INFEASIBLE") or search.device is None else budget.rounds
        report["lns_rounds_planned"] = planned
        if search.stats["lns_rounds"] < planned:
            wall_cuts.append(f"search: {planned - search.stats['lns_rounds']} of {planned} rounds not run")
    if box.expired:
        wall_cuts.append("time box")
        report["note"] = "the time limit ran out before the search ended: the best plan so far is returned"
    if best is None:
        raise InfeasibleError(
            f"pesto: the solver found no plan that fits ({status}) and no warm-start algorithm did either"
        )
    found = best.plan
    if isinstance(found, SimResult):
        device_of, orders = found.device_of, found.device_orders()
    else:
        device_of, orders = _arrays(found, searched, cluster)
    if searched is graph:
        plan = Plan.from_arrays(graph, cluster, device_of, orders)
    else:  # a plan of the rewritten graph, which binds to ``graph`` as the warm start's does
        plan = Plan.from_arrays(graph, cluster, device_of, orders, placed_graph=searched, splits=warm.splits)
    # A bound on every plan of the searched graph: of the model's own graph, or of the rewritten one.
    floor = max(lower_bound(searched, cluster), valid_bound)
    report.update(
        returned=best.origin,
        solve_time_s=time.perf_counter() - began,
        warm_start_s=warm_done - began,
        coarsening_s=coarse_done - warm_done,
        lower_bound_s=floor,
        gap=0.0 if best.makespan_s <= 0 else max(0.0, (best.makespan_s - floor) / best.makespan_s),
        cut_by_wall_clock=bool(wall_cuts),
        wall_clock_cuts=wall_cuts,
    )
    report["solver_cut_by_wall_clock"] = any(not cut.startswith("warm start") for cut in wall_cuts)
    if best.origin == "warm_start" and search is not None and not box.expired:
        report["note"] = (
            "the search's plans simulate no faster than the warm start, which is returned"
            if search.first_unfit is not True
            else "the solver's plans overflow memory under the reference model; the warm start is returned"
        )
    plan.extra["pesto"] = report
    return plan


@dataclass
class _Best:
    """The fastest fitting plan so far: its reference makespan, where it came from, and the plan."""

    makespan_s: float
    origin: str
    plan: object  # a Plan (a warm start) or a SimResult (from the search)


def _coarsen(graph: OpGraph, cluster: Cluster, goal: int) -> Coarsening:
    """The graph coarsened to about ``goal`` nodes (Theorem 3.5's batch merging), whatever any plan does."""
    if graph.num_nodes <= goal:
        return Coarsening(graph, np.arange(graph.num_nodes), [np.array([i]) for i in range(graph.num_nodes)], 0)
    return coarsen(graph, goal, cluster=cluster)


def _simulated(best: _Best, graph: OpGraph, cluster: Cluster) -> SimResult:
    """``best``'s plan of ``graph`` under the reference model."""
    if isinstance(best.plan, SimResult):
        return best.plan
    device_of, orders = _arrays(best.plan, graph, cluster)
    return simulate(graph, cluster, device_of, orders, check=False)


def _reorder(graph: OpGraph, cluster: Cluster, best: _Best | None) -> _Best | None:
    """The faster of ``best`` (a warm start) and its placement in DPOS's order, under the reference model.

    The warm start's order is its own algorithm's (the earliest-ready
    dispatch of a data-parallel plan, a list scheduler's booking); DPOS books
    the same placement by upward rank with insertion (FastT Algorithm 1 given
    every node's device), which puts the work that feeds the longest
    remaining path, collective steps included, first.
    """
    if best is None or isinstance(best.plan, SimResult) or cluster.num_devices < 2:
        return best
    device_of, _ = _arrays(best.plan, graph, cluster)
    try:
        schedule = rank_ordered_with_memory_retries(dpos_schedule, graph, cluster, "pesto", fixed=device_of)
    except (InfeasibleError, InvalidPlanError):
        return best
    result = schedule.simulated
    if result is None:
        result = simulate(graph, cluster, schedule.device_of, schedule.orders, check=False)
    if result.fits and result.makespan_s < best.makespan_s * (1 - 1e-12):
        return _Best(result.makespan_s, "reorder", result)
    return best


def _refine(
    graph: OpGraph, cluster: Cluster, best: _Best | None, goal: int, seed: int, limit: float, until: float
) -> tuple[_Best | None, dict]:
    """Refine ``best`` on the whole graph (:func:`.pesto_lns.refine`); the better plan and a report."""
    evaluations = int(REFINE_PER_SECOND * limit)
    if best is None or evaluations < 1 or cluster.num_devices < 2:
        return best, {}
    found = best.plan
    if isinstance(found, SimResult):
        result = found
    else:
        device_of = np.array([cluster.device_index[found.placement[i]] for i in graph.ids], dtype=np.int64)
        index = {name: i for i, name in enumerate(graph.ids)}
        order = [[index[i] for i in found.order.get(d.name, [])] for d in cluster.devices]
        result = simulate(graph, cluster, device_of, order, check=False)
    position = np.empty(graph.num_nodes, dtype=np.int64)
    position[graph.topological_order] = np.arange(graph.num_nodes)
    rank = np.empty(graph.num_nodes, dtype=np.int64)
    rank[np.lexsort((position, result.finish, result.start))] = np.arange(graph.num_nodes)
    refined = refine(
        graph,
        cluster,
        result.device_of,
        rank,
        _move_units(graph, cluster, REFINE_UNIT_FACTOR * goal),
        seed,
        evaluations,
        until,
    )
    report = {
        "refine_evaluations": refined.evaluations,
        "refine_accepted": refined.accepted,
        "refine_cut_by_wall_clock": refined.cut_by_wall_clock,
    }
    span = refined.result.makespan_s
    if refined.result.fits and span < best.makespan_s * (1 - 1e-12):
        best = _Best(span, "refinement", refined.result)
    return best, report


def _move_units(graph: OpGraph, cluster: Cluster, size: int) -> np.ndarray:
    """Unit of every node for the refinement: the graph coarsened to ``size`` nodes, colocation groups joined."""
    fine = _coarsen(graph, cluster, size)
    parent = np.arange(fine.graph.num_nodes)

    def find(u: int) -> int:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = int(parent[u])
        return u

    for members in fine.graph.colocation_groups.values():
        for other in members[1:].tolist():
            parent[find(other)] = find(int(members[0]))
    roots = np.array([find(u) for u in range(fine.graph.num_nodes)], dtype=np.int64)
    return np.unique(roots, return_inverse=True)[1].reshape(-1)[fine.group_of]


def _starting_placement(
    graph: OpGraph, cluster: Cluster, coarse: Coarsening, problem: "_Problem", plans: dict[str, Plan]
) -> np.ndarray | None:
    """The warm-start plan whose projection on the coarse graph simulates fastest, projected, or None.

    Coarse nodes need not sit on one device in a warm-start plan: each goes
    where most of its compute ran, and the projections are compared by the
    reference makespan of the whole graph (ties: the order of
    ``WARM_START_ALGORITHMS``).
    """
    found: tuple[float, np.ndarray] | None = None
    for name, plan in plans.items():
        device_of = np.array([cluster.device_index[plan.placement[i]] for i in graph.ids], dtype=np.int64)
        projected = _project(graph, device_of, coarse, problem)
        if projected is None:
            continue
        result = simulate(graph, cluster, coarse.expand(projected), check=False)
        if result.fits and (found is None or result.makespan_s < found[0]):
            found = (result.makespan_s, projected)
    return None if found is None else found[1]


def _project(graph: OpGraph, device_of: np.ndarray, coarse: Coarsening, problem: "_Problem") -> np.ndarray | None:
    """A device per coarse node from a placement of the original nodes, or None if it cannot be made valid.

    Each coarse node (each coarse colocation group as a whole) goes where most
    of its members' compute ran, among the devices it may use.
    """
    n_dev = problem.cluster.num_devices
    weight = np.zeros((coarse.graph.num_nodes, n_dev))
    np.add.at(weight, (coarse.group_of, device_of), graph.compute_s + 1e-12)
    for members in coarse.graph.colocation_groups.values():
        weight[members] = weight[members].sum(axis=0)
    choice = np.argmax(np.where(problem.duration >= 0, weight, -1.0), axis=1)
    cross = choice[coarse.graph.src] != choice[coarse.graph.dst]
    if np.any(problem.cluster.channel_index[choice[coarse.graph.src[cross]], choice[coarse.graph.dst[cross]]] < 0):
        return None
    return choice


def _warm_start(
    graph: OpGraph,
    cluster: Cluster,
    seed: int,
    until: float,
    failures: dict[str, str],
    plans: dict[str, Plan] | None = None,
    limit: float = DEFAULT_TIME_LIMIT,
    rewrite: bool = True,
) -> tuple[str | None, Plan | None]:
    """The fastest fitting plan among the cheap registered algorithms (name, plan), or (None, None).

    Every fitting plan is also put in ``plans`` (by algorithm) when given. A
    plan may place a graph the algorithm rewrote (replicas, split
    operations): its ``rewritten_graph``.

    Once a plan is in hand, no further algorithm starts or runs past ``until``,
    except that an algorithm of ``WARM_START_OWN_SHARES`` runs under its own
    time limit (its share of ``limit``) and pushes ``until`` back by the time
    it took. Without ``rewrite``, those of ``REWRITING_WARM_STARTS`` are
    left out. An algorithm that fails only loses its turn; ``failures``
    records why (a failure other than a :class:`PlacerError` is that
    algorithm's bug, which should not cost pesto its plan).
    """
    best: tuple[float, str, Plan] | None = None
    registered = set(available_algorithms())
    for name in WARM_START_ALGORITHMS:
        if name not in registered or (not rewrite and name in REWRITING_WARM_STARTS):
            continue
        if best is not None and time.perf_counter() > until:
            failures[name] = "not started: the warm start's share of the time limit was spent"
            continue
        options = dict(WARM_START_OPTIONS.get(name, {}))
        own = WARM_START_OWN_SHARES.get(name)
        if own is not None:
            options["time_limit"] = own * limit
        began = time.perf_counter()
        try:
            # An algorithm with a limit of its own is held to it by place().
            box_s = None if best is None or own is not None else until - began
            with frugal(), TimeBox(box_s) as box:
                plan = place(graph, cluster, name, seed=seed, **options)
            if box.expired:
                failures[name] = "out of the warm start's share of the time limit"
                continue
        except PlacerError as exc:
            failures[name] = str(exc)
            continue
        except Exception as exc:  # noqa: BLE001  (another algorithm's bug; reported, not fatal)
            failures[name] = f"{type(exc).__name__}: {exc}"
            continue
        finally:
            if own is not None:
                until += time.perf_counter() - began
        span = plan.predicted["makespan_s"]
        if plans is not None and plan.predicted.get("fits", True):
            plans[name] = plan
        if best is None or span < best[0]:
            best = (span, name, plan)
    return (None, None) if best is None else (best[1], best[2])


def _placed_graph(plan: Plan | None, graph: OpGraph) -> OpGraph:
    """The graph ``plan`` places: its rewritten graph, or ``graph`` (no plan, or one that keeps it)."""
    return graph if plan is None or plan.rewritten_graph is None else plan.rewritten_graph


def _arrays(plan: Plan, graph: OpGraph, cluster: Cluster) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """Device index of every node of ``graph`` in ``plan``, and per device its node indices in order (or None)."""
    device_of = np.array([cluster.device_index[plan.placement[i]] for i in graph.ids], dtype=np.int64)
    if plan.order is None:
        return device_of, None
    index = graph.index
    orders = [np.array([index[i] for i in plan.order.get(d.name, [])], dtype=np.int64) for d in cluster.devices]
    return device_of, orders


@dataclass
class _Problem:
    """The scheduling data of one graph on one cluster, in integer time units.

    ``tensors`` lists (producer, tensor) pairs with their consumers; a
    transfer is a (tensor index, destination device) pair, as in the
    reference model.
    """

    graph: OpGraph
    cluster: Cluster
    resolution: float
    duration: np.ndarray  # (nodes, devices) units; -1 where not allowed
    need: np.ndarray  # memory units per node
    capacity: np.ndarray  # memory units per device
    horizon: int
    tensors: list[tuple[int, int, list[tuple[int, int]]]]  # (producer, tensor, [(consumer, bytes)])
    position: np.ndarray  # topological position of every node
    rounding_slack: float = 0.0  # seconds integer rounding may take off any schedule

    @classmethod
    def build(cls, graph: OpGraph, cluster: Cluster, ratio: float) -> "_Problem":
        n, n_dev = graph.num_nodes, cluster.num_devices
        allowed = graph.allowed(cluster)
        _restrict_to_groups(graph, allowed)
        seconds = np.where(allowed, graph.durations(cluster), 0.0)
        consumers: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for u, v, b, t in zip(
            graph.src.tolist(), graph.dst.tolist(), graph.edge_bytes.tolist(), graph.edge_tensor.tolist()
        ):
            consumers.setdefault((u, t), []).append((v, b))
        tensors = [(u, t, vs) for (u, t), vs in sorted(consumers.items())]
        lat, inv_bw = cluster.latency, cluster.inverse_bandwidth
        finite = np.isfinite(lat) & ~np.eye(n_dev, dtype=bool)
        slowest_link = max([float(lat[finite].max()), 0.0]) if finite.any() else 0.0
        slowest_byte = float(inv_bw[finite].max()) if finite.any() else 0.0
        worst_transfers = sum(slowest_link + max(b for _, b in vs) * slowest_byte for _, _, vs in tensors)
        horizon_s = float(seconds.max(axis=1).sum()) + worst_transfers * max(n_dev - 1, 1)
        resolution = 10.0 ** math.floor(math.log10(horizon_s / TIME_STEPS)) if horizon_s > 0 else 1.0
        units = np.rint(seconds / resolution).astype(np.int64)
        units[(seconds > 0) & (units == 0)] = 1
        units[~allowed] = -1
        footprint = static_footprint(graph).astype(np.float64) * ratio
        memory = cluster.memory.astype(np.float64)
        scale = max(1.0, max(float(footprint.sum()), float(memory.max())) / 2**40)
        position = np.empty(n, dtype=np.int64)
        position[graph.topological_order] = np.arange(n)
        events = n + len(tensors) * n_dev
        problem = cls(
            graph,
            cluster,
            resolution,
            units,
            np.ceil(footprint / scale).astype(np.int64),
            np.floor(memory / scale).astype(np.int64),
            int(math.ceil(horizon_s / resolution)) + events + 1,
            tensors,
            position,
        )
        problem.rounding_slack = problem._rounding_error(seconds, allowed)
        return problem

    def _rounding_error(self, seconds: np.ndarray, allowed: np.ndarray) -> float:
        """Most that integer rounding can shorten any schedule: every job's largest rounding error, summed."""
        err = np.where(allowed, np.maximum(seconds - self.duration * self.resolution, 0.0), 0.0).max(axis=1).sum()
        pairs = [
            (s, d)
            for s in range(self.cluster.num_devices)
            for d in range(self.cluster.num_devices)
            if s != d and self.cluster.channel_index[s, d] >= 0
        ]
        for _, _, consumers in self.tensors:  # a tensor travels to at most every other device
            err += (self.cluster.num_devices - 1) * max(
                (
                    self.cluster.channels[self.cluster.channel_index[s, d]].transfer_s(b)
                    - self.transfer_units(s, d, b) * self.resolution
                    for s, d in pairs
                    for b in {b for _, b in consumers}
                ),
                default=0.0,
            )
        return float(max(err, 0.0))

    def restricted(self, device_of: np.ndarray, free: np.ndarray) -> "_Problem":
        """The problem with every node not ``free`` held to its device in ``device_of`` (a colocation
        group is free as a whole if any member is)."""
        free = free.copy()
        for members in self.graph.colocation_groups.values():
            free[members] = free[members].any()
        duration = self.duration.copy()
        held = np.flatnonzero(~free)
        keep = duration[held, device_of[held]]
        duration[held] = -1
        duration[held, device_of[held]] = keep
        return replace(self, duration=duration)

    def admit(self, device_of: np.ndarray) -> None:
        """Raise memory budgets to what ``device_of`` uses, so that a plan known to fit stays a solution."""
        used = np.bincount(device_of, weights=self.need, minlength=self.cluster.num_devices)
        self.capacity = np.maximum(self.capacity, np.ceil(used).astype(np.int64))

    def transfer_units(self, src: int, dst: int, nbytes: int) -> int:
        c = self.cluster.channels[self.cluster.channel_index[src, dst]]
        seconds = c.transfer_s(nbytes)
        return max(1, int(round(seconds / self.resolution))) if seconds > 0 else 0


def _restrict_to_groups(graph: OpGraph, allowed: np.ndarray) -> None:
    """Every member of a colocation group may use only the devices all members may use."""
    for members in graph.colocation_groups.values():
        allowed[members] = allowed[members].all(axis=0)


class _CpModel:
    """The CP-SAT model of a :class:`_Problem` and the reading of its solution."""

    def __init__(self, problem: _Problem, exact: bool):
        self.p = p = problem
        self.exact = exact
        g, cluster = p.graph, p.cluster
        n, n_dev = g.num_nodes, cluster.num_devices
        m = self.model = cp_model.CpModel()
        horizon = p.horizon
        self.x = [{d: m.NewBoolVar(f"x{v}_{d}") for d in range(n_dev) if p.duration[v, d] >= 0} for v in range(n)]
        self.start = [m.NewIntVar(0, horizon, f"s{v}") for v in range(n)]
        self.end = [m.NewIntVar(0, horizon, f"e{v}") for v in range(n)]
        self.makespan = m.NewIntVar(0, horizon, "makespan")
        on_device: list[list] = [[] for _ in range(n_dev)]
        for v in range(n):
            m.AddExactlyOne(self.x[v].values())
            m.Add(self.end[v] == self.start[v] + sum(int(p.duration[v, d]) * lit for d, lit in self.x[v].items()))
            for d, lit in self.x[v].items():
                on_device[d].append(
                    m.NewOptionalFixedSizeIntervalVar(self.start[v], int(p.duration[v, d]), lit, f"run{v}_{d}")
                )
            m.Add(self.makespan >= self.end[v])
        for members in g.colocation_groups.values():
            head = int(members[0])
            for other in members[1:].tolist():
                for d, lit in self.x[other].items():
                    m.Add(lit == self.x[head][d])
        for d in range(n_dev):
            m.AddNoOverlap(on_device[d])
            users = [(v, lit) for v in range(n) for dd, lit in self.x[v].items() if dd == d]
            if sum(int(p.need[v]) for v, _ in users) > p.capacity[d]:
                m.Add(sum(int(p.need[v]) * lit for v, lit in users) <= int(p.capacity[d]))
        for u, v in zip(g.src.tolist(), g.dst.tolist()):
            m.Add(self.start[v] >= self.end[u])
        self._transfers()
        self._fifo_channels(exact)
        if exact:
            self._no_idling()
        m.Minimize(self.makespan)

    # ------------------------------------------------------------ transfers
    def _transfers(self) -> None:
        """One optional interval per (tensor, destination, source device) on that pair's channel."""
        p, m, cluster = self.p, self.model, self.p.cluster
        n_dev = cluster.num_devices
        self.xfer: dict[tuple[int, int], tuple] = {}  # (tensor index, dst) -> (start, end)
        self.wanted: dict[tuple[int, int], object] = {}  # (tensor index, dst) -> some consumer on dst
        self.present: dict[tuple[int, int, int], object] = {}  # (tensor index, src, dst) -> transfer made
        self.sizes: dict[tuple[int, int, int], tuple] = {}  # variable sizes: (var, [(consumer, units)])
        self.fifo: dict[tuple[int, int], object] = {}  # (producer a, producer b) -> a finishes no later
        self.on_channel: list[list[tuple]] = [[] for _ in range(len(cluster.channels))]
        for k, (u, t, consumers) in enumerate(p.tensors):
            for d in range(n_dev):
                here = [(v, b) for v, b in consumers if d in self.x[v]]
                if not here:
                    continue
                wanted = m.NewBoolVar(f"want{k}_{d}")  # some consumer of the tensor sits on d
                m.AddBoolOr([self.x[v][d] for v, _ in here]).OnlyEnforceIf(wanted)
                for v, _ in here:
                    m.AddImplication(self.x[v][d], wanted)
                begin = m.NewIntVar(0, p.horizon, f"ts{k}_{d}")
                finish = m.NewIntVar(0, p.horizon, f"te{k}_{d}")
                m.Add(begin >= self.end[u])
                self.xfer[(k, d)] = (begin, finish)
                self.wanted[(k, d)] = wanted
                for s, from_lit in self.x[u].items():
                    if s == d:
                        continue
                    c = int(cluster.channel_index[s, d])
                    if c < 0:  # no channel: producer on s and a consumer on d cannot both happen
                        for v, _ in here:
                            m.AddBoolOr([from_lit.Not(), self.x[v][d].Not()])
                        continue
                    present = m.NewBoolVar(f"y{k}_{s}_{d}")
                    m.AddBoolAnd([from_lit, wanted]).OnlyEnforceIf(present)
                    m.AddBoolOr([from_lit.Not(), wanted.Not(), present])
                    self.present[(k, s, d)] = present
                    sizes = sorted({p.transfer_units(s, d, b) for _, b in here})
                    if len(sizes) == 1:
                        size = sizes[0]
                    else:  # the largest bytes among the edges to the consumers on d
                        size = m.NewIntVar(0, sizes[-1], f"tsz{k}_{s}_{d}")
                        m.AddMaxEquality(size, [p.transfer_units(s, d, b) * self.x[v][d] for v, b in here])
                        self.sizes[(k, s, d)] = (size, [(v, p.transfer_units(s, d, b)) for v, b in here])
                    interval = m.NewOptionalIntervalVar(begin, size, finish, present, f"xfer{k}_{s}_{d}")
                    self.on_channel[c].append((k, d, s, present, interval))
                for v, _ in here:
                    if d in self.x[u]:
                        m.Add(self.start[v] >= finish).OnlyEnforceIf([self.x[v][d], self.x[u][d].Not()])
                    else:
                        m.Add(self.start[v] >= finish).OnlyEnforceIf(self.x[v][d])
        for entries in self.on_channel:
            if len(entries) > 1:
                m.AddNoOverlap([entry[4] for entry in entries])

    # ------------------------------------------------- the reference model's rules
    def _fifo_channels(self, exact: bool) -> None:
        """A channel serves transfers in queue order: producer's finish, then producer, destination name, tensor.

        Transfers of one producer from one device queue at the same instant,
        so their order is fixed; ordering transfers of different producers
        needs a literal per pair of producers. A relaxed model keeps these
        pairwise rules only while they number at most ``FIFO_MAX_PAIRS``.
        """
        p, m = self.p, self.model
        name_rank = p.cluster.name_rank.tolist()

        def queue_key(entry):
            k, d = entry[0], entry[1]
            return p.tensors[k][0], name_rank[d], p.tensors[k][1]

        groups = []  # per channel, its entries by producer, and those by source device, in queue order
        same_count = across_count = 0
        for entries in self.on_channel:
            by_producer: dict[int, list] = {}
            for entry in sorted(entries, key=queue_key):
                by_producer.setdefault(queue_key(entry)[0], []).append(entry)
            groups.append(by_producer)
            sizes = [len(group) for group in by_producer.values()]
            across_count += (sum(sizes) ** 2 - sum(size * size for size in sizes)) // 2
            for group in by_producer.values():
                per_source: dict[int, int] = {}
                for entry in group:
                    per_source[entry[2]] = per_source.get(entry[2], 0) + 1
                same_count += sum(c * (c - 1) // 2 for c in per_source.values())
        budget = np.inf if exact else FIFO_MAX_PAIRS
        if same_count > budget:
            return
        for by_producer in groups:
            for group in by_producer.values():
                for i, a in enumerate(group):
                    for b in group[i + 1 :]:
                        if a[2] == b[2]:  # one producer sits on one device
                            m.Add(self.xfer[a[:2]][1] <= self.xfer[b[:2]][0]).OnlyEnforceIf([a[3], b[3]])
        if same_count + across_count > budget:
            return
        across = [
            (a, b)
            for by_producer in groups
            for (ua, group_a), (ub, group_b) in itertools.combinations(by_producer.items(), 2)
            for a in group_a
            for b in group_b
            if a[:2] != b[:2]
        ]
        for a, b in across:
            ua, ub = queue_key(a)[0], queue_key(b)[0]
            if (ua, ub) not in self.fifo:  # a's producer finishes no later (ties go to the lower index)
                lit = self.fifo[(ua, ub)] = m.NewBoolVar(f"fifo{ua}_{ub}")
                m.Add(self.end[ua] <= self.end[ub]).OnlyEnforceIf(lit)
                m.Add(self.end[ua] > self.end[ub]).OnlyEnforceIf(lit.Not())
            lit = self.fifo[(ua, ub)]
            m.Add(self.xfer[a[:2]][1] <= self.xfer[b[:2]][0]).OnlyEnforceIf([a[3], b[3], lit])
            m.Add(self.xfer[b[:2]][1] <= self.xfer[a[:2]][0]).OnlyEnforceIf([a[3], b[3], lit.Not()])

    def _no_idling(self) -> None:
        """Every job starts the moment it may: when its inputs are in and its device or channel is free."""
        p, m = self.p, self.model
        g = p.graph
        n = g.num_nodes
        inputs: list[list[int]] = [[] for _ in range(n)]
        for k, (_, _, consumers) in enumerate(p.tensors):
            for v, _ in consumers:
                inputs[v].append(k)
        for v in range(n):
            reasons = []
            at_zero = m.NewBoolVar(f"zero{v}")
            m.Add(self.start[v] == 0).OnlyEnforceIf(at_zero)
            reasons.append(at_zero)
            for u in range(n):
                if u == v:
                    continue
                for d, lit in self.x[v].items():
                    if d not in self.x[u]:
                        continue
                    if p.duration[u, d] == 0 and p.duration[v, d] == 0 and p.position[u] > p.position[v]:
                        continue
                    after = m.NewBoolVar(f"after{u}_{v}_{d}")  # u ran just before v on d
                    m.Add(self.end[u] == self.start[v]).OnlyEnforceIf(after)
                    m.AddImplication(after, lit)
                    m.AddImplication(after, self.x[u][d])
                    reasons.append(after)
            for k in sorted(set(inputs[v])):
                producer = p.tensors[k][0]
                for d, lit in self.x[v].items():
                    if (k, d) not in self.xfer:
                        continue
                    arrived = m.NewBoolVar(f"arrive{k}_{v}_{d}")
                    m.Add(self.xfer[(k, d)][1] == self.start[v]).OnlyEnforceIf(arrived)
                    m.AddImplication(arrived, lit)
                    if d in self.x[producer]:
                        m.AddImplication(arrived, self.x[producer][d].Not())
                    reasons.append(arrived)
            m.AddBoolOr(reasons)
        for entries in self.on_channel:
            for i, (k, d, _, present, _) in enumerate(entries):
                begin = self.xfer[(k, d)][0]
                queued = m.NewBoolVar(f"queued{k}_{d}_{i}")
                m.Add(begin == self.end[p.tensors[k][0]]).OnlyEnforceIf(queued)
                reasons = [queued]
                for j, (k2, d2, _, present2, _) in enumerate(entries):
                    if (k2, d2) == (k, d):
                        continue
                    behind = m.NewBoolVar(f"behind{k}_{d}_{i}_{j}")
                    m.Add(self.xfer[(k2, d2)][1] == begin).OnlyEnforceIf(behind)
                    m.AddImplication(behind, present2)
                    reasons.append(behind)
                m.AddBoolOr(reasons).OnlyEnforceIf(present)

    # ------------------------------------------------------------ hint and solve
    def hint(self, device_of: np.ndarray, order: list[np.ndarray] | None = None) -> None:
        """Hint the schedule the reference model gives ``device_of`` (in ``order``), retimed in integer units."""
        p, m = self.p, self.model
        result = simulate(p.graph, p.cluster, device_of, order, check=False)
        starts, ends, xfer_times = _integer_schedule(p, result)
        for v in range(p.graph.num_nodes):
            for d, lit in self.x[v].items():
                m.AddHint(lit, int(device_of[v] == d))
            m.AddHint(self.start[v], starts[v])
            m.AddHint(self.end[v], ends[v])
        for (k, d), (begin, finish) in self.xfer.items():
            begin_at, finish_at = xfer_times.get((k, d), (ends[p.tensors[k][0]],) * 2)
            m.AddHint(begin, begin_at)
            m.AddHint(finish, finish_at)
            m.AddHint(self.wanted[(k, d)], int(any(device_of[v] == d for v, _ in p.tensors[k][2])))
        for (k, s, d), lit in self.present.items():
            m.AddHint(lit, int(device_of[p.tensors[k][0]] == s and any(device_of[v] == d for v, _ in p.tensors[k][2])))
        for (k, s, d), (var, terms) in self.sizes.items():
            m.AddHint(var, max(units * int(device_of[v] == d) for v, units in terms))
        for (ua, ub), lit in self.fifo.items():
            m.AddHint(lit, int(ends[ua] <= ends[ub]))
        m.AddHint(self.makespan, max(ends, default=0))

    def solve(self, seed: int, workers: int, seconds: float, effort: float):
        solver = cp_model.CpSolver()
        params = solver.parameters
        params.random_seed = seed % 2**31  # CP-SAT's seed is a 32-bit integer
        params.num_workers = workers
        params.catch_sigint_signal = False  # Ctrl-C is placer's to handle
        if workers > 1:
            params.interleave_search = True
        params.max_time_in_seconds = max(0.1, seconds)
        params.max_deterministic_time = max(0.01, effort)
        # Symmetry detection and probing cost many seconds on models with thousands of optional intervals.
        params.symmetry_level = 0
        params.cp_model_probing_level = 0
        status = solver.Solve(self.model)
        return status, solver

    def placement_of(self, values) -> np.ndarray:
        """Device of every node in a solution given as the values of all the model's variables."""
        return np.array([next(d for d, lit in xs.items() if values[lit.Index()]) for xs in self.x], dtype=np.int64)

    def starts_of(self, values) -> np.ndarray:
        return np.array([values[s.Index()] for s in self.start], dtype=np.int64)

    def orders_of(self, values, device_of: np.ndarray) -> list[np.ndarray]:
        """Per device, nodes by start time in a solution (ties: end time, then topological position)."""
        start = self.starts_of(values)
        end = np.array([values[e.Index()] for e in self.end], dtype=np.int64)
        by_time = np.lexsort((self.p.position, end, start)) if start.size else np.zeros(0, dtype=np.int64)
        return [by_time[device_of[by_time] == d] for d in range(self.p.cluster.num_devices)]

    def is_relaxation(self, coarse: Coarsening, graph: OpGraph) -> bool:
        """Whether the solver's bound bounds every plan of ``graph``: uncoarsened, memory not limiting."""
        p = self.p
        return coarse.graph.num_nodes == graph.num_nodes and bool(np.all(p.need.sum() <= p.capacity))


def _integer_schedule(p: _Problem, result: SimResult):
    """The simulated schedule's device and channel orders, retimed with the model's integer durations."""
    g = p.graph
    n = g.num_nodes
    dev = result.device_of
    xf = result.transfers
    tensor_index = {(u, t): k for k, (u, t, _) in enumerate(p.tensors)}
    jobs = [(float(result.start[v]), float(result.finish[v]), 0, v) for v in range(n)]
    jobs += [(float(xf.start[x]), float(xf.end[x]), 1, x) for x in range(len(xf))]
    jobs.sort()
    x_key = [(tensor_index[(int(xf.producer[x]), int(xf.tensor[x]))], int(xf.dst_device[x])) for x in range(len(xf))]
    x_size = np.zeros(len(xf), dtype=np.int64)
    for x in range(len(xf)):
        k, d = x_key[x]
        sizes = [p.transfer_units(int(xf.src_device[x]), d, b) for v, b in p.tensors[k][2] if dev[v] == d]
        x_size[x] = max(sizes)
    arrival_of = {key: x for x, key in enumerate(x_key)}
    in_ptr, in_eids = g.in_edges
    start, end = [0] * n, [0] * n
    xs, xe = [0] * len(xf), [0] * len(xf)
    for _ in range(4):  # repeat until stable (ties of zero-length jobs may need a second pass)
        changed = False
        dev_free: dict[int, int] = {}
        ch_free: dict[int, int] = {}
        for _, _, kind, i in jobs:
            if kind == 0:
                ready = dev_free.get(int(dev[i]), 0)
                for e in in_eids[in_ptr[i] : in_ptr[i + 1]].tolist():
                    u = int(g.src[e])
                    if dev[u] == dev[i]:
                        ready = max(ready, end[u])
                    else:
                        x = arrival_of[(tensor_index[(u, int(g.edge_tensor[e]))], int(dev[i]))]
                        ready = max(ready, xe[x])
                new_end = ready + int(p.duration[i, dev[i]])
                changed |= (ready, new_end) != (start[i], end[i])
                start[i], end[i] = ready, new_end
                dev_free[int(dev[i])] = new_end
            else:
                c = int(xf.channel[i])
                ready = max(ch_free.get(c, 0), end[int(xf.producer[i])])
                changed |= (ready, ready + int(x_size[i])) != (xs[i], xe[i])
                xs[i], xe[i] = ready, ready + int(x_size[i])
                ch_free[c] = xe[i]
        if not changed:
            break
    return start, end, {x_key[x]: (xs[x], xe[x]) for x in range(len(xf))}


class _Search:
    """The first solve of the coarse model and the large-neighbourhood search after it.

    Every solution the solver returns is mapped back to the whole graph and
    simulated under the reference model (in the solver's order and in the
    reference model's own); a round's solution becomes the incumbent only
    when its simulated makespan is no worse than the incumbent's, and the
    best plan only when it is faster. ``wall_cuts`` lists the solves and
    rounds the wall clock ended before their work was done.
    """

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        coarse: Coarsening,
        cp: "_CpModel",
        seed: int,
        workers: int,
        until: float,
    ):
        self.graph, self.cluster, self.coarse, self.cp = graph, cluster, coarse, cp
        self.seed, self.workers, self.until = seed, workers, until
        self.objective: float | None = None  # solver's objective and bound (model units) of the first solve
        self.bound = 0.0
        self.model_gap: float | None = None
        self.fitting: list[tuple[str, SimResult]] = []
        self.first_unfit: bool | None = None  # the first solve's plans all overflow memory
        self.wall_cuts: list[str] = []
        self.work_done = 0.0
        self.device = None  # the incumbent: its coarse placement,
        self.order = None  # its coarse nodes per device in order (None: earliest ready),
        self.starts = None  # their start times (any unit),
        self.span = np.inf  # and its reference makespan
        self.stats = {"lns_rounds": 0, "lns_accepted": 0, "lns_improved": 0, "lns_closed": 0}
        self.hoods: Neighbourhoods | None = None
        self.best: _Best | None = None  # the best plan of the search (and of what it was given)

    def _solve(self, seed: int, work: float, label: str, cp: "_CpModel | None" = None):
        seconds = self.until - time.perf_counter()
        status, solver = (cp or self.cp).solve(seed, self.workers, seconds, work)
        done = solver.ResponseProto().deterministic_time
        self.work_done += done
        if status in (cp_model.FEASIBLE, cp_model.UNKNOWN) and done < 0.99 * solver.parameters.max_deterministic_time:
            self.wall_cuts.append(label)
        return status, solver

    def _evaluate(self, values, cp: "_CpModel | None" = None) -> list[tuple[str, SimResult]]:
        """The solution's plan on the whole graph, in the solver's order and in the reference model's; those
        that fit."""
        cp = cp or self.cp
        coarse_device = cp.placement_of(values)
        device_of = self.coarse.expand(coarse_device)
        order = [
            np.concatenate([self.coarse.members[k] for k in seq.tolist()]) if seq.size else np.zeros(0, dtype=np.int64)
            for seq in cp.orders_of(values, coarse_device)
        ]
        results = [
            ("solver", simulate(self.graph, self.cluster, device_of, order, check=False)),
            ("solver_placement", simulate(self.graph, self.cluster, device_of, check=False)),
        ]
        return [(label, r) for label, r in results if r.fits]

    def first_solve(self, start: np.ndarray | None, work: float) -> str:
        """Solve the whole model from the warm start's projection; the solver's status."""
        if start is not None:
            self.cp.hint(start)
            self.device = start
            self.span = simulate(self.graph, self.cluster, self.coarse.expand(start), check=False).makespan_s
            self.starts = simulate(self.coarse.graph, self.cluster, start, check=False).start
        status, solver = self._solve(self.seed, work, "first solve")
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            self.objective = solver.ObjectiveValue()
            self.bound = solver.BestObjectiveBound()
            self.model_gap = 0.0 if self.objective <= 0 else max(0.0, (self.objective - self.bound) / self.objective)
            values = list(solver.ResponseProto().solution)
            self.fitting = self._evaluate(values)
            self.first_unfit = not self.fitting
            if self.fitting:
                self._adopt(self.cp, values, min(r.makespan_s for _, r in self.fitting))
        return solver.StatusName(status)

    def offer(self, best: _Best | None) -> _Best | None:
        """The faster of ``best`` and the first solve's plans."""
        for label, result in self.fitting:
            if best is None or result.makespan_s < best.makespan_s:
                best = _Best(result.makespan_s, label, result)
        return best

    def _adopt(self, cp: "_CpModel", values, span: float) -> None:
        """Make a solution of ``cp`` the incumbent: its coarse placement, device orders and start times."""
        self.device = cp.placement_of(values)
        self.order = cp.orders_of(values, self.device)
        self.starts = cp.starts_of(values)
        self.span = span

    def improve(self, budget: LnsBudget) -> _Best | None:
        """Run the neighbourhood rounds of ``budget`` from the incumbent; the best plan after them.

        Each round builds the model again with every placement but the
        neighbourhood's held (so that the solver loads only what may change),
        hinted with the incumbent's schedule: its placement in its device
        orders under the reference model. ``self.best`` holds the best plan
        so far at every moment, so that a time box ending a round loses
        nothing found before it.
        """
        if self.device is None or budget.rounds == 0:
            return self.best
        g = self.coarse.graph
        n = g.num_nodes
        neighbours: list[set] = [set() for _ in range(n)]
        for u, v in zip(g.src.tolist(), g.dst.tolist()):
            neighbours[u].add(v)
            neighbours[v].add(u)
        groups = [np.array([v]) for v in range(n)]
        for members in g.colocation_groups.values():
            for v in members.tolist():
                groups[v] = np.asarray(members)
        self.hoods = hoods = Neighbourhoods(
            [np.array(sorted(s), dtype=np.int64) for s in neighbours], groups, self.cluster.num_devices, self.seed
        )
        for r in range(budget.rounds):
            if self.until - time.perf_counter() < 0.5:
                break
            free = hoods.pick(np.asarray(self.starts, dtype=np.float64), self.device)
            sub = _CpModel(self.cp.p.restricted(self.device, free), False)
            sub.hint(self.device, self.order)
            status, solver = self._solve(self.seed + r + 1, budget.work_per_round, f"search round {r + 1}", sub)
            self.stats["lns_rounds"] += 1
            hoods.adapt(status == cp_model.OPTIMAL)
            self.stats["lns_closed"] += status == cp_model.OPTIMAL
            if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                continue
            values = list(solver.ResponseProto().solution)
            fitting = self._evaluate(values, sub)
            if not fitting:
                continue
            label, result = min(fitting, key=lambda c: c[1].makespan_s)
            if result.makespan_s > self.span * (1 + 1e-12):
                continue
            self.stats["lns_accepted"] += 1
            self._adopt(sub, values, result.makespan_s)
            if self.best is None or result.makespan_s < self.best.makespan_s:
                self.stats["lns_improved"] += 1
                self.best = _Best(result.makespan_s, f"search ({label})", result)
        return self.best

    def report(self) -> dict:
        out = dict(self.stats, solver_work=self.work_done)
        if self.hoods is not None:
            out["lns_neighbourhoods"] = dict(self.hoods.kinds_used)
            out["lns_final_share"] = self.hoods.share
        return out
