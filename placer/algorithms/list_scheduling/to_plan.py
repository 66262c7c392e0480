"""A list schedule as a plan: its placement with its own order, or the reference model's dispatch of it."""

from __future__ import annotations

from ...cluster import Cluster
from ...graph import OpGraph
from ...plan import Plan
from ...sim.simulator import SimResult, simulate
from ..timebox import TimeBox, seconds_left
from .state import Schedule

__all__ = ["plan_from_schedule", "plan_simulation", "DISPATCH_SHARE"]


#: Share of a running time limit's remaining seconds that :func:`plan_from_schedule` may spend on
#: simulating earliest-ready dispatch.
DISPATCH_SHARE = 0.9


def plan_simulation(graph: OpGraph, cluster: Cluster, sched: Schedule, dispatch: bool) -> SimResult:
    """The reference simulation of the plan :func:`plan_from_schedule` makes of ``sched`` (simulated).

    Its own order's; with ``dispatch``, the earliest-ready dispatch of its
    placement where that fits and is faster (simulated once, kept in ``sched.dispatched``).
    """
    if not dispatch:
        return sched.simulated
    if sched.dispatched is None:
        sched.dispatched = simulate(graph, cluster, sched.device_of, check=False)
    faster = sched.dispatched.fits and sched.dispatched.makespan_s < sched.simulated.makespan_s
    return sched.dispatched if faster else sched.simulated


def plan_from_schedule(graph: OpGraph, cluster: Cluster, sched: Schedule, *, dispatch: bool = False, **kwargs) -> Plan:
    """A plan with the schedule's placement and per-device order.

    With ``dispatch``, the order is instead the one the reference model's
    earliest-ready dispatch gives the placement (FORMATS.md, rule 2: no
    order), where that fits and is faster: for placers whose output is a
    placement that the framework then runs (Baechi's), as Celeritas keeps
    the faster of its own order and that one. A schedule's order can lose to
    it where transfers queue on a channel: the channel serves them first
    come, first served, not in the order the schedule booked them. The
    dispatch is optional work: where a time limit is running it may take
    :data:`DISPATCH_SHARE` of what is left, and the schedule's order stays
    where it runs out.

    Parameters
    ----------
    graph, cluster
    sched : Schedule
        A schedule of ``graph``; with ``dispatch`` its simulations are kept in it
        (:attr:`Schedule.simulated`, :attr:`Schedule.dispatched`).
    dispatch : bool
        Whether the reference model's earliest-ready order may replace the schedule's.
    **kwargs
        Passed to :meth:`~placer.plan.Plan.from_arrays`.

    Examples
    --------
    >>> import numpy as np
    >>> from placer.cluster import load_cluster
    >>> g = OpGraph(["a", "b"], [1.0, 2.0], [0], [1], [8], [0])
    >>> sched = Schedule(np.array([1, 1]), [np.array([], dtype=int), np.array([0, 1])],
    ...                  np.array([0.0, 1.0]), np.array([1.0, 3.0]))
    >>> plan_from_schedule(g, load_cluster("2xcpu"), sched).order
    {'cpu0': [], 'cpu1': ['a', 'b']}
    """
    orders = sched.orders
    if dispatch:
        if sched.simulated is None:
            sched.simulated = simulate(graph, cluster, sched.device_of, orders, check=False)
        # Optional: where a time limit is running, it must not cost the plan in hand.
        left = seconds_left()
        with TimeBox(None if left is None else DISPATCH_SHARE * left) as box:
            run = plan_simulation(graph, cluster, sched, dispatch)
        if not box.expired and run is sched.dispatched:
            orders = run.device_orders()
    return Plan.from_arrays(graph, cluster, sched.device_of, orders, **kwargs)
