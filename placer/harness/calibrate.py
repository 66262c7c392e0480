"""Communication calibration: measure transfers, fit latency + bytes / bandwidth per link.

Pesto (section 3) and FastT (section 4.1) model the time of a transfer as
linear in its size, ``t = latency + bytes / bandwidth``, with both parameters
fitted per link type. This module measures transfers of growing sizes on the
devices at hand:

* ``gloo``: CPU processes of this host exchanging tensors over
  torch.distributed's gloo backend on 127.0.0.1 (the transport of the
  one-process-per-device runtime), with the host cost of a message;
* ``cuda-peer``, ``host-to-device``, ``device-to-host``: CUDA copies where GPUs exist.

It fits each link type by least squares, reports R^2, and writes a
``placer.calibration/1`` file that :func:`apply_calibration` applies to a cluster.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from ..algorithms import place
from ..cluster import Channel, Cluster, load_cluster
from ..cost.profile import Profile, apply_profile
from ..errors import FormatError, OptionError, PlacerError
from ..io import Field, check_format, check_number, read_json, write_json_atomic
from ..sim.messages import MessageCost, fit_after_message, spread_over_gaps
from ..terminate import signals_deferred, terminate_raises
from ..transform.bind import bind_plan
from .feedback import own_times
from .profiling import profile_module

__all__ = [
    "LinkFit",
    "Calibration",
    "COLLECTIVE_KINDS",
    "GlooMeasurements",
    "CALIBRATION_FORMAT",
    "DEFAULT_SIZES",
    "PROBE_MODEL",
    "fit_link",
    "measure_gloo",
    "measure_probe",
    "measure_cuda",
    "calibrate",
    "load_calibration",
    "apply_calibration",
]

CALIBRATION_FORMAT = "placer.calibration/1"

#: 1 KiB to 64 MiB by factors of 4.
DEFAULT_SIZES: tuple[int, ...] = tuple(1024 * 4**k for k in range(9))
#: The largest message whose host cost :func:`measure_gloo` times (a plan's are mostly far smaller).
MESSAGE_SIZE_LIMIT = 4 << 20
#: Round trips timed per transfer size up to ``MESSAGE_SIZE_LIMIT`` (at least; cheap, and a median of a few
#: can land on a scheduler's slice where the ranks share cores, which moves the fitted latency tenfold).
SMALL_TRIPS = 21
#: The computation between messages in the streams whose host cost :func:`measure_gloo` times: from
#: back to back (a round-robin plan's hundreds per step) to milliseconds apart (an expert split's few).
MESSAGE_GAPS: tuple[float, ...] = (0.0, 25e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3)
#: The size of a streamed message (small: its cost is the fixed part).
STREAM_MESSAGE_BYTES = 1024
#: Messages each way whose one-way time :func:`measure_gloo` takes while their ranks compute (a mean over
#: them: a few take a scheduler's slice).
LOADED_MESSAGES = 300
#: The computation before each of those messages on its sender; it computes half as long after sending.
LOADED_WORK_S = 1e-3
#: The model spec and batch of :func:`measure_probe`'s run: a small ResNet (bench/fidelity.py's
#: ``resnet``), placed round robin: hundreds of messages a step, of every size from bytes to megabytes.
PROBE_MODEL: tuple[str, int] = ("zoo:resnet50?depth=14&image_size=32&width=8&classes=10", 32)
#: Steps of the probe's run (the first is not timed).
PROBE_STEPS = 6
#: The ``torch.distributed`` collectives a data-parallel plan's buckets run as on one process per device
#: (:mod:`placer.runtime.replicas`): a bucket's all-reduce (a sharded optimizer's reduce-scatter runs as
#: one too), a sharded optimizer's all-gather of the updated shards.
COLLECTIVE_KINDS = ("all_reduce", "all_gather")


@dataclass
class LinkFit:
    """``seconds = latency_s + bytes / bandwidth_bytes_per_s`` for one link type.

    ``samples`` holds the measured ``(bytes, seconds)`` points; ``r2`` is the
    coefficient of determination of the fit over them, in relative terms (residuals
    divided by the measured time, as the fit weighs them).
    """

    latency_s: float
    bandwidth_bytes_per_s: float
    r2: float
    samples: list[tuple[int, float]] = field(default_factory=list)

    def predict(self, nbytes) -> np.ndarray:
        return self.latency_s + np.asarray(nbytes, dtype=np.float64) / self.bandwidth_bytes_per_s


def fit_link(nbytes: Sequence[float], seconds: Sequence[float], link: str = "link") -> LinkFit:
    """Least-squares fit of ``seconds = latency + bytes / bandwidth``.

    The residuals are weighted by ``1 / seconds`` (relative error), so that the latency,
    which only matters for small transfers, is not drowned by the large ones.

    Parameters
    ----------
    nbytes, seconds : sequence of float
        Measured transfer sizes and times (at least two distinct sizes).
    link : str
        The link's name, for error messages.

    Returns
    -------
    LinkFit

    Raises
    ------
    PlacerError
        Fewer than two distinct sizes, non-positive times, or times that do not grow
        with size (no positive bandwidth).

    References
    ----------
    Hafeez et al., "Pesto", 2021, section 3 (linear communication model);
    Yi et al., "FastT", 2020, section 4.1 (latency and bandwidth per device pair).

    Examples
    --------
    >>> f = fit_link([1e3, 1e6, 1e7], [1e-5 + 1e3 / 2e9, 1e-5 + 1e6 / 2e9, 1e-5 + 1e7 / 2e9])
    >>> round(f.latency_s * 1e6, 6), round(f.bandwidth_bytes_per_s / 1e9, 6), round(f.r2, 6)
    (10.0, 2.0, 1.0)
    """
    x = np.asarray(nbytes, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if x.shape != y.shape or np.unique(x).size < 2:
        raise PlacerError(f"link {link!r}: need transfers of at least two distinct sizes to fit")
    if not (np.all(np.isfinite(y)) and np.all(y > 0)):
        raise PlacerError(f"link {link!r}: measured times must be finite and > 0")
    w = 1.0 / y
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    if not per_byte > 0:
        raise PlacerError(f"link {link!r}: transfer time does not grow with size; cannot fit a bandwidth")
    # R^2 in the same relative terms as the fit (weighted residuals and weighted mean).
    residual = (y - (latency + per_byte * x)) * w
    weighted_mean = np.sum(y * w * w) / np.sum(w * w)
    total = np.sum(((y - weighted_mean) * w) ** 2)
    r2 = 1.0 - float(np.sum(residual**2) / total) if total > 0 else 1.0
    return LinkFit(
        float(latency), float(1.0 / per_byte), r2, [(int(a), float(b)) for a, b in zip(x.tolist(), y.tolist())]
    )


@dataclass
class Calibration:
    """Fitted links (link type -> :class:`LinkFit`), where they were measured, and (gloo) the host
    cost of a message with the ``(0, 1, bytes, sending seconds, receiving seconds)`` it was fitted to,
    and the seconds the last rank to reach a barrier spends in it (what ends a step of
    :mod:`placer.runtime.distributed` after its last operation, with its last sends); and (gloo)
    the ``torch.distributed`` collectives a data-parallel plan's buckets run as, fitted per kind
    (``all_reduce``, ``all_gather``: seconds against the bucket's bytes, on ``meta["ranks"]`` ranks).

    ``loaded_latency_s`` (gloo) is the latency a message a rank waits for has while the ranks compute: the
    mean one-way time of small messages sent by a computing rank to one asleep in its receive, less their
    bytes' time over the fitted link. On a host whose cores the ranks share it is several times the idle
    ping-pong's fitted latency, and it is what a step's waits pay (an idle ping-pong also swings tenfold
    where a host's idle cores are slow to wake), so :func:`apply_calibration` gives it to the backend's
    channels in place of the fitted latency."""

    links: dict[str, LinkFit]
    meta: dict[str, Any] = field(default_factory=dict)
    message_cost: MessageCost | None = None
    message_samples: list[tuple[int, int, int, float, float]] = field(default_factory=list)
    barrier_s: float | None = None
    collectives: dict[str, LinkFit] = field(default_factory=dict)
    loaded_latency_s: float | None = None

    def to_dict(self) -> dict:
        doc = {"format": CALIBRATION_FORMAT, **self.meta, "links": _fits_to_dict(self.links)}
        if self.message_cost is not None:
            doc["messages"] = {**self.message_cost.to_dict(), "samples": [list(m) for m in self.message_samples]}
        if self.barrier_s is not None:
            doc["barrier_s"] = self.barrier_s
        if self.collectives:
            doc["collectives"] = _fits_to_dict(self.collectives)
        if self.loaded_latency_s is not None:
            doc["loaded_latency_s"] = self.loaded_latency_s
        return doc

    def save(self, path: str | os.PathLike) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(cls, doc: Any, source: str | None = None) -> "Calibration":
        """Read a ``placer.calibration/1`` document.

        Raises
        ------
        FormatError
            Naming the file, the link and the field at fault.
        """
        where = f"calibration {source}" if source else "calibration"
        check_format(doc, CALIBRATION_FORMAT, where)
        top = Field(doc, where)
        links = _fits_from_dict(top.mapping("links", required=True), f"{where}: link")
        message_cost, message_samples = None, []
        messages = top.mapping("messages")
        if messages is not None:
            where_messages = f"{where}: field 'messages'"
            message_cost = MessageCost.from_dict({k: v for k, v in messages.items() if k != "samples"}, where_messages)
            for k, m in enumerate(Field(messages, where_messages).array("samples") or []):
                if not (isinstance(m, list) and len(m) == 5):
                    raise FormatError(
                        f"{where_messages}: sample #{k} must be [source, destination, bytes, "
                        f"sending seconds, receiving seconds], got {m!r}"
                    )
                numbers = [check_number(x, f"{where_messages}: sample #{k}") for x in m]
                message_samples.append((int(numbers[0]), int(numbers[1]), int(numbers[2]), numbers[3], numbers[4]))
        barrier_s = top.number("barrier_s")
        collectives = _fits_from_dict(top.mapping("collectives") or {}, f"{where}: collective")
        unknown = sorted(set(collectives) - set(COLLECTIVE_KINDS))
        if unknown:
            raise FormatError(
                f"{where}: collective {unknown[0]!r} is not one placer measures ({', '.join(COLLECTIVE_KINDS)})"
            )
        loaded_latency_s = top.number("loaded_latency_s")
        meta = top.extra({"format", "links", "messages", "barrier_s", "collectives", "loaded_latency_s"})
        return cls(links, meta, message_cost, message_samples, barrier_s, collectives, loaded_latency_s)


def _fits_to_dict(fits: dict[str, LinkFit]) -> dict:
    return {
        name: {
            "latency_s": f.latency_s,
            "bandwidth_bytes_per_s": f.bandwidth_bytes_per_s,
            "r2": f.r2,
            "samples": [list(s) for s in f.samples],
        }
        for name, f in fits.items()
    }


def _fits_from_dict(raw_fits: dict, what: str) -> dict[str, LinkFit]:
    """Fits by name from a calibration file's ``links`` or ``collectives``; errors name ``what`` and the name."""
    fits = {}
    for name, raw in raw_fits.items():
        f = Field(raw, f"{what} {name!r}")
        samples = []
        for k, s in enumerate(f.array("samples") or []):
            if not (isinstance(s, list) and len(s) == 2):
                raise FormatError(f"{f.where}: sample #{k} must be [bytes, seconds], got {s!r}")
            samples.append(
                (
                    int(check_number(s[0], f"{f.where}: sample #{k} bytes")),
                    check_number(s[1], f"{f.where}: sample #{k} seconds"),
                )
            )
        fits[name] = LinkFit(
            latency_s=f.number("latency_s", required=True, minimum=None),
            bandwidth_bytes_per_s=f.number("bandwidth_bytes_per_s", required=True, positive=True),
            r2=f.number("r2", default=float("nan"), minimum=None),
            samples=samples,
        )
    return fits


def load_calibration(path: str | os.PathLike) -> Calibration:
    """Read and validate a calibration file (see :meth:`Calibration.from_dict`)."""
    return Calibration.from_dict(read_json(path, "calibration file"), source=str(path))


def apply_calibration(cluster: Cluster, calibration: Calibration, link_map: dict[str, str] | None = None) -> Cluster:
    """A copy of ``cluster`` whose channels take the fitted latency and bandwidth.

    Parameters
    ----------
    cluster : Cluster
        Channels name their link type in ``extra["link"]`` (as the presets do).
    calibration : Calibration
    link_map : dict, optional
        Channel link type -> calibration link type, for links measured under another
        name (e.g. ``{"nvswitch": "cuda-peer"}``). By default a channel takes the fit of
        the link type of the same name.

    Returns
    -------
    Cluster
        Named ``NAME-calibrated`` (a plan made on it names a cluster of its own, not the
        preset or file it was calibrated from, whose figures differ). Calibrated channels
        carry ``extra["calibrated_from"]``; where the calibration timed ``torch.distributed``'s
        collectives over that link (gloo), also ``extra["collectives"]``: ``{"ranks": n, kind:
        {"latency_s": ..., "bandwidth_bytes_per_s": ...}}`` for each of :data:`COLLECTIVE_KINDS`,
        which data-parallel plans cost their buckets by
        (:func:`~placer.transform.replicate.collective_cost`). Where it measured the latency of
        messages waited for while the ranks compute (gloo, :attr:`Calibration.loaded_latency_s`),
        the backend's channels take it in place of the fitted one. Where it timed a message's
        host cost (gloo) and some channel took that backend's fit, the cluster carries
        it as ``extra["message_cost"]`` (:meth:`~placer.sim.messages.MessageCost.to_dict`;
        :func:`~placer.sim.messages.cluster_message_cost` reads it), which ``auto`` ranks
        its members' plans by. A negative fitted latency (possible with noisy points) is
        applied as 0.

    Raises
    ------
    OptionError
        If no channel of the cluster matches a calibrated link.
    """
    link_map = dict(link_map or {})
    channels, matched = [], 0
    for ch in cluster.channels:
        link = ch.extra.get("link")
        fit = calibration.links.get(link_map.get(link, link)) if link is not None else None
        if fit is None:
            channels.append(ch)
            continue
        matched += 1
        extra = {**ch.extra, "calibrated_from": link_map.get(link, link)}
        extra.pop("collectives", None)  # an earlier calibration's
        if calibration.collectives and link_map.get(link, link) == calibration.meta.get("backend"):
            extra["collectives"] = {
                "ranks": int(calibration.meta.get("ranks", 2)),
                **{
                    kind: {"latency_s": max(0.0, f.latency_s), "bandwidth_bytes_per_s": f.bandwidth_bytes_per_s}
                    for kind, f in calibration.collectives.items()
                },
            }
        latency_s = max(0.0, fit.latency_s)
        if calibration.loaded_latency_s is not None and link_map.get(link, link) == calibration.meta.get("backend"):
            latency_s = calibration.loaded_latency_s
        channels.append(Channel(ch.name, fit.bandwidth_bytes_per_s, latency_s, ch.pairs, extra))
    if not matched:
        have = sorted({str(ch.extra.get("link")) for ch in cluster.channels})
        raise OptionError(
            f"calibration links {sorted(calibration.links)} match no channel of cluster "
            f"{cluster.name!r} (its links: {have}); map one (link_map; --link CHANNEL_LINK=MEASURED_LINK)"
        )
    name = cluster.name if cluster.name.endswith("-calibrated") else f"{cluster.name}-calibrated"  # once, again
    extra = dict(cluster.extra)
    extra.pop("message_cost", None)  # an earlier calibration's
    backend = calibration.meta.get("backend")
    if calibration.message_cost is not None and any(ch.extra.get("calibrated_from") == backend for ch in channels):
        extra["message_cost"] = calibration.message_cost.to_dict()
    return Cluster(name, cluster.devices, channels, extra=extra)


# ----------------------------------------------------------------- measuring
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_worker(
    rank: int, ranks: int, port: int, sizes: list[int], repeats: int, timeout_s: float, out_dir: str
) -> None:
    """One process of :func:`measure_gloo`: rank 0 ping-pongs with every other rank."""

    import torch  # deferred: imports torch
    import torch.distributed as dist  # deferred: imports torch

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks, timeout=timedelta(seconds=timeout_s)
    )
    samples, messages, streams, after_message = [], [], [], []
    pair = dist.new_group([0, 1])  # every rank must create it
    try:
        for peer in range(1, ranks):
            warm = torch.zeros(1024)
            for _ in range(5):  # open and warm the connection before timing anything
                if rank == 0:
                    dist.send(warm, peer)
                    dist.recv(warm, peer)
                elif rank == peer:
                    dist.recv(warm, 0)
                    dist.send(warm, 0)
            for size in sizes:
                buf = torch.zeros(max(1, size // 4), dtype=torch.float32)
                trips = []
                for rep in range((max(repeats, SMALL_TRIPS) if size <= MESSAGE_SIZE_LIMIT else repeats) + 1):
                    # the first round trip warms the connection up
                    if rank == 0:
                        t0 = time.perf_counter()
                        dist.send(buf, peer)
                        dist.recv(buf, peer)
                        trips.append(time.perf_counter() - t0)
                    elif rank == peer:
                        dist.recv(buf, 0)
                        dist.send(buf, 0)
                if rank == 0:
                    samples.append([buf.numel() * 4, statistics.median(trips[1:]) / 2])
        if rank < 2:
            messages = _message_host_times(rank, pair, [s for s in sizes if s <= MESSAGE_SIZE_LIMIT], repeats)
            streams = _stream_host_times(rank, pair, MESSAGE_GAPS, max(16, repeats))
            after_message = _operation_after_message_s(rank, pair, max(32, repeats))
        barrier = _last_rank_barrier_s(rank, ranks, max(16, repeats))
        collectives = _collective_times(ranks, sizes, repeats)
        loaded = _loaded_one_way_s(rank, ranks, max(LOADED_MESSAGES, repeats), out_dir)
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "trips": samples,
                "messages": messages,
                "streams": streams if rank < 2 else [],
                "after_message": after_message,
                "loaded": loaded,
                "barrier": barrier,
                "collectives": collectives,
            }
        )
    )


def _last_rank_barrier_s(rank: int, ranks: int, count: int) -> float | None:
    """Median seconds the last rank to reach a barrier of all ``ranks`` spends in it (the others wait there
    already), as the rank that ends a runtime's step last does; None on the other ranks."""
    import torch.distributed as dist  # deferred: imports torch

    times = []
    for _ in range(count + 1):  # the first one warms up
        dist.barrier()
        if rank == ranks - 1:
            time.sleep(0.002)  # until the others surely wait
        began = time.perf_counter()
        dist.barrier()
        times.append(time.perf_counter() - began)
    return statistics.median(times[1:]) if rank == ranks - 1 else None


def _collective_times(ranks: int, sizes: list[int], repeats: int) -> dict[str, list[list[float]]]:
    """``[bytes, median seconds]`` of each of :data:`COLLECTIVE_KINDS` on a flat bucket of each size, run
    by the runtime's own functions (start, then wait: what a rank spends when it waits at once)."""
    import torch  # deferred: imports torch
    import torch.distributed as dist  # deferred: imports torch

    from ..runtime.replicas import all_gather_start, all_reduce_start, collective_wait

    out: dict[str, list[list[float]]] = {kind: [] for kind in COLLECTIVE_KINDS}
    rank = dist.get_rank()
    for size in sizes:
        chunk = max(1, size // 4 // ranks)
        bucket = torch.zeros(chunk * ranks)
        runs = {
            "all_reduce": lambda: collective_wait(all_reduce_start(bucket)),
            "all_gather": lambda: collective_wait(all_gather_start(bucket, chunk, rank, list(range(ranks)))),
        }
        for kind in COLLECTIVE_KINDS:
            times = []
            for _ in range(repeats + 1):  # the first one warms up
                dist.barrier()
                began = time.perf_counter()
                runs[kind]()
                times.append(time.perf_counter() - began)
            out[kind].append([bucket.numel() * 4, statistics.median(times[1:])])
    return out


def _message_host_times(rank: int, pair, sizes: list[int], repeats: int) -> list[list[float]]:
    """``[bytes, median host seconds]`` of one message per size, on rank 0 sending it, on rank 1 receiving it.

    As the runtime handles a message: the receive is posted before the send
    (a step posts them all at its start) and waited for once the message is
    there (the wait does not block), the sender's call returns before it is
    delivered (``isend``).
    """
    import torch  # deferred: imports torch
    import torch.distributed as dist  # deferred: imports torch

    out = []
    for size in sizes:
        value = torch.ones(max(1, size // 4))
        times = []
        for rep in range(repeats + 1):  # the first one warms up
            began = time.perf_counter()
            if rank == 1:
                buf = torch.empty_like(value)
                work = dist.irecv(buf, src=0, tag=rep)
            spent = time.perf_counter() - began
            dist.barrier(group=pair)
            if rank == 0:
                began = time.perf_counter()
                work = dist.isend(value.view(-1), dst=1, tag=rep)
                spent = time.perf_counter() - began
                work.wait()
            dist.barrier(group=pair)
            if rank == 1:
                time.sleep(0.002 + size / 1e9)  # until it has surely arrived
                began = time.perf_counter()
                work.wait()
                buf.view(value.shape)
                spent += time.perf_counter() - began
            times.append(spent)
        out.append([value.numel() * 4, statistics.median(times[1:])])
    return out


def compute_until(deadline: float, operation) -> None:
    """Run ``operation`` (a small tensor operation, as a rank runs between its messages) again and again
    until ``time.perf_counter()`` reaches ``deadline``: a busy rank, where sleeping would idle its thread."""
    while time.perf_counter() < deadline:
        operation()


def _stream_host_times(rank: int, pair, gaps: Sequence[float], count: int) -> list[list]:
    """``[gap, [sending seconds], [receiving seconds]]`` of the messages of this rank (0 or 1) in streams of
    ``count`` each way with ``gap`` seconds of computation between one message and the next, for each gap.

    As a step handles them: each rank posts every receive first, then sends its
    peer a message and takes the peer's next one in turn, computing for ``gap``
    before each, taking each a millisecond after it was sent. A receive's cost
    is its posting, its wait (none where the wait blocked, as the runtime counts
    it) and unpacking. Messages go both ways at once, as in a plan's run: a rank
    that only sends pays less per message than one that also receives.
    """
    import torch  # deferred: imports torch
    import torch.distributed as dist  # deferred: imports torch

    from ..runtime.distributed import BLOCKED_WAIT_S  # deferred: imports torch

    work = torch.ones(4096)
    clock = time.perf_counter

    def step_work() -> None:
        work.mul_(1.0)

    peer = 1 - rank
    value = torch.ones(STREAM_MESSAGE_BYTES // 4)
    lag = 1e-3
    out = []
    for gap in gaps:
        total = count + 2  # the first two each way warm up
        sent_s, received_s = [], []
        posted = []
        for i in range(total):
            began = clock()
            buf = torch.empty_like(value)
            posted.append((dist.irecv(buf, src=peer, tag=i), buf, clock() - began))
        dist.barrier(group=pair)
        start = clock()
        sending = []
        for i, (received, buf, spent) in enumerate(posted):
            compute_until(start + 2 * i * gap, step_work)
            began = clock()
            sending.append(dist.isend(value, dst=peer, tag=i))
            sent_s.append(clock() - began)
            compute_until(start + lag + (2 * i + 1) * gap, step_work)
            began = clock()
            received.wait()
            if clock() - began > BLOCKED_WAIT_S:
                began = clock()  # it blocked: waiting, not work
            buf.view(value.shape)
            received_s.append(spent + clock() - began)
        for request in sending:
            request.wait()
        dist.barrier(group=pair)
        out.append([gap, sent_s[2:], received_s[2:]])
    return out


def _operation_after_message_s(rank: int, pair, count: int) -> list[float]:
    """``[after sending, after receiving, after waiting]``: how much longer a small operation takes on this
    rank (0 or 1) right after it sent a message, received one that was there, or received one it waited
    for (a millisecond, its thread asleep), than right after another operation; medians over ``count``
    messages each way (waited for by each rank in turn).

    A profile times every operation right after another, but in a placed step
    the operation right after a message runs longer, most of all after a
    receive its thread slept in, whether or not it reads the received tensor:
    the cost comes from the operation's place, not its data
    (``bench/op_slowdown.py --part receive`` shows it).
    """
    import torch  # deferred: imports torch
    import torch.distributed as dist  # deferred: imports torch

    clock = time.perf_counter
    small = torch.ones(64)
    value = torch.ones(STREAM_MESSAGE_BYTES // 4)
    peer = 1 - rank

    def excess_s() -> float:
        """The first of two small operations' seconds less the second's."""
        began = clock()
        torch.add(small, 1.0)
        first = clock() - began
        began = clock()
        torch.add(small, 1.0)
        return first - (clock() - began)

    def compute_for(seconds: float) -> None:
        compute_until(clock() + seconds, lambda: torch.add(small, 1.0))

    after_sending, after_receiving = [], []
    for i in range(count + 2):  # the first two warm up
        buf = torch.empty_like(value)
        received = dist.irecv(buf, src=peer, tag=i)
        dist.barrier(group=pair)
        # Operations between the barrier and the send (the first after the barrier's wait is slow too), and
        # between the send and the wait, long enough for the peer's message to be there (no blocking wait).
        compute_for(50e-6)
        sending = dist.isend(value, dst=peer, tag=i)
        after_sending.append(excess_s())
        compute_for(200e-6)
        received.wait()
        after_receiving.append(excess_s())
        sending.wait()
    after_waiting = []
    for i in range(count + 2):
        buf = torch.empty_like(value)
        received = dist.irecv(buf, src=peer, tag=i)
        dist.barrier(group=pair)
        if i % 2 == rank:  # this rank waits; its peer computes a millisecond first
            sending = dist.isend(value, dst=peer, tag=i)
            received.wait()
            after_waiting.append(excess_s())
        else:
            compute_for(1e-3)
            sending = dist.isend(value, dst=peer, tag=i)
            received.wait()
        sending.wait()
    return [
        statistics.median(after_sending[2:]),
        statistics.median(after_receiving[2:]),
        statistics.median(after_waiting[1:]),
    ]


def _loaded_one_way_s(rank: int, ranks: int, count: int, out_dir: str) -> list[float]:
    """Seconds from a send to the end of the receive that waited for it, of the ``count`` messages this rank
    received from its pair's other rank while both took turns computing.

    As a placed step's waits go: the ranks pair off (0 with 1, 2 with 3, ...)
    and take turns; the sender computes, sends (``isend``, the clock in the
    message: ranks on one host share it) and computes on; the receiver waits
    for it, asleep since its own last send, so half the ranks compute at any
    time. A rank left without a pair computes until rank 0 says (a file in
    ``out_dir``) that its messages are done, and returns []. Only receives that
    began waiting before the send count; the sends are waited for at the end,
    as a step's are.
    """
    import torch  # deferred: imports torch
    import torch.distributed as dist  # deferred: imports torch

    clock = time.perf_counter
    work = torch.ones(4096)

    def step_work() -> None:
        work.mul_(1.0)

    done = Path(out_dir, "loaded-done")  # a gloo receive cannot be polled: a file can
    peer = rank ^ 1
    if peer >= ranks:
        while not done.exists():
            compute_until(clock() + 1e-4, step_work)
        return []
    stamp = torch.zeros(STREAM_MESSAGE_BYTES // 8, dtype=torch.float64)
    one_way, sending = [], []
    for i in range(2 * count + 2):  # the first message each way warms up
        if i % 2 == rank % 2:
            compute_until(clock() + LOADED_WORK_S, step_work)
            stamp = stamp.clone()  # the runtime's sends are waited for as its step ends: one buffer each
            stamp[0] = clock()
            sending.append(dist.isend(stamp, dst=peer, tag=i))
            compute_until(clock() + LOADED_WORK_S / 2, step_work)
        else:
            buf = torch.empty_like(stamp)
            waiting_since = clock()
            dist.recv(buf, src=peer, tag=i)
            arrived = clock()
            if i >= 2 and waiting_since < buf[0].item():
                one_way.append(arrived - buf[0].item())
    for request in sending:
        request.wait()
    if rank == 0:
        done.touch()
    return one_way


class GlooMeasurements(NamedTuple):
    """What :func:`measure_gloo` measured (the fields are its steps')."""

    #: (bytes, one-way seconds) of each transfer size
    trips: list[tuple[int, float]]
    #: (0, 1, bytes, sending seconds, receiving seconds) of a message alone
    messages: list[tuple[int, int, int, float, float]]
    #: (gap seconds, sending seconds, receiving seconds) of messages in streams
    streams: list[tuple[float, float, float]]
    #: (after sending, after receiving, after waiting) seconds an operation loses
    after_message: tuple[float, float, float]
    #: seconds the last rank to reach a barrier spends in it
    barrier_s: float
    #: collective kind -> (bucket bytes, seconds) of each size
    collectives: dict[str, list[tuple[int, float]]]
    #: one-way seconds of the messages ranks 0 and 1 waited for while the ranks computed (both ways)
    loaded: list[float]


def measure_gloo(
    ranks: int = 2, sizes: Iterable[int] = DEFAULT_SIZES, repeats: int = 5, timeout_s: float = 120.0
) -> GlooMeasurements:
    """One-way transfer times between CPU processes over gloo on 127.0.0.1, and a message's host cost.

    Spawns ``ranks`` processes and measures, in turn:

    1. transfers: rank 0 ping-pongs a tensor of each size with every other
       rank (``repeats`` times, at least ``SMALL_TRIPS`` up to
       ``MESSAGE_SIZE_LIMIT``); a one-way time is half the median round trip;
    2. a message's host cost: rank 0 sends rank 1 messages of each size up to
       ``MESSAGE_SIZE_LIMIT`` as the runtime does (``isend`` to a posted
       ``irecv``), one at a time, each side timing its median cost (what
       :class:`placer.sim.messages.MessageCost` fits);
    3. costs by gap: streams of ``STREAM_MESSAGE_BYTES`` messages both ways
       between ranks 0 and 1 with each of ``MESSAGE_GAPS`` of computation between
       them (medians over both ranks; :attr:`~placer.sim.messages.MessageCost.by_gap`);
    4. how much longer an operation takes right after a message than after
       another operation (the mean of both ranks' medians, after sending, after
       receiving, after waiting to receive);
    5. the median seconds the last rank to reach a barrier of all ranks spends
       in it: how a runtime's step ends;
    6. the seconds of each ``torch.distributed`` collective a data-parallel
       plan's buckets run as (:data:`COLLECTIVE_KINDS`), on every size, all
       ranks taking part (rank 0's medians);
    7. the one-way time of ``LOADED_MESSAGES`` small messages each way within
       pairs of ranks that take turns computing, each waited for by its receiver
       while its sender computes on: what a rank waiting for another's output in
       a step sees, more than an idle ping-pong's (:attr:`Calibration.loaded_latency_s`).

    Returns
    -------
    GlooMeasurements

    Raises
    ------
    OptionError
        If ``ranks < 2`` or ``repeats < 1`` or a size is not positive.
    PlacerError
        If the processes fail or do not finish within ``timeout_s`` (they are killed, as they are
        when this process is interrupted or terminated).
    """
    sizes = [int(s) for s in sizes]
    if ranks < 2:
        raise OptionError(f"option 'ranks' must be >= 2 to measure transfers, got {ranks}")
    if repeats < 1:
        raise OptionError(f"option 'repeats' must be >= 1, got {repeats}")
    if not sizes or min(sizes) < 4:
        raise OptionError(f"option 'sizes' must list sizes of at least 4 bytes, got {sizes}")
    port = _free_port()
    # Fresh interpreters (not multiprocessing's spawn, which re-imports the caller's
    # __main__ and breaks on scripts without a main guard).
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    # Terminated (SIGTERM) or interrupted, no rank outlives this process and the directory goes with it.
    with terminate_raises(), tempfile.TemporaryDirectory(prefix="placer-calibrate-") as out_dir:
        procs = []
        deadline = time.monotonic() + timeout_s
        errors, hung = {}, False
        try:
            for rank in range(ranks):
                args = json.dumps([rank, ranks, port, sizes, repeats, timeout_s, out_dir])
                code = (
                    f"import json; from placer.harness.calibrate import _gloo_worker; "
                    f"_gloo_worker(*json.loads({args!r}))"
                )
                with signals_deferred():  # a rank started is a rank known, and stopped below
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, "-c", code],
                            env=env,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE,
                            text=True,
                        )
                    )
            for rank, p in enumerate(procs):
                try:
                    _, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    hung = True
                    p.kill()
                    p.communicate()
                    continue
                if p.returncode != 0:
                    errors[rank] = (err.strip().splitlines() or [f"status {p.returncode}"])[-1]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if hung:
            raise PlacerError(f"gloo calibration did not finish within {timeout_s:g} s (processes killed)")
        if errors:
            rank, message = next(iter(errors.items()))
            raise PlacerError(f"gloo calibration: rank {rank} failed: {message}")
        sender, receiver = (json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in (0, 1))
        trips = [(int(b), float(t)) for b, t in sender["trips"]]
        messages = [
            (0, 1, int(b), float(sent), float(received))
            for (b, sent), (_, received) in zip(sender["messages"], receiver["messages"])
        ]
        streams = [
            (float(gap), statistics.median(sent + sent_by_1), statistics.median(received + received_by_1))
            for (gap, sent, received), (_, sent_by_1, received_by_1) in zip(sender["streams"], receiver["streams"])
        ]
        after_message = tuple(
            float(np.mean(sides)) for sides in zip(sender["after_message"], receiver["after_message"])
        )
        last = json.loads(Path(out_dir, f"rank{ranks - 1}.json").read_text())
        collectives = {kind: [(int(b), float(t)) for b, t in points] for kind, points in sender["collectives"].items()}
        loaded = [
            float(t) for r in range(ranks) for t in json.loads(Path(out_dir, f"rank{r}.json").read_text())["loaded"]
        ]
        return GlooMeasurements(trips, messages, streams, after_message, float(last["barrier"]), collectives, loaded)


def measure_probe(
    cost: MessageCost, model: tuple[str, int] = PROBE_MODEL, *, steps: int = PROBE_STEPS, timeout_s: float = 120.0
) -> tuple[MessageCost, int]:
    """The host cost of a message as a run pays it: a probe model's step placed round robin over two gloo ranks.

    The calibration's streams send one small message at a time; a plan's run
    sends hundreds in a step, of every size, with all its receives posted as the
    step begins, and there a message costs more. So the probe runs that:
    ``model`` (a ``zoo:`` or file spec and a batch,
    :func:`placer.capture.spec.capture_spec`) placed round robin over ``2xcpu``
    for ``steps`` steps (:func:`placer.runtime.distributed.run_distributed`).
    Its messages are fitted (:meth:`MessageCost.fit`) and shaped over gaps as
    ``cost``'s streams (:func:`placer.sim.messages.spread_over_gaps`). What the
    operation right after a message loses is fitted to the run's operations
    against a profile of the probe's step taken just before
    (:func:`placer.sim.messages.fit_after_message`), in place of ``cost``'s.

    Parameters
    ----------
    cost : MessageCost
        The streams' cost (:func:`measure_gloo`, with costs by gap).
    model : (str, int)
        The probe's model spec and batch.
    steps : int
        Steps to run (at least 2: the first is not timed).
    timeout_s : float
        Longest a rank may wait for a message.

    Returns
    -------
    (MessageCost, int)
        The cost, and how many messages it was fitted to.

    Raises
    ------
    OptionError
        If ``steps < 2``.
    RunError
        If a rank of the run fails or hangs (:func:`placer.runtime.distributed.run_distributed`).
    PlacerError
        If the probe's plan sends no message.
    """
    if steps < 2:
        raise OptionError(f"option 'steps' must be >= 2 (the first is not timed), got {steps}")
    from ..capture.spec import capture_spec, load_model  # deferred: imports torch
    from ..runtime.distributed import run_distributed  # deferred: imports torch

    spec, batch = model
    captured = capture_spec(spec, batch)
    flat = captured.step_inputs(*load_model(spec, batch))
    cluster = load_cluster("2xcpu")
    graph = captured.graph
    profiled = profile_module(captured.gm, [t.clone() for t in flat], node_ids=set(graph.ids))
    graph = apply_profile(graph, Profile(graph.name, graph.digest(), "cpu", profiled))
    plan = place(graph, cluster, "round_robin")
    result = run_distributed(
        captured.gm,
        graph,
        plan,
        cluster,
        flat,
        steps=steps,
        backend="gloo",
        carrier=captured.carrier,
        timeout_s=timeout_s,
    )
    if not result.message_s:
        raise PlacerError(f"the probe {spec!r} sent no message over two ranks; probe with a larger model")
    bound = bind_plan(plan, graph, cluster)
    own = own_times(result.op_s, result.op_message_s)
    shaped = spread_over_gaps(MessageCost.fit(result.message_s), cost, bound, own)
    return fit_after_message(bound, own, shaped), len(result.message_s)


def measure_cuda(sizes: Iterable[int] = DEFAULT_SIZES, repeats: int = 5) -> dict[str, list[tuple[int, float]]]:
    """Copy times on the GPUs at hand, timed with CUDA events.

    Returns
    -------
    dict
        ``"host-to-device"`` and ``"device-to-host"`` (pinned host memory, GPU 0) and,
        with two GPUs or more, ``"cuda-peer"`` over every ordered pair of GPUs;
        each a list of (bytes, seconds).

    Raises
    ------
    PlacerError
        If CUDA is not available.
    """
    import torch  # deferred: imports torch

    if not torch.cuda.is_available():
        raise PlacerError("CUDA is not available on this machine; calibrate with --backend gloo")
    n = torch.cuda.device_count()

    def timed(dst, src, device) -> float:
        times = []
        for rep in range(repeats + 1):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.device(device):
                start.record()
                dst.copy_(src, non_blocking=True)
                end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times[1:])

    out: dict[str, list[tuple[int, float]]] = {"host-to-device": [], "device-to-host": []}
    for size in sizes:
        numel = max(1, int(size) // 4)
        host = torch.zeros(numel, pin_memory=True)
        gpu = torch.zeros(numel, device="cuda:0")
        out["host-to-device"].append((numel * 4, timed(gpu, host, 0)))
        out["device-to-host"].append((numel * 4, timed(host, gpu, 0)))
        for a in range(n):
            for b in range(n):
                if a != b:
                    src = torch.zeros(numel, device=f"cuda:{a}")
                    dst = torch.zeros(numel, device=f"cuda:{b}")
                    out.setdefault("cuda-peer", []).append((numel * 4, timed(dst, src, a)))
    return out


def calibrate(
    backend: str = "gloo",
    *,
    ranks: int = 2,
    sizes: Iterable[int] = DEFAULT_SIZES,
    repeats: int = 5,
    timeout_s: float = 120.0,
    probe: bool = False,
) -> Calibration:
    """Measure the links of ``backend`` (``"gloo"`` or ``"cuda"``) and fit each.

    With ``probe`` (gloo), a message's host cost is then the one a probe run pays
    (:func:`measure_probe`); the streams' is kept in ``meta["stream_message_cost"]``,
    the probe's model, steps and messages in ``meta["probe"]``.

    Raises
    ------
    OptionError
        Unknown backend, bad sizes/repeats/ranks, or ``probe`` without gloo.
    PlacerError
        Measurement failed or timed out, or a link could not be fitted.
    """
    import torch  # deferred: imports torch

    if probe and backend != "gloo":
        raise OptionError("option 'probe' runs gloo ranks: calibrate with backend 'gloo'")
    sizes = list(sizes)
    messages, streams, after_message, barrier_s, collectives = [], [], (0.0, 0.0, 0.0), None, {}
    loaded: list[float] = []
    if backend == "gloo":
        gloo = measure_gloo(ranks, sizes, repeats, timeout_s)
        messages, streams, after_message, barrier_s = gloo.messages, gloo.streams, gloo.after_message, gloo.barrier_s
        loaded = gloo.loaded
        measured = {"gloo": gloo.trips}
        if len({b for b, _ in gloo.trips}) > 1:  # a fit needs two sizes
            collectives = {
                kind: fit_link([b for b, _ in pts], [t for _, t in pts], kind) for kind, pts in gloo.collectives.items()
            }
    elif backend == "cuda":
        measured = measure_cuda(sizes, repeats)
    else:
        raise OptionError(f"option 'backend' must be 'gloo' or 'cuda', got {backend!r}")
    links = {name: fit_link([b for b, _ in pts], [t for _, t in pts], name) for name, pts in measured.items()}
    meta = {
        "backend": backend,
        "host": platform.node(),
        "torch": torch.__version__,
        "repeats": repeats,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if backend == "gloo":
        meta["ranks"] = ranks
    cost = _message_cost(messages, streams, after_message) if messages else None
    if probe and cost is not None:
        meta["stream_message_cost"] = cost.to_dict()
        cost, fitted_to = measure_probe(cost, timeout_s=timeout_s)
        meta["probe"] = {"model": PROBE_MODEL[0], "batch": PROBE_MODEL[1], "steps": PROBE_STEPS, "messages": fitted_to}
    loaded_latency_s = None
    if loaded and "gloo" in links:
        loaded_latency_s = max(0.0, float(np.mean(loaded)) - STREAM_MESSAGE_BYTES / links["gloo"].bandwidth_bytes_per_s)
        meta["loaded_messages"] = len(loaded)
    return Calibration(links, meta, cost, messages, barrier_s, collectives, loaded_latency_s)


def _message_cost(
    messages: list[tuple[int, int, int, float, float]],
    streams: list[tuple[float, float, float]],
    after_message: tuple[float, float, float],
) -> MessageCost:
    """The cost fitted to the messages timed alone, with the streams' fixed parts by gap (their bytes' share
    at the fitted per-byte cost taken off) and what an operation right after a message loses (never below
    zero)."""
    alone = MessageCost.fit(messages)
    by_gap = tuple(
        (
            gap,
            max(0.0, sent - STREAM_MESSAGE_BYTES * alone.send_per_byte_s),
            max(0.0, received - STREAM_MESSAGE_BYTES * alone.receive_per_byte_s),
        )
        for gap, sent, received in streams
    )
    after_sending, after_receiving, after_waiting = (max(0.0, s) for s in after_message)
    return replace(
        alone, by_gap=by_gap, after_send_s=after_sending, after_receive_s=after_receiving, after_wait_s=after_waiting
    )
