"""placer.capture: captured training steps equal eager PyTorch, graphs are faithful."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from placer.capture import OPTIMIZERS, capture
from placer.errors import FormatError, OptionError
from placer.graph import OpGraph


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
        self.block = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=16, dropout=0.0,
                                                batch_first=True, norm_first=True)
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


MODELS = {"mlp": _mlp, "cnn_bn": _cnn, "tied_lm": _lm}


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
    opt = step.optimizer.eager(model.parameters())   # its state is filled by the captured step
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
