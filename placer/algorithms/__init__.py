"""Placement algorithms, one module per family, all behind ``place(graph, cluster, name, **options)``.

Importing this package registers every algorithm; add a family by writing
its module and importing it here.
"""

from . import (  # noqa: F401  (register auto; single, round_robin, expert, metis)  # noqa: F401  (m_topo, m_etf, m_sct; data_parallel; dpos, os_dpos; heft)
    auto,
    baechi,
    baselines,
    celeritas,  # noqa: F401  (register celeritas, order_place)
    data_parallel,
    fastt,
    heft,
    pesto,  # noqa: F401  (register pesto)
    pipeline,  # noqa: F401  (register gpipe, 1f1b)
    placeto,  # noqa: F401  (register placeto)
)
from .registry import Algorithm, available_algorithms, get_algorithm, place, register

__all__ = ["Algorithm", "available_algorithms", "get_algorithm", "place", "register"]
