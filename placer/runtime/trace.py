"""Chrome-trace / Perfetto timeline of a measured step, beside the simulator's (:mod:`placer.sim.trace`).

Where the simulator and a run disagree (``bench/fidelity.py``), the two
timelines side by side show where: an operation that ran longer than its
cost, or a rank that waited for a transfer longer than the link model says.
"""

from __future__ import annotations

import os

from ..cluster import Cluster
from ..errors import PlacerError
from ..io import write_json_atomic
from .cli import Measurement
from .distributed import DistributedResult

__all__ = ["run_trace", "write_run_trace"]


def run_trace(result: DistributedResult | Measurement, cluster: Cluster) -> dict:
    """The last measured step as a Trace Event Format document: one lane per rank (plan device).

    Each operation is an event from when its inputs were in hand to its end
    (its busy time, as :attr:`DistributedResult.op_s` counts it); the time a
    rank waited for an input from another rank before it is a ``wait`` event.
    Times are in microseconds from the step's start, as in the simulator's trace.

    Raises
    ------
    PlacerError
        If the run recorded no timeline (ranks on several hosts do not share a clock).

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> run = DistributedResult([1.0], [], {}, timeline={0: [("a", 0.0, 0.0, 0.5)], 1: [("b", 0.0, 0.5, 1.0)]})
    >>> [(e["name"], e["ts"], e["dur"]) for e in run_trace(run, load_cluster("2xcpu"))["traceEvents"] if e["ph"] == "X"]
    [('a', 0.0, 500000.0), ('wait', 0.0, 500000.0), ('b', 500000.0, 500000.0)]
    """
    if not result.timeline:
        raise PlacerError("the run recorded no timeline: ranks on several hosts do not share a clock")
    events: list[dict] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "ranks (measured)"}}]
    for rank, d in enumerate(cluster.devices):
        events.append({"ph": "M", "pid": 1, "tid": rank, "name": "thread_name",
                       "args": {"name": f"rank {rank}: {d.name} ({d.kind})"}})
    for rank, ops in sorted(result.timeline.items()):
        for name, began, waited, ended in ops:
            if waited > 0:
                events.append({"ph": "X", "pid": 1, "tid": rank, "name": "wait", "cat": "wait", "ts": began * 1e6,
                               "dur": waited * 1e6, "args": {"for": name}})
            events.append({"ph": "X", "pid": 1, "tid": rank, "name": name, "cat": "op", "ts": (began + waited) * 1e6,
                           "dur": (ended - began - waited) * 1e6})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"step_s": result.step_s[-1] if result.step_s else None, "predicted_s": result.predicted_s,
                          "cluster": cluster.name}}


def write_run_trace(result: DistributedResult | Measurement, cluster: Cluster, path: str | os.PathLike) -> None:
    """Write :func:`run_trace` to ``path`` atomically."""
    write_json_atomic(path, run_trace(result, cluster))
