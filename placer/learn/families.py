"""Graph families to learn placement from, generated like Placeto's datasets.

Placeto (appendix A.3) trains on three families of TensorFlow graphs:
*cifar-10* (image cells found by ENAS), *ptb* (recurrent cells found by
ENAS, unrolled) and *nmt* (a 2-layer encoder-decoder with attention), with
sizes sampled per graph. This module generates the same three shapes as
training steps (forward, loss, backward, optimizer update), costed by the
roofline model (:func:`placer.cost.analytic.annotate`):

- :func:`image_cell_graph`: a stem, then cells whose nodes each add two
  branches (3x3/5x5 convolution, 3x3 average or max pooling, identity) drawn
  from the cell's inputs and earlier nodes, as ENAS's micro search space;
- :func:`rnn_cell_graph`: an ENAS recurrent cell unrolled over ``steps``,
  with a softmax over the vocabulary at every step;
- :func:`nmt_graph`: a 2-layer LSTM encoder and decoder with dot attention
  and a projection to the vocabulary at every decoder step.

Weights are variable nodes (``op="placeholder"``, no time) holding the
weights and Adam's two moments, read by every op that uses them (shared
across time steps in the recurrent models); each op with weights gets a
data-gradient and a weight-gradient node, shared weights sum their
gradients, and the update is colocated with its variable.

:func:`dataset` gives a family's fixed, seeded train/test split (half of 32
graphs each, as the appendix). Sizes are scaled down from the appendix
(fewer cells and unrolled steps) to 150-700 nodes, so that training is quick.

Examples
--------
>>> g = image_cell_graph(seed=0)
>>> g.num_nodes > 100 and bool(g.compute_s.sum() > 0)
True
>>> [g.name for g in dataset("nmt", "test")][:1]
['nmt-0']

References
----------
Addanki et al., "Placeto: Learning Generalizable Device Placement Algorithms
for Distributed Machine Learning", NeurIPS 2019, appendix A.3.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cost.analytic import annotate
from ..errors import OptionError
from ..graph import OpGraph

__all__ = [
    "FAMILIES",
    "image_cell_graph",
    "rnn_cell_graph",
    "nmt_graph",
    "family_graph",
    "split_indices",
    "dataset",
    "GRAPHS_PER_FAMILY",
]

FLOAT = 4  # bytes per float32 element
GRAPHS_PER_FAMILY = 32
TRAIN_FRACTION = 0.5


@dataclass
class _Node:
    op: str
    layer: str
    inputs: list[int]
    flops: float
    out_bytes: int
    params: list[int] = field(default_factory=list)
    param_bytes: int = 0  # variables: weights plus Adam's two moments
    weight_bytes: int = 0  # variables: the weights alone (what a reader receives)
    requires_grad: bool = True


class _StepBuilder:
    """Records a forward pass, then writes the whole training step as an OpGraph."""

    def __init__(self, name: str):
        self.name = name
        self.nodes: list[_Node] = []

    def data(self, layer: str, nbytes: float) -> int:
        """An input batch (needs no gradient)."""
        return self._add(_Node("placeholder", layer, [], 0.0, int(nbytes), requires_grad=False))

    def variable(self, layer: str, elements: float) -> int:
        """A weight tensor of ``elements`` floats, resident with its Adam moments."""
        weight = int(elements * FLOAT)
        return self._add(_Node("placeholder", layer, [], 0.0, 0, param_bytes=3 * weight, weight_bytes=weight))

    def op(
        self, op: str, layer: str, inputs: list[int], flops: float, out_bytes: float, params: tuple[int, ...] = ()
    ) -> int:
        needs = bool(params) or any(self.nodes[u].requires_grad for u in inputs)
        return self._add(
            _Node(op, layer, list(inputs), float(flops), int(out_bytes), list(params), requires_grad=needs)
        )

    def _add(self, node: _Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def _is_variable(self, i: int) -> bool:
        return self.nodes[i].weight_bytes > 0

    def build(self) -> OpGraph:
        fwd = self.nodes
        ids, op, layer, flops, out_b, par_b, accessed, coloc = [], [], [], [], [], [], [], []
        src, dst, ebytes = [], [], []
        counts: dict[str, int] = {}

        def node(name, kind, lay, fl, out, params=0, touched=0.0, group=None):
            k = counts.get(name, 0)
            counts[name] = k + 1
            ids.append(name if k == 0 else f"{name}~{k}")
            op.append(kind)
            layer.append(lay)
            flops.append(float(fl))
            out_b.append(int(out))
            par_b.append(int(params))
            accessed.append(float(touched))
            coloc.append(group)
            return len(ids) - 1

        def edge(u, v, nbytes):
            src.append(u)
            dst.append(v)
            ebytes.append(int(nbytes))

        def sent(i):  # bytes a reader of forward node i receives
            return fwd[i].weight_bytes or fwd[i].out_bytes

        consumers: list[list[int]] = [[] for _ in fwd]
        for v, nd in enumerate(fwd):
            for u in nd.inputs + nd.params:
                consumers[u].append(v)
        fid = []
        for v, nd in enumerate(fwd):
            touched = sum(sent(u) for u in nd.inputs + nd.params) + nd.out_bytes
            kind = nd.op if nd.op == "placeholder" else f"aten.{nd.op}"
            group = f"{self.name}:var{v}" if self._is_variable(v) else None
            fid.append(
                node(f"{nd.layer}.{nd.op}", kind, nd.layer, nd.flops, nd.out_bytes, nd.param_bytes, touched, group)
            )
            for u in nd.inputs + nd.params:
                edge(fid[u], fid[v], sent(u))
        sinks = [v for v, nd in enumerate(fwd) if not consumers[v] and nd.op != "placeholder"]
        loss_in = sum(fwd[v].out_bytes for v in sinks)
        loss = node("loss", "aten.sum", "loss", loss_in / FLOAT, FLOAT, touched=loss_in)
        for v in sinks:
            edge(fid[v], loss, fwd[v].out_bytes)

        # Backward in reverse: each node's output gradient comes from its consumers' data gradients.
        grad_sources: list[list[int]] = [[] for _ in fwd]
        for v in sinks:
            grad_sources[v].append(loss)
        weight_grads: dict[int, list[int]] = {}
        for v in reversed(range(len(fwd))):
            nd = fwd[v]
            if nd.op == "placeholder" or not nd.requires_grad or not grad_sources[v]:
                continue
            saved = nd.inputs  # activations kept for the backward pass
            grad_in = [u for u in nd.inputs if fwd[u].requires_grad and fwd[u].op != "placeholder"]
            incoming = nd.out_bytes * len(grad_sources[v])
            if grad_in:
                out = sum(fwd[u].out_bytes for u in grad_in)
                touched = (
                    incoming + sum(fwd[u].out_bytes for u in saved) + out + sum(fwd[p].weight_bytes for p in nd.params)
                )
                g = node(
                    f"{nd.layer}.{nd.op}.bwd",
                    f"aten.{nd.op}_backward" if nd.params else f"aten.{nd.op}",
                    nd.layer,
                    nd.flops,
                    out,
                    touched=touched,
                )
                for s in grad_sources[v]:
                    edge(s, g, nd.out_bytes)
                for u in saved:
                    edge(fid[u], g, fwd[u].out_bytes)
                for p in nd.params:
                    edge(fid[p], g, fwd[p].weight_bytes)
                for u in grad_in:
                    grad_sources[u].append(g)
            if nd.params:
                wbytes = sum(fwd[p].weight_bytes for p in nd.params)
                touched = incoming + sum(fwd[u].out_bytes for u in saved) + wbytes
                gw = node(
                    f"{nd.layer}.{nd.op}.bwd_weight",
                    f"aten.{nd.op}_backward",
                    nd.layer,
                    nd.flops,
                    wbytes,
                    touched=touched,
                )
                for s in grad_sources[v]:
                    edge(s, gw, nd.out_bytes)
                for u in saved:
                    edge(fid[u], gw, fwd[u].out_bytes)
                for p in nd.params:
                    weight_grads.setdefault(p, []).append(gw)
        for p, grads in sorted(weight_grads.items()):
            w = fwd[p].weight_bytes
            lay = fwd[p].layer
            if len(grads) > 1:
                acc = node(f"{lay}.grad_sum", "aten.add", lay, len(grads) * w / FLOAT, w, touched=(len(grads) + 1) * w)
                for gw in grads:
                    edge(gw, acc, w)
                grads = [acc]
            # Adam: read weight, gradient and two moments, write three of them back (in place).
            upd = node(f"{lay}.update", "aten._foreach_add", lay, 10 * w / FLOAT, 0, touched=7 * w, group=coloc[fid[p]])
            edge(grads[0], upd, w)
        graph = OpGraph(
            ids,
            np.zeros(len(ids)),
            src,
            dst,
            ebytes,
            output_bytes=out_b,
            param_bytes=par_b,
            flops=flops,
            op=op,
            layer=layer,
            colocation=coloc,
            node_extra=[{"bytes_accessed": a, "dtype": "float32"} for a in accessed],
            name=self.name,
        )
        return annotate(graph)


# ------------------------------------------------------------------- image cells
_IMAGE_BRANCHES = ("conv3x3", "conv5x5", "avgpool", "maxpool", "identity")


def image_cell_graph(
    seed: int = 0,
    *,
    batch: int | None = None,
    cells: int | None = None,
    nodes_per_cell: int | None = None,
    channels: int | None = None,
    name: str | None = None,
) -> OpGraph:
    """A training step of a random ENAS-like convolutional network on 32x32 images.

    Parameters
    ----------
    seed : int
        Draws the architecture and the sizes left as None.
    batch : int, optional
        Images per step (default: uniform in 240-360, the appendix's cifar-10 range).
    cells : int, optional
        Number of cells (default 3-5; one reduction, halving the image, after the second).
    nodes_per_cell : int, optional
        Nodes per cell (default 3-5), each adding two branches.
    channels : int, optional
        Channels of the first cell (default one of 32, 48, 64, 96).

    Returns
    -------
    OpGraph
        Training step with ``layer`` = ``cellK.nodeJ`` so that the expert split keeps branches whole.

    References
    ----------
    Pham et al., "Efficient Neural Architecture Search via Parameter Sharing" (ICML 2018), Section 2.3
    (micro search space); Addanki et al., Placeto (NeurIPS 2019), appendix A.3, *cifar-10* dataset.
    """
    rng = np.random.default_rng(seed)
    batch = int(batch if batch is not None else rng.integers(240, 361))
    cells = int(cells if cells is not None else rng.integers(3, 6))
    per_cell = int(nodes_per_cell if nodes_per_cell is not None else rng.integers(3, 6))
    c = int(channels if channels is not None else rng.choice([32, 48, 64, 96]))
    b = _StepBuilder(name or f"image-{seed}")
    hw = 32 * 32

    def conv(layer, x, c_in, c_out, k, pixels):
        w = b.variable(layer, k * k * c_in * c_out)
        return b.op(
            "convolution",
            layer,
            [x],
            2 * k * k * c_in * c_out * pixels * batch,
            c_out * pixels * batch * FLOAT,
            params=(w,),
        )

    image = b.data("input", 3 * hw * batch * FLOAT)
    stem = conv("stem", image, 3, c, 3, hw)
    prev2 = prev = stem
    for k in range(cells):
        if k == 2:  # reduction: pool to half the side, widen to twice the channels
            layer = f"cell{k}.reduce"
            pooled = b.op("max_pool2d", layer, [prev], 9 * c * hw * batch, c * hw // 4 * batch * FLOAT)
            hw //= 4
            prev = conv(layer, pooled, c, 2 * c, 1, hw)
            c *= 2
            prev2 = prev
        states = [prev2, prev]
        used: set[int] = set()
        for j in range(per_cell):
            layer = f"cell{k}.node{j}"
            branches = []
            for _ in range(2):
                pick = int(rng.integers(len(states)))
                used.add(pick)
                x = states[pick]
                kind = _IMAGE_BRANCHES[int(rng.integers(len(_IMAGE_BRANCHES)))]
                if kind.startswith("conv"):
                    size = int(kind[4])
                    act = b.op("relu", layer, [x], c * hw * batch, c * hw * batch * FLOAT)
                    branches.append(conv(layer, act, c, c, size, hw))
                elif kind.endswith("pool"):
                    branches.append(b.op(f"{kind[:3]}_pool2d", layer, [x], 9 * c * hw * batch, c * hw * batch * FLOAT))
                else:
                    branches.append(x)
            states.append(b.op("add", layer, branches, c * hw * batch, c * hw * batch * FLOAT))
        loose = [s for i, s in enumerate(states) if i >= 2 and i not in used]
        layer = f"cell{k}.out"
        joined = b.op("cat", layer, loose, 0, len(loose) * c * hw * batch * FLOAT) if len(loose) > 1 else loose[0]
        prev2, prev = prev, conv(layer, joined, len(loose) * c, c, 1, hw)
    pooled = b.op("mean", "head", [prev], c * hw * batch, c * batch * FLOAT)
    w = b.variable("head", c * 10)
    b.op("addmm", "head", [pooled], 2 * c * 10 * batch, 10 * batch * FLOAT, params=(w,))
    return b.build()


# ---------------------------------------------------------------- recurrent cells
_RNN_ACTIVATIONS = ("tanh", "relu", "sigmoid", "identity")


def rnn_cell_graph(
    seed: int = 0,
    *,
    batch: int | None = None,
    steps: int | None = None,
    nodes_per_cell: int | None = None,
    hidden: int | None = None,
    vocab: int = 10000,
    name: str | None = None,
) -> OpGraph:
    """A training step of a random ENAS-like recurrent cell unrolled over ``steps`` (a language model).

    Parameters
    ----------
    seed : int
    batch : int, optional
        Sequences per step (default 64-256).
    steps : int, optional
        Unrolled time steps (default 4-10; the appendix's ptb uses 25-40).
    nodes_per_cell : int, optional
        Cell nodes (default 3-6): node 0 mixes the input and the previous state, each later
        node applies a linear map and an activation to an earlier node; the new state is
        the mean of the nodes no other node reads.
    hidden : int, optional
        State size (default one of 256, 512, 1024).
    vocab : int
        Vocabulary of the embedding and of the softmax at every step.

    References
    ----------
    Pham et al., ENAS (ICML 2018), Section 2.1 (recurrent cells); Addanki et al., Placeto
    (NeurIPS 2019), appendix A.3, *ptb* dataset.
    """
    rng = np.random.default_rng(seed)
    batch = int(batch if batch is not None else rng.integers(64, 257))
    steps = int(steps if steps is not None else rng.integers(4, 11))
    per_cell = int(nodes_per_cell if nodes_per_cell is not None else rng.integers(3, 7))
    h = int(hidden if hidden is not None else rng.choice([256, 512, 1024]))
    parents = [0] + [int(rng.integers(j)) for j in range(1, per_cell)]
    acts = [_RNN_ACTIVATIONS[int(rng.integers(len(_RNN_ACTIVATIONS)))] for _ in range(per_cell)]
    b = _StepBuilder(name or f"rnn-{seed}")
    state_bytes = batch * h * FLOAT
    embedding = b.variable("embedding", vocab * h)
    cell_w = [b.variable(f"cell.node{j}", (2 * h if j == 0 else h) * h) for j in range(per_cell)]
    softmax_w = b.variable("softmax", h * vocab)
    tokens = b.data("input", steps * batch * 8)
    state = b.data("input", state_bytes)
    for t in range(steps):
        x = b.op("embedding", f"step{t}.embed", [tokens], 0, state_bytes, params=(embedding,))
        outs: list[int] = []
        for j in range(per_cell):
            layer = f"step{t}.node{j}"
            inputs = [x, state] if j == 0 else [outs[parents[j]]]
            fan_in = len(inputs) * h
            lin = b.op("mm", layer, inputs, 2 * batch * fan_in * h, state_bytes, params=(cell_w[j],))
            outs.append(lin if acts[j] == "identity" else b.op(acts[j], layer, [lin], batch * h, state_bytes))
        loose = [outs[j] for j in range(per_cell) if j not in parents[1:]]
        state = (
            b.op("mean", f"step{t}.state", loose, len(loose) * batch * h, state_bytes) if len(loose) > 1 else loose[0]
        )
        logits = b.op(
            "mm", f"step{t}.softmax", [state], 2 * batch * h * vocab, batch * vocab * FLOAT, params=(softmax_w,)
        )
        b.op("cross_entropy", f"step{t}.softmax", [logits], 5 * batch * vocab, FLOAT)
    return b.build()


# ---------------------------------------------------------------------- NMT
def nmt_graph(
    seed: int = 0,
    *,
    batch: int | None = None,
    steps: int | None = None,
    hidden: int = 512,
    layers: int = 2,
    vocab: int = 16000,
    name: str | None = None,
) -> OpGraph:
    """A training step of an LSTM encoder-decoder with attention, unrolled over ``steps`` each side.

    Parameters
    ----------
    seed : int
    batch : int, optional
        Sentence pairs per step (default 64-128, the appendix's nmt range).
    steps : int, optional
        Source and target length (default 4-10; the appendix uses 16-32).
    hidden : int
        LSTM state size.
    layers : int
        LSTM layers in the encoder and in the decoder (2, as the appendix).
    vocab : int
        Source and target vocabulary.

    References
    ----------
    Wu et al., "Google's Neural Machine Translation System" (2016); Luong et al., "Effective
    Approaches to Attention-based NMT" (EMNLP 2015); Addanki et al., Placeto (NeurIPS 2019),
    appendix A.3, *nmt* dataset.
    """
    rng = np.random.default_rng(seed)
    batch = int(batch if batch is not None else rng.integers(64, 129))
    steps = int(steps if steps is not None else rng.integers(4, 11))
    b = _StepBuilder(name or f"nmt-{seed}")
    hb = batch * hidden * FLOAT

    def lstm(layer, x, state, weight):
        gates = b.op("addmm", layer, [x, state], 2 * batch * 2 * hidden * 4 * hidden, 4 * hb, params=(weight,))
        return b.op("lstm_cell", layer, [gates], 10 * batch * hidden, 2 * hb)

    tokens = b.data("input", 2 * steps * batch * 8)
    zero = b.data("input", 2 * hb)
    emb = {side: b.variable(f"{side}.embedding", vocab * hidden) for side in ("enc", "dec")}
    weights = {
        (side, layer): b.variable(f"{side}.lstm{layer}", 2 * hidden * 4 * hidden)
        for side in ("enc", "dec")
        for layer in range(layers)
    }
    attn_w = b.variable("dec.attention", 2 * hidden * hidden)
    proj_w = b.variable("dec.projection", hidden * vocab)
    states = {(side, layer): zero for side in ("enc", "dec") for layer in range(layers)}
    encoder_out = []
    for side in ("enc", "dec"):
        for t in range(steps):
            x = b.op("embedding", f"{side}.embedding", [tokens], 0, hb, params=(emb[side],))
            for layer in range(layers):
                x = states[side, layer] = lstm(f"{side}.lstm{layer}", x, states[side, layer], weights[side, layer])
            if side == "enc":
                encoder_out.append(x)
                continue
            if t == 0:
                memory = b.op("stack", "dec.attention", encoder_out, 0, steps * hb)
            score = b.op("bmm", "dec.attention", [x, memory], 2 * batch * steps * hidden, batch * steps * FLOAT)
            weight = b.op("softmax", "dec.attention", [score], 5 * batch * steps, batch * steps * FLOAT)
            context = b.op("bmm", "dec.attention", [weight, memory], 2 * batch * steps * hidden, hb)
            combined = b.op(
                "addmm", "dec.attention", [x, context], 2 * batch * 2 * hidden * hidden, hb, params=(attn_w,)
            )
            logits = b.op(
                "mm", "dec.projection", [combined], 2 * batch * hidden * vocab, batch * vocab * FLOAT, params=(proj_w,)
            )
            b.op("cross_entropy", "dec.projection", [logits], 5 * batch * vocab, FLOAT)
    return b.build()


FAMILIES = {"image": image_cell_graph, "rnn": rnn_cell_graph, "nmt": nmt_graph}


def family_graph(family: str, index: int) -> OpGraph:
    """Graph ``index`` (0 to :data:`GRAPHS_PER_FAMILY` - 1) of a family, named ``{family}-{index}``."""
    try:
        make = FAMILIES[family]
    except KeyError:
        raise OptionError(f"unknown graph family {family!r}; families: {', '.join(FAMILIES)}") from None
    return make(seed=1000 * (list(FAMILIES).index(family) + 1) + index, name=f"{family}-{index}")


def split_indices(family: str) -> dict[str, list[int]]:
    """The fixed train/test split of a family: a seeded shuffle of its indices, cut at ``TRAIN_FRACTION``."""
    if family not in FAMILIES:
        raise OptionError(f"unknown graph family {family!r}; families: {', '.join(FAMILIES)}")
    order = np.random.default_rng(list(FAMILIES).index(family)).permutation(GRAPHS_PER_FAMILY).tolist()
    cut = int(GRAPHS_PER_FAMILY * TRAIN_FRACTION)
    return {"train": sorted(order[:cut]), "test": sorted(order[cut:])}


def dataset(family: str, split: str, count: int | None = None) -> list[OpGraph]:
    """The graphs of a family's ``"train"`` or ``"test"`` split (the first ``count`` of them).

    ``family="all"`` interleaves the three families.
    """
    if split not in ("train", "test"):
        raise OptionError(f"split must be 'train' or 'test', got {split!r}")
    families = list(FAMILIES) if family == "all" else [family]
    lists = [[(f, i) for i in split_indices(f)[split]] for f in families]
    chosen = [pair for group in zip(*lists) for pair in group]
    if count is not None:
        chosen = chosen[:count]
    return [family_graph(f, i) for f, i in chosen]
