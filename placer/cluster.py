"""Devices and the channels between them (``placer.cluster/1``), with presets.

A channel is one exclusive transfer resource: it carries the transfers of
every ordered (source, destination) pair it lists, one at a time. Presets
are usable wherever a cluster file is (``--cluster 4xV100-nvlink``); each
preset's figures say where they come from.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import FormatError
from .io import Field, check_format, read_json, shown, write_json_atomic

__all__ = ["Device", "Channel", "Cluster", "PRESETS", "PRESET_SOURCES", "load_cluster", "CLUSTER_FORMAT"]

CLUSTER_FORMAT = "placer.cluster/1"
GiB = 1 << 30
#: Bounds on a cluster file's figures that keep every duration finite, and sums of many: a node's time
#: (at most placer.graph.MAX_COMPUTE_S) over its device's speed, a transfer's bytes (at most 2**62) over
#: its channel's bandwidth plus its latency.
MIN_SPEED, MAX_SPEED = 1e-9, 1e9
MIN_BANDWIDTH = 1.0
MAX_LATENCY_S = 1e9


@dataclass(frozen=True)
class Device:
    name: str
    kind: str
    memory_bytes: int
    speed: float = 1.0
    extra: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Channel:
    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    pairs: tuple[tuple[str, str], ...]
    extra: dict = field(default_factory=dict, compare=False)

    def transfer_s(self, nbytes: float) -> float:
        """Time to move ``nbytes`` over this channel: latency + bytes / bandwidth."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


class Cluster:
    """A set of devices and the channels that connect them.

    Attributes
    ----------
    devices : list of Device
    channels : list of Channel
    channel_index : ndarray of int, shape (devices, devices)
        Channel carrying transfers from device i to device j, or -1 if none.

    Raises
    ------
    FormatError
        Duplicate device or channel names, non-positive memory, a speed,
        bandwidth or latency out of the range a file may hold (:data:`MIN_SPEED`
        and the others), a channel naming an unknown device, or a pair listed by
        two channels.
    """

    def __init__(
        self,
        name: str,
        devices: list[Device],
        channels: list[Channel],
        extra: dict | None = None,
        source: str | None = None,
    ):
        where = f"cluster {source}" if source else f"cluster '{name}'"
        if not devices:
            raise FormatError(f"{where}: field 'devices' must list at least one device")
        self.name = name
        self.devices = list(devices)
        self.channels = list(channels)
        self.extra = dict(extra or {})
        self.device_index: dict[str, int] = {}
        for j, d in enumerate(self.devices):
            if d.name in self.device_index:
                raise FormatError(f"{where}: duplicate device name {d.name!r}")
            if d.memory_bytes <= 0:
                raise FormatError(f"{where}: device {d.name!r}: field 'memory_bytes' must be > 0")
            if d.memory_bytes == math.inf:
                raise FormatError(f"{where}: device {d.name!r}: field 'memory_bytes' must be finite")
            if not MIN_SPEED <= d.speed <= MAX_SPEED:  # a cluster built in code, not read from a file
                raise FormatError(
                    f"{where}: device {d.name!r}: field 'speed' must lie in [{MIN_SPEED:g}, "
                    f"{MAX_SPEED:g}], got {d.speed!r}"
                )
            self.device_index[d.name] = j
        n = len(self.devices)
        self.channel_index = np.full((n, n), -1, dtype=np.int64)
        names: set[str] = set()
        for c, ch in enumerate(self.channels):
            if ch.name in names:
                raise FormatError(f"{where}: duplicate channel name {ch.name!r}")
            names.add(ch.name)
            if not MIN_BANDWIDTH <= ch.bandwidth_bytes_per_s:
                raise FormatError(
                    f"{where}: channel {ch.name!r}: field 'bandwidth_bytes_per_s' must be >= "
                    f"{MIN_BANDWIDTH:g}, got {ch.bandwidth_bytes_per_s!r}"
                )
            if ch.bandwidth_bytes_per_s == math.inf:  # built in code: no file can hold it
                raise FormatError(f"{where}: channel {ch.name!r}: field 'bandwidth_bytes_per_s' must be finite")
            if ch.latency_s < 0:
                raise FormatError(f"{where}: channel {ch.name!r}: field 'latency_s' must be >= 0")
            if not ch.latency_s <= MAX_LATENCY_S:
                raise FormatError(
                    f"{where}: channel {ch.name!r}: field 'latency_s' must be <= {MAX_LATENCY_S:g}, "
                    f"got {ch.latency_s!r}"
                )
            for s, d in ch.pairs:
                for end in (s, d):
                    if end not in self.device_index:
                        raise FormatError(f"{where}: channel {ch.name!r} names unknown device {end!r}")
                i, j = self.device_index[s], self.device_index[d]
                if i == j:
                    raise FormatError(
                        f"{where}: channel {ch.name!r} lists the pair ({s!r}, {d!r}) from a device to itself"
                    )
                if self.channel_index[i, j] >= 0:
                    other = self.channels[self.channel_index[i, j]].name
                    raise FormatError(f"{where}: pair ({s!r}, {d!r}) is listed by channels {other!r} and {ch.name!r}")
                self.channel_index[i, j] = c
        self.source = source

    # ------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, devices={self.num_devices}, channels={len(self.channels)})"

    @property
    def name_rank(self) -> np.ndarray:
        """Each device's place among the devices sorted by name (a channel's tie rule: FORMATS.md, rule 4)."""
        return np.argsort(np.argsort([d.name for d in self.devices], kind="stable"))

    @property
    def memory(self) -> np.ndarray:
        return np.array([d.memory_bytes for d in self.devices], dtype=np.int64)

    @property
    def latency(self) -> np.ndarray:
        """Latency of the channel from i to j (inf where none, 0 on the diagonal)."""
        return self._per_pair(lambda ch: ch.latency_s)

    @property
    def inverse_bandwidth(self) -> np.ndarray:
        """Seconds per byte from i to j (inf where no channel, 0 on the diagonal)."""
        return self._per_pair(lambda ch: 1.0 / ch.bandwidth_bytes_per_s)

    def _per_pair(self, value: Callable[[Channel], float]) -> np.ndarray:
        out = np.full(self.channel_index.shape, np.inf)
        np.fill_diagonal(out, 0.0)
        for (i, j), c in np.ndenumerate(self.channel_index):
            if c >= 0:
                out[i, j] = value(self.channels[c])
        return out

    def transfer_s(self, src_device: int, dst_device: int, nbytes: float) -> float:
        """Uncongested time to move ``nbytes`` from one device to another (0 on the same device)."""
        if src_device == dst_device:
            return 0.0
        c = self.channel_index[src_device, dst_device]
        if c < 0:
            return float("inf")
        return self.channels[c].transfer_s(nbytes)

    @property
    def linked(self) -> np.ndarray:
        """Boolean ``(devices, devices)``: can device i send to device j (a channel, or i is j).

        Transfers never go through a third device, so a producer on i and a consumer on j need this.
        """
        return (self.channel_index >= 0) | np.eye(self.num_devices, dtype=bool)

    def unreachable_pairs(self) -> list[tuple[str, str]]:
        """Ordered device pairs with no channel between them."""
        n = self.num_devices
        return [
            (self.devices[i].name, self.devices[j].name)
            for i in range(n)
            for j in range(n)
            if i != j and self.channel_index[i, j] < 0
        ]

    def digest(self) -> str:
        """A short fingerprint of the devices and channels' figures (not the names of the cluster or its
        channels), to tell a plan's cluster from another of the same name. A channel's calibrated
        collectives (``extra["collectives"]``) and the cluster's calibrated message cost
        (``extra["message_cost"]``) are figures too."""
        figures = [
            [[d.name, d.kind, int(d.memory_bytes), float(d.speed)] for d in self.devices],
            [
                [float(c.bandwidth_bytes_per_s), float(c.latency_s), [list(p) for p in c.pairs]]
                + ([c.extra["collectives"]] if "collectives" in c.extra else [])
                for c in self.channels
            ],
        ] + ([self.extra["message_cost"]] if "message_cost" in self.extra else [])
        return hashlib.sha256(json.dumps(figures).encode()).hexdigest()[:16]

    # ---------------------------------------------------------------- io
    def to_dict(self) -> dict:
        doc: dict[str, Any] = {"format": CLUSTER_FORMAT, "name": self.name}
        doc.update(self.extra)
        doc["devices"] = [
            {"name": d.name, "kind": d.kind, "memory_bytes": int(d.memory_bytes), "speed": float(d.speed), **d.extra}
            for d in self.devices
        ]
        doc["channels"] = [
            {
                "name": c.name,
                "bandwidth_bytes_per_s": float(c.bandwidth_bytes_per_s),
                "latency_s": float(c.latency_s),
                "pairs": [list(p) for p in c.pairs],
                **c.extra,
            }
            for c in self.channels
        ]
        return doc

    @classmethod
    def from_dict(cls, doc: Any, source: str | None = None) -> "Cluster":
        where = f"cluster {source}" if source else "cluster"
        check_format(doc, CLUSTER_FORMAT, where)
        top = Field(doc, where)
        name = top.string("name", default="")
        devices = []
        for k, raw in enumerate(top.array("devices", required=True)):
            f = Field(raw, f"{where}: device #{k}")
            dname = f.string("name", required=True)
            f.where = f"{where}: device {dname!r}"
            devices.append(
                Device(
                    name=dname,
                    kind=f.string("kind", required=True),
                    memory_bytes=f.integer("memory_bytes", required=True, minimum=1),
                    speed=f.number("speed", default=1.0, positive=True, minimum=MIN_SPEED, maximum=MAX_SPEED),
                    extra=f.extra({"name", "kind", "memory_bytes", "speed"}),
                )
            )
        channels = []
        for k, raw in enumerate(top.array("channels") or []):
            f = Field(raw, f"{where}: channel #{k}")
            cname = f.string("name", required=True)
            f.where = f"{where}: channel {cname!r}"
            pairs = []
            for p in f.array("pairs", required=True):
                if not (isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)):
                    raise FormatError(
                        f"{f.where}: each entry of 'pairs' must be [source, destination] device names, got {shown(p)}"
                    )
                pairs.append((p[0], p[1]))
            channels.append(
                Channel(
                    name=cname,
                    bandwidth_bytes_per_s=f.number(
                        "bandwidth_bytes_per_s", required=True, positive=True, minimum=MIN_BANDWIDTH
                    ),
                    latency_s=f.number("latency_s", default=0.0, maximum=MAX_LATENCY_S),
                    pairs=tuple(pairs),
                    extra=f.extra({"name", "bandwidth_bytes_per_s", "latency_s", "pairs"}),
                )
            )
        return cls(name, devices, channels, extra=top.extra({"format", "name", "devices", "channels"}), source=source)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Cluster":
        return cls.from_dict(read_json(path, "cluster file"), source=str(path))

    def save(self, path: str | os.PathLike) -> None:
        write_json_atomic(path, self.to_dict(), "cluster file")


# ------------------------------------------------------------------ presets
# Sources of the figures below:
#   V100 SXM2 16 GB, NVLink 2 (one link: 25 GB/s per direction): NVIDIA Tesla V100
#     datasheet (2017) and the DGX-1 V100 whitepaper; 16 GiB of HBM2.
#   V100 PCIe: PCIe 3.0 x16, 15.75 GB/s theoretical, ~12 GB/s achieved by cudaMemcpy
#     peer copies (NVIDIA p2pBandwidthLatencyTest figures commonly reported).
#   A100 SXM4 40 GB: NVIDIA A100 datasheet; NVLink 3, 600 GB/s per GPU in total
#     (12 links); in a 4-GPU HGX board each pair shares 4 links = 100 GB/s per direction.
#   H100 SXM5 80 GB: NVIDIA H100 datasheet; NVLink 4, 900 GB/s per GPU in total,
#     450 GB/s per direction through NVSwitch, so one egress channel per GPU.
#   Speeds are the FP32 (non-tensor) peak relative to V100 SXM2: 15.7, 19.5 and
#     67 TFLOP/s by the datasheets. A graph's compute_s_by_kind overrides them.
#   Latency ~10 us per peer copy (cudaMemcpyPeerAsync launch + completion), as used
#     by Pesto and Baechi's linear communication fits.
#   2x4xV100: hosts joined by 100 Gb/s EDR InfiniBand (12.5 GB/s), ~20 us latency
#     with the software stack; one shared NIC channel per direction.
#   cpu: processes of one host over torch.distributed gloo on 127.0.0.1; the bandwidth
#     is a line through loopback transfers of 1 to 64 MB (`placer calibrate` fits a host's own).
_NVLINK2_BW = 25e9
_PCIE3_BW = 12e9
_GPU_LATENCY = 1e-5


def _full_mesh(names: list[str], bandwidth: float, latency: float, link: str) -> list[Channel]:
    return [Channel(f"{a}->{b}", bandwidth, latency, ((a, b),), {"link": link}) for a in names for b in names if a != b]


def _per_source(names: list[str], bandwidth: float, latency: float, link: str) -> list[Channel]:
    return [
        Channel(f"{a}->*", bandwidth, latency, tuple((a, b) for b in names if b != a), {"link": link}) for a in names
    ]


def _box(
    name: str,
    count: int,
    kind: str,
    memory: int,
    speed: float,
    bandwidth: float,
    topology: Callable[..., list[Channel]],
    link: str,
    prefix: str = "gpu",
    latency: float = _GPU_LATENCY,
) -> Cluster:
    devices = [Device(f"{prefix}{i}", kind, memory, speed) for i in range(count)]
    names = [d.name for d in devices]
    return Cluster(name, devices, topology(names, bandwidth, latency, link))


def _two_hosts() -> Cluster:
    hosts = [[f"h{h}gpu{i}" for i in range(4)] for h in range(2)]
    devices = [Device(n, "V100", 16 * GiB, 1.0) for names in hosts for n in names]
    channels = [ch for names in hosts for ch in _full_mesh(names, _NVLINK2_BW, _GPU_LATENCY, "nvlink2")]
    for a, b in ((0, 1), (1, 0)):
        pairs = tuple((s, d) for s in hosts[a] for d in hosts[b])
        channels.append(Channel(f"net:h{a}->h{b}", 12.5e9, 2e-5, pairs, {"link": "infiniband-edr"}))
    return Cluster("2x4xV100", devices, channels)


PRESETS: dict[str, Callable[[], Cluster]] = {
    "2xV100-nvlink": lambda: _box("2xV100-nvlink", 2, "V100", 16 * GiB, 1.0, _NVLINK2_BW, _full_mesh, "nvlink2"),
    "4xV100-nvlink": lambda: _box("4xV100-nvlink", 4, "V100", 16 * GiB, 1.0, _NVLINK2_BW, _full_mesh, "nvlink2"),
    "8xV100-nvlink": lambda: _box("8xV100-nvlink", 8, "V100", 16 * GiB, 1.0, _NVLINK2_BW, _full_mesh, "nvlink2"),
    "4xA100-nvlink": lambda: _box("4xA100-nvlink", 4, "A100", 40 * GiB, 19.5 / 15.7, 100e9, _full_mesh, "nvlink3"),
    "8xH100-nvswitch": lambda: _box("8xH100-nvswitch", 8, "H100", 80 * GiB, 67 / 15.7, 450e9, _per_source, "nvswitch"),
    "4xGPU-pcie": lambda: _box("4xGPU-pcie", 4, "V100", 16 * GiB, 1.0, _PCIE3_BW, _per_source, "pcie3"),
    "2x4xV100": _two_hosts,
    "2xcpu": lambda: _box("2xcpu", 2, "cpu", 8 * GiB, 1.0, 2.1e9, _full_mesh, "gloo", prefix="cpu", latency=1.6e-5),
    "4xcpu": lambda: _box("4xcpu", 4, "cpu", 8 * GiB, 1.0, 2.1e9, _full_mesh, "gloo", prefix="cpu", latency=1.6e-5),
}


PRESET_SOURCES: dict[str, str] = {
    "2xV100-nvlink": "V100 SXM2 16 GB datasheet; one NVLink 2 link per pair, 25 GB/s per direction",
    "4xV100-nvlink": "V100 SXM2 16 GB datasheet; one NVLink 2 link per pair, 25 GB/s per direction",
    "8xV100-nvlink": "V100 SXM2 16 GB datasheet; one NVLink 2 link per pair, 25 GB/s per direction",
    "4xA100-nvlink": "A100 SXM4 40 GB datasheet; HGX 4-GPU board, 4 NVLink 3 links per pair = 100 GB/s",
    "8xH100-nvswitch": "H100 SXM5 80 GB datasheet; NVLink 4 via NVSwitch, 450 GB/s egress per GPU",
    "4xGPU-pcie": "V100 16 GB on PCIe 3.0 x16, ~12 GB/s achieved, one shared channel per source GPU",
    "2x4xV100": "two DGX-1-like hosts (NVLink 2 inside), 100 Gb/s EDR InfiniBand between, one NIC channel per direction",
    "2xcpu": "processes on this machine over gloo on 127.0.0.1, ~2.1 GB/s measured on a 2-core machine",
    "4xcpu": "processes on this machine over gloo on 127.0.0.1, ~2.1 GB/s measured on a 2-core machine",
}


def load_cluster(spec: "str | os.PathLike | Cluster") -> Cluster:
    """A cluster from a preset name, a ``placer.cluster/1`` file, or a Cluster (returned as is).

    Raises
    ------
    FormatError
        If ``spec`` is neither a preset nor a readable, valid cluster file.
    """
    if isinstance(spec, Cluster):
        return spec
    key = str(spec)
    if key in PRESETS:
        cluster = PRESETS[key]()
        cluster.extra["source"] = PRESET_SOURCES[key]
        return cluster
    if Path(key).exists() or key.endswith(".json"):
        return Cluster.load(key)
    raise FormatError(f"unknown cluster {key!r}: not a file and not a preset (presets: {', '.join(PRESETS)})")
