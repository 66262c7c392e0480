"""Chrome-trace / Perfetto timeline of a simulated step: one lane per device and per channel."""

from __future__ import annotations

import os

from ..io import write_json_atomic
from .simulator import SimResult

__all__ = ["chrome_trace", "write_trace"]


def chrome_trace(result: SimResult) -> dict:
    """The step as a Trace Event Format document (open it in ui.perfetto.dev or chrome://tracing).

    Devices are threads of process 1, channels threads of process 2; times are
    in microseconds as the format requires.
    """
    g, cluster = result.graph, result.cluster
    events: list[dict] = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "devices"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "channels"}},
    ]
    for j, d in enumerate(cluster.devices):
        events.append({"ph": "M", "pid": 1, "tid": j, "name": "thread_name", "args": {"name": f"{d.name} ({d.kind})"}})
    for c, ch in enumerate(cluster.channels):
        events.append({"ph": "M", "pid": 2, "tid": c, "name": "thread_name", "args": {"name": ch.name}})
    for i in range(g.num_nodes):
        events.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": int(result.device_of[i]),
                "name": g.ids[i],
                "cat": g.op[i] or "op",
                "ts": result.start[i] * 1e6,
                "dur": (result.finish[i] - result.start[i]) * 1e6,
                "args": {"layer": g.layer[i], "output_bytes": int(g.output_bytes[i])},
            }
        )
    xf = result.transfers
    for x in range(len(xf)):
        src, dst = cluster.devices[xf.src_device[x]].name, cluster.devices[xf.dst_device[x]].name
        events.append(
            {
                "ph": "X",
                "pid": 2,
                "tid": int(xf.channel[x]),
                "name": f"{g.ids[xf.producer[x]]}:{int(xf.tensor[x])}",
                "cat": "transfer",
                "ts": xf.start[x] * 1e6,
                "dur": (xf.end[x] - xf.start[x]) * 1e6,
                "args": {"bytes": int(xf.nbytes[x]), "from": src, "to": dst, "queued_us": xf.queued[x] * 1e6},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"makespan_s": result.makespan_s, "graph": g.name, "cluster": cluster.name},
    }


def write_trace(result: SimResult, path: str | os.PathLike) -> None:
    """Write :func:`chrome_trace` to ``path`` atomically."""
    write_json_atomic(path, chrome_trace(result))
