"""A captured step in a form that pickle can carry to a process started afresh (spawn).

The distributed runtime forks its ranks on CPUs, which share the captured
:class:`torch.fx.GraphModule` without copying it; CUDA needs fresh processes
(``spawn``), which receive their job by pickle. A captured GraphModule does not
pickle as it is: its tracer cannot be rebuilt, and where it can, pickle
re-traces the generated code, which renames the nodes and drops the trace
metadata the runtime reads (node names are the graph's ids; ``meta["val"]``
gives the shape of every message). :class:`PortableStep` keeps both.

Examples
--------
>>> import pickle, torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda x: (x * 2).sum())(torch.ones(3))
>>> again = pickle.loads(pickle.dumps(PortableStep(gm))).module()
>>> [n.name for n in again.graph.nodes] == [n.name for n in gm.graph.nodes], float(again(torch.ones(3)))
(True, 6.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

__all__ = ["PortableStep"]


@dataclass(frozen=True)
class _Ref:
    """A node among another node's arguments, by name."""

    name: str


@dataclass(frozen=True)
class _Op:
    """An aten (or other ``torch.ops``) operator overload, by its names: the objects do not pickle."""

    namespace: str
    name: str
    overload: str

    def resolve(self) -> Any:
        return getattr(getattr(getattr(torch.ops, self.namespace), self.name), self.overload)


class PortableStep:
    """A GraphModule's nodes, their names, targets, arguments and traced values, and its constants.

    Parameters
    ----------
    gm : torch.fx.GraphModule
        A flat graph (placeholders, ``call_function``, ``get_attr``, output),
        as :func:`placer.capture.capture` makes.
    """

    def __init__(self, gm: fx.GraphModule):
        self.nodes = [
            (
                v.op,
                v.name,
                _portable_target(v.target),
                fx.node.map_arg(v.args, lambda a: _Ref(a.name)),
                fx.node.map_arg(v.kwargs, lambda a: _Ref(a.name)),
                _portable_value(v.meta.get("val")),
            )
            for v in gm.graph.nodes
        ]
        self.constants = {v.target: _attribute(gm, v.target) for v in gm.graph.nodes if v.op == "get_attr"}

    def module(self) -> fx.GraphModule:
        """The GraphModule again: the same node names, targets, arguments and ``meta["val"]`` shapes."""
        graph = fx.Graph()
        made: dict[str, fx.Node] = {}
        for op, name, target, args, kwargs, val in self.nodes:

            def node_of(a: Any) -> Any:
                return made[a.name] if isinstance(a, _Ref) else a

            node = graph.create_node(
                op,
                target.resolve() if isinstance(target, _Op) else target,
                _map(args, node_of),
                _map(kwargs, node_of),
                name=name,
            )
            if node.name != name:
                raise RuntimeError(f"node {name!r} came back as {node.name!r}")
            if val is not None:
                node.meta["val"] = val
            made[name] = node
        root = torch.nn.Module()
        for target, value in self.constants.items():
            owner = root
            *path, last = target.split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            setattr(owner, last, value)
        return fx.GraphModule(root, graph)


def _portable_target(target: Any) -> Any:
    if isinstance(target, torch._ops.OpOverload):
        return _Op(target.namespace, target._schema.name.split("::")[-1], target._overloadname)
    return target


def _portable_value(val: Any) -> Any:
    """A traced value with every tensor (fake ones too) replaced by an empty one of its layout on ``meta``,
    and every symbolic scalar by a plain one of its kind."""
    if isinstance(val, torch.Tensor):
        return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device="meta")
    if isinstance(val, (list, tuple)):
        return type(val)(_portable_value(x) for x in val)
    if isinstance(val, (bool, int, float)) or val is None:
        return val
    # A traced scalar may depend on data (``.item()``): only its kind matters (value_spec), not its value.
    for kind, stand_in in ((torch.SymBool, False), (torch.SymInt, 0), (torch.SymFloat, 0.0)):
        if isinstance(val, kind):
            return stand_in
    return None


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _map(value: Any, fn) -> Any:
    if isinstance(value, tuple):
        return tuple(_map(x, fn) for x in value)
    if isinstance(value, list):
        return [_map(x, fn) for x in value]
    if isinstance(value, dict):
        return {k: _map(x, fn) for k, x in value.items()}
    return fn(value)
