"""Machinery shared by the list schedulers (HEFT, DPOS, Baechi's m-ETF, m-TOPO, m-SCT).

A list scheduler takes nodes one at a time, in an order of its own, and
books each on a device and its input transfers on channels, under the
reference model of FORMATS.md, within each device's memory. The modules,
from the bottom up:

- :mod:`.timeline`: busy intervals of a device or channel, and a channel's
  first-come-first-served queue;
- :mod:`.memory`: each device's memory over time;
- :mod:`.tables`: what every schedule of one graph on one cluster reads
  (inputs, units, channels), built once per pair;
- :mod:`.priorities`: the orders nodes are booked in (upward ranks,
  earliest starts);
- :mod:`.state`: the partial schedule (:class:`ScheduleState`) and the
  finished one (:class:`Schedule`);
- :mod:`.retries`: the memory retries, which build schedules until one fits
  under the reference model, then look for a faster one;
- :mod:`.to_plan`: a schedule as a :class:`~placer.plan.Plan`.

Every public name is importable from here. The retries' tuning constants are
re-exported for reading; patch them on :mod:`.retries`, which reads them.
"""

from .memory import MemoryTimeline
from .priorities import (
    earliest_start_priorities,
    edge_transfer_times,
    priority_order,
    scheduling_priorities,
    upward_ranks,
)
from .retries import (
    MOST_RAISE,
    PRESSURE_COST,
    REBUDGETS_AT_FIRST_RATIO,
    REFINE_GAIN,
    REFINEMENTS,
    RETIME_EXCESS,
    SEARCH_BUILDS,
    SEARCH_CLIMB,
    SEARCH_CLIMBS,
    SEARCH_HALVINGS,
    STALE_SCHEDULES,
    rank_ordered_with_memory_retries,
    rebudgeted,
    refined_schedule,
    schedule_with_memory_retries,
    simulated_sends,
)
from .state import BookedTransfer, Booking, Estimate, Schedule, ScheduleState, Send
from .tables import Links, ScheduleTables, schedule_tables, unit_neighbours
from .timeline import QueueOrder, Timeline
from .to_plan import DISPATCH_SHARE, plan_from_schedule, plan_simulation

__all__ = [
    "Schedule",
    "ScheduleState",
    "upward_ranks",
    "edge_transfer_times",
    "Timeline",
    "QueueOrder",
    "schedule_with_memory_retries",
    "plan_from_schedule",
    "priority_order",
    "MemoryTimeline",
    "earliest_start_priorities",
    "simulated_sends",
    "refined_schedule",
    "plan_simulation",
    "rank_ordered_with_memory_retries",
    "scheduling_priorities",
    "rebudgeted",
    "ScheduleTables",
    "schedule_tables",
    "unit_neighbours",
    "Estimate",
    "Booking",
    "BookedTransfer",
    "Send",
    "Links",
    "DISPATCH_SHARE",
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
