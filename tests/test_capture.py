"""placer.capture: captured training steps equal eager PyTorch, graphs are faithful."""

from __future__ import annotations

import copy
from functools import partial

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.flop_counter import FlopCounterMode

from placer.capture import OPTIMIZERS, capture, trace
from placer.capture.build import conv_backward_flops
from placer.capture.trace import portable_kernels
from placer.errors import FormatError, OptionError
from placer.graph import OpGraph


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Eager runs on one thread: on a busy machine, OpenMP threads waiting for each other make
    small CPU kernels up to 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class MLP(nn.Module):
    def __init__(self, d_in=6, hidden=8, classes=3):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.fc2(torch.tanh(self.fc1(x))), y)


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x, y):
        h = torch.relu(self.bn(self.conv(x)))
        return nn.functional.cross_entropy(self.head(h.flatten(1)), y)


class TinyLM(nn.Module):
    """A GPT-2-like LM whose output projection is the embedding (one Parameter, tied)."""

    def __init__(self, vocab=11, dim=8, context=5):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.block = nn.TransformerEncoderLayer(
            dim, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True, norm_first=True
        )
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens, targets):
        positions = torch.arange(tokens.shape[1])
        h = self.ln_f(self.block(self.wte(tokens) + self.wpe(positions)))
        logits = self.lm_head(h)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _mlp(batch=4):
    torch.manual_seed(0)
    return MLP(), (torch.randn(batch, 6), torch.randint(0, 3, (batch,)))


def _cnn(batch=2):
    torch.manual_seed(0)
    return ConvBN(), (torch.randn(batch, 3, 6, 6), torch.randint(0, 5, (batch,)))


def _lm(batch=2):
    torch.manual_seed(0)
    return TinyLM(), (torch.randint(0, 11, (batch, 5)), torch.randint(0, 11, (batch, 5)))


class LSTMLM(nn.Module):
    def __init__(self, vocab=13, dim=6, hidden=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, hidden, num_layers=2, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens, targets):
        h, _ = self.rnn(self.emb(tokens))
        return nn.functional.cross_entropy(self.out(h).flatten(0, 1), targets.flatten())


def _lstm(batch=3):
    torch.manual_seed(0)
    return LSTMLM(), (torch.randint(0, 13, (batch, 4)), torch.randint(0, 13, (batch, 4)))


class Kinds(nn.Module):
    """Parameters of three kinds, which torch.optim's update treats apart: float32, float64, complex64."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 3, dtype=torch.float64))
        self.phase = nn.Parameter(torch.tensor([1 + 1j, 1 - 0.5j, 0.5j], dtype=torch.complex64))

    def forward(self, x):
        h = self.fc(x).double() * self.scale
        return (h.to(torch.complex64) * self.phase).abs().sum().float()


def _kinds(batch=2):
    torch.manual_seed(0)
    return Kinds(), (torch.randn(batch, 4),)


MODELS = {"mlp": _mlp, "cnn_bn": _cnn, "tied_lm": _lm, "lstm": _lstm, "kinds": _kinds}


def _eager_steps(model, inputs, opt, steps):
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(*inputs)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_two_captured_steps_equal_eager_training(model_name, optimizer):
    model, inputs = MODELS[model_name]()
    reference = copy.deepcopy(model)
    step = capture(model, inputs, optimizer=optimizer, lr=1e-2)
    opt = step.optimizer.eager(model.parameters())  # its state is filled by the captured step
    eager_opt = step.optimizer.eager(reference.parameters())
    losses = [step.run(model, inputs, opt).item() for _ in range(2)]
    np.testing.assert_allclose(losses, _eager_steps(reference, inputs, eager_opt, 2), rtol=1e-6, atol=1e-6)
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert opt.state[p].keys() == eager_opt.state[q].keys()
        for key, value in eager_opt.state[q].items():
            torch.testing.assert_close(opt.state[p][key], value, rtol=1e-6, atol=1e-6)
    # Eager training goes on from the state the captured steps left.
    _eager_steps(model, inputs, opt, 1)
    _eager_steps(reference, inputs, eager_opt, 1)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


_TRACE_STEP = trace._trace_step


def _fx_signature(gm: torch.fx.GraphModule) -> list[tuple]:
    """Every node's name, target, arguments, value layout and metadata placer reads; autograd
    sequence numbers as the order they first appear in (their values count from the process's start)."""
    first_seen: dict = {}
    signature = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        layout = (tuple(val.shape), val.stride(), val.dtype) if isinstance(val, torch.Tensor) else type(val).__name__
        seq = None if node.op == "placeholder" else first_seen.setdefault(node.meta.get("seq_nr"), len(first_seen))
        signature.append(
            (
                node.name,
                node.op,
                str(node.target),
                str(node.args),
                str(node.kwargs),
                layout,
                node.meta.get("custom"),
                seq,
                str(node.meta.get("nn_module_stack")),
            )
        )
    return signature


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_copied_updates_give_the_graph_of_a_trace_of_every_update(model_name, optimizer, monkeypatch):
    # placer.capture.updates traces each kind of parameter's update once and copies it for the others.
    steps = []
    for per_parameter in (True, False):
        monkeypatch.setattr(trace, "_trace_step", partial(_TRACE_STEP, per_parameter=per_parameter))
        steps.append(capture(*MODELS[model_name](), optimizer=optimizer))
    copied, traced = steps
    assert _fx_signature(copied.gm) == _fx_signature(traced.gm)
    assert copied.graph.to_dict() == traced.graph.to_dict()
    assert not any(n.target is torch.ops.placer.optimizer_update.default for n in copied.gm.graph.nodes)


def _eager_flops(model, inputs, optimizer):
    opt = optimizer.eager(model.parameters())
    mapping = {torch.ops.aten.convolution_backward: conv_backward_flops}
    with portable_kernels(), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        model(*inputs).backward()
        opt.step()
    return counter.get_total_flops()


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_node_flops_sum_to_flop_counter_of_eager_step(model_name):
    model, inputs = MODELS[model_name]()
    step = capture(model, inputs, optimizer="adam")
    expected = _eager_flops(model, inputs, step.optimizer)
    assert expected > 0
    assert np.nansum(step.graph.flops) == pytest.approx(expected, rel=0.02)


class Depthwise(nn.Module):
    def __init__(self, channels=8):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)

    def forward(self, x):
        return self.conv(x).square().mean()


def test_depthwise_weight_gradient_does_the_forward_multiply_adds():
    # torch's own formula counts the weight gradient over every input channel (8x too many here).
    step = capture(Depthwise(8), (torch.randn(2, 8, 6, 6),), optimizer="sgd")
    graph = step.graph
    forward = 2 * 2 * 8 * 1 * 3 * 3 * 6 * 6  # 2 x batch x out channels x in channels per group x 3x3 x 6x6
    (conv,) = [i for i, op in enumerate(graph.op) if op == "aten.convolution"]
    (backward,) = [i for i, op in enumerate(graph.op) if op == "aten.convolution_backward"]
    assert graph.flops[conv] == forward
    assert graph.flops[backward] == forward  # the input needs no gradient: the weight's alone


def test_capture_is_deterministic_and_ids_are_fx_names():
    a = capture(*_cnn(), optimizer="adam")
    b = capture(*_cnn(), optimizer="adam")
    assert a.graph.ids == b.graph.ids
    assert a.graph.digest() == b.graph.digest()
    assert a.graph.to_dict() == b.graph.to_dict()
    fx_names = {n.name for n in a.gm.graph.nodes}
    assert set(a.graph.ids) <= fx_names
    assert set(a.carrier) == fx_names - {"output"}
    assert capture(*_cnn(), optimizer="sgd").graph.digest() != a.graph.digest()


def test_graph_round_trips_and_costs_are_filled(tmp_path):
    step = capture(*_lm(), optimizer="adamw")
    graph = step.graph
    path = tmp_path / "g.json"
    graph.save(path)
    again = OpGraph.load(path)
    assert again.to_dict() == graph.to_dict()
    assert (graph.compute_s >= 0).all() and graph.compute_s.sum() > 0
    assert all(set(k) == {"A100", "H100", "cpu"} for k in graph.compute_s_by_kind if k)
    assert all("bytes_accessed" in e for e in graph.node_extra)


def test_placeholders_hold_state_and_tied_weight_is_listed_once():
    model, inputs = _lm()
    step = capture(model, inputs, optimizer="adam")
    graph = step.graph
    assert "lm_head.weight" not in step.layout.params and "wte.weight" in step.layout.params
    unique = {id(p): p for p in model.parameters()}.values()
    param_bytes = sum(p.numel() * p.element_size() for p in unique)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    state_bytes = 2 * param_bytes + 4 * len(unique)  # exp_avg, exp_avg_sq, step per parameter
    assert graph.param_bytes.sum() == param_bytes + buffer_bytes + state_bytes + 8  # and the float64 lr
    i = graph.index["p_wte_weight"]
    assert graph.op[i] == "placeholder" and graph.layer[i] == "wte"


def test_state_writes_are_colocated_and_ordered_after_every_reader():
    step = capture(*_cnn(), optimizer="adam")
    graph, gm = step.graph, step.gm
    order = {node_id: k for k, node_id in enumerate(graph.topological_order.tolist())}
    writes = [n for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert len(writes) == len(step.layout.params) * 4 + 1  # params, 3 Adam states, num_batches_tracked
    for node in writes:
        target = node.args[0].name
        w, t = graph.index[node.name], graph.index[target]
        assert graph.colocation[w] is not None and graph.colocation[w] == graph.colocation[t]
        for reader in node.args[0].users:
            if reader is not node:
                r = graph.index[step.carrier[reader.name]]
                assert order[r] < order[w], (reader.name, node.name)
    # native_batch_norm writes the running statistics in place: same group as both buffers.
    bn = graph.index["native_batch_norm"]
    assert (
        graph.colocation[bn]
        == graph.colocation[graph.index["b_bn_running_mean"]]
        == graph.colocation[graph.index["b_bn_running_var"]]
    )


def test_layers_follow_modules_into_backward_and_optimizer():
    step = capture(*_cnn(), optimizer="adam")
    layer = dict(zip(step.graph.ids, step.graph.layer))
    assert layer["convolution"] == "conv" and layer["convolution_backward"] == "conv"
    assert layer["native_batch_norm_backward"] == "bn"
    ops = dict(zip(step.graph.ids, step.graph.op))
    addcdivs = [i for i, op in ops.items() if op == "aten.addcdiv"]
    assert [layer[i] for i in addcdivs] == ["conv", "conv", "bn", "bn", "head", "head"]


def _dims(entries, dim):
    return [e for e in entries or [] if e["dim"] == dim]


def test_batch_splittable_ops():
    step = capture(*_mlp(batch=5), optimizer="sgd")
    graph = step.graph
    split = {graph.ids[i]: _dims(s, "batch") for i, s in enumerate(graph.splittable) if _dims(s, "batch")}
    rows = {i: s for i, s in split.items() if "join" not in s[0]}
    assert rows and all(s == [{"dim": "batch", "size": 5}] for s in rows.values())
    assert all(graph.op[graph.index[i]] in ("aten.addmm", "aten.mm") for i in split)
    # Weight gradients (rows = output features, not samples) are not split by rows: t(grad) @ x sums over the
    # batch, so a batch split slices both operands' samples and sums the partial products.
    weight_shapes = {tuple(p.shape) for p in MLP().parameters()}
    for node in step.gm.graph.find_nodes(op="call_function", target=torch.ops.aten.mm.default):
        is_weight_grad = tuple(node.meta["val"].shape) in weight_shapes
        assert (node.name not in rows) == is_weight_grad, node.name
        if is_weight_grad:
            (a, b), entry = node.args, split[node.name][0]
            assert entry == {
                "dim": "batch",
                "size": 5,
                "args": [[0, 1], [1, 0]],
                "inputs": [[a.name, 0], [b.name, 0]],
                "join": ["sum"],
            }
    cnn = capture(*_cnn(batch=3), optimizer="sgd").graph
    assert cnn.splittable[cnn.index["convolution"]] == [
        {"dim": "batch", "size": 3},
        {"dim": "channel", "size": 4, "axis": 1, "args": [[1, 0], [2, 0]]},
    ]


def test_channel_splittable_ops_record_the_arguments_a_split_slices():
    """Output channels of a forward convolution or of a product with a weight: weight (and bias) sliced."""
    step = capture(*_mlp(batch=5), optimizer="sgd")
    graph = step.graph
    channel = {graph.ids[i]: _dims(s, "channel") for i, s in enumerate(graph.splittable) if _dims(s, "channel")}
    # Weight gradients read the batch twice: their output rows split with t(grad)'s rows, x whole.
    weight_grads = {i: s for i, s in channel.items() if "join" in s[0]}
    assert sorted(s[0]["size"] for s in weight_grads.values()) == [3, 8]
    assert all(s[0]["join"] == [0] and s[0]["args"] == [[0, 0]] for s in weight_grads.values())
    channel = {i: s for i, s in channel.items() if i not in weight_grads}
    # fc1 (8 outputs) and fc2 (3) forward: addmm(bias, x, t(weight)), bias and weight columns sliced; fc2's
    # input gradient mm(grad, weight): the weight's 8 columns.
    entry = {"dim": "channel", "axis": 1}
    assert channel == {
        "addmm": [{**entry, "size": 8, "args": [[0, 0], [2, 1]]}],
        "addmm_1": [{**entry, "size": 3, "args": [[0, 0], [2, 1]]}],
        "mm": [{**entry, "size": 8, "args": [[1, 1]]}],
    }
    assert step.gm.graph.find_nodes(op="call_function", target=torch.ops.aten.mm.default)[0].name == "mm"

    class Convs(nn.Module):
        """A plain convolution without bias, a grouped one and a transposed one: only the first is declared."""

        def __init__(self, transposed=nn.ConvTranspose2d(4, 4, 3, padding=1)):
            super().__init__()
            self.plain = nn.Conv2d(3, 4, 3, padding=1, bias=False)
            self.grouped = nn.Conv2d(4, 4, 3, padding=1, groups=2)
            self.transposed = transposed

        def forward(self, x):
            return self.transposed(self.grouped(self.plain(x))).pow(2).mean()

    convs = capture(Convs(), (torch.randn(1, 3, 5, 5),), optimizer="sgd")
    forward = convs.gm.graph.find_nodes(op="call_function", target=torch.ops.aten.convolution.default)
    declared = [_dims(convs.graph.splittable[convs.graph.index[n.name]], "channel") for n in forward]
    assert declared == [[{"dim": "channel", "size": 4, "axis": 1, "args": [[1, 0]]}], [], []]


def test_meta_model_captures_without_memory_and_matches_real_capture():
    real = capture(*_lm(), optimizer="adam")
    with torch.device("meta"):
        model, inputs = _lm()
    assert next(model.parameters()).is_meta
    fake = capture(model, inputs, optimizer="adam")
    assert fake.fake and not real.fake
    assert fake.graph.ids == real.graph.ids
    np.testing.assert_array_equal(fake.graph.output_bytes, real.graph.output_bytes)
    np.testing.assert_array_equal(fake.graph.param_bytes, real.graph.param_bytes)
    np.testing.assert_array_equal(fake.graph.flops, real.graph.flops)


class NotScalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)


def test_bad_arguments_give_named_errors():
    with pytest.raises(FormatError, match="scalar"):
        capture(NotScalar(), (torch.randn(4, 3),))
    with pytest.raises(OptionError, match="lamb"):
        capture(*_mlp(), optimizer="lamb")
    with pytest.raises(OptionError, match="lr"):
        capture(*_mlp(), lr=-1.0)
    with pytest.raises(OptionError, match="Module"):
        capture(lambda x: x, (torch.randn(2),))


class LossOfInputsOnly(MLP):
    def forward(self, x, y):
        return (x * 2).sum()


class DetachedLoss(MLP):
    def forward(self, x, y):
        return super().forward(x, y).detach()


class LossUnderNoGrad(MLP):
    def forward(self, x, y):
        with torch.no_grad():
            return super().forward(x, y)


@pytest.mark.parametrize(
    "model", [LossOfInputsOnly(), DetachedLoss(), LossUnderNoGrad()], ids=lambda m: type(m).__name__
)
def test_a_loss_without_gradient_is_refused(model):
    # It used to capture a forward pass with zero gradients and no backward, silently.
    with pytest.raises(
        FormatError,
        match=f"training step of {type(model).__name__}: its loss has no gradient, "
        r"it depends on none of the trainable parameters \(fc1.weight",
    ):
        capture(model, (torch.randn(4, 6), torch.randint(0, 3, (4,))))


def test_a_model_without_trainable_parameters_is_refused():
    model, inputs = _mlp()
    model.requires_grad_(False)
    with pytest.raises(
        FormatError,
        match="training step of MLP: it has no trainable parameter "
        r"\(its 4 parameters all have requires_grad=False\)",
    ):
        capture(model, inputs)
    with pytest.raises(FormatError, match=r"no trainable parameter \(it has no parameters\)"):
        capture(nn.MSELoss(), (torch.randn(4, 2), torch.randn(4, 2)))


class BranchesOnValues(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x):
        y = self.fc(x).sum()
        return y if bool((x > 0).all()) else -y


def test_data_dependent_model_names_the_line():
    with pytest.raises(FormatError, match=r"test_capture.py:\d+: .*branches on tensor values"):
        capture(BranchesOnValues(), (torch.randn(4, 3),))


class ScalesItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x):
        x /= 255
        return self.fc(x).sum()


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.fc, x, use_reentrant=False).sum()


class CumulativeNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(3, momentum=None)  # reads its step count as a Python number

    def forward(self, x):
        return self.norm(x).pow(2).sum()


@pytest.mark.parametrize(
    "model, message",
    [
        (ScalesItsInput, r"test_capture.py:\d+: .*writes in place into one of its inputs"),
        (Checkpointed, r"test_capture.py:\d+ \(in torch.*activation checkpointing"),
        (CumulativeNorm, r"test_capture.py:\d+ \(in torch.nn.modules.batchnorm.py:\d+\).*branches on tensor values"),
    ],
)
def test_what_capture_cannot_follow_is_said_in_the_models_terms(model, message):
    # torch's own advice ("rewrite the function being transformed", "open an issue") named torch's files.
    with pytest.raises(FormatError, match=message):
        capture(model(), (torch.randn(4, 3),))


MODEL_FILE = """
import torch
from torch import nn
from sibling import WIDTH   # imported from the file's own folder, as when it runs

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(10, WIDTH)
        self.b = nn.Linear(WIDTH, 1)

    def forward(self, x, y):
        return nn.functional.mse_loss(self.b(torch.relu(self.a(x))), y)

def make(batch_size):
    return Net(), (torch.randn(batch_size, 10), torch.randn(batch_size, 1))

def broken(batch_size):
    raise ValueError("no data here")

def model_only(batch_size):
    return Net()

def vector_loss(batch_size):
    class PerSample(Net):
        def forward(self, x, y):
            return (self.b(self.a(x)) - y) ** 2
    return PerSample(), (torch.randn(batch_size, 10), torch.randn(batch_size, 1))

def data_dependent(batch_size):
    class Positive(Net):
        def forward(self, x, y):
            out = self.b(self.a(x))
            return out[out > 0].sum()
    return Positive(), (torch.randn(batch_size, 10), torch.randn(batch_size, 1))

NOT_A_FUNCTION = 3
"""


@pytest.fixture()
def model_file(tmp_path):
    (tmp_path / "sibling.py").write_text("WIDTH = 16\n")
    path = tmp_path / "mymodel.py"
    path.write_text(MODEL_FILE)
    return path


def test_file_spec_captures_an_unchanged_model_file(model_file):
    from placer.capture import capture_spec, load_model

    step = capture_spec(f"{model_file}:make", 8, optimizer="sgd")
    assert step.graph.name == "make-bs8-sgd" and step.batch_size == 8
    model, inputs = load_model(f"{model_file}:make", 8)
    assert inputs[0].shape == (8, 10) and model.a.out_features == 16
    real = capture(model, inputs, optimizer="sgd", name="make-bs8-sgd")
    assert real.graph.to_dict() == step.graph.to_dict()


@pytest.mark.parametrize(
    "factory, error, words",
    [
        ("broken", FormatError, "factory 'broken' .* raised ValueError: no data here"),
        ("missing", FormatError, "no factory 'missing'.*broken, data_dependent, make"),
        ("NOT_A_FUNCTION", FormatError, "non-callable factory"),
        ("model_only", FormatError, r"must return \(model, inputs\)"),
        ("vector_loss", FormatError, "scalar"),
        ("data_dependent", FormatError, "size depends on the data"),
    ],
)
def test_bad_file_specs_say_what_is_wrong(model_file, factory, error, words):
    from placer.capture import capture_spec

    with pytest.raises(error, match=words):
        capture_spec(f"{model_file}:{factory}", 4)


def test_bad_specs_and_batches(tmp_path):
    from placer.capture import capture_spec, load_model, parse_spec

    with pytest.raises(FormatError, match="no such file"):
        load_model(f"{tmp_path}/absent.py:make", 4)
    (tmp_path / "bad.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(FormatError, match="importing it raised RuntimeError: boom"):
        load_model(f"{tmp_path}/bad.py:make", 4)
    for spec in ("", "model.py", "model.py:not-a-name"):
        with pytest.raises(OptionError):
            parse_spec(spec)
    with pytest.raises(OptionError, match="batch"):
        capture_spec("zoo:anything", 0)
    assert parse_spec("zoo:gpt2?layers=2&dropout=0.1&tied=true&act=gelu") == (
        "zoo",
        "gpt2",
        {"layers": 2, "dropout": 0.1, "tied": True, "act": "gelu"},
    )


@pytest.mark.parametrize(
    "query, message",
    [
        ("depth=50&depth=101", r"size option 'depth' is given twice \('depth=50' and 'depth=101'\)"),
        ("image-size=64&width=8&image_size=64", r"size option 'image_size' is given twice \('image-size=64' and"),
    ],
)
def test_a_size_option_given_twice_is_refused(query, message):
    # The last one used to win silently.
    from placer.capture import capture_spec, parse_spec

    with pytest.raises(OptionError, match=message):
        parse_spec(f"zoo:resnet50?{query}")
    with pytest.raises(OptionError, match=message):
        capture_spec(f"zoo:resnet50?{query}", 2)


def test_cli_capture_writes_the_graph_atomically(model_file, tmp_path, capsys):
    from placer.cli import main

    out = tmp_path / "g.json"
    assert main(["capture", f"{model_file}:make", "--batch", "4", "--optimizer", "adamw", "-o", str(out)]) == 0
    graph = OpGraph.load(out)
    assert graph.name == "make-bs4-adamw" and graph.num_nodes > 50
    printed = capsys.readouterr().out
    assert f"{graph.num_nodes} nodes, {graph.num_edges} edges" in printed
    assert main(["capture", f"{model_file}:broken", "--batch", "4", "-o", str(tmp_path / "h.json")]) == 2
    assert "raised ValueError" in capsys.readouterr().err
    assert not (tmp_path / "h.json").exists()


def test_write_back_from_copies_equals_running_in_place():
    model, inputs = _cnn()
    reference = copy.deepcopy(model)
    step = capture(model, inputs, optimizer="adam", lr=1e-2)
    opt, ref_opt = step.optimizer.eager(model.parameters()), step.optimizer.eager(reference.parameters())
    for _ in range(2):
        copies = [t.clone() for t in step.step_inputs(model, inputs, opt)]  # as a runtime on other devices
        loss = step.gm(*copies)
        step.write_back(copies, model, opt)
        ref_loss = step.run(reference, inputs, ref_opt)
        assert loss.item() == ref_loss.item()
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert all(torch.equal(opt.state[p][k], ref_opt.state[q][k]) for k in step.layout.state_names)
    fresh = step.step_inputs(model, inputs)  # no optimizer: new zero state, reused across steps
    assert len(fresh) == step.layout.num_flat
    with pytest.raises(OptionError, match="Adam"):
        step.step_inputs(model, inputs, torch.optim.SGD(model.parameters(), lr=0.1))


def test_frozen_parameters_are_inputs_not_trained():
    model, inputs = _mlp()
    model.fc1.requires_grad_(False)
    reference = copy.deepcopy(model)
    step = capture(model, inputs, optimizer="adamw", lr=1e-2)
    assert step.layout.params == ("fc2.weight", "fc2.bias")
    assert step.layout.buffers == ("fc1.weight", "fc1.bias")
    opt = step.optimizer.eager([p for p in model.parameters() if p.requires_grad])
    ref_opt = step.optimizer.eager([p for p in reference.parameters() if p.requires_grad])
    for _ in range(2):
        step.run(model, inputs, opt)
    _eager_steps(reference, inputs, ref_opt, 2)
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_example_args_run_the_step_without_touching_the_model():
    model, inputs = _lm()
    before = copy.deepcopy(model.state_dict())
    step = capture(model, inputs, optimizer="adam")
    args = step.example_args()
    loss = step.gm(*args)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), before.values()))
    with torch.device("meta"):
        meta_model, meta_inputs = _lm()
    fake = capture(meta_model, meta_inputs, optimizer="adam")
    fake_args = fake.example_args()
    assert [a.shape for a in fake_args] == [a.shape for a in args]
    assert torch.isfinite(fake.gm(*fake_args))


def _zoo_names():
    from placer.capture.zoo import ZOO

    return sorted(ZOO)


@pytest.mark.parametrize("name", _zoo_names())
def test_every_zoo_model_captures_at_batch_4_with_faithful_flops(name):
    from placer.capture import capture_spec
    from placer.capture.zoo import ZOO

    entry = ZOO[name]
    query = "&".join(f"{k}={v}" for k, v in entry.tiny.items())
    spec = f"zoo:{name}" + (f"?{query}" if query else "")
    step = capture_spec(spec, 4, optimizer="sgd", fake=False)
    graph = OpGraph.from_dict(step.graph.to_dict())
    assert graph.num_nodes > 20 and graph.name == f"{spec[4:]}-bs4-sgd"
    assert any(s for s in graph.splittable), "no batch-splittable op"
    model, inputs = entry.factory(4, **entry.tiny)
    assert np.nansum(graph.flops) == pytest.approx(_eager_flops(model, inputs, step.optimizer), rel=0.02)


def test_unknown_zoo_model_and_option_are_named():
    from placer.capture import load_model

    with pytest.raises(OptionError, match="unknown zoo model 'nope'.*lenet"):
        load_model("zoo:nope", 4)
    with pytest.raises(OptionError, match="depthh"):
        load_model("zoo:resnet50?depthh=3", 4)


@settings(max_examples=4, deadline=None)
@given(
    widths=st.lists(st.integers(1, 9), min_size=2, max_size=4),
    batch=st.integers(1, 6),
    optimizer=st.sampled_from(OPTIMIZERS),
)
def test_mlp_graph_properties(widths, batch, optimizer):
    layers = [nn.Linear(a, b) for a, b in zip(widths, widths[1:])]
    model = nn.Sequential(*[m for layer in layers for m in (layer, nn.ReLU())][:-1])

    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x, y):
            return nn.functional.mse_loss(self.net(x), y)

    step = capture(WithLoss(), (torch.randn(batch, widths[0]), torch.randn(batch, widths[-1])), optimizer=optimizer)
    graph = step.graph
    # Forward, weight-gradient and input-gradient matmuls of every layer but the input gradient of the first.
    macs = sum(a * b for a, b in zip(widths, widths[1:]))
    assert graph.flops.sum() == 2 * batch * (3 * macs - widths[0] * widths[1])
    params = sum(p.numel() for p in model.parameters()) * 4
    state = {"sgd": 0, "adam": 2 * params + 4 * 2 * len(layers), "adamw": 2 * params + 4 * 2 * len(layers)}
    assert graph.param_bytes.sum() == params + state[optimizer] + 8  # the learning rate, a float64
    for i in np.flatnonzero(graph.output_bytes):
        assert graph.op[i] != "placeholder" or graph.ids[i].startswith("input_")
    for i, split in enumerate(graph.splittable):
        # A weight gradient's entries sum partial products ("join"); its batch entry, where the batch has 2
        # samples or more, slices the samples as the others' do.
        summing = any("join" in e for e in split or [])
        assert split is None or (
            (_dims(split, "batch") == [{"dim": "batch", "size": batch}] or summing)
            and graph.op[i] in ("aten.addmm", "aten.mm")
        )
        assert all(e["size"] == batch for e in _dims(split, "batch")) and len(_dims(split, "batch")) <= 1
        # Channels: a layer's outputs (its forward product) or inputs (its input gradient), 2 or more of them.
        assert all(e["size"] in widths and e["size"] >= 2 for e in _dims(split, "channel"))
    groups = graph.colocation_groups
    assert len(groups) == len(step.layout.params) * (1 + len(step.layout.state_names))
    assert all(len(members) == 2 for members in groups.values())  # each state tensor and its write-back


def test_batch_splittable_ops_record_the_rows_a_split_cuts():
    """A (batch, seq, features) activation viewed as (batch * seq, features): a split cuts all those rows."""
    step = capture(*_lm(batch=2), optimizer="sgd")
    graph = step.graph
    sizes = set()
    for node in step.gm.graph.nodes:
        split = _dims(graph.splittable[graph.index[node.name]], "batch") if node.name in graph.index else None
        if split and "join" in split[0]:
            # A weight gradient t(grad) @ x sums over the rows it contracts, x's leading ones.
            assert split[0]["size"] == node.args[1].meta["val"].shape[0], node.name
            sizes.add(split[0]["size"])
        elif split:
            packet = node.target.overloadpacket
            first = node.args[1] if packet in (torch.ops.aten.addmm, torch.ops.aten.baddbmm) else node.args[0]
            assert split == [{"dim": "batch", "size": first.meta["val"].shape[0]}], node.name
            sizes.add(split[0]["size"])
    assert 2 * 5 in sizes  # batch 2 x 5 tokens

    class Gram(nn.Module):
        """x @ (x^T x): the second operand depends on the batch too, so rows of x alone cannot be cut."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            return (h @ (h.t() @ h)).pow(2).mean()

    gram = capture(Gram(), (torch.randn(4, 4),), optimizer="sgd")
    outer = [
        n
        for n in gram.gm.graph.find_nodes(op="call_function", target=torch.ops.aten.mm.default)
        if n.args[0].name == "addmm"
    ]
    assert outer and all(gram.graph.splittable[gram.graph.index[n.name]] is None for n in outer)


def test_an_ordering_edge_holds_its_source_only_until_the_first_node_that_leads_to_the_write():
    """A linear layer's input gradient reads the weight that the update writes at the end of the step, and
    no path orders the two: the ordering edge that does goes to the first node after the reader (in program
    order) that leads to the update (the weight's gradient), so the input gradient is not held until the
    update (FORMATS.md, rule 6)."""
    import networkx as nx

    g = capture(*_mlp(), optimizer="sgd").graph
    graph = nx.DiGraph([(int(g.src[e]), int(g.dst[e])) for e in range(g.num_edges)])
    writes = [i for i, op in enumerate(g.op) if op == "aten.copy_"]
    leads = {w: nx.ancestors(graph, w) for w in writes}
    held = [
        (g.ids[int(g.src[e])], g.ids[int(g.dst[e])])
        for e in range(g.num_edges)
        if not g.edge_bytes[e]
        and g.output_bytes[g.src[e]]
        and int(g.dst[e]) in leads
        and any(x in leads[int(g.dst[e])] for x in range(int(g.src[e]) + 1, int(g.dst[e])))
    ]
    assert not held
    # The input gradients' orderings are there, pointed at nodes before the writes.
    assert any(
        not g.edge_bytes[e] and g.op[g.src[e]] == "aten.mm" and any(int(g.dst[e]) in leads[w] for w in writes)
        for e in range(g.num_edges)
    )


def test_each_output_of_a_multi_output_op_is_a_node_held_until_its_own_readers_end():
    """Batch norm's output is read at once (by the ReLU), its saved statistics in the backward pass: each
    output picked (an fx ``getitem``) is its own node, colocated with the op, holding that output's bytes
    until its own readers end (FORMATS.md, rule 6); the op holds all its outputs until its picks have run."""
    step = capture(*_cnn(), optimizer="sgd")
    graph, gm = step.graph, step.gm
    (norm,) = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.native_batch_norm.default)
    x = graph.index[norm.name]
    picks = {int(p.args[1]): p for p in norm.users}
    assert set(picks) == {0, 1, 2} and all(step.carrier[p.name] == p.name for p in picks.values())
    ptr, eids = graph.out_edges
    consumers = {
        int(graph.dst[e]): (int(graph.edge_tensor[e]), int(graph.edge_bytes[e])) for e in eids[ptr[x] : ptr[x + 1]]
    }
    assert consumers == {graph.index[p.name]: (k, p.meta["val"].numel() * 4) for k, p in picks.items()}
    assert graph.output_bytes[x] == sum(graph.output_bytes[graph.index[p.name]] for p in picks.values())
    y = graph.index[picks[0].name]
    assert graph.output_bytes[y] == picks[0].meta["val"].numel() * 4
    assert {graph.colocation[graph.index[p.name]] for p in picks.values()} == {graph.colocation[x]}
    assert graph.op[y] == "_operator.getitem" and graph.compute_s[y] == 0


def test_outputs_that_are_views_of_an_input_hold_nothing_and_keep_their_base():
    """``unsafe_split`` (an LSTM's gates) returns views of its input, though its schema does not say so: its
    outputs allocate nothing, and each reader of one keeps the split input's producer held (a 0-byte edge)."""
    step = capture(*_lstm(), optimizer="sgd")
    graph, gm = step.graph, step.gm
    splits = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.unsafe_split.Tensor)
    assert splits
    for split in splits:
        base = graph.index[split.args[0].name]
        assert graph.output_bytes[base] > 0 and graph.output_bytes[graph.index[split.name]] == 0
        for pick in split.users:
            assert graph.output_bytes[graph.index[pick.name]] == 0
            for reader in pick.users:
                r = graph.index[reader.name]
                held = [e for e in range(graph.num_edges) if graph.src[e] == base and graph.dst[e] == r]
                assert held and graph.edge_bytes[held[0]] == 0


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_no_ordering_edge_is_implied_by_a_path(optimizer):
    """An in-place write's ordering edges are added only where no path of the graph orders the two nodes
    already: each makes its target a consumer, which holds its source's output (a convolution's activation)
    until the target (the weight's update) ends."""
    import networkx as nx

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm, self.fc = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4 * 6 * 6, 5)

        def forward(self, x, y):
            return nn.functional.cross_entropy(self.fc(self.norm(self.conv(x)).relu().flatten(1)), y)

    step = capture(Net(), (torch.randn(2, 3, 8, 8), torch.tensor([1, 3])), optimizer=optimizer)
    g, fx_node = step.graph, {n.name: n for n in step.gm.graph.nodes}

    def storages(node):
        val = node.meta.get("val")
        return {
            StorageWeakRef(t.untyped_storage())
            for t in (val if isinstance(val, (tuple, list)) else [val])
            if isinstance(t, torch.Tensor)
        }

    def keeps_a_view_base(u, v):
        """Whether edge (u, v) holds the storage of a view that v reads (not an ordering)."""
        return any(storages(fx_node[g.ids[u]]) & storages(a) for a in fx_node[g.ids[v]].all_input_nodes)

    zero = {
        e for e in range(g.num_edges) if g.edge_bytes[e] == 0 and not keeps_a_view_base(int(g.src[e]), int(g.dst[e]))
    }
    others = nx.DiGraph([(int(g.src[e]), int(g.dst[e])) for e in range(g.num_edges)])
    implied = []
    for e in zero:
        u, v = int(g.src[e]), int(g.dst[e])
        others.remove_edge(u, v)
        if nx.has_path(others, u, v):
            implied.append((g.ids[u], g.ids[v]))
        others.add_edge(u, v)
    assert zero and not implied


# ------------------------------------------------------ optimizer settings
SETTINGS = {
    "sgd-momentum-wd": ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-4)),
    "sgd-nesterov": ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    "sgd-maximize-wd": ("sgd", torch.optim.SGD, dict(lr=0.01, momentum=0.5, weight_decay=1e-2, maximize=True)),
    "adam-betas-wd": ("adam", torch.optim.Adam, dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.01)),
    "adam-decoupled": ("adam", torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)),
    "adamw-eps-maximize": ("adamw", torch.optim.AdamW, dict(lr=1e-2, eps=1e-6, maximize=True, weight_decay=0)),
}


@pytest.mark.parametrize("case", sorted(SETTINGS))
def test_captured_steps_with_optimizer_settings_equal_eager_training_bit_for_bit(case):
    name, torch_class, given = SETTINGS[case]
    model, inputs = _cnn()
    reference = copy.deepcopy(model)
    settings = {k: v for k, v in given.items() if k != "lr"}
    step = capture(model, inputs, optimizer=name, lr=given["lr"], settings=settings)
    opt = torch_class(model.parameters(), **given)
    eager_opt = torch_class(reference.parameters(), foreach=False, **given)
    for _ in range(3):
        step.run(model, inputs, opt)
    _eager_steps(reference, inputs, eager_opt, 3)
    for (key, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), key
    for p, q in zip(model.parameters(), reference.parameters()):
        assert opt.state[p].keys() == eager_opt.state[q].keys()
        for key, value in eager_opt.state[q].items():
            assert torch.equal(opt.state[p][key], value), key
    # Eager training goes on from the state (the momentum buffers) the captured steps left.
    _eager_steps(model, inputs, opt, 1)
    _eager_steps(reference, inputs, eager_opt, 1)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)


def test_copied_updates_with_momentum_give_the_graph_of_a_trace_of_every_update(monkeypatch):
    steps = []
    for per_parameter in (True, False):
        monkeypatch.setattr(trace, "_trace_step", partial(_TRACE_STEP, per_parameter=per_parameter))
        steps.append(capture(*_cnn(), optimizer="sgd", settings=dict(momentum=0.9, nesterov=True, weight_decay=1e-4)))
    copied, traced = steps
    assert _fx_signature(copied.gm) == _fx_signature(traced.gm)
    assert copied.graph.to_dict() == traced.graph.to_dict()


@pytest.mark.parametrize(
    "optimizer, settings",
    [("sgd", {}), ("sgd", dict(momentum=0.9, nesterov=True)), ("adam", {}), ("adamw", dict(weight_decay=0.05))],
)
def test_the_learning_rate_is_an_input_of_the_step_not_a_constant(optimizer, settings):
    # A scheduler changes lr between steps: the update reads it from the step's lr input, once per step.
    model, inputs = _cnn()
    step = capture(model, inputs, optimizer=optimizer, lr=0.0123, settings=settings)
    gone = {0.0123, -0.0123, 1 - 0.0123 * 0.05}
    constants = [
        (n.name, a)
        for n in step.gm.graph.nodes
        for a in torch.utils._pytree.tree_leaves((n.args, n.kwargs))
        if isinstance(a, float) and a in gone
    ]
    assert not constants
    placeholders = [n for n in step.gm.graph.nodes if n.op == "placeholder"]
    lr = placeholders[step.layout.lr_offset]
    assert lr.name == "lr" and lr.meta["val"].dtype == torch.float64 and lr.meta["val"].shape == ()
    assert [u.target for u in lr.users] == [torch.ops.aten._local_scalar_dense.default]
    other = capture(model, inputs, optimizer=optimizer, lr=0.5, settings=settings)
    assert step.graph.to_dict() == other.graph.to_dict()  # one graph, one plan, for every lr


def test_momentum_buffers_are_optimizer_state_the_graph_counts():
    model, inputs = _cnn()
    plain = capture(model, inputs, optimizer="sgd").graph
    step = capture(model, inputs, optimizer="sgd", settings=dict(momentum=0.9))
    graph = step.graph
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    assert step.layout.state_names == ("momentum_buffer",)
    assert graph.param_bytes.sum() == plain.param_bytes.sum() + trainable
    for name, p in model.named_parameters():
        i = graph.index[f"s_momentum_buffer_{name.replace('.', '_')}"]
        assert graph.op[i] == "placeholder" and graph.param_bytes[i] == p.numel() * p.element_size()
        assert graph.layer[i] == name.rpartition(".")[0]
    # Weight decay and Nesterov add operations, not state; betas and lr are constants of the same graph.
    decayed = capture(model, inputs, optimizer="sgd", settings=dict(weight_decay=1e-4)).graph
    assert decayed.param_bytes.sum() == plain.param_bytes.sum() and decayed.num_nodes > plain.num_nodes
    adam = capture(model, inputs, optimizer="adam").graph
    assert (
        capture(model, inputs, optimizer="adam", lr=0.5, settings=dict(betas=(0.5, 0.9))).graph.digest()
        == adam.digest()
    )


@pytest.mark.parametrize(
    "name, settings, message",
    [
        ("sgd", dict(momentum=-0.1), "momentum must be a finite number >= 0, got -0.1"),
        ("sgd", dict(momentum="0.9"), "momentum must be a finite number"),
        ("sgd", dict(weight_decay=float("nan")), "weight_decay must be a finite number"),
        ("sgd", dict(nesterov=1), "nesterov must be True or False, got 1"),
        ("sgd", dict(nesterov=True), "nesterov=True needs momentum > 0"),
        ("sgd", dict(momentum=0.9, dampening=0.1), "dampening=0.1 with momentum is not supported"),
        ("sgd", dict(betas=(0.9, 0.99)), "optimizer 'sgd' has no setting 'betas'.*momentum"),
        ("sgd", dict(amsgrad=True), "optimizer 'sgd' has no setting 'amsgrad'"),
        ("adam", dict(momentum=0.9), "optimizer 'adam' has no setting 'momentum'.*betas"),
        ("adam", dict(betas=(0.9, 1.0)), r"betas\[1\] must be a finite number in \[0, 1\), got 1.0"),
        ("adam", dict(betas=0.9), "betas must be a pair of numbers"),
        ("adam", dict(eps=-1e-8), "eps must be a finite number >= 0"),
        ("adam", dict(amsgrad=True), "amsgrad=True is not supported by capture"),
        ("adam", dict(fused=True), "fused=True is not supported by capture"),
        ("adamw", dict(decoupled_weight_decay=False), "optimizer 'adamw' has no setting 'decoupled_weight_decay'"),
    ],
)
def test_optimizer_settings_are_checked_at_the_door_naming_the_setting(name, settings, message):
    from placer.capture import optimizer_spec

    with pytest.raises(OptionError, match=message):
        optimizer_spec(name, 0.1, **settings)
    with pytest.raises(OptionError, match=message):
        capture(*_mlp(), optimizer=name, settings=settings)


def test_an_optimizer_object_is_refused_saying_capture_takes_a_name():
    # Its repr (several lines) was shown as the "name" not supported.
    model, inputs = _mlp()
    with pytest.raises(
        OptionError,
        match=r"^optimizer must be a name, one of sgd, adam, adamw \(its settings in "
        r"settings=...\), not a torch.optim.adam.Adam object$",
    ):
        capture(model, inputs, optimizer=torch.optim.Adam(model.parameters(), amsgrad=True))


def test_a_step_is_named_with_its_optimizer_settings_other_than_the_defaults():
    # Two steps whose settings add operations (a momentum buffer) must not share a name: a profile is
    # matched to its graph by name.
    from placer.capture import capture_spec
    from placer.capture.optim import optimizer_spec

    assert optimizer_spec("sgd", 0.1).label == "sgd"
    assert optimizer_spec("sgd", 0.1, momentum=0.9, nesterov=True).label == "sgd-momentum0.9-nesterov"
    assert optimizer_spec("adam", betas=(0.8, 0.99), eps=1e-8).label == "adam-betas0.8_0.99"
    plain = capture_spec("zoo:lenet", 2, optimizer="sgd", fake=True)
    with_momentum = capture_spec("zoo:lenet", 2, optimizer="sgd", settings={"momentum": 0.9}, fake=True)
    assert (plain.graph.name, with_momentum.graph.name) == ("lenet-bs2-sgd", "lenet-bs2-sgd-momentum0.9")
    assert with_momentum.graph.num_nodes > plain.graph.num_nodes

    class Regression(nn.Linear):
        def forward(self, x):
            return super().forward(x).square().mean()

    assert (
        capture(Regression(3, 1), torch.randn(2, 3), optimizer="adamw", settings={"weight_decay": 0.1}).graph.name
        == "Regression-bs2-adamw-weight_decay0.1"
    )
