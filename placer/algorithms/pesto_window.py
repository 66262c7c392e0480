"""Window search for :mod:`.pesto`: re-solve a small window of the whole graph's schedule with CP-SAT.

A CP-SAT model of a whole training step (tens of thousands of operations
once replicas and collective steps are nodes) takes the solver seconds to
load and presolve before it searches at all. A window round asks a question
the solver answers in about a second: the incumbent schedule (a simulated
plan of the whole graph) is kept everywhere but in a window -- the
operations two devices start in a short span of time -- and of those only a
few dozen are free (device and start time are variables). The rest enters
the model as constants or as rigid blocks:

- every job outside the window keeps its incumbent time: its outputs reach
  the window when they reached it in the incumbent (constants), and the
  window's outputs reach it as terms of the objective;
- the window's other operations form blocks (maximal runs of consecutive
  fixed operations on one device, gaps included) that keep their internal
  timing and their order but may start earlier or later;
- the first operation after the window on each of its devices waits for
  everything the window runs there;
- transfers are delays (the channel's latency and bandwidth), without the
  channel's queue, which the reference simulation puts back.

The objective is the step's length as the window sees it: the latest
``end + tail`` over the window's jobs and the jobs it feeds, where a job's
tail (:func:`~placer.sim.critical.schedule_tails`) is the longest chain of jobs after it in the
incumbent's schedule (data, device order and channel order), i.e. the
makespan minus its latest start. A round's solution becomes a plan of the
whole graph (the window's devices run the window's operations in the
solver's order, everything else as before) that the reference simulator
measures: it becomes the incumbent only if the whole step got shorter.

Windows are chosen where the step can shrink (:class:`WindowPicker`):
around an operation of the incumbent's critical path
(:func:`~placer.sim.critical.critical_path`), on its device and the device idle the
most around it; on the device pair with the most idle time in a stretch of
the step; and around a transfer on the path, or one of the jobs without
slack that queued on a channel. The search is deterministic for a seed:
windows come from a seeded generator, every solve stops on CP-SAT's
deterministic work, and the number of rounds follows from the time limit
alone (:class:`WindowBudget`); the wall clock only guards the limit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from ..cluster import Cluster
from ..errors import InvalidPlanError
from ..graph import OpGraph
from ..sim.critical import critical_path, schedule_tails
from ..sim.simulator import SimResult, simulate

__all__ = ["WINDOW_KINDS", "WindowBudget", "WindowPicker", "WindowSearch"]

#: Rounds per second of the time limit.
ROUNDS_PER_SECOND = 1.0
#: CP-SAT deterministic work of one round (about a second of one thread on a window of ``FREE_NODES``).
WORK_PER_ROUND = 0.2
#: At most this many rounds, whatever the limit.
MAX_ROUNDS = 100_000
#: Operations of a window whose device and start are variables.
FREE_NODES = 40
#: Operations of a window in all (free ones and those in blocks), on all its devices.
WINDOW_NODES = 160
WINDOW_KINDS = ("path", "idle", "transfer", "stretch")
#: Relative shortening of the step a round must achieve to be accepted.
ACCEPT_TOLERANCE = 1e-9


@dataclass(frozen=True)
class WindowBudget:
    """The rounds of a window search and the solver work of each, from the time limit alone.

    Examples
    --------
    >>> WindowBudget.for_limit(60.0)
    WindowBudget(rounds=60, work_per_round=0.2)
    >>> WindowBudget.for_limit(0.5).rounds
    0
    """

    rounds: int
    work_per_round: float

    @classmethod
    def for_limit(cls, seconds: float) -> "WindowBudget":
        rounds = int(min(MAX_ROUNDS, math.floor(max(seconds, 0.0) * ROUNDS_PER_SECOND)))
        return cls(rounds, WORK_PER_ROUND)


@dataclass
class Incumbent:
    """A simulated plan of the whole graph with what the window rounds read from it."""

    result: SimResult
    tail: np.ndarray
    xtail: np.ndarray
    path_nodes: np.ndarray  # operations of the critical path
    path_transfers: np.ndarray  # transfers of the critical path, and those without slack that queued
    orders: list[np.ndarray]
    position: np.ndarray  # index of every operation in its device's order

    @classmethod
    def of(cls, result: SimResult) -> "Incumbent":
        tail, xtail = schedule_tails(result)
        path = critical_path(result)
        xf = result.transfers
        span = result.makespan_s
        eps = 1e-9 * max(span, 1e-12)
        on_path = [link.transfer for link in path if link.kind == "transfer"]
        queued = np.flatnonzero((xf.start + xtail >= span - eps) & (xf.start > xf.queued + eps))
        transfers = np.unique(np.asarray(on_path + queued.tolist(), dtype=np.int64))
        orders = result.device_orders()
        position = np.zeros(result.graph.num_nodes, dtype=np.int64)
        for seq in orders:
            position[seq] = np.arange(seq.size)
        return cls(
            result,
            tail,
            xtail,
            np.asarray(sorted({link.node for link in path}), dtype=np.int64),
            transfers,
            orders,
            position,
        )


@dataclass
class Window:
    """The operations a round frees, and the devices and span of time whose operations it holds."""

    kind: str
    devices: np.ndarray
    nodes: np.ndarray  # every operation in the window, free or not
    free: np.ndarray  # the free ones


@dataclass
class WindowPicker:
    """Seeded choice of windows where the step can shrink.

    Kinds take turns: ``path``, around a random operation of the critical
    path, on its device and the one idle the most around it; ``idle``, around
    a random operation without slack, the busiest device and the one idle the
    most there; ``transfer``, around a transfer of the critical path (or one
    without slack that waited for its channel), on its two devices, freeing
    its producer and the producers of the transfers queued ahead of it
    first; ``stretch``, as ``idle`` around a random instant of the step. The
    free operations are the window's jobs without slack first, then those
    nearest the anchor in time.
    """

    num_devices: int
    seed: int
    rng: np.random.Generator = field(init=False)
    kinds_used: dict[str, int] = field(init=False)
    turn: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed % 2**63)
        self.kinds_used = {kind: 0 for kind in WINDOW_KINDS}

    def pick(self, inc: Incumbent) -> Window | None:
        """The next round's window, or None where the chosen devices run nothing."""
        r = inc.result
        kind = WINDOW_KINDS[self.turn % len(WINDOW_KINDS)]
        self.turn += 1
        if kind == "transfer" and inc.path_transfers.size == 0:
            kind = "path"
        if kind == "path" and inc.path_nodes.size == 0:
            kind = "idle"
        self.kinds_used[kind] += 1
        xf = r.transfers
        first: list[int] = []  # operations freed before the rest
        if kind == "path":
            anchor = int(inc.path_nodes[self.rng.integers(inc.path_nodes.size)])
            t = float(r.start[anchor])
            home = [int(r.device_of[anchor])]
            first = [anchor]
        elif kind == "transfer":
            x = int(inc.path_transfers[self.rng.integers(inc.path_transfers.size)])
            t = float(xf.queued[x])
            home = [int(xf.src_device[x]), int(xf.dst_device[x])]
            ahead = np.flatnonzero((xf.channel == xf.channel[x]) & (xf.start < xf.start[x]) & (xf.end > xf.queued[x]))
            first = [int(xf.producer[x])] + xf.producer[ahead[np.argsort(-xf.start[ahead])]].tolist()
        else:
            eps = 1e-9 * max(r.makespan_s, 1e-12)
            tight = np.flatnonzero(r.start + inc.tail >= r.makespan_s - eps) if kind == "idle" else []
            if len(tight):  # an instant where a job without slack runs
                t = float(r.start[tight[self.rng.integers(len(tight))]])
            else:
                t = float(self.rng.uniform(0.0, r.makespan_s))
            home = []
        span = max(r.makespan_s, 1e-12) * (0.5 * WINDOW_NODES) / max(r.graph.num_nodes / self.num_devices, 1.0)
        lo, hi = t - span, t + span
        overlap = np.clip(np.minimum(r.finish, hi) - np.maximum(r.start, lo), 0.0, None)
        busy = np.bincount(r.device_of, weights=overlap, minlength=self.num_devices)
        devices = list(dict.fromkeys(home))
        order = np.lexsort((np.arange(self.num_devices), busy)).tolist()  # idlest first
        if not devices:
            devices = [int(np.argmax(busy))]
        for d in order:
            if len(devices) >= 2:
                break
            if d not in devices:
                devices.append(d)
        devices = np.asarray(sorted(devices[:2]), dtype=np.int64)
        nodes = self._window_nodes(inc, devices, t)
        if nodes.size == 0:
            return None
        in_window = np.zeros(r.graph.num_nodes, dtype=bool)
        in_window[nodes] = True
        slack = r.makespan_s - (r.start + inc.tail)
        eps = 1e-9 * max(r.makespan_s, 1e-12)
        firsts = [v for v in first if in_window[v]]
        cand = nodes[~np.isin(nodes, firsts)]
        cand = cand[np.lexsort((cand, np.abs(r.start[cand] - t), slack[cand] > eps))]
        chosen = list(dict.fromkeys(firsts + cand.tolist()))
        chosen = chosen[:FREE_NODES]
        return Window(kind, devices, nodes, np.asarray(sorted(chosen), dtype=np.int64))

    @staticmethod
    def _window_nodes(inc: Incumbent, devices: np.ndarray, t: float) -> np.ndarray:
        """Up to ``WINDOW_NODES`` operations of ``devices`` around instant ``t``: contiguous runs of each
        device's order."""
        r = inc.result
        per = max(1, WINDOW_NODES // devices.size)
        out = []
        for d in devices.tolist():
            seq = inc.orders[d]
            if seq.size == 0:
                continue
            at = int(np.searchsorted(r.start[seq], t))
            lo = max(0, min(at - per // 2, seq.size - per))
            out.append(seq[lo : lo + per])
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


class _WindowModel:
    """The CP-SAT model of one window (see the module's description) and the plan of its solution."""

    def __init__(self, inc: Incumbent, win: Window, cluster: Cluster, durations: np.ndarray, movable: np.ndarray):
        r = inc.result
        g = r.graph
        self.inc, self.win, self.cluster = inc, win, cluster
        span = r.makespan_s
        self.res = res = 10.0 ** math.floor(math.log10(max(span, 1e-12) / 1e6))
        self.m = m = cp_model.CpModel()

        def units(seconds: float) -> int:  # a length, rounded down so that the incumbent stays a solution
            return int(math.floor(seconds / res + 1e-6))

        devs = win.devices.tolist()
        in_win = np.zeros(g.num_nodes, dtype=bool)
        in_win[win.nodes] = True
        is_free = np.zeros(g.num_nodes, dtype=bool)
        is_free[win.free] = True
        self.t0 = t0 = float(r.start[win.nodes].min())
        horizon = units(2 * span - t0) + 1
        dev = r.device_of
        lat, inv_bw = cluster.latency, cluster.inverse_bandwidth

        linked = cluster.channel_index >= 0

        def tx(a: int, b: int, nbytes: int) -> float:
            return 0.0 if a == b else float(lat[a, b] + nbytes * inv_bw[a, b])

        def rel(seconds: float) -> int:  # an absolute instant, in units after the window's start
            return int(math.ceil((seconds - t0) / res - 1e-6))

        # Jobs: free operations, and blocks of consecutive fixed operations per device.
        self.block_of: dict[int, tuple[int, int]] = {}  # node -> (block, offset units)
        blocks: list[dict] = []
        self.x: dict[int, dict[int, object]] = {}
        self.s: dict[int, object] = {}
        self.e: dict[int, object] = {}
        intervals: dict[int, list] = {d: [] for d in devs}
        for d in devs:
            seq = inc.orders[d]
            seq = seq[in_win[seq]]
            run: list[int] = []
            for v in seq.tolist() + [-1]:
                if v >= 0 and not is_free[v]:
                    run.append(v)
                    continue
                if run:
                    b = len(blocks)
                    first = float(r.start[run[0]])
                    for u in run:
                        self.block_of[u] = (b, rel(r.start[u]) - rel(first))
                    length = rel(r.finish[run[-1]]) - rel(first)
                    var = m.NewIntVar(0, horizon, f"b{b}")
                    blocks.append({"var": var, "nodes": run, "device": d, "length": length, "at": rel(first)})
                    intervals[d].append(m.NewFixedSizeIntervalVar(var, length, f"B{b}"))
                    run = []
        self.blocks = blocks
        for d in devs:  # blocks of a device keep their order
            mine = [b for b in blocks if b["device"] == d]
            for a, b in zip(mine, mine[1:]):
                m.Add(b["var"] >= a["var"] + a["length"])
        for v in win.free.tolist():
            options = [d for d in devs if durations[v, d] >= 0] if movable[v] else [int(dev[v])]
            self.x[v] = {d: m.NewBoolVar(f"x{v}_{d}") for d in options}
            m.AddExactlyOne(self.x[v].values())
            self.s[v] = m.NewIntVar(0, horizon, f"s{v}")
            self.e[v] = m.NewIntVar(0, horizon, f"e{v}")
            m.Add(self.e[v] == self.s[v] + sum(units(durations[v, d]) * lit for d, lit in self.x[v].items()))
            for d, lit in self.x[v].items():
                intervals[d].append(
                    m.NewOptionalFixedSizeIntervalVar(self.s[v], units(durations[v, d]), lit, f"r{v}_{d}")
                )
        for d in devs:
            m.AddNoOverlap(intervals[d])
            # Nothing of the window runs on d before the operation ahead of the window there has ended.
            seq = inc.orders[d]
            inside = np.flatnonzero(in_win[seq])
            if inside.size and inside[0] > 0:
                free_from = rel(r.finish[seq[inside[0] - 1]])
                for b in blocks:
                    if b["device"] == d:
                        m.Add(b["var"] >= free_from)
                for v in win.free.tolist():
                    if d in self.x[v]:
                        m.Add(self.s[v] >= free_from).OnlyEnforceIf(self.x[v][d])

        z = self.z = m.NewIntVar(0, 4 * horizon, "z")
        xrows = r.transfers.rows()
        xf = r.transfers

        def start_of(v: int):  # the model's start of window operation v: a variable expression
            if is_free[v]:
                return self.s[v]
            b, off = self.block_of[v]
            return blocks[b]["var"] + off

        def end_of(v: int):
            if is_free[v]:
                return self.e[v]
            b, off = self.block_of[v]
            return blocks[b]["var"] + off + (rel(r.finish[v]) - rel(r.start[v]))

        def arrival(u: int, tensor: int, d: int, nbytes: int) -> float:
            """When the output of fixed operation u outside the window reaches device d, in seconds."""
            if dev[u] == d:
                return float(r.finish[u])
            x = xrows.get((u, tensor, d))
            if x is not None:
                return float(xf.end[x])
            return float(r.finish[u]) + tx(int(dev[u]), d, nbytes)

        ptr, in_eids = g.in_edges
        optr, out_eids = g.out_edges
        # Channels: the transfers of what the window sends are variables; the incumbent's other transfers
        # on the channels the window's devices send on hold their times.
        channel_jobs: dict[int, list] = {}
        hint_xfer: list[tuple] = []
        sending = np.unique(cluster.channel_index[win.devices][cluster.channel_index[win.devices] >= 0])
        held = np.flatnonzero(np.isin(xf.channel, sending) & ~in_win[xf.producer] & (xf.end > t0))
        for x in held[np.argsort(xf.start[held], kind="stable")].tolist():
            begin, size = rel(xf.start[x]), max(0, rel(xf.end[x]) - rel(xf.start[x]))
            channel_jobs.setdefault(int(xf.channel[x]), []).append(m.NewFixedSizeIntervalVar(begin, size, f"H{x}"))
        for v in win.nodes.tolist():
            lits = self.x[v] if is_free[v] else {int(dev[v]): None}
            m.Add(start_of(v) >= 0)
            for e in in_eids[ptr[v] : ptr[v + 1]].tolist():
                u, t, nb = int(g.src[e]), int(g.edge_tensor[e]), int(g.edge_bytes[e])
                if in_win[u] and not is_free[v]:
                    continue  # a fixed reader of the window's output: through the transfers below
                if in_win[u]:
                    ulits = self.x[u] if is_free[u] else {int(dev[u]): None}
                    for du, lu in ulits.items():
                        for dv, lv in lits.items():
                            cond = [lit for lit in (lu, lv) if lit is not None]
                            if du != dv and not linked[du, dv]:  # no channel: not both
                                m.AddBoolOr([lit.Not() for lit in cond])
                                continue
                            m.Add(start_of(v) >= end_of(u) + units(tx(du, dv, nb))).OnlyEnforceIf(cond)
                else:
                    for dv, lv in lits.items():
                        if dv != dev[u] and not linked[dev[u], dv]:
                            m.Add(lv == 0)
                            continue
                        at = rel(arrival(u, t, dv, nb))
                        if at > 0:
                            m.Add(start_of(v) >= at).OnlyEnforceIf([lv] if lv is not None else [])
            # What the window's outputs feed on fixed readers (in blocks, or outside with their tails):
            # one transfer per tensor, reading device and sending device, on that pair's channel.
            readers: dict[tuple[int, int], list[tuple[int, int]]] = {}
            for e in out_eids[optr[v] : optr[v + 1]].tolist():
                w = int(g.dst[e])
                if not is_free[w]:
                    readers.setdefault((int(g.edge_tensor[e]), int(dev[w])), []).append((w, int(g.edge_bytes[e])))
            for (t, dw), ws in sorted(readers.items()):
                for dv, lv in lits.items():
                    cond = [lv] if lv is not None else []
                    if dv == dw:
                        arrive = end_of(v)
                    elif not linked[dv, dw]:
                        m.Add(lv == 0)
                        continue
                    else:
                        size = units(tx(dv, dw, max(b for _, b in ws)))
                        c = int(cluster.channel_index[dv, dw])
                        begin = m.NewIntVar(0, 2 * horizon, f"xb{v}_{t}_{dw}_{dv}")
                        arrive = m.NewIntVar(0, 2 * horizon, f"xe{v}_{t}_{dw}_{dv}")
                        m.Add(begin >= end_of(v)).OnlyEnforceIf(cond)
                        if lv is None:
                            channel_jobs.setdefault(c, []).append(
                                m.NewIntervalVar(begin, size, arrive, f"X{v}_{t}_{dw}")
                            )
                        else:
                            channel_jobs.setdefault(c, []).append(
                                m.NewOptionalIntervalVar(begin, size, arrive, lv, f"X{v}_{t}_{dw}_{dv}")
                            )
                        x = xrows.get((v, t, dw))
                        hint_xfer.append((begin, rel(xf.start[x]) if x is not None and dv == dev[v] else None, v))
                    for w, _ in ws:
                        if in_win[w]:
                            m.Add(start_of(w) >= arrive).OnlyEnforceIf(cond)
                        else:
                            m.Add(z >= arrive + units(inc.tail[w])).OnlyEnforceIf(cond)
            m.Add(z >= end_of(v))
        for jobs in channel_jobs.values():
            m.AddNoOverlap(jobs)
        # The first operation after the window on each of its devices waits for the window there.
        self.after: dict[int, object] = {}
        for d in devs:
            seq = inc.orders[d]
            inside = np.flatnonzero(in_win[seq])
            if inside.size == 0 or inside[-1] + 1 >= seq.size:
                continue
            a = int(seq[inside[-1] + 1])
            av = m.NewIntVar(0, horizon, f"after{d}")
            self.after[d] = av
            earliest = 0
            for e in in_eids[ptr[a] : ptr[a + 1]].tolist():
                u = int(g.src[e])
                if not in_win[u]:
                    earliest = max(earliest, rel(arrival(u, int(g.edge_tensor[e]), d, int(g.edge_bytes[e]))))
                else:
                    ulits = self.x[u] if is_free[u] else {int(dev[u]): None}
                    for du, lu in ulits.items():
                        if du != d and not linked[du, d]:
                            continue  # ruled out with the edge's consumer term above
                        delay = units(tx(du, d, int(g.edge_bytes[e])))
                        m.Add(av >= end_of(u) + delay).OnlyEnforceIf([lu] if lu is not None else [])
            m.Add(av >= earliest)
            for v in win.nodes.tolist():
                if is_free[v] and d in self.x[v]:
                    m.Add(av >= self.e[v]).OnlyEnforceIf(self.x[v][d])
                elif not is_free[v] and dev[v] == d:
                    m.Add(av >= end_of(v))
            m.Add(z >= av + units(inc.tail[a]))
        m.Minimize(z)
        # The incumbent as a complete hint.
        for v in win.free.tolist():
            for d, lit in self.x[v].items():
                m.AddHint(lit, int(dev[v] == d))
            m.AddHint(self.s[v], rel(r.start[v]))
            m.AddHint(self.e[v], rel(r.start[v]) + units(durations[v, int(dev[v])]))
        for b in blocks:
            m.AddHint(b["var"], b["at"])
        for begin, at, v in hint_xfer:
            m.AddHint(begin, at if at is not None else rel(r.finish[v]))

    def solve(self, seed: int, workers: int, seconds: float, work: float):
        solver = cp_model.CpSolver()
        params = solver.parameters
        params.random_seed = seed % 2**31
        params.num_workers = workers
        params.catch_sigint_signal = False
        if workers > 1:
            params.interleave_search = True
        params.max_time_in_seconds = max(0.1, seconds)
        params.max_deterministic_time = max(0.01, work)
        params.symmetry_level = 0
        return solver.Solve(self.m), solver

    def plan(self, solver: cp_model.CpSolver) -> tuple[np.ndarray, list[np.ndarray]]:
        """The whole graph's placement and per-device orders with the window as the solver has it."""
        r, win = self.inc.result, self.win
        device_of = r.device_of.copy()
        key = r.start.astype(np.float64).copy()  # order key: window operations by the solver's start
        for v in win.free.tolist():
            device_of[v] = next(d for d, lit in self.x[v].items() if solver.Value(lit))
            key[v] = self.t0 + solver.Value(self.s[v]) * self.res
        for v, (b, off) in self.block_of.items():
            key[v] = self.t0 + (solver.Value(self.blocks[b]["var"]) + off) * self.res
        in_win = np.zeros(r.graph.num_nodes, dtype=bool)
        in_win[win.nodes] = True
        orders = []
        for d in range(self.cluster.num_devices):
            seq = self.inc.orders[d]
            if d not in win.devices:
                orders.append(seq[device_of[seq] == d])
                continue
            first = int(np.flatnonzero(in_win[seq])[0]) if in_win[seq].any() else seq.size
            before, rest = seq[:first], seq[first:]
            rest = rest[~in_win[rest]]
            mine = win.nodes[device_of[win.nodes] == d]
            mine = mine[np.lexsort((self.inc.position[mine], r.start[mine], key[mine]))]
            orders.append(np.concatenate([before[device_of[before] == d], mine, rest]).astype(np.int64))
        return device_of, orders


class WindowSearch:
    """Window rounds from an incumbent plan of the whole graph (see the module's description).

    Parameters
    ----------
    graph, cluster
    result : SimResult
        The incumbent: a fitting simulated plan of ``graph``.
    seed : int
    workers : int
        CP-SAT threads.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=6, branches=3, seed=2)
    >>> c = load_cluster("2xV100-nvlink")
    >>> from placer.algorithms.registry import place
    >>> from placer.sim.simulator import simulate_plan
    >>> start = simulate_plan(place(g, c, "round_robin"), g, c)
    >>> search = WindowSearch(g, c, start, seed=0)
    >>> found = search.run(WindowBudget(6, 0.2), until=float("inf"))
    >>> found.makespan_s <= start.makespan_s
    True
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, result: SimResult, seed: int = 0, workers: int = 1):
        self.graph, self.cluster, self.seed, self.workers = graph, cluster, seed, workers
        allowed = graph.allowed(cluster)
        for members in graph.colocation_groups.values():
            allowed[members] = allowed[members].all(axis=0)
        self.durations = np.where(allowed, graph.durations(cluster), -1.0)
        self.movable = np.ones(graph.num_nodes, dtype=bool)
        for members in graph.colocation_groups.values():
            self.movable[members] = False  # a colocated operation moves with its group: only its order is free
        self.incumbent = Incumbent.of(result)
        self.picker = WindowPicker(cluster.num_devices, seed)
        self.stats = {"window_rounds": 0, "window_improved": 0, "window_closed": 0, "window_work": 0.0}
        self.cut_by_wall_clock = False

    def run(self, budget: WindowBudget, until: float) -> SimResult:
        """Run ``budget``'s rounds (or until ``until`` on ``time.perf_counter()``); the best plan found."""
        for r in range(budget.rounds):
            if time.perf_counter() > until:
                self.cut_by_wall_clock = True
                break
            self.round(self.seed + r + 1, budget.work_per_round, until)
        return self.incumbent.result

    def round(self, seed: int, work: float, until: float) -> bool:
        """One window round; whether it shortened the step."""
        inc = self.incumbent
        self.stats["window_rounds"] += 1
        win = self.picker.pick(inc)
        if win is None or win.free.size == 0:
            return False
        model = _WindowModel(inc, win, self.cluster, self.durations, self.movable)
        status, solver = model.solve(seed, self.workers, until - time.perf_counter(), work)
        done = solver.ResponseProto().deterministic_time
        self.stats["window_work"] += done
        if status in (cp_model.FEASIBLE, cp_model.UNKNOWN) and done < 0.99 * work:
            self.cut_by_wall_clock = True
        self.stats["window_closed"] += status == cp_model.OPTIMAL
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return False
        device_of, orders = model.plan(solver)
        if np.array_equal(device_of, inc.result.device_of) and all(
            np.array_equal(a, b) for a, b in zip(orders, inc.orders)
        ):
            return False
        try:
            trial = simulate(self.graph, self.cluster, device_of, orders, check=False)
        except InvalidPlanError:  # no channel between a moved operation's new device and a neighbour's
            return False
        if not trial.fits or trial.makespan_s >= inc.result.makespan_s * (1 - ACCEPT_TOLERANCE):
            return False
        self.incumbent = Incumbent.of(trial)
        self.stats["window_improved"] += 1
        return True

    def report(self) -> dict:
        return dict(self.stats, window_kinds=dict(self.picker.kinds_used))
