"""Clusters the tests build by hand."""

from placer.cluster import Channel, Cluster, Device

GIB = 1 << 30


def line_cluster(names, memory=16 * GIB, kinds=None, both_ways=True) -> Cluster:
    """Devices in a line, channels only between neighbours (a pair no channel lists cannot communicate):
    the devices at the two ends cannot send to each other."""
    pairs = list(zip(names, names[1:])) + (list(zip(names[1:], names)) if both_ways else [])
    kinds = kinds or ["V100"] * len(names)
    return Cluster(
        "line",
        [Device(n, k, memory) for n, k in zip(names, kinds)],
        [Channel(f"{a}->{b}", 25e9, 1e-5, ((a, b),)) for a, b in pairs],
    )
