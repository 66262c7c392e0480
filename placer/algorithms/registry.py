"""One interface for every placement algorithm: ``place(graph, cluster, **options) -> Plan``.

An algorithm is a plain function registered under a name::

    @register("round_robin")
    def round_robin(graph, cluster, *, seed=0, time_limit=None) -> Plan: ...

Its keyword-only parameters are its options; :func:`place` validates them at
the door, diagnoses impossible problems, runs the algorithm, then checks the
plan against the reference model and fills in its predicted figures, so
every plan that leaves :func:`place` is valid and fits in memory (a plan it
already checked for the same graph and cluster and that comes back unchanged,
as ``auto`` returns a member's, keeps that check's figures).
"""

from __future__ import annotations

import inspect
import math
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from ..cluster import Cluster
from ..errors import InfeasibleError, InvalidPlanError, OptionError, TimeLimitError
from ..feasibility import diagnose
from ..graph import OpGraph
from ..io import shown
from ..plan import Plan
from ..sim.bounds import plan_lower_bound
from ..sim.validation import validate
from ..transform.bind import target_graph
from ..transform.microbatch import check_microbatches, microbatch_graph
from .timebox import TimeBox

__all__ = [
    "register",
    "get_algorithm",
    "available_algorithms",
    "place",
    "Algorithm",
    "failure_message",
    "checked_options",
    "check_time_limit",
    "check_seed",
]

_COMMON = ("seed", "time_limit")
#: An algorithm still running at this share of its ``time_limit`` is stopped (TimeLimitError).
BOX_SHARE = 1.05


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm: its name, function, options with defaults, and a one-line summary."""

    name: str
    func: Callable[..., Plan]
    options: dict[str, Any]
    summary: str
    prepare: Callable[[dict[str, Any]], None] | None = None


_REGISTRY: dict[str, Algorithm] = {}

#: Plans :func:`place` checked, with what the check depended on and its figures: a plan an algorithm
#: returns as place() checked it for the same graph and cluster (``auto`` returns a member's plan)
#: is not simulated again, which is costly on a large replicated graph.
_checked: "weakref.WeakKeyDictionary[Plan, tuple[tuple, dict]]" = weakref.WeakKeyDictionary()


def _check_key(plan: Plan, graph: OpGraph, cluster: Cluster) -> tuple:
    """Everything a check of ``plan`` on ``graph`` and ``cluster`` depends on (the objects by identity)."""
    order = None if plan.order is None else tuple((device, tuple(ids)) for device, ids in plan.order.items())
    rewritten = None if plan.rewritten_graph is None else id(plan.rewritten_graph)
    return (
        weakref.ref(graph),
        weakref.ref(cluster),
        rewritten,
        plan.graph_digest,
        plan.graph_name,
        repr(plan.splits),
        tuple(plan.placement.items()),
        order,
    )


def register(
    name: str, *, prepare: Callable[[dict[str, Any]], None] | None = None
) -> Callable[[Callable[..., Plan]], Callable[..., Plan]]:
    """Register ``func(graph, cluster, *, seed=..., time_limit=..., **options) -> Plan`` as ``name``.

    ``prepare(options)``, if given, does a process's one-time setup for a call with these (checked)
    options (importing torch): :func:`place` runs it before the algorithm's time limit starts.
    """

    def decorate(func: Callable[..., Plan]) -> Callable[..., Plan]:
        params = inspect.signature(func).parameters
        options = {p.name: p.default for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
        missing = [c for c in _COMMON if c not in options]
        if missing:
            raise TypeError(f"algorithm {name!r} must accept the keyword options {missing}")
        if name in _REGISTRY:
            raise TypeError(f"algorithm {name!r} is registered twice")
        summary = (inspect.getdoc(func) or "").split("\n", 1)[0]
        _REGISTRY[name] = Algorithm(name, func, options, summary, prepare)
        return func

    return decorate


def available_algorithms() -> list[str]:
    """Names of the registered algorithms, sorted."""
    return sorted(_REGISTRY)


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``; OptionError listing the names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise OptionError(f"unknown algorithm {name!r}; available: {', '.join(available_algorithms())}") from None


def failure_message(name: str, exc: Exception) -> str:
    """``exc``'s message, prefixed with the algorithm's name unless it already starts with it
    (``"pesto: ..."``, ``"pesto found no plan ..."``) or names it quoted (``"option target of 'pesto' ..."``)."""
    message = str(exc)
    named = message.startswith((f"{name}:", f"{name} ")) or f"'{name}'" in message
    return message if named else f"{name}: {message}"


#: The longest time limit an algorithm takes, in seconds (about 11.6 days): a longer one would overflow
#: the timers that hold it (the alarm of placer.algorithms.timebox).
MAX_TIME_LIMIT = 1e6
#: The largest seed: the solvers the algorithms hand it to hold a seed in 32 bits (OR-Tools'
#: ``random_seed``, METIS's ``seed``), and every algorithm takes the same seeds.
MAX_SEED = 2**31 - 1


def check_time_limit(value: Any, option: str = "time_limit") -> None:
    """Refuse a time limit that is not a positive number of seconds up to :data:`MAX_TIME_LIMIT` (None: none),
    naming ``option``."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0
    ):
        raise OptionError(f"option {option} must be a positive number of seconds, got {_number(value)}")
    if value is not None and value > MAX_TIME_LIMIT:
        raise OptionError(
            f"option {option} must be at most {MAX_TIME_LIMIT:,.0f} seconds (about 11.6 days), got {_number(value)}"
        )


def check_seed(value: Any, option: str = "seed") -> None:
    """Refuse a seed that is not an integer from 0 to :data:`MAX_SEED`, naming ``option``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OptionError(f"option {option} must be a non-negative integer, got {_number(value)}")
    if value > MAX_SEED:
        raise OptionError(
            f"option {option} must be at most {MAX_SEED} (2**31 - 1: the solvers hold a seed in "
            f"32 bits), got {shown(value)}"
        )


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)


def checked_options(alg: Algorithm, options: dict[str, Any]) -> dict[str, Any]:
    """``alg``'s options with ``options`` applied, each validated (OptionError naming the option otherwise)."""
    unknown = sorted(set(options) - set(alg.options))
    if unknown:
        raise OptionError(
            f"algorithm {alg.name!r} has no option {unknown[0]!r}; its options are: {', '.join(sorted(alg.options))}"
        )
    checked = dict(alg.options)
    for key, value in options.items():
        default = alg.options[key]
        if key == "time_limit":
            check_time_limit(value)
        elif key == "seed":
            check_seed(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise OptionError(f"option {key} of {alg.name!r} must be true or false, got {value!r}")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int):
                raise OptionError(f"option {key} of {alg.name!r} must be an integer, got {value!r}")
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise OptionError(f"option {key} of {alg.name!r} must be a number, got {value!r}")
            value = float(value)
        elif isinstance(default, str) and not isinstance(value, str):
            raise OptionError(f"option {key} of {alg.name!r} must be a string, got {value!r}")
        checked[key] = value
    return checked


def _import_libraries() -> None:
    """Import what the algorithms load on first use: scipy's sparse graphs (grouping nodes,
    :func:`~placer.graph.joined_groups`) and its LP solver (m-SCT). This can take seconds, which a
    process's first call would otherwise spend from a short time limit and fail with.
    """
    import scipy.optimize  # noqa: F401
    import scipy.sparse.csgraph  # noqa: F401


def place(
    graph: OpGraph, cluster: Cluster, algorithm: str = "expert", *, microbatches: int | None = None, **options: Any
) -> Plan:
    """Place ``graph`` on ``cluster`` with the named algorithm and return a valid plan.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    algorithm : str
        A name from :func:`available_algorithms`.
    **options
        The algorithm's options; every algorithm takes ``seed`` (int) and
        ``time_limit`` (seconds or None). The limit bounds the checks and the
        search, not a process's one-time setup (the first call imports scipy's
        graphs and solvers, and Placeto's torch, before its clock starts).
    microbatches : int, optional
        Place the step cut into this many micro-batches, their gradients
        accumulated (:func:`~placer.transform.microbatch.microbatch_graph`):
        the plan places the micro-batched step, which it carries as its
        rewritten graph, so that any algorithm pipelines by itself. An
        algorithm with a ``microbatches`` option of its own (``gpipe``,
        ``1f1b``, ``auto``) is given it instead. None or 1: the step as it is.

    Returns
    -------
    Plan
        With a per-device order, ``predicted`` figures from the reference model
        (makespan_s, peak_memory_bytes, fits, lower_bound_s), ``search_time_s``, and
        ``graph`` and ``cluster`` in its ``context`` (so that ``placer.describe(plan)`` needs neither).

    Raises
    ------
    OptionError
        Unknown algorithm or option, or a bad option value; more
        micro-batches than the batch has samples, or none to cut.
    InfeasibleError
        The problem is impossible, or the algorithm found no plan that fits.
    TimeLimitError
        The algorithm had no plan when ``time_limit`` ran out.

    Examples
    --------
    >>> from placer.cluster import PRESETS
    >>> g = OpGraph(["a", "b"], [1.0, 1.0], [0], [1], [8])
    >>> place(g, PRESETS["2xV100-nvlink"](), "single").predicted["makespan_s"]
    2.0
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2)
    >>> place(g, PRESETS["2xV100-nvlink"](), "m_etf", microbatches=2).rewritten_graph.extra["microbatches"]["count"]
    2
    """
    alg = get_algorithm(algorithm)
    if microbatches is not None and "microbatches" in alg.options:
        options = {**options, "microbatches": microbatches}
    elif microbatches is not None:
        checked_options(alg, options)
        if check_microbatches(graph, microbatches, algorithm) > 1:
            return _place_microbatched(graph, cluster, algorithm, int(microbatches), options)
    opts = checked_options(alg, options)
    _import_libraries()  # once per process, outside the time limit: it is no search
    if alg.prepare is not None:
        alg.prepare(opts)
    entered = time.perf_counter()
    if "microbatches" not in alg.options:  # an algorithm that cuts the step diagnoses what it cuts
        diagnose(graph, cluster)
    began = time.perf_counter()
    # Searches stop by themselves within their limit (the box leaves them 5% to return what they
    # found); the box stops what cannot stop itself (the one-pass schedulers).
    limit = opts.get("time_limit")
    try:
        with TimeBox(None if limit is None else BOX_SHARE * limit - (began - entered)) as box:
            plan = alg.func(graph, cluster, **opts)
    except InvalidPlanError as exc:  # the algorithm's own check of what it built (a baseline's fixed rule)
        raise InfeasibleError(failure_message(algorithm, f"found no valid plan: {exc}")) from None
    except OptionError as exc:  # an option checked where it is used (a transform's), named like the rest
        raise OptionError(failure_message(algorithm, str(exc))) from None
    if box.expired:
        raise TimeLimitError(
            f"{algorithm} found no plan within its time limit of {opts['time_limit']:g} s "
            f"({graph.num_nodes} ops on {cluster.num_devices} devices); give it more time"
        )
    elapsed = time.perf_counter() - began
    plan.cluster_digest = cluster.digest()  # before the check: the plan is for this cluster, as built on any
    known = _checked.get(plan)
    if known is not None and known[0] == _check_key(plan, graph, cluster):
        figures = known[1]
    else:
        try:
            result = validate(plan, graph, cluster)
        except InvalidPlanError as exc:
            raise InfeasibleError(f"{algorithm} found no valid plan: {exc}") from None
        if plan.order is None:
            names = [d.name for d in cluster.devices]
            target = target_graph(plan, graph)
            plan.order = {
                names[j]: [target.ids[i] for i in seq.tolist()] for j, seq in enumerate(result.device_orders())
            }
        figures = {**result.predicted(), "lower_bound_s": plan_lower_bound(plan, graph, cluster)}
        _checked[plan] = (_check_key(plan, graph, cluster), figures)
    plan.algorithm = algorithm
    plan.predicted = dict(figures)
    plan.search_time_s = elapsed
    plan.context.update(graph=graph, cluster=cluster)  # describe(plan) and apply(plan, ...) without them
    return plan


def _place_microbatched(
    graph: OpGraph, cluster: Cluster, algorithm: str, microbatches: int, options: dict[str, Any]
) -> Plan:
    """:func:`place` of the step cut into ``microbatches`` micro-batches, as a plan of ``graph``.

    The algorithm places the micro-batched step like any graph (and :func:`place` checks that plan
    against it); the plan then names ``graph`` as the one it was made for and carries what it placed
    as its rewritten graph, so that it binds, validates and runs as a plan of ``graph``.
    """
    micro = microbatch_graph(graph, microbatches).graph
    plan = place(micro, cluster, algorithm, **options)
    if plan.rewritten_graph is None:
        plan.rewritten_graph = target_graph(plan, micro)
    plan.graph_digest, plan.graph_name = graph.digest(), graph.name
    plan.extra = {**plan.extra, "microbatches": microbatches}
    plan.context.update(graph=graph, cluster=cluster)
    _checked[plan] = (_check_key(plan, graph, cluster), dict(plan.predicted))
    return plan
