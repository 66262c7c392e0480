"""placer: decide where and in what order every operation of a training step runs.

The pipeline, one package per stage::

    capture -> cost -> transform -> place (algorithms) -> simulate (sim) -> run (runtime)

Quick start::

    import placer
    plan = placer.plan(model, inputs, cluster="4xV100-nvlink", algorithm="auto")  # model(*inputs) is the loss
    print(placer.describe(plan))
    step = placer.apply(plan, model, optimizer)   # a placed training step
    loss = step(*inputs)

or, from a graph file::

    graph = placer.OpGraph.load("g.json")
    plan = placer.place(graph, placer.load_cluster("4xV100-nvlink"), "expert")
"""

from .algorithms import available_algorithms, place, register
from .api import apply, describe, plan, validate
from .cluster import PRESETS, Channel, Cluster, Device, load_cluster
from .errors import (
    ClusterMismatchWarning,
    FormatError,
    GraphCycleError,
    InfeasibleError,
    InvalidPlanError,
    OptionError,
    PlacerError,
    TimeLimitError,
)
from .graph import OpGraph
from .plan import Plan
from .sim import SimResult, lower_bound, simulate, simulate_plan

__version__ = "0.1.0"

__all__ = [
    "plan",
    "validate",
    "describe",
    "apply",
    "OpGraph",
    "Cluster",
    "Device",
    "Channel",
    "PRESETS",
    "load_cluster",
    "Plan",
    "place",
    "register",
    "available_algorithms",
    "simulate",
    "simulate_plan",
    "lower_bound",
    "SimResult",
    "PlacerError",
    "FormatError",
    "GraphCycleError",
    "InvalidPlanError",
    "InfeasibleError",
    "TimeLimitError",
    "OptionError",
    "ClusterMismatchWarning",
]
