"""The training tasks: batches of (inputs, targets) token tensors [B, T], targets -100 where
nothing is scored.

- MQAR, multi-query associative recall as in Zoology (Arora et al., 2023): ``pairs`` key-value
  pairs, then the keys again, each at a random position of the rest of the sequence among blank
  tokens; the model must answer each query with its key's value. Keys and values come from two
  disjoint halves of the vocabulary; token 0 is the blank. Scored on the queried positions.
- charlm: next-character prediction on a text, the first 90% for training and the last 10% held
  out; scored everywhere. By default the text is a toy English written by the probabilistic grammar
  of corpus.py, whose information content gives the floor of the held-out bits per character;
  any text file may be given instead.

Batches come from a numpy Generator, so a seed fixes them.
"""

import gzip
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import torch

from . import corpus

IGNORE = -100
GENERATED_CHARACTERS = 400_000  # about the size of a short book


class MQAR:
    """Sequences of seq_len tokens over a vocabulary of vocab_size: token 0 blank, keys in
    [1, 1 + K), values in [1 + K, 1 + 2K) with K = (vocab_size - 1) // 2."""

    def __init__(self, seq_len: int, pairs: int, vocab_size: int):
        if pairs < 1:
            raise ValueError(f"flat.train: --pairs: expected at least 1, got {pairs}")
        if 3 * pairs > seq_len:
            raise ValueError(f"flat.train: --pairs {pairs} needs a sequence of at least 3 * pairs = {3 * pairs} "
                             f"tokens (the pairs, then every key queried once), got --seq-len {seq_len}")
        self.keys = (vocab_size - 1) // 2
        if self.keys < pairs:
            raise ValueError(f"flat.train: a vocabulary of {vocab_size} has {self.keys} keys, fewer than --pairs "
                             f"{pairs}")
        self.seq_len, self.pairs, self.vocab_size = seq_len, pairs, vocab_size

    def batch(self, rng: np.random.Generator, batch_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
        B, T, P = batch_size, self.seq_len, self.pairs
        # Distinct keys per sequence (a random permutation's first P), values with repeats.
        keys = np.argsort(rng.random((B, self.keys)), axis=1)[:, :P] + 1
        values = rng.integers(0, self.keys, (B, P)) + 1 + self.keys
        tokens = np.zeros((B, T + 1), np.int64)
        tokens[:, 0:2 * P:2], tokens[:, 1:2 * P:2] = keys, values
        # Each key queried once, at P distinct positions of [2P, T), in a random order.
        slots = np.argsort(rng.random((B, T - 2 * P)), axis=1)[:, :P] + 2 * P
        order = np.argsort(rng.random((B, P)), axis=1)
        rows = np.arange(B)[:, None]
        tokens[rows, slots] = keys[rows, order]
        targets = np.full((B, T), IGNORE, np.int64)
        targets[rows, slots] = values[rows, order]
        return torch.from_numpy(tokens[:, :T]), torch.from_numpy(targets)


class CharLM:
    """Windows of seq_len + 1 characters of a text, as byte values: the generated toy English, or
    the file `text` (read as bytes; .gz and dictd's .dz decompressed). The vocabulary is 128 for
    ASCII text, else 256. `floor_bpc` is the generated text's information per held-out character
    (None for a file)."""

    def __init__(self, seq_len: int, text: Optional[str] = None):
        if text is None:
            generated, bits = corpus.generate(GENERATED_CHARACTERS)
            raw = generated.encode("ascii")
        else:
            path = Path(text)
            if not path.is_file():
                raise ValueError(f"flat.train: --text: expected a text file, got {text!r} (no such file)")
            raw = path.read_bytes()
            if path.suffix in (".gz", ".dz"):
                raw = gzip.decompress(raw)
        data = np.frombuffer(raw, np.uint8).astype(np.int64)
        split = int(len(data) * 0.9)
        self.train, self.held_out = data[:split], data[split:]
        if seq_len + 1 > len(self.held_out):
            raise ValueError(f"flat.train: --seq-len {seq_len} is longer than the held-out text "
                             f"({len(self.held_out) - 1} characters)")
        self.seq_len = seq_len
        self.vocab_size = 128 if int(data.max()) < 128 else 256
        # The generated text's information in the tokens that start in the held-out part.
        self.floor_bpc = sum(b for o, b in bits if o >= split) / len(self.held_out) if text is None else None

    def batch(self, rng: np.random.Generator, batch_size: int, held_out: bool = False):
        data = self.held_out if held_out else self.train
        starts = rng.integers(0, len(data) - self.seq_len - 1, batch_size)
        windows = np.stack([data[s:s + self.seq_len + 1] for s in starts])
        return torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy())
