"""The contract of every graph transform: the new graph, and the map back to the original.

A transform rewrites a training step's :class:`~placer.graph.OpGraph` before
it is placed: it colocates operations, merges them into coarser ones, splits
one into parts, or replicates the step. Whatever it does, a placement found
for the new graph must be read back on the original one, and the new graph
must cost what the original costs, or differ from it in a way the transform
states. So every transform registered here

- is called one way: :func:`apply_transform` ``(name, graph, cluster, **options)``,
  its options validated at the door (:class:`~placer.errors.OptionError`
  for an unknown, missing or mistyped one, before any work);
- returns a :class:`TransformResult`: the new graph, the original, and the
  map between their nodes both ways (:class:`NodeMap`): each new node to the
  original nodes it stands for, each original node to the new nodes that
  stand for it;
- states what it requires of its input (``requires``) and what it ensures
  of its output (:class:`Ensures`): which costs and memory it conserves, and
  by which law.

The laws are stated over *blocks*: the connected pieces of the map, each a
set ``O`` of original nodes and the set ``N`` of new nodes standing for
them (one node and itself under a colocation; a group and its merged node
under a coarsening; one operation and its parts under a split or its
replicas under data parallelism). Nodes a transform *adds* (the split and
concat nodes of a split, the all-reduce steps of data parallelism) carry
costs of the transform's own and stand outside the blocks. For a quantity
``q`` (a node's duration on each device, or one of its memory fields) a law
is one of

- :data:`SAME`: every new node has exactly one original, with its ``q``;
- :data:`SUM`: ``sum(q[N]) == sum(q[O])``;
- :data:`MAX`: ``max(q[N]) == max(q[O])`` (workspace: members run one at a time);
- :data:`SHARE_OR_WHOLE`: either ``sum(q[N]) == sum(q[O])`` (the work is
  shared among the copies; a share in whole bytes may round by half a byte)
  or every ``q[v] == sum(q[O])`` (every copy holds the whole);
- :data:`SHARE_AND_WHOLE`: ``sum(q[N]) >= sum(q[O])`` and every
  ``q[v] <= sum(q[O])``: each copy holds a share of some of it and the whole
  of the rest (the parts of a split that each compute a whole partial of an
  output that is their sum, and a share of the other outputs), so nothing is
  lost and no copy holds more than the original.

Transfers (edge bytes) follow :data:`SAME` (the same edges), :data:`CUT`
(between any two blocks, the new edges carry what the original sends between
them: for every producer's tensor and consuming block, its largest edge,
once; the reference model's transfers), or no law (the transform says how
they change). With ``constraints``, every device kind a new node may use is
one each of its originals may use, and the nodes standing for one original
colocation group share a colocation label within each copy (a replica, a
part). Every transform ensures, besides its laws: the new graph is a valid,
acyclic OpGraph; the map is total (every original node has a new node
standing for it) and both of its directions agree; and every dependency
between two blocks is kept (each new node standing for an edge's consumer
is reachable from one standing for its producer).
:mod:`placer.transform.checks` runs these checks on every registered
transform.

Examples
--------
>>> from placer.generate import training_graph
>>> g = training_graph(layers=2, branches=2)
>>> result = apply_transform("coarsen", g, target=6)
>>> result.graph.num_nodes <= 6, len(result.image) == g.num_nodes
(True, True)
>>> bool(np.isclose(result.graph.compute_s.sum(), g.compute_s.sum()))   # the SUM law of its compute
True
>>> get_transform("coarsen").ensures.compute
'sum'

References
----------
The requires/ensures pair and a result holding the new graph follow
torch.fx's ``passes/infra/pass_base.py`` (``PassBase``, ``PassResult``);
one check suite for every registered implementation follows scikit-learn's
``check_estimator``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cluster import Cluster
from ..errors import OptionError
from ..graph import OpGraph

__all__ = [
    "NodeMap",
    "TransformResult",
    "Ensures",
    "Transform",
    "register_transform",
    "get_transform",
    "available_transforms",
    "apply_transform",
    "checked_transform_options",
    "REQUIRED",
    "SAME",
    "SUM",
    "MAX",
    "SHARE_OR_WHOLE",
    "SHARE_AND_WHOLE",
    "CUT",
    "LAWS",
    "part_times",
]

#: Laws a quantity may follow (see the module's description).
SAME, SUM, MAX, SHARE_OR_WHOLE, SHARE_AND_WHOLE = "same", "sum", "max", "share_or_whole", "share_and_whole"
#: The law of transfers between blocks: the original's cut transfers, once each.
CUT = "cut"
LAWS = (SAME, SUM, MAX, SHARE_OR_WHOLE, SHARE_AND_WHOLE)


def part_times(times: dict[str, float] | None, fixed: dict[str, float] | None, share: float) -> dict[str, float] | None:
    """A node's times by device kind for a part of it that does ``share`` of its work: on each kind, the
    node's fixed part whole and ``share`` of the rest.

    A micro-batch of a node, its replica on a slice of the batch or a split
    part of it runs the same operation on fewer rows: the call and the
    kernel's set-up, which the rows do not scale, it pays in full
    (``node_extra["fixed_s"]``, from a profile at two batches:
    :func:`~placer.cost.profile.fixed_part`; none: 0). So the parts of a
    node cost at least the node, and each at most the node: the law
    :data:`SHARE_AND_WHOLE`, which is :data:`SUM` where nothing is fixed.

    Examples
    --------
    >>> part_times({"cpu": 10e-3, "V100": 1e-3}, {"cpu": 2e-3}, 0.25)
    {'cpu': 0.004, 'V100': 0.00025}
    >>> part_times(None, {"cpu": 2e-3}, 0.5) is None
    True
    """
    if not times:
        return None
    fixed = fixed or {}
    out = {}
    for kind, seconds in times.items():
        whole = min(float(fixed.get(kind, 0.0)), seconds)
        out[kind] = whole + (seconds - whole) * share
    return out


class _Required:
    """Marks an option without a default: :func:`apply_transform` refuses a call without it."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class NodeMap:
    """Each of ``len(self)`` nodes of one graph to a set of nodes of another (of ``size`` nodes).

    Stored compressed (CSR): node ``i``'s targets are ``index[ptr[i]:ptr[i + 1]]``, in increasing order.

    Examples
    --------
    >>> m = NodeMap.from_groups([[0, 2], [1]], size=3)
    >>> m[0].tolist(), m.sizes.tolist(), m.inverse()[2].tolist()
    ([0, 2], [2, 1], [0])
    >>> NodeMap.function([0, 1, 0], size=2).inverse() == m
    True
    """

    ptr: np.ndarray
    index: np.ndarray
    size: int

    def __post_init__(self) -> None:
        if (
            self.ptr.ndim != 1
            or self.ptr.size < 1
            or self.ptr[0] != 0
            or self.ptr[-1] != self.index.size
            or np.any(np.diff(self.ptr) < 0)
        ):
            raise ValueError("NodeMap: ptr must rise from 0 to the number of targets")
        if self.index.size and (self.index.min() < 0 or self.index.max() >= self.size):
            raise ValueError(f"NodeMap: a target lies outside 0..{self.size - 1}")

    @classmethod
    def from_groups(cls, groups: Sequence[Sequence[int]], size: int) -> NodeMap:
        """Node ``i`` to the nodes ``groups[i]`` (sorted, duplicates dropped)."""
        parts = [np.unique(np.asarray(g, dtype=np.int64)) for g in groups]
        ptr = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([p.size for p in parts], out=ptr[1:])
        index = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return cls(ptr, index.astype(np.int64), int(size))

    @classmethod
    def function(cls, target: Sequence[int], size: int) -> NodeMap:
        """Node ``i`` to the one node ``target[i]``."""
        target = np.asarray(target, dtype=np.int64).reshape(-1)
        return cls(np.arange(target.size + 1, dtype=np.int64), target, int(size))

    @classmethod
    def identity(cls, n: int) -> NodeMap:
        """Node ``i`` to node ``i``, for ``n`` nodes."""
        return cls.function(np.arange(n), n)

    def __len__(self) -> int:
        return self.ptr.size - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.index[self.ptr[i] : self.ptr[i + 1]]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, NodeMap)
            and self.size == other.size
            and np.array_equal(self.ptr, other.ptr)
            and np.array_equal(self.index, other.index)
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def sizes(self) -> np.ndarray:
        """How many targets each node has."""
        return np.diff(self.ptr)

    @property
    def sources(self) -> np.ndarray:
        """The node of every entry of ``index`` (the map as pairs ``(sources, index)``)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.sizes)

    def inverse(self) -> NodeMap:
        """The map the other way: each of the ``size`` target nodes to the nodes that map to it."""
        order = np.lexsort((self.sources, self.index))
        ptr = np.zeros(self.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.index, minlength=self.size), out=ptr[1:])
        return NodeMap(ptr, self.sources[order], len(self))


@dataclass(frozen=True, eq=False)
class TransformResult:
    """What every transform returns: the new graph and how its nodes map to the original's.

    Attributes
    ----------
    graph : OpGraph
        The new graph (the original itself where the transform changed nothing).
    original : OpGraph
        The graph the transform was given.
    origin : NodeMap
        Each new node to the original nodes it stands for; empty only for an
        added node that stands for none (an all-reduce step).
    image : NodeMap
        Each original node to the new nodes standing for it (never empty).
    added : ndarray of bool
        New nodes the transform adds (split, concat, all-reduce): their costs
        are the transform's own and outside the conservation laws.
    copy : ndarray of int
        Which copy of its originals each new node is (a replica, a part); 0
        where the transform makes no copies.
    detail : object, optional
        The transform's own record (:class:`~placer.transform.coarsen.Coarsening`,
        :class:`~placer.transform.fusion.FusedGraph`, ...), for what only it holds.

    Raises
    ------
    ValueError
        If the arrays' lengths do not match the two graphs.
    """

    graph: OpGraph
    original: OpGraph
    origin: NodeMap
    image: NodeMap
    added: np.ndarray
    copy: np.ndarray
    detail: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n_new, n_old = self.graph.num_nodes, self.original.num_nodes
        if len(self.origin) != n_new or self.origin.size != n_old:
            raise ValueError(
                f"origin maps {len(self.origin)} nodes into {self.origin.size}; the graphs have "
                f"{n_new} new and {n_old} original nodes"
            )
        if len(self.image) != n_old or self.image.size != n_new:
            raise ValueError(
                f"image maps {len(self.image)} nodes into {self.image.size}; the graphs have "
                f"{n_old} original and {n_new} new nodes"
            )
        if np.shape(self.added) != (n_new,) or np.shape(self.copy) != (n_new,):
            raise ValueError(f"added and copy need one entry per new node ({n_new})")

    @classmethod
    def identity(cls, original: OpGraph, graph: OpGraph | None = None, detail: Any = None) -> TransformResult:
        """A result whose new graph has the original's nodes in the original's order (``graph``, or the original)."""
        graph = original if graph is None else graph
        n = original.num_nodes
        return cls(
            graph,
            original,
            NodeMap.identity(n),
            NodeMap.identity(n),
            np.zeros(n, dtype=bool),
            np.zeros(n, dtype=np.int64),
            detail,
        )

    @classmethod
    def quotient(
        cls,
        original: OpGraph,
        graph: OpGraph,
        group_of: Sequence[int],
        members: Sequence[Sequence[int]] | None = None,
        detail: Any = None,
    ) -> TransformResult:
        """A result merging the original nodes ``members[g]`` into new node ``g``; ``group_of`` gives each
        original node's new node (``members``, where omitted, is read from it)."""
        m = graph.num_nodes
        image = NodeMap.function(group_of, m)
        origin = image.inverse() if members is None else NodeMap.from_groups(members, original.num_nodes)
        return cls(graph, original, origin, image, np.zeros(m, dtype=bool), np.zeros(m, dtype=np.int64), detail)

    @property
    def changed(self) -> bool:
        """Whether the transform made a new graph."""
        return self.graph is not self.original

    def expand(self, values: Sequence[Any]) -> np.ndarray:
        """A value per original node from one per new node, where each original node has one new node.

        Raises
        ------
        ValueError
            If some original node has several new nodes (replicas, parts): no one value is its own.

        Examples
        --------
        >>> g = OpGraph(["a", "b", "c"], [1.0, 1.0, 1.0], [0, 1], [1, 2], [8, 8])
        >>> coarse = OpGraph(["ab", "c"], [2.0, 1.0], [0], [1], [8])
        >>> TransformResult.quotient(g, coarse, [0, 0, 1], [[0, 1], [2]]).expand(["gpu0", "gpu1"]).tolist()
        ['gpu0', 'gpu0', 'gpu1']
        """
        if np.any(self.image.sizes != 1):
            i = int(np.flatnonzero(self.image.sizes != 1)[0])
            raise ValueError(
                f"original node {self.original.ids[i]!r} has {int(self.image.sizes[i])} new nodes, not one"
            )
        return np.asarray(values)[self.image.index]


@dataclass(frozen=True)
class Ensures:
    """What a transform guarantees of its output, law by law (see the module's description).

    Attributes
    ----------
    compute : str
        Law of every node's duration on every device of the cluster (its
        ``compute_s`` and ``compute_s_by_kind``).
    output_bytes, param_bytes, temp_bytes : str
        Laws of the memory fields.
    transfers : str or None
        :data:`SAME`, :data:`CUT`, or None where edges change as ``note`` says.
    constraints : bool
        Whether colocation and device kinds carry into the new graph.
    note : str
        What the laws leave out: the added nodes' costs, how transfers change.
    """

    compute: str
    output_bytes: str
    param_bytes: str
    temp_bytes: str
    transfers: str | None
    constraints: bool = True
    note: str = ""

    def __post_init__(self) -> None:
        for name in ("compute", "output_bytes", "param_bytes", "temp_bytes"):
            if getattr(self, name) not in LAWS:
                raise ValueError(f"law of {name} must be one of {LAWS}, got {getattr(self, name)!r}")
        if self.transfers not in (SAME, CUT, None):
            raise ValueError(f"law of transfers must be 'same', 'cut' or None, got {self.transfers!r}")


@dataclass(frozen=True)
class Transform:
    """A registered transform.

    Attributes
    ----------
    name : str
    func : callable
        ``func(graph, cluster, **options) -> TransformResult``.
    options : dict
        Every option with its default (:data:`REQUIRED` where it has none).
    requires : str
        What the input must satisfy (beyond a valid OpGraph), in words.
    ensures : Ensures
    needs_cluster : bool
        Whether it reads the cluster (costs on its devices); otherwise the cluster may be None.
    trials : callable
        ``trials(graph) -> list of options`` to run it with on ``graph`` in the
        checks (an empty list where none applies, as a split on a graph with no
        splittable operation).
    summary : str
        The first line of ``func``'s docstring.
    """

    name: str
    func: Callable[..., TransformResult]
    options: dict[str, Any]
    requires: str
    ensures: Ensures
    needs_cluster: bool
    trials: Callable[[OpGraph], list[dict[str, Any]]]
    summary: str

    def __call__(self, graph: OpGraph, cluster: Cluster | None = None, **options: Any) -> TransformResult:
        """Run the transform with its options checked: :func:`apply_transform` by record."""
        if not isinstance(graph, OpGraph):
            raise OptionError(f"transform {self.name!r} takes an OpGraph, got {type(graph).__name__}")
        checked = checked_transform_options(self, options)
        if self.needs_cluster and cluster is None:
            raise OptionError(f"transform {self.name!r} needs a cluster (it costs the graph on its devices)")
        result = self.func(graph, cluster, **checked)
        if not isinstance(result, TransformResult) or result.original is not graph:
            raise TypeError(f"transform {self.name!r} must return a TransformResult of the graph it was given")
        return result


_TRANSFORMS: dict[str, Transform] = {}


def register_transform(
    name: str,
    *,
    requires: str,
    ensures: Ensures,
    trials: Callable[[OpGraph], list[dict[str, Any]]],
    needs_cluster: bool = False,
) -> Callable[[Callable[..., TransformResult]], Callable[..., TransformResult]]:
    """Register ``func(graph, cluster, *, **options) -> TransformResult`` as ``name``.

    Its keyword-only parameters are its options; one without a default is
    required. Raises TypeError if ``name`` is taken or ``func`` takes other
    than ``(graph, cluster)`` positionally.
    """

    def decorate(func: Callable[..., TransformResult]) -> Callable[..., TransformResult]:
        params = list(inspect.signature(func).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) != 2:
            raise TypeError(f"transform {name!r} must take (graph, cluster) and keyword-only options")
        if name in _TRANSFORMS:
            raise TypeError(f"transform {name!r} is registered twice")
        options = {p.name: REQUIRED if p.default is p.empty else p.default for p in params if p.kind is p.KEYWORD_ONLY}
        summary = (inspect.getdoc(func) or "").split("\n", 1)[0]
        _TRANSFORMS[name] = Transform(name, func, options, requires, ensures, needs_cluster, trials, summary)
        return func

    return decorate


def _unregister(name: str) -> None:
    """Forget a registered transform (for tests that register one of their own)."""
    _TRANSFORMS.pop(name, None)


def available_transforms() -> list[str]:
    """Names of the registered transforms, sorted.

    Examples
    --------
    >>> available_transforms()      # doctest: +NORMALIZE_WHITESPACE
    ['coarsen', 'colocate_layers', 'colocate_sole_consumers', 'contract', 'fuse', 'merge', 'microbatch', 'replicate',
     'split']
    """
    return sorted(_TRANSFORMS)


def get_transform(name: str) -> Transform:
    """The transform registered as ``name``; OptionError listing the names otherwise."""
    try:
        return _TRANSFORMS[name]
    except KeyError:
        raise OptionError(f"unknown transform {name!r}; available: {', '.join(available_transforms())}") from None


def checked_transform_options(transform: Transform, options: dict[str, Any]) -> dict[str, Any]:
    """``transform``'s options with ``options`` applied, names and types checked.

    An unknown or missing option, or a value whose type differs from its
    default's (an integer for an integer, a number for a float, true or false
    for a flag, a string for a string), raises OptionError naming it. Ranges
    and values a default does not type (arrays, lists) are checked by the
    transform itself, before any work.
    """
    unknown = sorted(set(options) - set(transform.options))
    if unknown:
        raise OptionError(
            f"transform {transform.name!r} has no option {unknown[0]!r}; "
            f"its options are: {', '.join(sorted(transform.options)) or 'none'}"
        )
    checked = {**transform.options, **options}
    missing = sorted(k for k, v in checked.items() if v is REQUIRED)
    if missing:
        raise OptionError(f"transform {transform.name!r} needs option {missing[0]!r}")
    for key, value in options.items():
        default, what = transform.options[key], f"option {key} of transform {transform.name!r}"
        if isinstance(default, bool):
            if not isinstance(value, (bool, np.bool_)):
                raise OptionError(f"{what} must be true or false, got {value!r}")
            checked[key] = bool(value)
        elif isinstance(default, int):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise OptionError(f"{what} must be an integer, got {value!r}")
            checked[key] = int(value)
        elif isinstance(default, float):
            if (
                isinstance(value, (bool, np.bool_))
                or not isinstance(value, (int, float, np.integer, np.floating))
                or not math.isfinite(value)
            ):
                raise OptionError(f"{what} must be a finite number, got {value!r}")
            checked[key] = float(value)
        elif isinstance(default, str) and not isinstance(value, str):
            raise OptionError(f"{what} must be a string, got {value!r}")
    return checked


def apply_transform(name: str, graph: OpGraph, cluster: Cluster | None = None, **options: Any) -> TransformResult:
    """Run the transform registered as ``name`` on ``graph`` and return its result.

    Parameters
    ----------
    name : str
        A name from :func:`available_transforms`.
    graph : OpGraph
    cluster : Cluster, optional
        The devices the graph will be placed on: transforms that cost the
        graph (``needs_cluster``) require it, others may use it (exact
        per-kind times of merged nodes).
    **options
        The transform's options (:attr:`Transform.options`).

    Returns
    -------
    TransformResult

    Raises
    ------
    OptionError
        Unknown transform or option, a missing or mistyped option, a bad
        value, or no cluster for a transform that needs one.

    Examples
    --------
    >>> g = OpGraph(["a", "b", "c"], [1.0, 2.0, 3.0], [0, 1], [1, 2], [8, 8], layer=["l", "l", None])
    >>> r = apply_transform("colocate_layers", g)
    >>> r.graph.colocation, r.origin[1].tolist()
    (['layer0', 'layer0', None], [1])
    >>> apply_transform("coarsen", g, target=0)
    Traceback (most recent call last):
    ...
    placer.errors.OptionError: coarsening target must be a positive integer, got 0
    """
    return get_transform(name)(graph, cluster, **options)
