"""distill_trainer's synthetic data (trainer/src/data.cpp, data_internal.h) in numpy.

Every micro-batch is a pure function of (data.seed, split, index). The generator is splitmix64,
whose state only ever advances by a constant: the n-th draw of a batch is finalize(s0 + n*G),
so every sequence length and every uniform draw is known without running the generator. Only
the successor of each token hashes the tokens before it, a loop over positions that numpy runs
for all B sequences at once. `exact_batch` gives the trainer's tokens (for the parity steps);
`shaped_batch` gives its lengths with random tokens (for timing: the same token counts, no
generation cost).
"""
from __future__ import annotations

import numpy as np
import torch

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def _finalize(z):  # splitmix64's output function; numpy uint64 arrays wrap like C++ uint64_t
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _mix(a, b):  # internal::Mix: splitmix64 of a ^ (b * 0xD6E8FEB86659FD93)
    return _finalize((a ^ (b * np.uint64(0xD6E8FEB86659FD93))) + np.uint64(GOLDEN))


def _mix_int(a: int, b: int) -> int:
    return int(_mix(np.array([a], np.uint64), np.array([b], np.uint64))[0])


def stream_state(seed: int, split: int, index: int) -> int:
    return _mix_int(_mix_int(seed & M64, 0x5EED0000 + split), index & M64)


def _draws(s0: int, counters: np.ndarray) -> np.ndarray:  # the draws numbered `counters` (1-based)
    states = (np.uint64(s0) + counters.astype(np.uint64) * np.uint64(GOLDEN))
    return _finalize(states)


class SyntheticData:
    """data.source synthetic of a resolved config; vocab = the trainer's (distill.vocab_size
    when > 0, else student.vocab_size)."""

    def __init__(self, config: dict):
        d = config["data"]
        if d["source"] != "synthetic":
            raise ValueError(f"the port generates data.source synthetic only, got {d['source']!r}: "
                             "pass data.source=synthetic")
        self.B, self.T, self.min_len, self.seed = d["batch_size"], d["seq_len"], d["min_seq_len"], d["seed"]
        self.order, self.branching = d["synthetic"]["order"], d["synthetic"]["branching"]
        v = config["distill"]["vocab_size"]
        self.V = v if v > 0 else config["student"]["vocab_size"]
        self.ignore_index = config["distill"]["ignore_index"]
        w = [float(r) ** -d["synthetic"]["zipf"] for r in range(1, self.branching + 1)]
        total = 0.0
        for x in w:
            total += x
        acc, self.cumulative = 0.0, []
        for x in w:
            acc += x / total
            self.cumulative.append(acc)
        self.cumulative[-1] = 1.0
        self.cumulative = np.array(self.cumulative)
        self.context_hash = _mix_int(self.seed & M64, 0xC0FFEE)

    def _lengths(self, s0: int) -> tuple[np.ndarray, np.ndarray]:
        """Each sequence's length and the counter of its length draw (it then draws len + 1 tokens)."""
        span = self.T - self.min_len + 1
        lengths, starts, c = [], [], 0
        for _ in range(self.B):
            c += 1
            starts.append(c)
            n = self.min_len + int(_draws(s0, np.array([c]))[0]) % span
            lengths.append(n)
            c += n + 1
        return np.array(lengths), np.array(starts)

    def _batch(self, lengths: np.ndarray, tokens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, int]:
        inputs = np.zeros((self.B, self.T), np.int64)
        targets = np.full((self.B, self.T), self.ignore_index, np.int64)
        for b, n in enumerate(lengths):
            inputs[b, :n] = tokens[b, :n]
            targets[b, :n] = tokens[b, 1:n + 1]
        return torch.from_numpy(inputs), torch.from_numpy(targets), int(lengths.sum())

    def exact_batch(self, index: int, split: int = 0):
        """The trainer's micro-batch `index`: (inputs, targets) (B, T) int64 CPU, target count."""
        s0 = stream_state(self.seed, split, index)
        lengths, starts = self._lengths(s0)
        n = self.T + 1
        raw = _draws(s0, starts[:, None] + 1 + np.arange(n)[None, :])  # (B, T+1)
        tokens = np.zeros((self.B, n), np.uint64)
        uniform = (raw >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        ranks = np.minimum(np.searchsorted(self.cumulative, uniform, side="right"), self.branching - 1)
        for t in range(n):
            if t < self.order:
                tokens[:, t] = raw[:, t] % np.uint64(self.V)
            else:
                tokens[:, t] = self._successors(tokens[:, t - self.order:t], ranks[:, t])
        return self._batch(lengths, tokens.astype(np.int64))

    def _successors(self, context: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """SyntheticLanguage::Successor for B contexts: the rank-th distinct candidate of the
        hash sequence Mix(h, attempt) % V, attempt = 0, 1, ..."""
        h = np.full(context.shape[0], self.context_hash, np.uint64)
        for i in range(self.order):
            h = _mix(h, context[:, i])
        attempts = np.arange(self.branching + 8, dtype=np.uint64)
        cand = _mix(h[:, None], attempts[None, :]) % np.uint64(self.V)  # (B, A)
        seen_before = np.tril(cand[:, :, None] == cand[:, None, :], k=-1).any(axis=2)
        distinct = ~seen_before
        count = np.cumsum(distinct, axis=1)
        hit = distinct & (count == (rank[:, None] + 1))
        out = np.empty(context.shape[0], np.uint64)
        for b in range(context.shape[0]):
            where = np.flatnonzero(hit[b])
            out[b] = cand[b, where[0]] if len(where) else self._successor_slow(int(h[b]), int(rank[b]))
        return out

    def _successor_slow(self, h: int, rank: int) -> int:
        chosen, attempt = [], 0
        while len(chosen) < rank + 1:
            c = _mix_int(h, attempt) % self.V
            if c not in chosen:
                chosen.append(c)
            attempt += 1
        return chosen[rank]

    def shaped_batch(self, index: int, generator: torch.Generator, split: int = 0):
        """The trainer's lengths of micro-batch `index` (so the same target count) with random
        tokens: what timing needs, at no generation cost."""
        lengths, _ = self._lengths(stream_state(self.seed, split, index))
        tokens = torch.randint(0, self.V, (self.B, self.T + 1), generator=generator).numpy()
        return self._batch(lengths, tokens)
