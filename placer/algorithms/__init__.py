"""Placement algorithms, one module per family, all behind ``place(graph, cluster, name, **options)``.

Importing this package registers every algorithm; add a family by writing
its module and importing it here.
"""

from . import (  # noqa: F401  (each module registers its family)
    auto,  # auto
    baechi,  # m_topo, m_etf, m_sct
    baselines,  # single, round_robin, expert, metis
    celeritas,  # celeritas, order_place
    data_parallel,  # data_parallel, sharded_data_parallel
    fastt,  # dpos, os_dpos
    heft,  # heft
    pesto,  # pesto
    pipeline,  # gpipe, 1f1b
    placeto,  # placeto
)
from .registry import Algorithm, available_algorithms, get_algorithm, place, register

__all__ = ["Algorithm", "available_algorithms", "get_algorithm", "place", "register"]
