"""Charts of a simulated step with matplotlib: a Gantt chart and memory over time.

The Gantt chart has one lane per device and one per channel that carried a
transfer; operations are coloured by layer so that a layer split is visible
at a glance, transfers are drawn in their channel's lane. Names are drawn as
written: a ``$`` in a graph, cluster or device name is not read as math.
"""

from __future__ import annotations

import os
import zlib

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..sim.simulator import SimResult  # noqa: E402

__all__ = ["gantt_chart", "memory_chart"]

#: Text as written, never mathtext (``$x^$`` in a name would make matplotlib raise while drawing).
_PLAIN_TEXT = {"text.parse_math": False}


def _layer_colours(result: SimResult) -> list:
    cmap = plt.get_cmap("tab20")
    return [
        cmap(zlib.crc32((layer or op or "").encode()) % 20) for layer, op in zip(result.graph.layer, result.graph.op)
    ]


@matplotlib.rc_context(_PLAIN_TEXT)
def gantt_chart(result: SimResult, path: str | os.PathLike, title: str = "") -> None:
    """Write a PNG Gantt chart of ``result`` (devices, then the channels used, as lanes)."""
    cluster = result.cluster
    xf = result.transfers
    used_channels = sorted(set(xf.channel.tolist()))
    lanes = [d.name for d in cluster.devices] + [cluster.channels[c].name for c in used_channels]
    scale, unit = (1e3, "ms") if result.makespan_s < 10 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(lanes) + 1.6), dpi=100)
    colours = _layer_colours(result)
    for j in range(cluster.num_devices):
        nodes = np.flatnonzero(result.device_of == j)
        ax.broken_barh(
            list(zip(result.start[nodes] * scale, (result.finish[nodes] - result.start[nodes]) * scale)),
            (j - 0.4, 0.8),
            facecolors=[colours[i] for i in nodes],
            linewidth=0,
        )
    for k, c in enumerate(used_channels):
        sel = np.flatnonzero(xf.channel == c)
        ax.broken_barh(
            list(zip(xf.start[sel] * scale, (xf.end[sel] - xf.start[sel]) * scale)),
            (cluster.num_devices + k - 0.3, 0.6),
            facecolors="tab:gray",
            edgecolors="black",
            linewidth=0.3,
        )
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, max(result.makespan_s * scale, 1e-9))
    ax.axvline(result.makespan_s * scale, color="red", linewidth=0.8)
    ax.set_title(title or f"{result.graph.name} on {result.cluster.name}: makespan {result.makespan_s * 1e3:.3f} ms")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@matplotlib.rc_context(_PLAIN_TEXT)
def memory_chart(result: SimResult, path: str | os.PathLike, title: str = "") -> None:
    """Write a PNG of memory in use per device over the step, with each device's capacity."""
    fig, ax = plt.subplots(figsize=(12, 3.2), dpi=100)
    scale, unit = (1e3, "ms") if result.makespan_s < 10 else (1.0, "s")
    for j, d in enumerate(result.cluster.devices):
        times, levels = result.memory_timeline(j)
        times = np.append(times, result.makespan_s)
        levels = np.append(levels, levels[-1])
        (line,) = ax.step(times * scale, levels / 2**30, where="post", label=d.name, linewidth=1)
        ax.axhline(d.memory_bytes / 2**30, color=line.get_color(), linestyle=":", linewidth=0.8)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("GiB in use")
    ax.set_title(title or "memory per device (dotted: capacity)")
    ax.legend(loc="upper right", fontsize="small", ncol=min(8, result.cluster.num_devices))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
