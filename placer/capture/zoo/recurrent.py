"""Recurrent models of the placement papers: GNMT (LSTM encoder-decoder with attention) and RNNLM.

LSTMs are ``nn.LSTMCell`` layers unrolled over time (:class:`~.blocks.StackedLSTM`), so a
captured step holds every time step's ops, like the unrolled TensorFlow graphs the papers
place (Placeto appendix A.1: NMT unrolled to 32 steps).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import LSTMLayer, StackedLSTM, token_batch
from .registry import require, zoo_model

__all__ = ["GNMT", "RNNLM", "gnmt", "rnnlm"]


class BidirectionalLSTM(nn.Module):
    """GNMT's bottom encoder layer: a forward and a backward LSTM, outputs concatenated."""

    def __init__(self, input_size: int, hidden: int):
        super().__init__()
        self.forward_lstm = StackedLSTM(input_size, hidden, 1)
        self.backward_lstm = StackedLSTM(input_size, hidden, 1)

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        backward = self.backward_lstm(sequence.flip(1)).flip(1)
        return torch.cat([self.forward_lstm(sequence), backward], dim=-1)


class AdditiveAttention(nn.Module):
    """Bahdanau attention: ``score(q, k) = v . tanh(W_q q + W_k k)`` over the encoder outputs."""

    def __init__(self, query_size: int, key_size: int, hidden: int):
        super().__init__()
        self.query = nn.Linear(query_size, hidden, bias=False)
        self.key = nn.Linear(key_size, hidden, bias=False)
        self.score = nn.Linear(hidden, 1, bias=False)

    def forward(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """query (N, Q), projected keys (N, S, H), values (N, S, V) -> context (N, V)."""
        weights = self.score(torch.tanh(keys + self.query(query).unsqueeze(1))).squeeze(-1).softmax(dim=-1)
        return torch.bmm(weights.unsqueeze(1), values).squeeze(1)


class GNMT(nn.Module):
    """GNMT (Wu et al., 2016), section 3: LSTM encoder-decoder with attention and residual layers.

    Encoder: a bidirectional bottom layer, then ``layers - 1`` LSTM layers, residual from the
    third. Decoder: the bottom layer reads the embedding and the previous attention context;
    its output queries the attention; the context goes to every upper layer (residual from
    the third) and the top output to the softmax.
    """

    def __init__(self, layers: int, hidden: int, vocab: int, dropout: float):
        super().__init__()
        self.source_embedding = nn.Embedding(vocab, hidden)
        self.target_embedding = nn.Embedding(vocab, hidden)
        self.encoder_bidirectional = BidirectionalLSTM(hidden, hidden)
        self.encoder = StackedLSTM(2 * hidden, hidden, layers - 1, dropout, residual_from=1)
        self.attention = AdditiveAttention(hidden, hidden, hidden)
        self.decoder_bottom = LSTMLayer(2 * hidden, hidden)
        self.decoder = StackedLSTM(hidden, hidden, layers - 1, dropout, residual_from=1, extra_inputs=hidden)
        self.classifier = nn.Linear(hidden, vocab)

    def forward(self, source: torch.Tensor, target: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        memory = self.encoder(self.encoder_bidirectional(self.source_embedding(source)))
        keys = self.attention.key(memory)
        embedded = self.target_embedding(target)
        h = c = context = embedded.new_zeros(embedded.shape[0], self.decoder.hidden)
        state = self.decoder.initial_state(embedded)
        outputs = []
        for t in range(embedded.shape[1]):
            query, (h, c) = self.decoder_bottom(embedded[:, t], (h, c), extra=context)
            context = self.attention(query, keys, memory)
            top, state = self.decoder.step(query, state, extra=context)
            outputs.append(top)
        logits = self.classifier(torch.stack(outputs, dim=1))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


@zoo_model(
    "gnmt",
    paper_batch=128,
    tiny={"layers": 2, "hidden": 16, "vocab": 50, "seq_len": 4},
    reference="FastT Table 1 (GNMT 4 layers, batch 128); Pesto section 5 and Placeto appendix A.1 "
    "(1024 units, batch 128, unrolled 32 steps); Wu et al. (2016), 32k wordpieces",
    description="GNMT: 4-layer LSTM encoder (bidirectional bottom) and decoder, 1024 units, attention, 32 steps",
)
def gnmt(
    batch_size: int, layers: int = 4, hidden: int = 1024, vocab: int = 32000, seq_len: int = 32, dropout: float = 0.2
):
    """GNMT on source and target sentences of ``seq_len`` tokens."""
    require("gnmt", layers >= 2, f"layers must be at least 2 (a bidirectional layer and one more), got {layers}")
    inputs = tuple(token_batch(batch_size, seq_len, vocab) for _ in range(3))
    return GNMT(layers, hidden, vocab, dropout), inputs


class RNNLM(nn.Module):
    """LSTM language model (Zaremba et al., 2014; Jozefowicz et al., 2016): embed, LSTM layers, softmax."""

    def __init__(self, layers: int, hidden: int, vocab: int, dropout: float):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.dropout = nn.Dropout(dropout)
        self.lstm = StackedLSTM(hidden, hidden, layers, dropout)
        self.classifier = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(self.lstm(self.dropout(self.embedding(tokens))))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


@zoo_model(
    "rnnlm",
    paper_batch=128,
    tiny={"layers": 2, "hidden": 16, "vocab": 50, "seq_len": 4},
    reference="Pesto section 5 (2 layers x 2048 units, batch 128); Zaremba et al. (2014) "
    "(10k vocabulary, 35 unrolled steps)",
    description="RNNLM: 2-layer LSTM language model, 2048 units, 10k vocabulary, 35 steps",
)
def rnnlm(
    batch_size: int, layers: int = 2, hidden: int = 2048, vocab: int = 10000, seq_len: int = 35, dropout: float = 0.5
):
    """LSTM language model over ``seq_len`` tokens with next-token labels."""
    return RNNLM(layers, hidden, vocab, dropout), (
        token_batch(batch_size, seq_len, vocab),
        token_batch(batch_size, seq_len, vocab),
    )
