"""The one-call API: from a PyTorch model (or a graph) to a checked plan.

``placer.plan(model, inputs, cluster=..., algorithm=...)`` runs the pipeline
capture -> cost -> place -> simulate and returns a :class:`~placer.plan.Plan`
that remembers what it was made from, so that ``placer.describe(plan)`` and
``placer.apply(plan, model, optimizer)`` need no further arguments.
:func:`validate` checks any plan against a graph and a cluster.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from .algorithms import get_algorithm, place
from .algorithms.auto import RUNNABLE_DEPRECATED
from .algorithms.registry import checked_options
from .capture.optim import spec_of
from .cluster import Cluster, load_cluster
from .cost.profile import apply_profile, load_profile
from .errors import InvalidPlanError, OptionError
from .graph import OpGraph
from .plan import Plan
from .report.tables import simulation_text
from .sim.bounds import plan_lower_bound
from .sim.simulator import simulate_bound
from .sim.validation import validate
from .transform.bind import bind_plan
from .transform.microbatch import check_microbatches, uneven_microbatches
from .transform.split import batch_samples

__all__ = ["plan", "validate", "describe", "apply"]


def plan(
    model: Any,
    inputs: Any = None,
    *,
    cluster: "str | os.PathLike | Cluster" = "4xV100-nvlink",
    algorithm: str = "auto",
    batch: int | None = None,
    optimizer: Any = "adam",
    lr: float | None = None,
    profile: "str | os.PathLike | None" = None,
    runnable: bool | None = None,
    microbatches: int | None = None,
    **options: Any,
) -> Plan:
    """Capture one training step of ``model``, place it on ``cluster`` and check the plan.

    Parameters
    ----------
    model : torch.nn.Module, str or OpGraph
        A module with ``model(*inputs)`` the scalar loss; or a model spec
        (``"zoo:NAME"``, ``"path/file.py:FACTORY"``) captured at ``batch``; or
        an already captured :class:`OpGraph`.
    inputs : tuple of tensors, optional
        Example inputs of one step (required with a module, refused otherwise).
    cluster : str, path or Cluster
        A preset name or a ``placer.cluster/1`` file.
    algorithm : str
        A registered algorithm (``placer.available_algorithms()``).
    batch : int, optional
        Batch size for a model spec (required with one, refused otherwise).
    optimizer, lr
        The optimizer whose update is part of the captured step: a name (``"adam"``,
        ``"sgd"``, ``"adamw"``; torch's defaults, ``lr`` default 1e-3), or a live
        ``torch.optim`` optimizer, whose class and settings (``lr``, ``momentum``,
        ``weight_decay``, ``betas``, ...) the step is captured with (``lr`` then not given).
    profile : path, optional
        A ``placer.profile/1`` file of measured per-node times to use instead
        of the analytic costs for its device kind.
    microbatches : int, optional
        Place the step cut into this many micro-batches, their gradients
        accumulated before one optimizer step (``place(..., microbatches=M)``):
        every algorithm then pipelines. At most the batch's samples; a count
        that does not divide the batch plans uneven micro-batches, as replicas
        share a batch (the first ones one sample more), and says so with a
        UserWarning. Without it, ``auto`` searches the count itself.
    runnable : bool, optional
        Deprecated, no effect (every plan runs): giving it warns with a
        DeprecationWarning. To be removed in the next release.
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
        Bad arguments, a bad model spec, or no valid plan. The cluster, the
        algorithm, its options, the profile and the micro-batch count (against
        ``batch`` or the inputs' leading dimension: more micro-batches than
        samples, or no batch dimension to cut) are checked before the capture,
        which takes minutes for a large model.

    Examples
    --------
    >>> import placer                                            # doctest: +SKIP
    >>> plan = placer.plan("zoo:lenet", batch=8, cluster="2xcpu", algorithm="expert")  # doctest: +SKIP
    >>> plan.predicted["fits"]                                   # doctest: +SKIP
    True
    """
    if runnable is not None:
        warnings.warn(RUNNABLE_DEPRECATED, DeprecationWarning, stacklevel=2)
    target = load_cluster(cluster)
    checked_options(get_algorithm(algorithm), options)
    if microbatches is not None and (
        isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1
    ):
        raise OptionError(f"placer.plan: microbatches must be an integer >= 1, got {microbatches!r}")
    measured = None
    if profile is not None:
        measured = load_profile(profile)
        measured.check_cluster(target)
    if microbatches is not None and microbatches > 1:
        _check_microbatches(model, inputs, batch, microbatches)
    name, lr, settings = _optimizer(optimizer, lr)
    graph, captured = _captured(model, inputs, batch, name, lr, settings)
    if measured is not None:
        graph = apply_profile(graph, measured)
    result = place(graph, target, algorithm, microbatches=microbatches, **options)
    result.context.update(graph=graph, cluster=target, captured=captured)
    return result


def _check_microbatches(model: Any, inputs: Any, batch: int | None, microbatches: int) -> None:
    """Refuse, before the capture, ``microbatches`` that the step's batch cannot take; warn where they do not
    divide it.

    The batch is the graph's samples, a model spec's ``batch``, or a module's inputs' leading dimension (that
    of the first tensor that has one, as the capture takes it). Arguments that :func:`_captured` refuses
    are left to it.
    """
    if isinstance(model, OpGraph):
        check_microbatches(model, microbatches, "placer.plan")
        samples = batch_samples(model)
    elif isinstance(model, str):
        if not isinstance(batch, int) or isinstance(batch, bool):
            return
        samples = batch
        who = f"placer.plan({model!r}, batch={batch}, microbatches={microbatches})"
    else:
        if inputs is None:
            return
        flat = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
        leading = [x.shape[0] for x in flat if hasattr(x, "shape") and hasattr(x, "dim") and x.dim() >= 1]
        who = f"placer.plan(model, inputs, microbatches={microbatches})"
        if not leading:
            raise OptionError(
                f"{who}: no input has a batch dimension to cut into micro-batches (a tensor whose leading "
                f"dimension is the batch)"
            )
        samples = int(leading[0])
    if not isinstance(model, OpGraph) and microbatches > samples:
        raise OptionError(
            f"{who}: {microbatches} micro-batches of a batch of {samples} sample{'s' if samples != 1 else ''}: "
            f"at most {samples}, one sample each"
        )
    note = uneven_microbatches(samples, microbatches)
    if note:
        warnings.warn(f"placer.plan: {note}", UserWarning, stacklevel=3)


def _optimizer(optimizer: Any, lr: float | None) -> tuple[str, float, dict]:
    """The optimizer's name, lr and other settings, from a name and ``lr`` or from a live optimizer."""
    if isinstance(optimizer, str):
        return optimizer, 1e-3 if lr is None else lr, {}

    if lr is not None:
        raise OptionError(
            f"placer.plan(optimizer={type(optimizer).__name__}, lr={lr!r}): a live optimizer "
            f"gives its own lr; lr= is for an optimizer name"
        )
    spec = spec_of(optimizer)
    settings = spec.settings
    return spec.name, settings.pop("lr"), settings


def _captured(
    model: Any, inputs: Any, batch: int | None, optimizer: str, lr: float, settings: dict | None = None
) -> tuple[OpGraph, Any]:
    """The graph of ``model``'s training step and the captured step (None for a graph), refusing an argument
    that would be ignored (a batch or inputs beside a graph, inputs beside a spec, a batch beside a module)."""
    if isinstance(model, OpGraph):
        if batch is not None or inputs is not None:
            given = "batch=" if batch is not None else "inputs"
            raise OptionError(
                f"placer.plan(graph {model.name!r}): {given} is for a model to capture; the graph is "
                f"captured already, at its own batch"
            )
        return model, None
    if isinstance(model, str):
        from .capture import capture_spec  # deferred: imports torch

        if inputs is not None:
            raise OptionError(
                f"placer.plan({model!r}, inputs): a model spec makes its own inputs at batch=N; inputs are for a module"
            )
        if batch is None:
            raise OptionError(f"placer.plan({model!r}): a model spec needs batch=N")
        captured = capture_spec(model, batch, optimizer=optimizer, lr=lr, settings=settings)
        return captured.graph, captured
    from torch import nn  # deferred: imports torch

    if not isinstance(model, nn.Module):
        raise OptionError(
            f"placer.plan(model): model must be a torch.nn.Module, a model spec ('zoo:NAME', "
            f"'path/file.py:FACTORY') or an OpGraph, got {type(model).__name__}"
        )
    if inputs is None:
        raise OptionError("placer.plan(model, inputs): a module needs example inputs (a tuple of tensors)")
    if batch is not None:
        raise OptionError(
            f"placer.plan(model, inputs, batch={batch!r}): a module's batch is that of its inputs; "
            f"batch= is for a model spec"
        )
    from .capture import capture  # deferred: imports torch

    captured = capture(
        model,
        tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,),
        optimizer=optimizer,
        lr=lr,
        settings=settings,
    )
    return captured.graph, captured


def describe(plan: Plan, graph: OpGraph | None = None, cluster: Cluster | None = None) -> str:
    """Per-device load, peak memory and the step's figures of ``plan``, as text.

    ``graph`` and ``cluster`` default to those the plan was made for by
    :func:`placer.plan` or :func:`placer.place` (its ``context``). A plan that
    overflows a device's memory is reported so (its fits column), not refused.

    Raises
    ------
    InvalidPlanError
        Without a graph and cluster, or where the plan does not bind to them.
    """
    graph = graph or plan.context.get("graph")
    cluster = cluster or plan.context.get("cluster")
    if graph is None or cluster is None:
        raise InvalidPlanError("describe(plan) needs the graph and cluster the plan is for")
    result = simulate_bound(bind_plan(plan, graph, cluster))
    bound = plan_lower_bound(plan, graph, cluster)
    return simulation_text(result, {**result.predicted(), "lower_bound_s": bound})


def apply(plan: Plan, model: Any, optimizer: Any = None, **options: Any) -> Any:
    """A training-step callable that runs ``plan`` on ``model``: ``loss = step(*inputs)``.

    Each call updates the model's parameters and buffers and the optimizer's
    state in place; see :class:`placer.runtime.apply.PlacedStep` for ``options``.
    """
    from .runtime.apply import PlacedStep  # deferred: the runtime imports torch

    return PlacedStep(plan, model, optimizer, **options)
