"""Celeritas Standard Evaluation: predict a training step at a batch size that cannot run.

Celeritas (section 4.2.1, "Rough Estimation") runs the model at a few batch
sizes small enough for one device, fits a linear regression per node of
memory (and, roughly, of time) against the batch size, and builds the graph
at the target batch size from it. Here the small-batch graphs come from
:mod:`placer.capture` (with measured times from :mod:`placer.cost.profile`
when asked); nodes are matched across batch sizes by id, or by position in
topological order when ids differ; :meth:`BatchModel.predict` returns the
predicted ``OpGraph`` without running anything at the target batch size.

Celeritas' second step (a few iterations of the large-batch model under a
sequential memory-bounded placement) needs the runtime, not this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..capture.optim import optimizer_spec
from ..cost.analytic import annotate
from ..errors import FormatError, OptionError
from .profiling import profile_step

if TYPE_CHECKING:
    from ..cost.profile import Profile
    from ..graph import OpGraph

__all__ = ["BatchModel", "fit_batch_model", "standard_evaluation", "match_nodes"]


def match_nodes(base: "OpGraph", other: "OpGraph") -> tuple[np.ndarray, np.ndarray, str]:
    """Indices of ``other``'s nodes and edges matching those of ``base``.

    Returns
    -------
    node_map, edge_map : numpy.ndarray
        ``other`` index of each ``base`` node / edge.
    how : str
        ``"id"`` when the node ids are the same, ``"position"`` when nodes were matched
        by their position in topological order (same count and same ops required).

    Raises
    ------
    FormatError
        If the graphs differ in structure (node or edge counts, ops, edges).
    """
    if base.num_nodes != other.num_nodes or base.num_edges != other.num_edges:
        raise FormatError(
            f"graphs {base.name!r} and {other.name!r} differ in structure "
            f"({base.num_nodes} vs {other.num_nodes} nodes, {base.num_edges} vs {other.num_edges} edges)"
        )
    if set(base.ids) == set(other.ids):
        node_map, how = np.array([other.index[i] for i in base.ids], dtype=np.int64), "id"
    else:
        node_map = np.empty(base.num_nodes, dtype=np.int64)
        node_map[base.topological_order] = other.topological_order
        how = "position"
    bad = next((i for i in range(base.num_nodes) if base.op[i] != other.op[node_map[i]]), None)
    if bad is not None:
        raise FormatError(
            f"graphs {base.name!r} and {other.name!r} differ in structure: node {base.ids[bad]!r} "
            f"is {base.op[bad]!r} in one and {other.op[node_map[bad]]!r} in the other"
        )
    other_edges = {
        (int(s), int(d), int(t)): e
        for e, (s, d, t) in enumerate(zip(other.src.tolist(), other.dst.tolist(), other.edge_tensor.tolist()))
    }
    edge_map = np.empty(base.num_edges, dtype=np.int64)
    for e, (s, d, t) in enumerate(zip(base.src.tolist(), base.dst.tolist(), base.edge_tensor.tolist())):
        key = (int(node_map[s]), int(node_map[d]), int(t))
        if key not in other_edges:
            raise FormatError(
                f"graphs {base.name!r} and {other.name!r} differ in structure: edge "
                f"{base.ids[s]!r} -> {base.ids[d]!r} has no match"
            )
        edge_map[e] = other_edges[key]
    return node_map, edge_map, how


def _linear_fit(batches: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Least-squares ``value = intercept + slope * batch`` per column: shape ``(2, columns)``."""
    design = np.stack([np.ones_like(batches), batches], axis=1)
    coef, *_ = np.linalg.lstsq(design, values, rcond=None)
    return coef


@dataclass
class BatchModel:
    """Per-node and per-edge linear models of a training step in the batch size.

    Attributes
    ----------
    base : OpGraph
        The graph at the largest measured batch size; predictions keep its structure.
    batches : list of int
    matched_by : str
        ``"id"`` or ``"position"`` (see :func:`match_nodes`).
    coef : dict
        Field name -> ``(2, n)`` array of intercepts and slopes.
    time_kind : str or None
        Device kind the measured times are for (None: the graphs' ``compute_s``).
    fit_error : dict
        Field name -> largest relative residual of the fit at the measured batch sizes.
    name_at : callable or None
        Batch size -> name of the predicted graph: the name a capture at that batch
        would get (:func:`placer.capture.step_name`), so that profiles and the
        runtime take the prediction for that step. None: the base graph's name
        with ``@batchN``.
    analytic : bool
        The graphs' times (other than ``time_kind``'s) are the roofline model's:
        a prediction is costed again by it from its predicted FLOPs and bytes, as
        a capture at that batch would be, since a line through small batches'
        times misses where an operation turns from memory- to compute-bound.
        Otherwise each kind's times are fitted linearly, as the measured ones.
    """

    base: "OpGraph"
    batches: list[int]
    matched_by: str
    coef: dict[str, np.ndarray]
    time_kind: str | None = None
    fit_error: dict[str, float] = field(default_factory=dict)
    name_at: Callable[[int], str] | None = None
    analytic: bool = False

    @property
    def fitted_kinds(self) -> list[str]:
        """The device kinds whose times have a fit of their own (field ``time:KIND``)."""
        return [name.split(":", 1)[1] for name in self.coef if name.startswith("time:")]

    def predict_field(self, name: str, batch: int) -> np.ndarray:
        intercept, slope = self.coef[name]
        return np.maximum(intercept + slope * batch, 0.0)

    def predict(self, batch: int) -> "OpGraph":
        """The graph at ``batch``: predicted times, memory, FLOPs and edge bytes.

        Raises
        ------
        OptionError
            If ``batch`` is not a positive integer.
        """
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise OptionError(f"option 'batch' must be a positive integer, got {batch!r}")
        g = self.base

        def sizes(name):
            return np.rint(self.predict_field(name, batch)).astype(np.int64)

        times = self.predict_field("time", batch)
        kind = self.time_kind
        compute_s, by_kind = g.compute_s, g.compute_s_by_kind  # costed again below where analytic
        if not self.analytic:
            compute_s = times if kind is None else self.predict_field("compute_s", batch)
            fitted = {k: self.predict_field(f"time:{k}", batch).tolist() for k in self.fitted_kinds}
            by_kind = [
                {
                    **{k: fitted[k][i] for k in (d or {}) if k != kind},
                    **({kind: float(times[i])} if kind is not None else {}),
                }
                or None
                for i, d in enumerate(g.compute_s_by_kind)
            ]
        flops = np.where(np.isnan(g.flops), np.nan, self.predict_field("flops", batch))
        accessed = self.predict_field("bytes_accessed", batch)
        extra = [
            ({**e, "bytes_accessed": int(round(a))} if "bytes_accessed" in e else e)
            for e, a in zip(g.node_extra, accessed.tolist())
        ]
        # A split's rows are the batch or a multiple of it (batch x sequence): they scale with the batch.
        base = max(self.batches)
        splittable = [
            None
            if s is None
            else [{**d, "size": d["size"] * batch // base} if d.get("dim") == "batch" else d for d in s]
            for s in g.splittable
        ]
        name = self.name_at(int(batch)) if self.name_at is not None else f"{g.name}@batch{batch}"
        info = {
            "batches": self.batches,
            "target_batch": batch,
            "matched_by": self.matched_by,
            "time_kind": self.time_kind,
        }
        predicted = g.replace(
            compute_s=compute_s,
            compute_s_by_kind=by_kind,
            output_bytes=sizes("output_bytes"),
            param_bytes=sizes("param_bytes"),
            temp_bytes=sizes("temp_bytes"),
            flops=flops,
            edge_bytes=sizes("edge_bytes"),
            node_extra=extra,
            splittable=splittable,
            name=name,
            extra={
                **g.extra,
                "standard_evaluation": info,
                **({"batch_size": int(batch)} if "batch_size" in g.extra else {}),
            },
        )
        if not self.analytic:
            return predicted

        kinds = {k for d in g.compute_s_by_kind if d for k in d} - {kind}
        costed = annotate(predicted, kinds=sorted(kinds))
        if kind is None:
            return costed
        return costed.replace(
            compute_s_by_kind=[{**(d or {}), kind: float(t)} for d, t in zip(costed.compute_s_by_kind, times.tolist())]
        )


def fit_batch_model(
    graphs: Sequence["OpGraph"],
    batches: Sequence[int],
    profiles: "Sequence[Profile] | None" = None,
    *,
    name_at: Callable[[int], str] | None = None,
    analytic: bool = False,
) -> BatchModel:
    """Fit per-node time and memory, linear in the batch size, from graphs at small batches.

    Parameters
    ----------
    graphs : sequence of OpGraph
        The same step captured at each of ``batches`` (at least two distinct sizes).
    batches : sequence of int
    profiles : sequence of Profile, optional
        Measured times of each graph (one device kind); without them the graphs'
        ``compute_s`` are fitted.
    name_at : callable, optional
        Batch size -> graph name of a prediction (see :attr:`BatchModel.name_at`).
    analytic : bool
        The graphs' unmeasured times are the roofline model's (see :attr:`BatchModel.analytic`).

    Returns
    -------
    BatchModel

    Raises
    ------
    OptionError
        Fewer than two distinct batch sizes, or lengths that differ.
    FormatError
        Graphs of different structure, or a profile of another graph.

    References
    ----------
    Celeritas, section 4.2.1 (Rough Estimation: a linear regression per node of memory
    against the batch size, from runs at small batch sizes).

    Examples
    --------
    >>> from placer.graph import OpGraph
    >>> gs = [OpGraph(["a", "b"], [b * 1e-3, 1e-4], [0], [1], [b * 64], output_bytes=[b * 64, 8], name="s")
    ...       for b in (1, 2, 4)]
    >>> model = fit_batch_model(gs, [1, 2, 4])
    >>> big = model.predict(64)
    >>> big.output_bytes.tolist(), big.edge_bytes.tolist(), round(float(big.compute_s[0]), 6)
    ([4096, 8], [4096], 0.064)
    """
    batches = [int(b) for b in batches]
    if len(graphs) != len(batches) or (profiles is not None and len(profiles) != len(graphs)):
        raise OptionError("give one graph (and one profile, if any) per batch size")
    if len(set(batches)) < 2:
        raise OptionError(f"option 'batches' needs at least two distinct batch sizes, got {batches}")
    order = np.argsort(batches, kind="stable")
    graphs = [graphs[k] for k in order]
    batches = [batches[k] for k in order]
    profiles = None if profiles is None else [profiles[k] for k in order]
    base = graphs[-1]
    kinds = {p.device_kind for p in profiles} if profiles else set()
    if len(kinds) > 1:
        raise OptionError(f"the profiles are for different device kinds: {sorted(kinds)}")

    kind = next(iter(kinds)) if kinds else None
    # Each kind's times but the measured one get their own fit, unless the analytic model costs them again.
    other_kinds = [] if analytic else sorted({k for d in base.compute_s_by_kind if d for k in d} - {kind})
    rows: dict[str, list[np.ndarray]] = {
        k: []
        for k in (
            "time",
            "output_bytes",
            "param_bytes",
            "temp_bytes",
            "flops",
            "bytes_accessed",
            "edge_bytes",
            "compute_s",
            *(f"time:{k}" for k in other_kinds),
        )
    }
    how = "id"
    for k, g in enumerate(graphs):
        node_map, edge_map, matched = match_nodes(base, g)
        how = "position" if matched == "position" else how
        if profiles is not None:
            profiles[k].check_graph(g)
            seconds = profiles[k].node_seconds
            times = np.array([seconds.get(g.ids[j], g.compute_s[j]) for j in node_map])
        else:
            times = g.compute_s[node_map]
        rows["time"].append(times)
        rows["compute_s"].append(g.compute_s[node_map])
        for other in other_kinds:
            rows[f"time:{other}"].append(
                np.array([(g.compute_s_by_kind[j] or {}).get(other, g.compute_s[j]) for j in node_map])
            )
        for name in ("output_bytes", "param_bytes", "temp_bytes"):
            rows[name].append(getattr(g, name)[node_map].astype(np.float64))
        rows["flops"].append(np.nan_to_num(g.flops[node_map], nan=0.0))
        rows["bytes_accessed"].append(np.array([float(g.node_extra[j].get("bytes_accessed", 0)) for j in node_map]))
        rows["edge_bytes"].append(g.edge_bytes[edge_map].astype(np.float64))
    x = np.asarray(batches, dtype=np.float64)
    # A node whose work is the same at every batch (an optimizer update, a copy of a parameter) takes the
    # same time at every batch: its measured times differ by noise alone, which a line would extrapolate
    # far to the target. Its median it is.
    same_work = np.all(
        [
            np.ptp(np.stack(rows[name]), axis=0) == 0
            for name in ("flops", "bytes_accessed", "output_bytes", "temp_bytes")
        ],
        axis=0,
    )
    coef, fit_error = {}, {}
    for name, values in rows.items():
        y = np.stack(values)
        coef[name] = _linear_fit(x, y) if y.shape[1] else np.zeros((2, 0))
        if name == "time" or name.startswith("time:"):
            coef[name][0, same_work] = np.median(y[:, same_work], axis=0)
            coef[name][1, same_work] = 0.0
        residual = np.abs(coef[name][0] + np.outer(x, coef[name][1]) - y)
        scale = np.maximum(np.abs(y), 1e-300)
        fit_error[name] = float((residual / scale).max()) if y.size else 0.0
    return BatchModel(base, batches, how, coef, kind, fit_error, name_at, analytic)


def standard_evaluation(
    spec: "str | Callable[[int], tuple]",
    batches: Sequence[int] = (2, 4, 8),
    *,
    optimizer: str = "adam",
    lr: float = 1e-3,
    settings: dict | None = None,
    device: str | None = "cpu",
    repeats: int = 3,
) -> BatchModel:
    """Capture (and profile, on ``device``) a model at small batch sizes and fit a :class:`BatchModel`.

    Parameters
    ----------
    spec : str or callable
        A model spec for :func:`placer.capture.capture_spec` (``"zoo:NAME"`` or
        ``"file.py:FACTORY"``), or a factory ``f(batch_size) -> (model, inputs)``.
    batches : sequence of int
        Batch sizes small enough to run here.
    optimizer, lr, settings
        As for :func:`placer.capture.capture` (the settings shape the graph:
        SGD's momentum adds a buffer per parameter).
    device : str or None
        Where to time the nodes (``"cpu"``, ``"cuda:N"``); None fits the
        analytic ``compute_s`` instead.
    repeats : int
        Timed runs per node (see :func:`placer.harness.profiling.profile_step`).

    Returns
    -------
    BatchModel
        ``model.predict(target)`` is the graph at the target batch size, named
        as a capture of ``spec`` at that batch would be.

    Raises
    ------
    OptionError, FormatError
        Bad options, or captures whose structure changes with the batch size.

    References
    ----------
    Celeritas, section 4.2.1.
    """
    from ..capture import capture, spec_label, step_name  # deferred: imports torch

    if callable(spec):
        factory = spec
        # A factory is named as the FACTORY of a file.py:FACTORY spec; a lambda as capture names a model.
        label = getattr(spec, "__name__", "")
        label = label if label.isidentifier() else None
    else:
        from ..capture import load_model  # deferred: imports torch

        label = spec_label(spec)

        def factory(batch):
            return load_model(spec, batch)

    labelled = optimizer_spec(optimizer, lr, **(settings or {}))  # the settings are in the graphs' names
    graphs, profiles = [], []
    for batch in batches:
        model, inputs = factory(batch)
        label = label or type(model).__name__
        step = capture(
            model, inputs, optimizer=optimizer, lr=lr, settings=settings, name=step_name(label, batch, labelled)
        )
        graphs.append(step.graph)
        if device:
            profiles.append(profile_step(step, model, inputs, device=device, repeats=repeats))
    return fit_batch_model(
        graphs,
        batches,
        profiles if device else None,
        name_at=partial(step_name, label, optimizer=labelled),
        analytic=True,
    )
