"""The memory retries of the list schedulers: build schedules until one fits, then look for a faster one.

A list scheduler (:class:`~placer.algorithms.list_scheduling.ScheduleState`)
checks every booking against its device's memory over time, but it learns
when an output is freed only once the output's last consumer is booked, and
counts it as held for good until then. Counting outputs, workspaces and
copies whole (memory ratio 1) is therefore safe but pessimistic: it spreads
work that would have fitted. :func:`schedule_with_memory_retries` judges
every schedule by the reference simulation of its own order instead, and
moves the ratio and the per-device budgets (shares of each capacity) in
stages:

1. At the liveness ratio (:func:`~placer.algorithms.common.liveness_ratio`:
   the share of the step's footprint live at the peak of a one-device run),
   a schedule that overflows is built again with moved budgets
   (:func:`rebudgeted`) while that cuts the excess; one that overflows
   slightly (:data:`RETIME_EXCESS`) is first built once again told the
   transfers its simulation ran, as the copies may be what overflows (the
   reference model sends them when their producer ends, not when the
   scheduler booked them). Then the scheduler's ``pressed`` way of ordering
   nodes, one that holds less memory at once, schedules once.
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

import time
from dataclasses import dataclass
from functools import partial
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
#: :func:`schedule_with_memory_retries` gives up on the node-level placement.
STALE_SCHEDULES = 1
#: Overflowing schedules in a row at the first ratio that do not cut the smallest excess so far by a
#: tenth, before :func:`_retry` stops moving budgets there: a schedule at the liveness ratio costs a
#: fraction of one counting outputs whole, so it is worth a few tries.
REBUDGETS_AT_FIRST_RATIO = 3
#: The most a device's budget grows from one schedule to the next (:func:`rebudgeted`).
MOST_RAISE = 2.0
#: Where the fitting schedule's step is within this factor of the first schedule's (which
#: overflowed), memory cost the step little, and :func:`_search_budgets` does not run.
PRESSURE_COST = 1.25
#: A schedule at the liveness ratio that overflows no device by more than this share of its capacity
#: is built once again knowing the transfers its simulation ran, before the ratio gives way (:func:`_retry`).
RETIME_EXCESS = 0.1
#: Schedules :func:`_search_budgets` may build.
SEARCH_BUILDS = 24
#: Halvings of the ratio interval per way of scheduling in :func:`_search_budgets`.
SEARCH_HALVINGS = 3
#: From a way's smallest fitting ratio, :func:`_search_budgets` tries ratios this factor apart upwards,
#: up to :data:`SEARCH_CLIMBS` of them, while each is faster than the one below it.
SEARCH_CLIMB = 1.15
SEARCH_CLIMBS = 2


@gc_paused()  # its schedules book hundreds of thousands of tuples: placer.gcpause
def schedule_with_memory_retries(
    build: Callable[..., Schedule],
    graph: OpGraph,
    cluster: Cluster,
    name: str,
    ratio: float | None = None,
    tries: int = 16,
    pressed: Callable[..., Schedule] | None = None,
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
    built = 0

    def counted(maker: Callable[..., Schedule] | None) -> Callable[..., Schedule] | None:
        def build_and_count(*args, **kwargs) -> Schedule:
            nonlocal built
            built += 1
            return maker(*args, **kwargs)

        return None if maker is None else build_and_count

    build, pressed = counted(build), counted(pressed)
    if ratio is None:
        ratio = liveness_ratio(graph, cluster)
    loosest = ratio
    fit, failure, ratio, free_step = _retry(build, graph, graph, cluster, name, ratio, ratio >= 1.0, tries, pressed)
    failures = [failure]
    layered = None
    if fit is None:
        layered = colocate_layers(graph)
        if layered is not None:
            # The liveness ratio and whole counting were tried on the nodes: go on from the ratio reached.
            fit, failure, ratio, _ = _retry(build, layered, graph, cluster, name, ratio, True, tries)
            failures.append(failure)
    if fit is None and pressed is not None:
        fit, failure, _, _ = _retry(
            pressed, graph if layered is None else layered, graph, cluster, name, ratio, True, tries
        )
        failures.append(failure)
    if fit is None:
        raise min(failures, key=lambda failed: failed.excess).error  # the closest to fitting

    def refined(chosen: _Fit) -> Schedule:
        if not refine:
            return chosen.sched
        return refined_schedule(
            chosen.build,
            graph,
            cluster,
            chosen.sched,
            chosen.ratio,
            chosen.scale,
            chosen.stage,
            chosen.took_s,
            dispatch,
        )

    sched = refined(fit)
    step = plan_simulation(graph, cluster, sched, dispatch).makespan_s
    if step > PRESSURE_COST * free_step:
        if layered is None:
            layered = colocate_layers(graph)
        ways = [
            (stage, maker)
            for stage in (layered, graph)
            if stage is not None
            for maker in (build, pressed)
            if maker is not None
        ]
        found = _search_budgets(fit, step, ways, graph, cluster, loosest, dispatch, built)
        if found is not None:  # faster already; refining never slows a schedule
            sched = refined(found)
    return sched


def rank_ordered_with_memory_retries(
    schedule: Callable[..., Schedule], graph: OpGraph, cluster: Cluster, name: str, refine: bool = True, **options
) -> Schedule:
    """:func:`schedule_with_memory_retries` for a scheduler that books by rank (HEFT, DPOS).

    ``schedule(graph, cluster, ratio, capacity_scale=..., earliest_first=..., sends=..., **options)``;
    its way of holding less memory at once (``pressed``) is booking by earliest start
    (:func:`~placer.algorithms.list_scheduling.earliest_start_priorities`).
    """

    def build(
        g: OpGraph, ratio: float, scale: np.ndarray, sends: dict | None = None, earliest_first: bool = False
    ) -> Schedule:
        return schedule(g, cluster, ratio, capacity_scale=scale, earliest_first=earliest_first, sends=sends, **options)

    return schedule_with_memory_retries(
        build, graph, cluster, name, pressed=partial(build, earliest_first=True), refine=refine
    )


@dataclass
class _Fit:
    """A fitting schedule (simulated) and how it was built, so that it can be built again."""

    sched: Schedule
    build: Callable[..., Schedule]
    stage: OpGraph
    ratio: float
    scale: np.ndarray
    took_s: float


class _Failure(NamedTuple):
    """Why the schedule of a stage closest to fitting failed: its ``excess`` over the devices' capacities
    in bytes (infinite where no schedule was built) and the ``error`` to raise."""

    excess: float
    error: InfeasibleError


class _Outcome(NamedTuple):
    """What one stage of the retries (:func:`_retry`) found."""

    fit: _Fit | None  #: the fitting schedule, None if there is none
    failure: _Failure  #: why the schedule closest to fitting failed
    ratio: float  #: the memory ratio the retries reached
    first_step: float  #: the simulated step of the first schedule built (inf if none was)


def _retry(
    build: Callable[..., Schedule],
    stage: OpGraph,
    graph: OpGraph,
    cluster: Cluster,
    name: str,
    ratio: float,
    counted_whole: bool,
    tries: int,
    pressed: Callable[..., Schedule] | None = None,
) -> _Outcome:
    """Stages 1 and 2 of :func:`schedule_with_memory_retries` on ``stage`` (``graph``, or it with its layers
    colocated), from ``ratio`` (``counted_whole``: stage 2 at once), up to ``tries`` schedules.

    Before outputs are counted whole, a schedule that overflows is built
    again at the same ratio with moved budgets while that makes progress,
    then once by ``pressed`` (if given) with whole budgets.
    """
    scale = np.ones(cluster.num_devices)
    capacity = cluster.memory.astype(np.float64)
    error = InfeasibleError(f"{name}: no schedule tried")
    closest = np.inf
    on_layers = "" if stage is graph else " (its layers colocated)"
    least_excess, stale = np.inf, 0
    use_pressed = False
    first_step = np.inf
    # Whether every schedule at the first ratio held more than all devices together (None before the first).
    overfilled = None

    def count_whole() -> None:
        nonlocal use_pressed, ratio, counted_whole, scale, least_excess, stale
        use_pressed, ratio, counted_whole = False, 1.0, True
        scale, least_excess, stale = np.ones(cluster.num_devices), np.inf, 0

    for _ in range(tries):
        began = time.perf_counter()
        try:
            maker = pressed if use_pressed else build
            sched = maker(stage, ratio, scale)
        except InfeasibleError as exc:
            if np.isinf(closest):  # an overflow says more: how far from fitting
                error = InfeasibleError(f"{name}: {exc}")
            if not counted_whole and (use_pressed or np.any(scale != 1.0)):
                # Budgets moved at the first ratio left some node no room, or ``pressed`` did: go on as if the
                # schedule had overflowed without progress.
                if pressed is not None and not use_pressed:
                    use_pressed, scale = True, np.ones(cluster.num_devices)
                else:
                    count_whole()
                continue
            ratio /= 1.2
            if overfilled and np.all(scale == 1.0):
                # Counting outputs whole leaves no room for every node, and the first ratio's schedules
                # held more than the devices do together: a smaller ratio seldom fits on the nodes then,
                # so the layers are tried next.
                break
            continue
        result = simulate(graph, cluster, sched.device_of, sched.orders, check=False)
        if np.isinf(first_step):
            first_step = result.makespan_s
        if not (result.fits or counted_whole) and np.all(result.peak_memory_bytes <= (1 + RETIME_EXCESS) * capacity):
            # A slight overflow may be the transfers': the scheduler books a copy when it places the
            # consumer, the reference model queues it as its producer ends, so copies arrive (and are held)
            # at other times. Told those transfers, the schedule may fit at the same ratio, where counting
            # outputs whole would spread the step.
            try:
                again = maker(stage, ratio, scale, sends=simulated_sends(result))
            except InfeasibleError:
                pass
            else:
                retimed = simulate(graph, cluster, again.device_of, again.orders, check=False)
                if retimed.fits:
                    sched, result = again, retimed
        if result.fits:
            sched.simulated = result
            return _Outcome(
                _Fit(sched, maker, stage, ratio, scale, time.perf_counter() - began),
                _Failure(closest, error),
                ratio,
                first_step,
            )
        peak = result.peak_memory_bytes
        held_more = peak.sum() > capacity.sum()  # than all the devices together
        excess = float(np.maximum(peak - capacity, 0).sum())
        if excess < closest:
            j = int(np.argmax(peak - capacity))
            needs, has = shown_sizes(peak[j], capacity[j])
            closest, error = (
                excess,
                InfeasibleError(f"{name}: device {cluster.devices[j].name!r} would need {needs} of {has}{on_layers}"),
            )
        progress = excess < 0.9 * least_excess
        # A new budget moves work, it sheds none: where the peaks sum to more than the devices hold and no
        # budget made this schedule's excess smaller (or none was made yet), the next would only move it
        # from one device to another.
        moves_only = held_more and not (progress and np.isfinite(least_excess))
        least_excess, stale = (excess, 0) if progress else (least_excess, stale + 1)
        if not counted_whole:
            overfilled = held_more and overfilled is not False
            if not use_pressed and not moves_only and stale < REBUDGETS_AT_FIRST_RATIO:
                scale = rebudgeted(scale, peak, capacity, sched.memory_seen)
                continue
            if pressed is not None and not use_pressed:
                use_pressed, scale = True, np.ones(cluster.num_devices)
                continue
            count_whole()
            continue
        if moves_only or stale >= STALE_SCHEDULES:
            break
        scale = rebudgeted(scale, peak, capacity, sched.memory_seen)
    return _Outcome(None, _Failure(closest, error), ratio, first_step)


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


def _search_budgets(
    fit: _Fit,
    step: float,
    ways: list[tuple[OpGraph, Callable[..., Schedule]]],
    graph: OpGraph,
    cluster: Cluster,
    low: float,
    dispatch: bool,
    spent_builds: int,
) -> _Fit | None:
    """The fastest fitting schedule that a way of scheduling builds over the ratio, where its step is below ``step``.

    ``fit`` is the retries' fitting schedule, whose budgets need not be built again.

    For each ``(stage, build)`` of ``ways``, the ratio (every device's
    whole capacity) is halved between ``low``, where budgets are loosest,
    and 1: a schedule that overflows raises the lower end, one that fits or
    that finds no device with room for some node (InfeasibleError) lowers the
    upper end, since a smaller ratio leaves work less spread. The step is not
    monotone in the ratio, though: budgets a notch tighter than the smallest
    that fits can spread the work better, so once every way is halved, the
    search climbs from each way's smallest fitting ratio by
    :data:`SEARCH_CLIMB` while that is faster.
    Every schedule that fits competes by the step of its plan
    (:func:`plan_simulation`); None where none is below ``step``. Up to
    :data:`SEARCH_BUILDS` schedules, :data:`SEARCH_HALVINGS` halvings and
    :data:`SEARCH_CLIMBS` climbs per way. Optional work
    (:func:`~placer.algorithms.timebox.optional_work`) as a whole and each build
    in it, like :func:`refined_schedule`; within
    :func:`~placer.algorithms.timebox.frugal` (``auto``, Pesto's warm
    start), the search also builds no more schedules than ``spent_builds``,
    those the scheduler built so far, so that it at most doubles what the
    scheduler costs its caller.
    """
    best, best_step = None, step
    whole = np.ones(cluster.num_devices)  # every device's whole capacity
    took_s, builds = fit.took_s, 0
    most_builds = min(SEARCH_BUILDS, spent_builds) if is_frugal() else SEARCH_BUILDS
    # Outcomes by (stage, build, ratio), the stages and builds being the very objects of ``ways``. The
    # retries' first schedules, at the loosest ratio on the nodes, did not fit (else no search); theirs did.
    known: dict[tuple[int, int, float], str] = {
        (id(graph), id(build), low): "overflows" for _, build in ways if low < 1.0
    }
    steps: dict[tuple[int, int, float], float] = {}  # the plan's step of each schedule that fits
    if np.all(fit.scale == 1.0):
        known[id(fit.stage), id(fit.build), fit.ratio] = "fits"
        steps[id(fit.stage), id(fit.build), fit.ratio] = step  # refined: a climb from it must beat that

    def probe(stage: OpGraph, build: Callable[..., Schedule], ratio: float) -> str | None:
        """``"fits"``, ``"overflows"``, ``"infeasible"``; None where the search must stop."""
        nonlocal best, best_step, took_s, builds
        key = (id(stage), id(build), ratio)
        if key in known:
            return known[key]
        box = optional_work(took_s) if builds < most_builds else None
        if box is None:
            return None
        builds += 1
        began = time.perf_counter()
        with box:
            try:
                sched = build(stage, ratio, whole)
            except InfeasibleError:
                outcome = "infeasible"
            else:
                sched.simulated = simulate(graph, cluster, sched.device_of, sched.orders, check=False)
                outcome = "fits" if sched.simulated.fits else "overflows"
                if outcome == "fits":
                    its_step = plan_simulation(graph, cluster, sched, dispatch).makespan_s
        took_s = time.perf_counter() - began
        if box.expired:
            return None
        if outcome == "fits":
            steps[key] = its_step
            if its_step < best_step:
                best, best_step = _Fit(sched, build, stage, ratio, whole, took_s), its_step
        known[key] = outcome
        return outcome

    def halve(stage: OpGraph, build: Callable[..., Schedule]) -> bool:
        """Halve the way's ratio interval; False where the search must stop."""
        lo, hi = low, 1.0
        for ratio in (lo, hi):
            outcome = probe(stage, build, ratio)
            if outcome != "overflows":
                break
        if outcome is None:
            return False
        if ratio == lo or outcome == "overflows":
            return True  # the loosest budgets fit or leave no room, or the tightest overflow: nothing between
        for _ in range(SEARCH_HALVINGS):
            mid = (lo + hi) / 2
            outcome = probe(stage, build, mid)
            if outcome is None:
                return False
            lo, hi = (mid, hi) if outcome == "overflows" else (lo, mid)
        return True

    def climb(stage: OpGraph, build: Callable[..., Schedule]) -> bool:
        """Climb from the way's smallest fitting ratio while faster; False where the search must stop."""
        fitting = [ratio for s, b, ratio in steps if s == id(stage) and b == id(build)]
        if not fitting:
            return True
        ratio = min(fitting)
        for _ in range(SEARCH_CLIMBS):
            above = ratio * SEARCH_CLIMB
            if above >= 1.0:
                return True
            outcome = probe(stage, build, above)
            if outcome is None:
                return False
            if outcome != "fits" or steps[id(stage), id(build), above] >= steps[id(stage), id(build), ratio]:
                return True
            ratio = above
        return True

    def search() -> None:
        # Every way's halvings first: the climbs, which seldom pay as much, get what is left.
        for part in (halve, climb):
            for stage, build in ways:
                if not part(stage, build):
                    return

    # The whole search is optional work too, so that a running time limit leaves room to refine.
    box = optional_work(took_s)
    if box is not None:
        with box:
            search()
    return best


def refined_schedule(
    build: Callable[..., Schedule],
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
