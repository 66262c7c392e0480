"""An independent, deliberately naive implementation of FORMATS.md's reference execution model.

It reads the JSON documents (not placer's objects), advances time from event
to event with plain scans instead of heaps, and measures memory by summing
the blocks alive at every instant. Tests compare placer's simulator with it.
"""

from __future__ import annotations

import math


def reference_simulate(graph: dict, cluster: dict, placement: dict, order: dict | None = None) -> dict:
    nodes = graph["nodes"]
    edges = graph["edges"]
    index = {n["id"]: i for i, n in enumerate(nodes)}
    devices = {d["name"]: d for d in cluster["devices"]}
    channel_of = {}
    for ch in cluster.get("channels", []):
        for a, b in ch["pairs"]:
            channel_of[(a, b)] = ch

    def duration(node):
        d = devices[placement[node["id"]]]
        by_kind = node.get("compute_s_by_kind") or {}
        if d["kind"] in by_kind:
            return by_kind[d["kind"]]
        return node["compute_s"] / d.get("speed", 1.0)

    # Transfers: one per (producer, tensor, destination device).
    transfers = {}
    for e in edges:
        a, b = placement[e["src"]], placement[e["dst"]]
        if a == b:
            continue
        key = (e["src"], e.get("tensor", 0), b)
        t = transfers.setdefault(
            key, {"bytes": 0, "consumers": [], "channel": channel_of[(a, b)]["name"], "src_dev": a, "dst_dev": b}
        )
        t["bytes"] = max(t["bytes"], e["bytes"])
        t["consumers"].append(e["dst"])
    channels = {ch["name"]: ch for ch in cluster.get("channels", [])}
    inputs = {n["id"]: [] for n in nodes}  # per node: list of ("local", producer) or ("xfer", key)
    for e in edges:
        if placement[e["src"]] == placement[e["dst"]]:
            inputs[e["dst"]].append(("local", e["src"]))
        else:
            inputs[e["dst"]].append(("xfer", (e["src"], e.get("tensor", 0), placement[e["dst"]])))

    start, finish, ready_at = {}, {}, {}
    x_queued, x_start, x_end = {}, {}, {}
    dev_running = {name: None for name in devices}
    ch_running = {name: None for name in channels}
    position = {name: 0 for name in devices}
    time = 0.0

    def arrived(inp):
        kind, what = inp
        if kind == "local":
            return what in finish and finish[what] <= time
        return what in x_end and x_end[what] <= time

    while True:
        # apply: everything that ended by now frees its resource
        for name, v in dev_running.items():
            if v is not None and finish[v] <= time:
                dev_running[name] = None
        for name, x in ch_running.items():
            if x is not None and x_end[x] <= time:
                ch_running[name] = None
        for key in transfers:
            if key not in x_queued and key[0] in finish and finish[key[0]] <= time:
                x_queued[key] = finish[key[0]]
        for n in nodes:
            v = n["id"]
            if v not in ready_at and all(arrived(i) for i in inputs[v]):
                ready_at[v] = time
        # pick: jobs of no duration first, whose ends (events of this instant) come before the other picks
        began = False
        for instant_only in (True, False):
            for name in devices:
                if dev_running[name] is not None:
                    continue
                if order is None:
                    cands = [
                        n["id"]
                        for n in nodes
                        if placement[n["id"]] == name and n["id"] in ready_at and n["id"] not in start
                    ]
                    if not cands:
                        continue
                    v = min(cands, key=lambda v: (ready_at[v], index[v]))
                else:
                    seq = order.get(name, [])
                    if position[name] >= len(seq) or seq[position[name]] not in ready_at:
                        continue
                    v = seq[position[name]]
                if instant_only and duration(nodes[index[v]]) != 0:
                    continue
                if order is not None:
                    position[name] += 1
                start[v] = time
                finish[v] = time + duration(nodes[index[v]])
                dev_running[name] = v
                began = True
            for name, ch in channels.items():
                if ch_running[name] is not None:
                    continue
                cands = [k for k in x_queued if transfers[k]["channel"] == name and k not in x_start]
                if not cands:
                    continue
                k = min(cands, key=lambda k: (x_queued[k], index[k[0]], k[2], k[1]))
                length = ch["latency_s"] + transfers[k]["bytes"] / ch["bandwidth_bytes_per_s"]  # a duration, as rule 4
                if instant_only and length != 0:
                    continue
                x_start[k] = time
                x_end[k] = time + length
                ch_running[name] = k
                began = True
            if began:
                break
        pending = [t for t in list(finish.values()) + list(x_end.values()) if t > time]
        zero_now = any(dev_running[d] is not None and finish[dev_running[d]] == time for d in devices) or any(
            ch_running[c] is not None and x_end[ch_running[c]] == time for c in channels
        )
        if zero_now:
            continue
        if not pending:
            break
        time = min(pending)
    if len(start) < len(nodes):
        raise RuntimeError("deadlock")

    makespan = max(finish.values(), default=0.0)
    # Memory: half-open blocks [alloc, free), releases before allocations at an instant.
    blocks = {name: [] for name in devices}
    params = {name: 0 for name in devices}
    for n in nodes:
        v, d = n["id"], placement[n["id"]]
        params[d] += n.get("param_bytes", 0)
        blocks[d].append((start[v], finish[v], n.get("temp_bytes", 0)))
        end = finish[v]
        for e in edges:
            if e["src"] == v and placement[e["dst"]] == d:
                end = max(end, finish[e["dst"]])
        for key in transfers:
            if key[0] == v:
                end = max(end, x_end[key])
        blocks[d].append((start[v], end, n.get("output_bytes", 0)))
    for key, t in transfers.items():
        end = max([x_end[key]] + [finish[c] for c in t["consumers"]])
        blocks[t["dst_dev"]].append((x_start[key], end, t["bytes"]))
    peak = {}
    for d, bl in blocks.items():
        best = 0
        for instant in {b[0] for b in bl}:
            best = max(best, sum(size for a, f, size in bl if a <= instant < f))
        peak[d] = params[d] + best
    fits = all(peak[d] <= devices[d]["memory_bytes"] for d in devices)
    return {"makespan_s": makespan, "start": start, "finish": finish, "peak_memory_bytes": peak, "fits": fits}


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


def random_valid_order(graph, num_devices: int, device_of, rnd) -> list[list[int]]:
    """A random topological order of ``graph`` (a placer OpGraph), split per device: always a valid order.

    ``rnd`` is a :class:`random.Random`; ``device_of`` gives each node's device.
    """
    indeg = [0] * graph.num_nodes
    for v in graph.dst.tolist():
        indeg[v] += 1
    ready = [i for i in range(graph.num_nodes) if indeg[i] == 0]
    topo = []
    while ready:
        u = ready.pop(rnd.randrange(len(ready)))
        topo.append(u)
        for v in graph.successors(u).tolist():
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return [[i for i in topo if device_of[i] == j] for j in range(num_devices)]
