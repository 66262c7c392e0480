"""``auto``: the best plan the registered algorithms can give, then improved by local search.

Users should not have to pick among a dozen algorithms. ``auto`` runs the
portfolio (one-pass list schedulers and the pipelines first, the searches
when time allows), each member boxed in the time left, keeps the fastest
plan that fits, and hill-climbs on its placement: it moves whole layers and
single placement units off the critical path, to the device of a neighbour
(saving a transfer) or to the least loaded device (balancing work), and
swaps units, keeping a move only if the reference simulation gets faster
and still fits. It never returns a plan slower than any member it ran, and
finds a fitting plan whenever any member does. A member whose cheap lower
bound shows it cannot win (data parallelism, a pipeline) is skipped.

Micro-batches: the pipelines (``gpipe``, ``1f1b``) cut the step into
micro-batches themselves, at twice the devices. On a step that records its
batch's samples (a capture does), auto searches their micro-batch count
where micro-batches can win: where no member found a plan that fits (a
micro-batch's activations are a fraction of the batch's), where no
data-parallel replica fits one device, and where a pipeline is the best plan
so far. In the first two cases the pipelines run right after the
data-parallel members, before the list schedulers can use up the time. The
search doubles the count (up to the samples) while the step gets faster or
until a pipeline fits, then halves it while the step gets faster, and skips
a count whose lower bound (:func:`~placer.sim.bounds.microbatch_lower_bound`)
cannot beat the plan in hand, so that it costs nothing where micro-batches
cannot win. Where it searches, what rules out every plan is the memory that
no micro-batch count shrinks (:func:`~placer.feasibility.diagnose` with
``microbatched=True``): a step whose activations rule out every plan of the
step whole still reaches the pipelines. Where micro-batches can win (or a
count is given), each pipeline also runs in replica groups (data
parallelism over pipelines: ``replicas`` of
:func:`~placer.algorithms.pipeline.pipeline_plan`), for every group count
that leaves at least two devices a group (:func:`replica_groups`), at its
default micro-batch count.

Message cost: on a cluster calibrated over gloo
(:func:`~placer.harness.calibrate.apply_calibration`), every message between
two processes also costs both of them host time that the reference model
leaves out (:mod:`placer.sim.messages`). There auto ranks its members' plans,
and the local search's result, by the step with each message's host cost
(:func:`~placer.sim.messages.simulate_with_messages`): a plan that splits
operations across processes sends many messages, which a data-parallel plan
does not, and the process-per-device runtime pays for them. There a later
member replaces the best plan so far only if it is faster by more than
:data:`MESSAGE_TIE`: that model is the prediction's least certain part, and
members are tried simplest first.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, InvalidPlanError, OptionError, PlacerError, TimeLimitError
from ..feasibility import diagnose
from ..graph import OpGraph
from ..plan import Plan
from ..sim.bounds import microbatch_lower_bound
from ..sim.critical import critical_path_nodes
from ..sim.messages import MessageCost, cluster_message_cost, simulate_with_messages
from ..sim.simulator import SimResult, simulate
from ..transform.bind import bind_plan, target_graph
from ..transform.microbatch import check_microbatches, microbatch_graph
from ..transform.replicate import replica_layout
from ..transform.split import batch_dependent, batch_samples
from .baselines import layer_labels
from .common import placement_units, unit_allowed
from .data_parallel import data_parallel_lower_bound
from .pipeline import default_group_microbatches, default_microbatches
from .registry import available_algorithms, failure_message, get_algorithm, place, register
from .timebox import TimeBox, frugal

__all__ = ["auto"]

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
#: runs before a slower one can use up the time; the pipelines among them (1F1B, which holds fewer
#: micro-batches' activations, first), as they beat the list schedulers where a replica does not fit; the
#: searches last.
FAST_FIRST = (
    "expert",
    "sharded_data_parallel",
    "data_parallel",
    "single",
    "metis",
    "celeritas",
    "order_place",
    "m_sct",
    "1f1b",
    "gpipe",
    "m_topo",
    "dpos",
    "heft",
)
#: Members that cut the step into micro-batches themselves (a ``microbatches`` option): auto searches their count.
PIPELINES = ("1f1b", "gpipe")
#: Members whose failure to fit means that a replica does not fit one device.
REPLICAS = ("sharded_data_parallel", "data_parallel")
#: Options auto gives members: data parallelism reduces its gradients with whichever collective is faster
#: for the case (the ring or direct exchanges within and between hosts).
MEMBER_OPTIONS = {"data_parallel": {"collective": "best"}, "sharded_data_parallel": {"collective": "best"}}
#: Members whose makespan has a cheap lower bound (for the options above): one whose bound is no better than
#: the best plan so far cannot win and does not run. Data parallelism's bound costs far less than its plan and
#: is tightest where the all-reduce dominates. (The pipelines' bound depends on their micro-batch count:
#: :func:`~placer.sim.bounds.microbatch_lower_bound`.)
LOWER_BOUNDS = {
    "data_parallel": partial(data_parallel_lower_bound, **MEMBER_OPTIONS["data_parallel"]),
    "sharded_data_parallel": partial(
        data_parallel_lower_bound, shard_optimizer=True, **MEMBER_OPTIONS["sharded_data_parallel"]
    ),
}
#: Most operations of a micro-batched step the search builds (the step's operations times the count).
MAX_MICROBATCHED_NODES = 1_000_000
#: What ``runnable=True`` (auto's and ``placer.plan``'s, deprecated) warns.
RUNNABLE_DEPRECATED = "runnable is deprecated and has no effect: every plan runs"


#: Where the cluster carries a message's host cost (processes on one host's cores), how much faster a member's
#: step must be predicted than the best so far to replace it. That model is the prediction's least certain
#: part (a calibration moves by tens of percent between runs), and a member predicted faster by less is
#: noise's pick: members are tried simplest first, so a near tie keeps the simpler plan (data parallelism
#: before one that also splits operations across processes).
MESSAGE_TIE = 0.02

DEFAULT_TIME_LIMIT = 60.0
#: Share of the time limit the portfolio may use: a member is worth more than the local search, which
#: gains little on large graphs in seconds; the rest leaves time for placer's check of the plan.
PORTFOLIO_SHARE = 0.9


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
    microbatches: int = 0,
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
    microbatches : int
        0 (the default): the pipelines choose their micro-batch count and
        auto searches it where micro-batches can win (see the module); the
        other members place the step whole. ``M`` >= 1: every member places
        the step cut into ``M`` micro-batches (``place(..., microbatches=M)``;
        one: the step whole), and nothing searches the count.

    Returns
    -------
    Plan
        Never slower than any portfolio member's plan, as ranked (see the
        module: with each message's host cost on a cluster that carries it,
        where a later member must be faster by more than :data:`MESSAGE_TIE`).
        ``extra["auto"]`` says which member it started from and its step as
        ranked (``start_makespan_s``), which members ran, were cut off, failed,
        or were skipped by their lower bound (``cannot_win``), the micro-batch
        counts searched (``microbatches``), what local search gained, and what
        the plans were ranked by (``ranked_by``).

    Raises
    ------
    OptionError
        An unknown algorithm in ``portfolio`` or none at all, a negative
        ``max_evaluations``, or a micro-batch count the batch cannot take.
    InfeasibleError
        If no portfolio member finds a plan that fits, or if no plan can fit
        (:func:`~placer.feasibility.diagnose`; at every micro-batch count,
        where auto searches them).

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
    and Addanki et al. The pipelines: Huang et al. (GPipe) and Narayanan et
    al. (PipeDream-Flush), as cited in :mod:`placer.algorithms.pipeline`.
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
    if microbatches:
        microbatches = check_microbatches(graph, microbatches, "auto")
    search = not microbatches and searches_microbatches(graph) and any(name in PIPELINES for name in members)
    # place() leaves the diagnosis to an algorithm that cuts the step into micro-batches, as auto may.
    diagnose(graph, cluster, microbatched=search or microbatches > 1)
    run = _Portfolio(
        graph, cluster, seed, began + PORTFOLIO_SHARE * limit, deadline, message_cost=cluster_message_cost(cluster)
    )
    micro = microbatch_graph(graph, microbatches).graph if microbatches > 1 else None
    whole = graph
    if search:
        try:  # what rules out every plan of the step whole need not rule out its micro-batches
            diagnose(graph, cluster)
        except InfeasibleError as exc:
            run.log["failed"].append(f"without micro-batches: {exc}")
            whole = None
    per_batch = replica_layout(graph, 2).per_batch if search else None
    pipelines = [name for name in members if name in PIPELINES]
    queue = list(members)
    while queue and not run.interrupted:
        name = queue.pop(0)
        if name in PIPELINES:
            count = microbatches or default_microbatches(graph, cluster)
            bound = partial(microbatch_lower_bound, graph, cluster, count, per_batch) if search else None
            options = {"microbatches": microbatches} if microbatches else {}
            run.member(name, graph, options, label=_label(name, count), bound=bound)
            if microbatches > 1 or (search and run.wants_microbatches()):
                _try_groups(run, name, microbatches, per_batch)
            # Right after the last pipeline, before the members that follow use up the time.
            if search and not any(p in queue for p in pipelines) and not run.interrupted and run.wants_microbatches():
                _search_counts(run, sorted(pipelines, key=PIPELINES.index), per_batch)
        elif whole is not None or micro is not None:
            run.member(name, micro if micro is not None else whole, MEMBER_OPTIONS.get(name, {}))
        # Where no plan fits, or no replica fits one device, what fits is most likely a pipeline: they go next,
        # before the list schedulers that place the whole step, which can use up the time.
        replicas_done = not any(r in queue for r in REPLICAS) and name not in PIPELINES
        if search and replicas_done and any(p in queue for p in pipelines) and run.wants_microbatches():
            queue = [p for p in queue if p in PIPELINES] + [p for p in queue if p not in PIPELINES]
    if run.best is None:
        # Every member's reason, one a line: the first few seldom include the one that came closest.
        log = run.log
        reasons = log["failed"] + ([f"out of time: {', '.join(log['out_of_time'])}"] if log["out_of_time"] else [])
        raise InfeasibleError("auto: no algorithm found a plan that fits:\n  " + "\n  ".join(reasons))
    best = run.best
    info = {
        "start": best.label,
        "start_makespan_s": best.span,
        **run.log,
        "evaluations": 0,
        "local_search_gain": 0.0,
        "interrupted": run.interrupted,
        "ranked_by": "reference model" if run.message_cost is None else "reference model and message host cost",
    }
    plan, placed = best.plan, best.graph
    # Split graphs are searched by their own algorithm; the search needs time for a few simulations.
    if plan.rewritten_graph is not None or run.interrupted or deadline - time.perf_counter() < 3 * run.check_s:
        plan = _as_plan_of(plan, graph, placed, microbatches)
        plan.extra["auto"] = info
        return plan
    device_of = np.array([cluster.device_index[plan.placement[i]] for i in placed.ids], dtype=np.int64)
    improved, improved_span, info["evaluations"], info["interrupted"] = _local_search(
        placed, cluster, device_of, seed, max_evaluations, deadline
    )
    if improved_span < plan.predicted["makespan_s"]:
        candidate = Plan.from_arrays(placed, cluster, improved)
        # The climb simulates the reference model; where messages cost host time, keep its plan only if it wins.
        improved_span = run.span(candidate, placed) if run.message_cost is not None else improved_span
        if run.beats(improved_span, best.span):
            plan = candidate
            info["local_search_gain"] = 1 - improved_span / best.span
    plan = _as_plan_of(plan, graph, placed, microbatches)
    plan.extra["auto"] = info
    return plan


def searches_microbatches(graph: OpGraph) -> bool:
    """Whether auto searches the pipelines' micro-batch count on ``graph``: it has a batch input and
    records the batch's samples (at least two), which bound the counts.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2)
    >>> searches_microbatches(g), searches_microbatches(g.replace(extra={"batch_size": 8}))
    (False, True)
    """
    samples = batch_samples(graph)
    return samples is not None and samples >= 2 and graph.num_nodes > 0 and bool(batch_dependent(graph).any())


def default_portfolio(time_limit: float | None) -> list[str]:
    """The registered algorithms auto runs, in order: fast one-pass ones and the pipelines first, searches last.

    Pesto and placeto join only when a limit of at least a minute is given.
    """
    registered = [name for name in available_algorithms() if name != "auto"]
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


@dataclass
class _Best:
    """The fastest fitting plan so far: its step, which member (and count) made it, and the graph it places."""

    span: float
    name: str
    label: str
    plan: Plan
    graph: OpGraph


@dataclass
class _Portfolio:
    """Runs members one after another until ``end``, keeping the fastest plan that fits and a log.

    Each member is boxed in the time left, except while no plan has been found
    (so that auto fits whenever a member does); members that search until a
    limit get a third of the time left. The portfolio ends early enough before
    ``deadline`` for placer to check the plan it returns; ``check_s`` is the
    time placer took to check the best plan. Ctrl-C ends it with the best plan
    so far (``interrupted``), or is raised where there is none. Plans are ranked
    by :meth:`span`.
    """

    graph: OpGraph
    cluster: Cluster
    seed: int
    end: float
    deadline: float
    best: _Best | None = None
    check_s: float = 0.0
    interrupted: bool = False
    log: dict[str, list] = field(
        default_factory=lambda: {"ran": [], "out_of_time": [], "failed": [], "cannot_win": [], "microbatches": []}
    )
    #: Per member that ran: its step, inf where it failed to fit.
    spans: dict[str, float] = field(default_factory=dict)
    #: The host cost of a message that the cluster carries (:func:`~placer.sim.messages.cluster_message_cost`).
    message_cost: MessageCost | None = None

    def beats(self, span: float, incumbent: float) -> bool:
        """Whether a plan of step ``span`` replaces one of ``incumbent``: faster, by more than
        :data:`MESSAGE_TIE` of it where messages cost host time.

        Examples
        --------
        >>> from placer.cluster import load_cluster
        >>> from placer.generate import training_graph
        >>> run = _Portfolio(training_graph(layers=1), load_cluster("2xcpu"), 0, 0.0, 0.0)
        >>> run.beats(0.0995, 0.1), run.beats(0.1, 0.1)
        (True, False)
        >>> run.message_cost = MessageCost(1e-5, 0.0, 1e-5, 0.0)
        >>> run.beats(0.0995, 0.1), run.beats(0.097, 0.1)
        (False, True)
        """
        return span < incumbent * (1.0 - MESSAGE_TIE if self.message_cost is not None else 1.0)

    def span(self, plan: Plan, graph: OpGraph) -> float:
        """The step ``plan`` of ``graph`` is ranked by: the reference model's, plus each message's host cost
        where the cluster carries one (:func:`~placer.sim.messages.simulate_with_messages`)."""
        if self.message_cost is None:
            return plan.predicted["makespan_s"]
        return simulate_with_messages(bind_plan(plan, graph, self.cluster), self.message_cost).makespan_s

    def member(
        self,
        name: str,
        graph: OpGraph,
        options: dict[str, Any],
        *,
        label: str | None = None,
        bound: Callable[[], float] | None = None,
        boxed: bool = False,
    ) -> float:
        """Run ``name`` on ``graph`` with ``options``; its step (inf where it found no plan that fits).

        ``boxed``: within the time left even while no plan has been found (the search of micro-batch counts).
        """
        label = label or name
        began = time.perf_counter()
        left = min(self.end, self.deadline - self.check_s) - began
        boxed = boxed or self.best is not None
        if left <= 0 and boxed:
            self.log["out_of_time"].append(label)
            return math.inf
        bound = bound or (partial(LOWER_BOUNDS[name], self.graph, self.cluster) if name in LOWER_BOUNDS else None)
        if bound is not None and self.best is not None:
            with TimeBox(left) as box:  # seconds on a big graph: within the time left, which it then shortens
                floor = bound()
            left = min(self.end, self.deadline - self.check_s) - time.perf_counter()
            if box.expired or left <= 0:
                self.log["out_of_time"].append(label)
                return math.inf
            if floor >= self.best.span:
                self.log["cannot_win"].append(f"{label} (at least {floor:.4g} s)")
                return math.inf
        searches = name in SEARCHES
        try:
            with frugal(), TimeBox(left if boxed else None) as box:
                plan = place(
                    graph,
                    self.cluster,
                    name,
                    seed=self.seed,
                    time_limit=max(1.0, left / 3) if searches else (left if boxed else None),
                    **options,
                )
            if box.expired:
                self.log["out_of_time"].append(label)
                return math.inf
        except TimeLimitError:
            self.log["out_of_time"].append(label)
            return math.inf
        except PlacerError as exc:
            message = failure_message(name, exc)
            if label != name and message.startswith(f"{name}:"):
                message = label + message[len(name) :]
            self.log["failed"].append(message if message.startswith(label) else f"{label}: {message}")
            self.spans[label] = math.inf
            return math.inf
        except KeyboardInterrupt:
            if self.best is None:
                raise
            self.interrupted = True
            return math.inf
        self.log["ran"].append(label)
        span = self.span(plan, graph)
        self.spans[label] = span
        if self.best is None or self.beats(span, self.best.span):
            self.best = _Best(span, name, label, plan, graph)
            # Only the plan auto returns is checked again: a slower member's big split graph is not.
            self.check_s = time.perf_counter() - began - plan.search_time_s
        return span

    def wants_microbatches(self) -> bool:
        """Whether a search of the pipelines' micro-batch count may win: no plan fits, a pipeline is the
        best plan, or the data-parallel members ran and no replica fit one device."""
        if self.best is None or self.best.name in PIPELINES:
            return True
        tried = [self.spans[name] for name in REPLICAS if name in self.spans]
        return bool(tried) and all(math.isinf(span) for span in tried)

    @property
    def over(self) -> bool:
        """Whether the portfolio's time is up, or Ctrl-C ended it."""
        return self.interrupted or time.perf_counter() >= min(self.end, self.deadline - self.check_s)


def _search_counts(run: _Portfolio, schedules: list[str], per_batch: np.ndarray) -> None:
    """Try the pipelines at other micro-batch counts: doubling from their default count while the step gets
    faster (or until one fits), then halving it while it gets faster, up to the batch's samples.

    Each count runs every schedule in ``schedules``; a count whose lower bound cannot beat the plan in
    hand is skipped (and the next tried), one whose micro-batched step would exceed
    :data:`MAX_MICROBATCHED_NODES` operations ends the doubling. Deterministic where time does not cut
    a member off.
    """
    graph, cluster = run.graph, run.cluster
    samples = batch_samples(graph)
    first = default_microbatches(graph, cluster)
    pipelined = [run.spans.get(_label(name, first), math.inf) for name in schedules]
    fastest = min(pipelined, default=math.inf)

    def at(count: int) -> float | None:
        """The fastest pipeline's step at ``count`` micro-batches (inf: none fits); None when time is up."""
        if run.over:
            run.log["out_of_time"].append(f"{', '.join(schedules)} ({count} micro-batches)")
            return None
        run.log["microbatches"].append(count)
        spans = []
        for name in schedules:
            bound = partial(microbatch_lower_bound, graph, cluster, count, per_batch)
            options = {"microbatches": count}
            spans.append(run.member(name, graph, options, label=_label(name, count), bound=bound, boxed=True))
            if run.interrupted:
                return None
        return min(spans, default=math.inf)

    count, best_count = first, first
    while count < samples and graph.num_nodes * min(2 * count, samples) <= MAX_MICROBATCHED_NODES:
        count = min(2 * count, samples)
        span = at(count)
        if span is None:
            return
        if span < fastest:
            fastest, best_count = span, count
        elif math.isfinite(fastest):
            break
    count = first
    while best_count == first and math.isfinite(fastest) and count > 2:
        count = max(2, count // 2)
        span = at(count)
        if span is None or span >= fastest:
            return
        fastest = span


def replica_groups(num_devices: int) -> list[int]:
    """The group counts auto tries for data parallelism over pipelines: each divisor ``r`` of the devices
    that leaves at least two devices a group.

    Examples
    --------
    >>> replica_groups(2), replica_groups(4), replica_groups(8)
    ([], [2], [2, 4])
    """
    return [r for r in range(2, num_devices // 2 + 1) if num_devices % r == 0]


def _try_groups(run: _Portfolio, name: str, microbatches: int, per_batch: np.ndarray | None) -> None:
    """Pipeline ``name`` in replica groups (:func:`replica_groups`; ``replicas`` of
    :func:`~placer.algorithms.pipeline.pipeline_plan`) at their default micro-batch count, or at
    ``microbatches`` where it divides among the groups."""
    graph, cluster = run.graph, run.cluster
    groups = replica_groups(cluster.num_devices)
    if groups and per_batch is None:
        per_batch = replica_layout(graph, 2).per_batch
    for r in groups:
        count = microbatches or default_group_microbatches(graph, cluster, r)
        if count % r or run.interrupted:
            continue
        bound = partial(microbatch_lower_bound, graph, cluster, count, per_batch)
        label = f"{name} ({r} replica groups, {count} micro-batches)"
        run.member(name, graph, {"microbatches": count, "replicas": r}, label=label, bound=bound)


def _label(name: str, microbatches: int) -> str:
    """How auto's log names a pipeline member: with its micro-batch count."""
    return f"{name} ({microbatches} micro-batch{'es' if microbatches != 1 else ''})"


def _as_plan_of(plan: Plan, graph: OpGraph, placed: OpGraph, microbatches: int) -> Plan:
    """``plan`` of ``placed`` as a plan of ``graph``: where ``placed`` is ``graph`` cut into ``microbatches``
    micro-batches, the plan names ``graph`` and carries what it placed as its rewritten graph."""
    if placed is graph:
        return plan
    if plan.rewritten_graph is None:
        plan.rewritten_graph = target_graph(plan, placed)
    plan.graph_digest, plan.graph_name = graph.digest(), graph.name
    plan.extra = {**plan.extra, "microbatches": microbatches}
    return plan


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
