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

__all__ = ["run_trace", "write_run_trace"]


def run_trace(timeline: dict[int, list[tuple[str, float, float, float]]], cluster: Cluster, **other_data) -> dict:
    """The last measured step as a Trace Event Format document: one lane per rank (plan device).

    Each operation is an event from when its inputs were in hand to its end
    (its busy time, as the run's ``op_s`` counts it); the time a
    rank waited for an input from another rank before it is a ``wait`` event.
    Times are in microseconds from the step's start, as in the simulator's trace.

    Parameters
    ----------
    timeline : dict
        :attr:`placer.runtime.distributed.DistributedResult.timeline`.
    cluster : Cluster
        The plan's cluster (rank j is its device j).
    **other_data
        Kept in the document's ``otherData`` (the step's measured and predicted seconds, say).

    Raises
    ------
    PlacerError
        If the run recorded no timeline (ranks on several hosts do not share a clock).

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> timeline = {0: [("a", 0.0, 0.0, 0.5)], 1: [("b", 0.0, 0.5, 1.0)]}
    >>> [(e["name"], e["ts"], e["dur"]) for e in run_trace(timeline, load_cluster("2xcpu"))["traceEvents"] if e["ph"] == "X"]
    [('a', 0.0, 500000.0), ('wait', 0.0, 500000.0), ('b', 500000.0, 500000.0)]
    """
    if not timeline:
        raise PlacerError("the run recorded no timeline: ranks on several hosts do not share a clock")
    events: list[dict] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "ranks (measured)"}}]
    for rank, d in enumerate(cluster.devices):
        events.append(
            {
                "ph": "M",
                "pid": 1,
                "tid": rank,
                "name": "thread_name",
                "args": {"name": f"rank {rank}: {d.name} ({d.kind})"},
            }
        )
    for rank, ops in sorted(timeline.items()):
        for name, began, waited, ended in ops:
            if waited > 0:
                events.append(
                    {
                        "ph": "X",
                        "pid": 1,
                        "tid": rank,
                        "name": "wait",
                        "cat": "wait",
                        "ts": began * 1e6,
                        "dur": waited * 1e6,
                        "args": {"for": name},
                    }
                )
            events.append(
                {
                    "ph": "X",
                    "pid": 1,
                    "tid": rank,
                    "name": name,
                    "cat": "op",
                    "ts": (began + waited) * 1e6,
                    "dur": (ended - began - waited) * 1e6,
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"cluster": cluster.name, **other_data}}


def write_run_trace(path: str | os.PathLike, timeline: dict, cluster: Cluster, **other_data) -> None:
    """Write :func:`run_trace` to ``path`` atomically."""
    write_json_atomic(path, run_trace(timeline, cluster, **other_data))
