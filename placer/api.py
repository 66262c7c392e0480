"""The one-call API: from a PyTorch model (or a graph) to a checked plan.

``placer.plan(model, inputs, cluster=..., algorithm=...)`` runs the pipeline
capture -> cost -> place -> simulate and returns a :class:`~placer.plan.Plan`
that remembers what it was made from, so that ``plan.report()`` and
``plan.apply(model, optimizer)`` need no further arguments.
"""

from __future__ import annotations

import os
from typing import Any

from .algorithms import place
from .cluster import Cluster, load_cluster
from .errors import OptionError
from .graph import OpGraph
from .plan import Plan

__all__ = ["plan"]


def plan(model: Any, inputs: Any = None, *, cluster: "str | os.PathLike | Cluster" = "4xV100-nvlink",
         algorithm: str = "auto", batch: int | None = None, optimizer: str = "adam", lr: float = 1e-3,
         profile: "str | os.PathLike | None" = None, **options: Any) -> Plan:
    """Capture one training step of ``model``, place it on ``cluster`` and check the plan.

    Parameters
    ----------
    model : torch.nn.Module, str or OpGraph
        A module with ``model(*inputs)`` the scalar loss; or a model spec
        (``"zoo:NAME"``, ``"path/file.py:FACTORY"``) captured at ``batch``; or
        an already captured :class:`OpGraph`.
    inputs : tuple of tensors, optional
        Example inputs of one step (required with a module).
    cluster : str, path or Cluster
        A preset name or a ``placer.cluster/1`` file.
    algorithm : str
        A registered algorithm (``placer.available_algorithms()``).
    batch : int, optional
        Batch size for a model spec (required with one).
    optimizer, lr
        The optimizer whose update is part of the captured step.
    profile : path, optional
        A ``placer.profile/1`` file of measured per-node times to use instead
        of the analytic costs for its device kind.
    **options
        The algorithm's options (``seed``, ``time_limit``, ...).

    Returns
    -------
    Plan
        Valid and memory-fitting under the reference model; ``plan.context``
        holds the graph, the cluster and the captured step.

    Raises
    ------
    OptionError, FormatError, InfeasibleError
        Bad arguments, a bad model spec, or no valid plan.

    Examples
    --------
    >>> import placer                                            # doctest: +SKIP
    >>> plan = placer.plan("zoo:lenet", batch=8, cluster="2xcpu", algorithm="expert")  # doctest: +SKIP
    >>> plan.predicted["fits"]                                   # doctest: +SKIP
    True
    """
    captured = None
    if isinstance(model, OpGraph):
        graph = model
    elif isinstance(model, str):
        from .capture import capture_spec

        if batch is None:
            raise OptionError(f"placer.plan({model!r}): a model spec needs batch=N")
        captured = capture_spec(model, batch, optimizer=optimizer, lr=lr)
        graph = captured.graph
    else:
        if inputs is None:
            raise OptionError("placer.plan(model, inputs): a module needs example inputs (a tuple of tensors)")
        from .capture import capture

        captured = capture(model, tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,),
                           optimizer=optimizer, lr=lr)
        graph = captured.graph
    if profile is not None:
        from .cost.profile import apply_profile, load_profile

        graph = apply_profile(graph, load_profile(profile))
    target = load_cluster(cluster)
    result = place(graph, target, algorithm, **options)
    result.context.update(graph=graph, cluster=target, captured=captured)
    return result
