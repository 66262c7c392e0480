"""The memory retries of the list schedulers: build schedules until one fits, then look for a faster one.

A list scheduler (:class:`~placer.algorithms.list_scheduling.ScheduleState`)
checks every booking against its device's memory, but it learns that an
output is freed only once the output's last consumer is booked. Counting
outputs, workspaces and copies whole (memory ratio 1) is therefore safe but
pessimistic: it spreads work that would have fitted.
:func:`schedule_with_memory_retries` judges every schedule by the reference
simulation of its own order instead, and moves the memory ratio and the
per-device budgets (shares of each capacity) in stages:

1. At the liveness ratio (:func:`~placer.algorithms.common.liveness_ratio`:
   the share of the step's footprint live at the peak of a one-device run),
   an overflowing schedule is built again with moved budgets
   (:func:`rebudgeted`) while that cuts the excess. One that overflows
   slightly (:data:`RETIME_EXCESS`) is first built once more told the
   transfers its simulation ran, since the copies may be what overflows
   (the reference model sends them when their producer ends, not when the
   scheduler booked them). Then the scheduler's ``pressed`` way of ordering
   nodes, which holds less memory at once, schedules once.
2. At ratio 1, budgets move the same way while the excess shrinks
   (:data:`STALE_SCHEDULES`); where counting whole leaves some node no room,
   the ratio is divided by 1.2.
3. Where moving work only moves the excess (the devices' peaks sum to more
   than their capacities), the activations copied between devices are what
   overflows: the same stages run, from the ratio reached, on the graph with
   each layer colocated (:func:`~placer.transform.colocate.colocate_layers`),
   which sends only what one layer hands the next; then with ``pressed``.
4. The fitting schedule is refined (:func:`refined_schedule`): built again,
   told the transfers its simulation ran, while the step gets shorter.
5. Where its step exceeds the first schedule's by more than
   :data:`PRESSURE_COST`, memory cost the step dearly, and the ratio is
   searched for a faster fitting schedule for every way of scheduling
   (:func:`_search_budgets`), within the time left.

The tuning constants below are read at call time: patch them on this module.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from ...cluster import Cluster
from ...errors import InfeasibleError
from ...gcpause import gc_paused
from ...graph import OpGraph
from ...io import shown_sizes
from ...sim.simulator import SimResult, simulate
from ...transform.colocate import colocate_layers
from ..common import liveness_ratio
from ..timebox import is_frugal, optional_work
from .state import Schedule, Send
from .to_plan import plan_simulation

__all__ = [
    "schedule_with_memory_retries",
    "rank_ordered_with_memory_retries",
    "refined_schedule",
    "rebudgeted",
    "simulated_sends",
    "REFINEMENTS",
    "REFINE_GAIN",
    "STALE_SCHEDULES",
    "REBUDGETS_AT_FIRST_RATIO",
    "MOST_RAISE",
    "PRESSURE_COST",
    "RETIME_EXCESS",
    "SEARCH_BUILDS",
    "SEARCH_HALVINGS",
    "SEARCH_CLIMB",
    "SEARCH_CLIMBS",
]


#: Schedules built again knowing the transfers of the best so far (:func:`refined_schedule`).
REFINEMENTS = 3
#: The share by which a schedule built again must shorten the step for another to be tried: most of
#: the gain comes from the first (bench/list_prediction.py), and each costs a whole schedule.
REFINE_GAIN = 0.02
#: Overflowing schedules in a row that do not cut the smallest excess so far by a tenth, before
#: the retries at ratio 1 give up on a graph (stage 2).
STALE_SCHEDULES = 1
#: Overflowing schedules in a row at the first ratio that do not cut the smallest excess so far by a
#: tenth, before the retries stop moving budgets there (stage 1): a schedule at the liveness ratio costs
#: a fraction of one counting outputs whole, so it is worth a few tries.
REBUDGETS_AT_FIRST_RATIO = 3
#: The most a device's budget grows from one schedule to the next (:func:`rebudgeted`).
MOST_RAISE = 2.0
#: Where the fitting schedule's step is within this factor of the first schedule's (which
#: overflowed), memory cost the step little, and :func:`_search_budgets` does not run.
PRESSURE_COST = 1.25
#: A schedule at the first ratio that overflows no device by more than this share of its capacity
#: is built once again knowing the transfers its simulation ran, before the budgets move (stage 1).
RETIME_EXCESS = 0.1
#: Schedules :func:`_search_budgets` may build.
SEARCH_BUILDS = 24
#: Halvings of the ratio interval per way of scheduling in :func:`_search_budgets`.
SEARCH_HALVINGS = 3
#: From a way's smallest fitting ratio, :func:`_search_budgets` tries ratios this factor apart upwards,
#: up to :data:`SEARCH_CLIMBS` of them, while each is faster than the one below it.
SEARCH_CLIMB = 1.15
SEARCH_CLIMBS = 2

#: ``build(stage, ratio, capacity_scale, sends=None) -> Schedule``: see :func:`schedule_with_memory_retries`.
Build = Callable[..., Schedule]


@gc_paused()  # its schedules book hundreds of thousands of tuples: placer.gcpause
def schedule_with_memory_retries(
    build: Build,
    graph: OpGraph,
    cluster: Cluster,
    name: str,
    ratio: float | None = None,
    tries: int = 16,
    pressed: Build | None = None,
    refine: bool = True,
    dispatch: bool = False,
) -> Schedule:
    """A schedule that ``build`` makes and that fits under the reference model: the module's stages 1-5.

    Parameters
    ----------
    build : callable
        ``build(stage, ratio, capacity_scale, sends=None) -> Schedule``, where ``stage`` is ``graph``
        or it with its layers colocated (the same nodes), ``ratio`` the memory ratio and
        ``capacity_scale`` the per-device budgets of :class:`~placer.algorithms.list_scheduling.ScheduleState`,
        and ``sends`` the transfers to book ahead (:func:`simulated_sends`). Raises
        :class:`~placer.errors.InfeasibleError` where some node fits no device.
    graph, cluster
    name : str
        The algorithm, for the error's message.
    ratio : float, optional
        The first memory ratio; default the liveness ratio.
    tries : int
        Schedules per stage at most.
    pressed : callable, optional
        The scheduler's way of ordering nodes that holds less memory at once, called as ``build``.
    refine : bool
        Refine the fitting schedule (stage 4).
    dispatch : bool
        Compare schedules by the step of the plan
        :func:`~placer.algorithms.list_scheduling.plan_from_schedule` makes of them with ``dispatch``.

    Returns
    -------
    Schedule
        A fitting schedule with its reference simulation (:attr:`Schedule.simulated`).

    Raises
    ------
    InfeasibleError
        Where no stage finds a schedule that fits: the failure of the one closest to fitting.

    Examples
    --------
    >>> from placer.algorithms.heft import heft_schedule
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> cluster = load_cluster("2xV100-nvlink")
    >>> def build(stage, ratio, scale, sends=None):
    ...     return heft_schedule(stage, cluster, ratio, capacity_scale=scale, sends=sends)
    >>> schedule_with_memory_retries(build, training_graph(layers=2), cluster, "heft").simulated.fits
    True
    """
    tally = _Tally()
    build = _Counted(build, tally)
    pressed = None if pressed is None else _Counted(pressed, tally)
    loosest = liveness_ratio(graph, cluster) if ratio is None else ratio
    first = _first_fit(build, pressed, graph, cluster, name, loosest, tries)
    sched = _refined(first.fit, graph, cluster, refine, dispatch)
    step = plan_simulation(graph, cluster, sched, dispatch).makespan_s
    if step <= PRESSURE_COST * first.free_step:
        return sched
    layered = colocate_layers(graph) if first.layered is None else first.layered
    ways = [
        _Way(stage, maker)
        for stage in (layered, graph)
        if stage is not None
        for maker in (build, pressed)
        if maker is not None
    ]
    found = _search_budgets(first.fit, step, ways, graph, cluster, loosest, dispatch, tally.builds)
    # A schedule the search found is faster already, and refining never slows a schedule.
    return sched if found is None else _refined(found, graph, cluster, refine, dispatch)


def rank_ordered_with_memory_retries(
    schedule: Callable[..., Schedule], graph: OpGraph, cluster: Cluster, name: str, refine: bool = True, **options
) -> Schedule:
    """:func:`schedule_with_memory_retries` for a scheduler that books by rank (HEFT, DPOS).

    ``schedule(graph, cluster, ratio, capacity_scale=..., earliest_first=..., sends=..., **options)``;
    its way of holding less memory at once (``pressed``) is booking by earliest start
    (:func:`~placer.algorithms.list_scheduling.earliest_start_priorities`).
    """
    build = _RankOrderedBuild(schedule, cluster, options, earliest_first=False)
    pressed = _RankOrderedBuild(schedule, cluster, options, earliest_first=True)
    return schedule_with_memory_retries(build, graph, cluster, name, pressed=pressed, refine=refine)


@dataclass(frozen=True, eq=False)
class _RankOrderedBuild:
    """A rank-ordered scheduler as a ``build`` of :func:`schedule_with_memory_retries`."""

    schedule: Callable[..., Schedule]
    cluster: Cluster
    options: dict
    earliest_first: bool

    def __call__(self, stage: OpGraph, ratio: float, scale: np.ndarray, sends: dict | None = None) -> Schedule:
        return self.schedule(
            stage,
            self.cluster,
            ratio,
            capacity_scale=scale,
            earliest_first=self.earliest_first,
            sends=sends,
            **self.options,
        )


@dataclass
class _Tally:
    """Schedules built so far by every :class:`_Counted` build that shares it."""

    builds: int = 0


@dataclass(frozen=True, eq=False)
class _Counted:
    """A build that counts its calls on a shared tally, so the search can spend no more than the retries."""

    build: Build
    tally: _Tally

    def __call__(self, *args, **kwargs) -> Schedule:
        self.tally.builds += 1
        return self.build(*args, **kwargs)


@dataclass
class _Fit:
    """A fitting schedule (simulated) and how it was built, so that it can be built again."""

    sched: Schedule
    build: Build
    stage: OpGraph
    ratio: float
    scale: np.ndarray
    took_s: float


class _Failure(NamedTuple):
    """Why the schedule closest to fitting failed: its ``excess`` over the devices' capacities in bytes
    (infinite where no schedule was built) and the ``error`` to raise."""

    excess: float
    error: InfeasibleError


class _Outcome(NamedTuple):
    """What stages 1 and 2 found on one graph (:class:`_Retries`)."""

    fit: _Fit | None  #: the fitting schedule, None if there is none
    failure: _Failure  #: why the schedule closest to fitting failed
    ratio: float  #: the memory ratio the retries reached
    first_step: float  #: the simulated step of the first schedule built (inf if none was)


class _FirstFit(NamedTuple):
    """What stages 1-3 found (:func:`_first_fit`)."""

    fit: _Fit  #: the first fitting schedule
    layered: OpGraph | None  #: the graph with its layers colocated, where stage 3 made it
    free_step: float  #: the simulated step of the very first schedule, which overflowed (inf if none was built)


def _first_fit(
    build: Build, pressed: Build | None, graph: OpGraph, cluster: Cluster, name: str, ratio: float, tries: int
) -> _FirstFit:
    """Stages 1-3: the first fitting schedule, on the nodes, else on the colocated layers, else by ``pressed``.

    Each later graph or build goes on from the ratio the one before reached,
    counting outputs whole. Raises the failure of the schedule closest to
    fitting (:class:`~placer.errors.InfeasibleError`) where none fits.
    """
    on_nodes = _Retries(build, pressed, graph, graph, cluster, name, ratio, counted_whole=ratio >= 1.0).run(tries)
    outcomes = [on_nodes]
    layered = None
    if on_nodes.fit is None:
        layered = colocate_layers(graph)
        if layered is not None:
            outcomes.append(_Retries(build, None, layered, graph, cluster, name, on_nodes.ratio).run(tries))
    if outcomes[-1].fit is None and pressed is not None:
        stage = graph if layered is None else layered
        outcomes.append(_Retries(pressed, None, stage, graph, cluster, name, outcomes[-1].ratio).run(tries))
    fit = outcomes[-1].fit
    if fit is None:
        raise min((outcome.failure for outcome in outcomes), key=lambda failure: failure.excess).error
    return _FirstFit(fit, layered, on_nodes.first_step)


@dataclass(eq=False)
class _Retries:
    """Stages 1 and 2 of the module on ``stage`` (``graph``, or it with its layers colocated), from ``ratio``.

    Every schedule is judged by its simulation on ``graph``; each that
    overflows, or that finds some node no room, sets up the next
    (:meth:`_overflowed`, :meth:`_found_no_room`) or ends the stages.
    """

    build: Build
    pressed: Build | None
    stage: OpGraph
    graph: OpGraph
    cluster: Cluster
    name: str
    ratio: float
    counted_whole: bool = True  #: stage 2 at once

    def __post_init__(self) -> None:
        self.capacity = self.cluster.memory.astype(np.float64)
        self.use_pressed = False
        self.scale = np.ones(self.cluster.num_devices)
        self.least_excess, self.stale = np.inf, 0  # the smallest excess so far, and overflows since it
        #: Whether every schedule at the first ratio held more than all devices together (None before the first).
        self.overfilled: bool | None = None
        self.first_step = np.inf
        self.failure = _Failure(np.inf, InfeasibleError(f"{self.name}: no schedule tried"))

    def run(self, tries: int) -> _Outcome:
        """Up to ``tries`` schedules, until one fits or the stages give up."""
        for _ in range(tries):
            began = time.perf_counter()
            maker = self.pressed if self.use_pressed else self.build
            try:
                sched = maker(self.stage, self.ratio, self.scale)
            except InfeasibleError as exc:
                if self._found_no_room(exc):
                    continue
                break
            sched, result = self._simulated(maker, sched)
            if result.fits:
                sched.simulated = result
                fit = _Fit(sched, maker, self.stage, self.ratio, self.scale, time.perf_counter() - began)
                return _Outcome(fit, self.failure, self.ratio, self.first_step)
            if not self._overflowed(result.peak_memory_bytes, sched.memory_seen):
                break
        return _Outcome(None, self.failure, self.ratio, self.first_step)

    def _simulated(self, maker: Build, sched: Schedule) -> tuple[Schedule, SimResult]:
        """``sched`` and its simulation; in stage 1, where it overflows slightly, the same schedule built
        again told the transfers its simulation ran, if that one fits."""
        result = simulate(self.graph, self.cluster, sched.device_of, sched.orders, check=False)
        if np.isinf(self.first_step):
            self.first_step = result.makespan_s
        slight = np.all(result.peak_memory_bytes <= (1 + RETIME_EXCESS) * self.capacity)
        if result.fits or self.counted_whole or not slight:
            return sched, result
        # Told the transfers, the copies arrive (and are held) when the reference model sends them.
        try:
            again = maker(self.stage, self.ratio, self.scale, sends=simulated_sends(result))
        except InfeasibleError:
            return sched, result
        retimed = simulate(self.graph, self.cluster, again.device_of, again.orders, check=False)
        return (again, retimed) if retimed.fits else (sched, result)

    def _found_no_room(self, exc: InfeasibleError) -> bool:
        """Set up the next schedule after ``build`` found some node no room; False where the graph is given up."""
        if np.isinf(self.failure.excess):  # an overflow says more: how far from fitting
            self.failure = _Failure(np.inf, InfeasibleError(f"{self.name}: {exc}"))
        if not self.counted_whole and (self.use_pressed or np.any(self.scale != 1.0)):
            self._give_way()  # as an overflow without progress would
            return True
        self.ratio /= 1.2
        # Counting whole leaves no room for every node, and the first ratio's schedules held more than the
        # devices do together: a smaller ratio seldom fits on this graph then, so the next graph is tried.
        return not (self.overfilled and np.all(self.scale == 1.0))

    def _overflowed(self, peak: np.ndarray, seen: np.ndarray | None) -> bool:
        """Set up the next schedule after one peaked at ``peak`` over some capacity; False where the graph
        is given up. ``seen`` is what the scheduler counted per device (:attr:`Schedule.memory_seen`)."""
        held_more = peak.sum() > self.capacity.sum()  # than all the devices together
        excess = float(np.maximum(peak - self.capacity, 0).sum())
        if excess < self.failure.excess:
            j = int(np.argmax(peak - self.capacity))
            needs, has = shown_sizes(peak[j], self.capacity[j])
            on_layers = "" if self.stage is self.graph else " (its layers colocated)"
            device = self.cluster.devices[j].name
            self.failure = _Failure(
                excess, InfeasibleError(f"{self.name}: device {device!r} would need {needs} of {has}{on_layers}")
            )
        progress = excess < 0.9 * self.least_excess
        # A new budget moves work, it sheds none: where the peaks sum to more than the devices hold and no
        # budget made this schedule's excess smaller (or none was made yet), the next would only move it.
        moves_only = held_more and not (progress and np.isfinite(self.least_excess))
        self.least_excess, self.stale = (excess, 0) if progress else (self.least_excess, self.stale + 1)
        if not self.counted_whole:
            self.overfilled = held_more and self.overfilled is not False
            if not self.use_pressed and not moves_only and self.stale < REBUDGETS_AT_FIRST_RATIO:
                self.scale = rebudgeted(self.scale, peak, self.capacity, seen)
            else:
                self._give_way()
            return True
        if moves_only or self.stale >= STALE_SCHEDULES:
            return False
        self.scale = rebudgeted(self.scale, peak, self.capacity, seen)
        return True

    def _give_way(self) -> None:
        """Leave stage 1's moved budgets: for ``pressed`` with whole budgets if it has not run, else for stage 2."""
        if self.pressed is not None and not self.use_pressed:
            self.use_pressed, self.scale = True, np.ones(self.cluster.num_devices)
            return
        self.use_pressed, self.ratio, self.counted_whole = False, 1.0, True
        self.scale, self.least_excess, self.stale = np.ones(self.cluster.num_devices), np.inf, 0


def rebudgeted(scale: np.ndarray, peak: np.ndarray, capacity: np.ndarray, seen: np.ndarray | None) -> np.ndarray:
    """The budgets (shares of each device's capacity) for the next schedule, after one with ``scale`` overflowed.

    ``new_d = scale_d * clip(sqrt(0.95 capacity_d / peak_d), 1, MOST_RAISE)`` for a device that held
    no more than its capacity, ``new_d = scale_d * 0.95 capacity_d / peak_d`` for one that overflowed.

    The scheduler's count of a device's memory is not the reference
    model's: it holds an output until its last consumer is booked, and books
    a copy when it books the reader, where the reference model sends it as
    its producer ends. So each device's simulated ``peak`` calibrates its
    budget: one that overflowed gets less, in proportion to its excess; one
    that held less than 95% of its capacity gets more, by the square root of
    its headroom (more work there raises its peak), so that the work moved
    off the others has somewhere to go where the count was full but the
    memory was not. Where every cut budget would still hold the most the
    scheduler counted there (``seen``: :attr:`Schedule.memory_seen`), each
    booking would pass its memory check again and the same schedule would
    come back, so those are cut from that count instead.

    Examples
    --------
    >>> rebudgeted(np.ones(2), np.array([12.0, 4.0]), np.array([10.0, 10.0]), None).round(3).tolist()
    [0.792, 1.541]
    """
    over = peak > capacity
    headroom = 0.95 * capacity / np.maximum(peak, 1.0)
    cut = scale[over] * headroom[over]
    if seen is not None:
        counted = seen[over] / capacity[over]
        if np.all(cut >= counted):
            cut = counted * headroom[over]
    new = scale * np.clip(np.sqrt(headroom), 1.0, MOST_RAISE)
    new[over] = cut
    return new


class _Way(NamedTuple):
    """A way of scheduling that :func:`_search_budgets` searches: a graph (the nodes or the colocated
    layers) and a build (the scheduler's own, or its ``pressed``)."""

    stage: OpGraph
    build: Build


def _search_budgets(
    fit: _Fit,
    step: float,
    ways: list[_Way],
    graph: OpGraph,
    cluster: Cluster,
    low: float,
    dispatch: bool,
    spent_builds: int,
) -> _Fit | None:
    """The fastest fitting schedule over the ratio, with whole budgets, if its plan's step beats ``step``.

    ``fit`` (the retries' refined schedule, whose plan's step is ``step``)
    is not built again. For each of ``ways`` in turn, the ratio is halved
    between ``low`` (the retries' first, loosest budgets) and 1: an overflow
    raises the lower end; a fit, or no room for some node, lowers the upper
    end, since a smaller ratio leaves work less spread. The step is not
    monotone in the ratio (budgets a notch tighter than the smallest that
    fits can spread the work better), so once every way is halved, each
    climbs from its smallest fitting ratio by :data:`SEARCH_CLIMB` while
    that is faster. Schedules compete by the step of their plan
    (:func:`~placer.algorithms.list_scheduling.plan_simulation` with ``dispatch``).

    It stops after :data:`SEARCH_BUILDS` schedules (within
    :func:`~placer.algorithms.timebox.frugal`, after ``spent_builds``, the
    scheduler's own so far, so that it at most doubles what the scheduler
    costs), or where a running time limit leaves no time: the search and
    each build in it are optional work
    (:func:`~placer.algorithms.timebox.optional_work`). None where no
    schedule beats ``step``.
    """
    search = _BudgetSearch(fit, step, ways, graph, cluster, low, dispatch, spent_builds)
    box = optional_work(fit.took_s)
    if box is not None:
        with box:
            search.run()
    return search.best


class _Probe(enum.Enum):
    """What a schedule at one ratio of a way gives (:meth:`_BudgetSearch.probe`)."""

    FITS = "fits"
    OVERFLOWS = "overflows"
    NO_ROOM = "no room"  # some node fits no device: InfeasibleError


class _Key(NamedTuple):
    """A schedule of the search: the identities of its way's graph and build, and its ratio."""

    stage: int
    build: int
    ratio: float

    @classmethod
    def of(cls, stage: OpGraph, build: Build, ratio: float) -> "_Key":
        return cls(id(stage), id(build), ratio)


class _BudgetSearch:
    """The state of :func:`_search_budgets`: the best schedule so far and what every ratio tried gave."""

    def __init__(
        self,
        fit: _Fit,
        step: float,
        ways: list[_Way],
        graph: OpGraph,
        cluster: Cluster,
        low: float,
        dispatch: bool,
        spent_builds: int,
    ):
        self.ways, self.graph, self.cluster, self.low, self.dispatch = ways, graph, cluster, low, dispatch
        self.best: _Fit | None = None
        self.best_step = step
        self.whole = np.ones(cluster.num_devices)  # every device's whole capacity
        self.took_s = fit.took_s  # the last build's seconds, which the next one's time box must allow
        self.builds = 0
        self.most_builds = min(SEARCH_BUILDS, spent_builds) if is_frugal() else SEARCH_BUILDS
        # The retries' first schedules, at the loosest ratio on the nodes, overflowed (else no search).
        self.known = {_Key.of(graph, way.build, low): _Probe.OVERFLOWS for way in ways if low < 1.0}
        self.steps: dict[_Key, float] = {}  # the plan's step of each schedule that fits
        if np.all(fit.scale == 1.0):
            fitted = _Key.of(fit.stage, fit.build, fit.ratio)
            self.known[fitted] = _Probe.FITS
            self.steps[fitted] = step  # refined: a climb from it must beat that

    def run(self) -> None:
        """Every way's halvings first; the climbs, which seldom pay as much, get what is left."""
        for part in (self.halve, self.climb):
            for way in self.ways:
                if not part(way):
                    return

    def halve(self, way: _Way) -> bool:
        """Halve the way's ratio interval :data:`SEARCH_HALVINGS` times; False where the search must stop."""
        lo, hi = self.low, 1.0
        for ratio in (lo, hi):
            outcome = self.probe(way, ratio)
            if outcome is not _Probe.OVERFLOWS:
                break
        if outcome is None:
            return False
        if ratio == lo or outcome is _Probe.OVERFLOWS:
            return True  # the loosest budgets fit or leave no room, or the tightest overflow: nothing between
        for _ in range(SEARCH_HALVINGS):
            mid = (lo + hi) / 2
            outcome = self.probe(way, mid)
            if outcome is None:
                return False
            lo, hi = (mid, hi) if outcome is _Probe.OVERFLOWS else (lo, mid)
        return True

    def climb(self, way: _Way) -> bool:
        """Climb from the way's smallest fitting ratio while faster; False where the search must stop."""
        fitting = [key.ratio for key in self.steps if key.stage == id(way.stage) and key.build == id(way.build)]
        if not fitting:
            return True
        ratio = min(fitting)
        for _ in range(SEARCH_CLIMBS):
            above = ratio * SEARCH_CLIMB
            if above >= 1.0:
                return True
            outcome = self.probe(way, above)
            if outcome is None:
                return False
            if outcome is not _Probe.FITS:
                return True
            if self.steps[_Key.of(*way, above)] >= self.steps[_Key.of(*way, ratio)]:
                return True
            ratio = above
        return True

    def probe(self, way: _Way, ratio: float) -> _Probe | None:
        """What the way's schedule at ``ratio`` gives, built once; None where the search must stop (out of
        builds or of time)."""
        key = _Key.of(*way, ratio)
        if key in self.known:
            return self.known[key]
        box = optional_work(self.took_s) if self.builds < self.most_builds else None
        if box is None:
            return None
        self.builds += 1
        began = time.perf_counter()
        with box:
            outcome, sched, its_step = self._built(way, ratio)
        self.took_s = time.perf_counter() - began
        if box.expired:
            return None
        if outcome is _Probe.FITS:
            self.steps[key] = its_step
            if its_step < self.best_step:
                self.best, self.best_step = _Fit(sched, way.build, way.stage, ratio, self.whole, self.took_s), its_step
        self.known[key] = outcome
        return outcome

    def _built(self, way: _Way, ratio: float) -> tuple[_Probe, Schedule | None, float]:
        """The way's schedule at ``ratio`` with whole budgets, simulated, and its plan's step (inf unless it fits)."""
        try:
            sched = way.build(way.stage, ratio, self.whole)
        except InfeasibleError:
            return _Probe.NO_ROOM, None, np.inf
        sched.simulated = simulate(self.graph, self.cluster, sched.device_of, sched.orders, check=False)
        if not sched.simulated.fits:
            return _Probe.OVERFLOWS, sched, np.inf
        return _Probe.FITS, sched, plan_simulation(self.graph, self.cluster, sched, self.dispatch).makespan_s


def _refined(fit: _Fit, graph: OpGraph, cluster: Cluster, refine: bool, dispatch: bool) -> Schedule:
    """``fit``'s schedule, refined (:func:`refined_schedule`) where ``refine``."""
    if not refine:
        return fit.sched
    return refined_schedule(fit.build, graph, cluster, fit.sched, fit.ratio, fit.scale, fit.stage, fit.took_s, dispatch)


def refined_schedule(
    build: Build,
    graph: OpGraph,
    cluster: Cluster,
    sched: Schedule,
    ratio: float,
    scale: np.ndarray,
    stage: OpGraph | None = None,
    took_s: float = 0.0,
    dispatch: bool = False,
) -> Schedule:
    """``sched``, or a faster fitting schedule that ``build`` makes knowing what ``sched`` sends.

    A list scheduler books a transfer when it places the consumer; the
    reference model queues it at its producer's finish, so a transfer booked
    late can go ahead of those booked earlier and delay them. Knowing the
    transfers the simulation of ``sched`` ran, the next schedule books each
    as soon as its producer is booked, where the channel's queue puts it
    (:class:`~placer.algorithms.list_scheduling.ScheduleState`'s ``sends``).
    Kept where the step gets shorter, and tried again while it gets shorter
    by :data:`REFINE_GAIN`, up to :data:`REFINEMENTS` times. Optional work
    (:func:`~placer.algorithms.timebox.optional_work`): a try cut short by a
    running time limit is dropped.

    Parameters
    ----------
    build : callable
        ``build(stage, ratio, scale, sends=...)``, as :func:`schedule_with_memory_retries` calls it.
    graph, cluster
    sched : Schedule
        A schedule of ``graph`` with its reference simulation (``sched.simulated``), which fits.
    ratio, scale
        The memory ratio and capacity scale ``sched`` was built with.
    stage : OpGraph, optional
        The graph ``build`` schedules (``graph``, or it with its layers colocated); default ``graph``.
    took_s : float
        Seconds ``sched`` took to build and simulate.
    dispatch : bool
        Compare schedules by the step of the plan
        :func:`~placer.algorithms.list_scheduling.plan_from_schedule` makes with ``dispatch``
        (:func:`~placer.algorithms.list_scheduling.plan_simulation`), not by their own order's.

    Returns
    -------
    Schedule
        The fastest schedule tried, with its simulation.
    """
    best = sched
    for _ in range(REFINEMENTS):
        box = optional_work(took_s)
        if box is None:
            break
        began = time.perf_counter()
        with box:
            step = plan_simulation(graph, cluster, best, dispatch).makespan_s
            try:
                again = build(graph if stage is None else stage, ratio, scale, sends=simulated_sends(best.simulated))
            except InfeasibleError:
                break
            again.simulated = simulate(graph, cluster, again.device_of, again.orders, check=False)
            if again.simulated.fits:
                new_step = plan_simulation(graph, cluster, again, dispatch).makespan_s
        took_s = time.perf_counter() - began
        if box.expired or not again.simulated.fits or new_step >= step:
            break
        best = again
        if new_step > (1 - REFINE_GAIN) * step:
            break
    return best


def simulated_sends(result: SimResult) -> dict[int, list[Send]]:
    """The transfers of a simulated step as :class:`~placer.algorithms.list_scheduling.ScheduleState`'s
    ``sends``: per producer, a :class:`~placer.algorithms.list_scheduling.state.Send` per transfer.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.graph import OpGraph
    >>> g = OpGraph(["a", "b"], [1.0, 1.0], [0], [1], [8], [0])
    >>> simulated_sends(simulate(g, load_cluster("2xcpu"), [0, 1]))
    {0: [Send(tensor=0, device=1, nbytes=8)]}
    """
    sent = result.transfers
    sends: dict[int, list[Send]] = {}
    for u, t, d, b in zip(sent.producer.tolist(), sent.tensor.tolist(), sent.dst_device.tolist(), sent.nbytes.tolist()):
        sends.setdefault(u, []).append(Send(t, d, b))
    return sends
