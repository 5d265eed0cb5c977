"""LEAF's stacked LSTM for Shakespeare's next-character prediction (``model='lstm'``), SuPerFed's
Table 3 model.

LEAF's ``models/shakespeare/stacked_lstm.py``: each character of a line (80 of them) becomes an
8-dimensional embedding, two LSTM layers of 256 units read the line, and one dense layer maps the
last step's output to the 80 characters of its vocabulary (:data:`VOCABULARY`). The model takes
the characters' indices (any integer type: the pool keeps them as bytes, 4.2 million lines of
Shakespeare in 340 MB) and returns logits.

Like every model of the project it is a ``body`` and a ``head`` (the dense layer). The two LSTM
layers are two modules, so its layers (:func:`pflower.models.layers`), pFedLA's and SuPerFed's
unit, are four: the embedding, each LSTM layer (its input and recurrent weights and biases) and
the head. The body has no fully connected layer, so a ``classifier`` head is the same Linear.
There is no normalization layer: FedBN keeps nothing local.
"""

from __future__ import annotations

import torch
from torch import nn

#: LEAF's characters (``models/utils/language_utils.py``, ``ALL_LETTERS``): a character's index
#: here is its input and its class.
VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


class CharEmbedding(nn.Embedding):
    """An embedding that takes indices of any integer type (the pool's bytes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.long())


class Recurrent(nn.LSTM):
    """One batch-first LSTM layer as a step of a ``Sequential``: its output at every step (the
    final states, which nothing reads, are dropped)."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__(input_size, hidden_size, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x)[0]


class LastStep(nn.Module):
    """The output of a sequence's last step, [batch, steps, features] -> [batch, features]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, -1]


class CharLSTM(nn.Module):
    """Embedding (``embedding`` dimensions), two LSTM layers (``hidden`` units), the last step's
    output, a Linear to the classes. LEAF's: 8, 256, 80 characters; ``hidden`` is smaller only in
    tests, whose layers are the same."""

    def __init__(self, num_classes: int, vocabulary: int = len(VOCABULARY), embedding: int = 8, hidden: int = 256):
        super().__init__()
        self.body = nn.Sequential(CharEmbedding(vocabulary, embedding), Recurrent(embedding, hidden), Recurrent(hidden, hidden), LastStep())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))
