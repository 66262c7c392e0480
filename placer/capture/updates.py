"""The optimizer's update in a captured step: traced once per kind of parameter, copied for each.

Tracing is most of a capture's time, and with Adam about half of a step's
operations are the update's, some of them scalar arithmetic on the step
count that ``make_fx`` carries through sympy. Every parameter's update is
the same sequence of operations: ``torch.optim``'s single-tensor path
branches only on the parameter's dtype, device and whether it is complex.
So the step is traced with one stand-in node per parameter
(:meth:`UpdateTemplates.stand_in`), the update is traced once per kind of
parameter (:meth:`UpdateTemplates.add`), and :meth:`UpdateTemplates.expand`
puts a copy of that trace in place of each stand-in. The learning rate is
read once per step (an ``.item()`` of the step's ``lr`` input) and every
copy reads that value. The result is the graph a trace of every update gives:
the same nodes in the same order, names, arguments and metadata
(``tests/test_capture.py`` compares the two).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.shape_prop import _extract_tensor_metadata
from torch.utils._pytree import tree_leaves

from .optim import OptimizerSpec

__all__ = ["UpdateTemplates"]


@torch.library.custom_op("placer::optimizer_update", mutates_args=())
def _optimizer_update(param: torch.Tensor, grad: torch.Tensor, state: list[torch.Tensor]) -> list[torch.Tensor]:
    raise RuntimeError(
        "placer::optimizer_update stands in for an optimizer update while a step is traced; it is never run"
    )


@_optimizer_update.register_fake
def _(param, grad, state):
    return [torch.empty_like(param)] + [torch.empty_like(s) for s in state]


_STAND_IN = torch.ops.placer.optimizer_update.default

# Metadata a copied node takes from its stand-in (the parameter it updates, where it was traced)
# rather than from the template.
_PER_PARAMETER = ("custom", "seq_nr", "nn_module_stack")


@dataclass(frozen=True)
class _Template:
    """One parameter's update, traced: inputs ``(param, grad, lr, *state)``, ``lr`` a 0-dim tensor."""

    inputs: tuple[fx.Node, ...]  # the placeholders
    lr_read: fx.Node  # the .item() of lr
    body: tuple[fx.Node, ...]  # the update's operations, in order (but lr_read)
    result: dict[int, fx.Node]  # stand-in output (0: param, 1..: state) -> the node holding its new value


def _kind(param: torch.Tensor) -> tuple:
    """What ``torch.optim``'s single-tensor update branches on."""
    return param.dtype, param.device, param.is_complex()


class UpdateTemplates:
    """The update of ``opt``, traced once per kind of parameter; see the module's docstring."""

    def __init__(self, opt: OptimizerSpec):
        self.opt = opt
        self._templates: dict[tuple, _Template] = {}

    def add(self, param: torch.Tensor, state: list[torch.Tensor]) -> None:
        """Trace the update of a parameter like ``param`` (a fake tensor), unless one of its kind was traced."""
        kind = _kind(param)
        if kind in self._templates:
            return

        def update(p, g, lr, *s):
            self.opt.update(p, g, lr.item(), s)

        grad = torch.empty_like(param)
        lr = param.new_empty((), dtype=torch.float64, device="cpu")
        with torch.no_grad():
            gm = make_fx(torch.func.functionalize(update, remove="mutations"), tracing_mode="fake")(
                param, grad, lr, *state
            )
        nodes = list(gm.graph.nodes)
        inputs = tuple(n for n in nodes if n.op == "placeholder")
        (lr_read,) = inputs[2].users
        # functionalize writes every updated input back at the end, one copy_ each.
        write_backs = [n for n in nodes if n.target is torch.ops.aten.copy_.default and n.args[0] in inputs]
        body = tuple(n for n in nodes if n.op == "call_function" and n not in write_backs and n is not lr_read)
        # The stand-in's outputs are the parameter's new value and its state's: inputs 0 and 3.. here.
        outputs = {inputs[0]: 0, **{node: k + 1 for k, node in enumerate(inputs[3:])}}
        self._templates[kind] = _Template(
            inputs, lr_read, body, {outputs[n.args[0]]: n.args[1] for n in write_backs if n.args[0] in outputs}
        )

    def stand_in(self, param: torch.Tensor, grad: torch.Tensor, lr: float, state: list[torch.Tensor]) -> None:
        """In the step being traced: one node in place of the update, its new values written back
        where the update writes. ``lr``, the step's learning rate as a number, is not an argument
        of it: the copies read it where :meth:`expand` is told."""
        template = self._templates[_kind(param)]
        new = _STAND_IN(param, grad, list(state))
        for position, target in enumerate([param, *state]):
            if position in template.result:
                target.copy_(new[position])

    def expand(self, graph: fx.Graph, fake_mode, lr_read: fx.Node) -> None:
        """Put a copy of its kind's update in place of every stand-in of ``graph`` (its module to be recompiled),
        reading the learning rate from ``lr_read``, the step's ``.item()`` of its ``lr`` input.

        Each copy's names come from the graph's namespace as a trace would give
        them; its tensors' ``meta["val"]`` are computed by ``fake_mode`` from its
        inputs', its scalars' are the template's (symbolic: only their kind is read).
        """
        for stand_in in [n for n in graph.nodes if n.target is _STAND_IN]:
            param, grad, state = stand_in.args
            template = self._templates[_kind(param.meta["val"])]
            made = dict(zip(template.inputs, (param, grad, lr_read.args[0], *state)))
            made[template.lr_read] = lr_read
            with graph.inserting_before(stand_in):
                for node in template.body:
                    made[node] = self._copy(graph, node, made, stand_in, fake_mode)
            # The trace wrote each new value back through functionalize's copy: getitem -> copy -> copy_.
            for pick in list(stand_in.users):
                new = made[template.result[pick.args[1]]]
                for user in list(pick.users):
                    if user.target is torch.ops.aten.copy.default:
                        user.replace_all_uses_with(new)
                        graph.erase_node(user)
                pick.replace_all_uses_with(new)
                graph.erase_node(pick)
            graph.erase_node(stand_in)

    @staticmethod
    def _copy(graph: fx.Graph, node: fx.Node, made: dict, stand_in: fx.Node, fake_mode) -> fx.Node:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), made.__getitem__)
        # make_fx names an aten op after its overload packet, anything else after its target.
        name = (
            graph._target_to_str(node.target.overloadpacket.__name__)
            if isinstance(node.target, torch._ops.OpOverload)
            else None
        )
        copy = graph.create_node("call_function", node.target, args, kwargs, name=name)
        copy.meta = {
            **{k: v for k, v in node.meta.items() if k not in _PER_PARAMETER},
            **{k: stand_in.meta[k] for k in _PER_PARAMETER if k in stand_in.meta},
        }
        val = node.meta.get("val")
        if any(isinstance(leaf, torch.Tensor) for leaf in tree_leaves(val)):
            # A tensor of its own (the graph tells aliases by storage); scalars enter as plain numbers, as a
            # tensor's layout does not depend on their values.
            values = fx.node.map_arg((args, kwargs), lambda a: _concrete(a.meta["val"]))
            with fake_mode:
                copy.meta["val"] = node.target(*values[0], **values[1])
            if isinstance(val, torch.Tensor):
                copy.meta["tensor_meta"] = _extract_tensor_metadata(copy.meta["val"])
        return copy


def _concrete(value):
    """``value`` with a symbolic scalar replaced by a plain one of its kind."""
    for kind, plain in ((torch.SymBool, True), (torch.SymInt, 1), (torch.SymFloat, 1.0)):
        if isinstance(value, kind):
            return plain
    return value
