"""Placement algorithms, one module per family, all behind ``place(graph, cluster, name, **options)``.

Importing this package registers every algorithm; add a family by writing
its module and importing it here.
"""

from . import auto, baselines  # noqa: F401  (register auto; single, round_robin, expert, metis)
from . import baechi, data_parallel, fastt, heft  # noqa: F401  (m_topo, m_etf, m_sct; data_parallel; dpos, os_dpos; heft)
from . import celeritas  # noqa: F401  (register celeritas, order_place)
from . import pesto  # noqa: F401  (register pesto)
from . import pipeline  # noqa: F401  (register gpipe, 1f1b)
from . import placeto  # noqa: F401  (register placeto)
from .registry import Algorithm, available_algorithms, get_algorithm, place, register

__all__ = ["Algorithm", "available_algorithms", "get_algorithm", "place", "register"]
