"""Proposers: what drafts the K tokens the target then verifies.

All drafters read the committed sequences from a `SequenceBatch` and return a `Proposal`. A drafter
that keeps state (a KV cache) is told how many drafts each row kept (`commit`) and which rows
remain (`select_rows`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from specbench.native.forward import CausalLM
from specbench.native.kvcache import RaggedKVCache, to_device
from specbench.native.sampling import SamplingParams, logits_to_probs, sample_from_probs


class VocabMismatchError(ValueError):
    pass


class SequenceBatch:
    """Committed tokens (prompt + generated) of the active rows, on the device and on the host."""

    def __init__(self, prompts: list[list[int]], capacity: int, device: torch.device,
                 request_ids: list[int] | None = None) -> None:
        batch_size = len(prompts)
        self.host_tokens = np.zeros((batch_size, capacity), dtype=np.int64)
        for row, prompt in enumerate(prompts):
            self.host_tokens[row, : len(prompt)] = prompt
        self.tokens = torch.from_numpy(self.host_tokens.copy()).to(device)
        self.lengths: list[int] = [len(p) for p in prompts]
        self.request_ids: list[int] = list(request_ids) if request_ids is not None else list(range(batch_size))
        self.device = device

    @property
    def size(self) -> int:
        return len(self.lengths)

    def last_tokens(self) -> torch.Tensor:
        index = to_device([n - 1 for n in self.lengths], self.device)
        return self.tokens.gather(1, index[:, None]).squeeze(1)

    def append(self, candidates: torch.Tensor, host_new: list[list[int]]) -> None:
        """Row b gains host_new[b]; `candidates` [B, W] holds those tokens first in each row
        (columns past them are scratch and get overwritten later)."""
        width = candidates.shape[1]
        start = to_device(self.lengths, self.device)
        columns = (start[:, None] + torch.arange(width, device=self.device)).clamp_max(self.tokens.shape[1] - 1)
        self.tokens.scatter_(1, columns, candidates)
        for row, new in enumerate(host_new):
            n = self.lengths[row]
            self.host_tokens[row, n : n + len(new)] = new
            self.lengths[row] = n + len(new)

    def select_rows(self, rows: list[int]) -> None:
        self.host_tokens = self.host_tokens[rows]
        self.tokens = self.tokens.index_select(0, torch.tensor(rows, device=self.device, dtype=torch.long))
        self.lengths = [self.lengths[r] for r in rows]
        self.request_ids = [self.request_ids[r] for r in rows]


@dataclass
class Proposal:
    tokens: torch.Tensor  # [B, K] drafted ids; columns past a row's length are padding
    lengths: torch.Tensor  # [B] drafted tokens per row
    host_lengths: list[int]
    probs: torch.Tensor | None  # [B, K, V] warped draft distributions; None = one-hot (deterministic)


class Drafter(ABC):
    name: str = "drafter"

    def check_compatible(self, target: CausalLM) -> None:
        """Raise if this drafter cannot propose for `target`."""

    def prefill(self, batch: SequenceBatch, capacity: int) -> None:
        """Called once after the target's prefill, before the first proposal."""

    @abstractmethod
    def propose(
        self, batch: SequenceBatch, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal: ...

    def commit(self, accepted_counts: list[int]) -> None:
        """Row b kept its first accepted_counts[b] drafts."""

    def select_rows(self, rows: list[int]) -> None:
        """Only `rows` remain active."""

    def parameter_bytes(self) -> int:
        return 0


class ModelDrafter(Drafter):
    """A smaller causal LM with the target's vocabulary (or the target's own first layers)."""

    def __init__(self, model: CausalLM | torch.nn.Module, name: str | None = None) -> None:
        self.model = CausalLM.wrap(model)
        self.name = name or self.model.name
        self.cache: RaggedKVCache | None = None
        self._lengths_at_proposal: list[int] = []
        self._shares_weights_with: CausalLM | None = None

    def check_compatible(self, target: CausalLM) -> None:
        if self.model.vocab_size != target.vocab_size:
            raise VocabMismatchError(
                f"draft {self.name} has a vocabulary of {self.model.vocab_size} tokens but target "
                f"{target.name} has {target.vocab_size}: they must share token ids"
            )
        if self.model.device != target.device:
            raise ValueError(f"draft on {self.model.device} but target on {target.device}")

    def parameter_bytes(self) -> int:
        return 0 if self._shares_weights_with is not None else self.model.parameter_bytes()

    def prefill(self, batch: SequenceBatch, capacity: int) -> None:
        self.cache = self.model.decode_cache(batch.size, capacity)
        # Feed everything but the last committed token: that one is fed by the first proposal,
        # exactly as the target holds it pending for its verify pass.
        self.model.prefill(self.cache, batch.tokens, [n - 1 for n in batch.lengths])

    def propose(
        self, batch: SequenceBatch, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        cache = self.cache
        # Tokens committed since the draft last ran: 1, or 2 when the previous step kept every
        # draft (the last draft was sampled but never fed back). Right-padded to the longest.
        pending = [committed - cached for committed, cached in zip(batch.lengths, cache.lengths)]
        width = max(pending)
        start = to_device(cache.lengths, batch.device)
        columns = start[:, None] + torch.arange(width, device=batch.device)
        step_input = batch.tokens.gather(1, columns.clamp_max(batch.tokens.shape[1] - 1))
        num_valid = to_device(pending, batch.device)
        self._lengths_at_proposal = list(batch.lengths)

        drafted, drafted_probs = [], []
        for position in range(k):
            logits = self.model.step(cache, step_input, logits_at="last", num_valid=num_valid)
            cache.set_lengths([n + v for n, v in zip(cache.lengths, pending)])
            if params.greedy:
                token = logits.argmax(dim=-1)
            else:
                probs = logits_to_probs(logits, params)
                token = sample_from_probs(probs, generator)
                drafted_probs.append(probs)
            drafted.append(token)
            step_input = token[:, None]
            pending = [1] * batch.size
            num_valid = None
        tokens = torch.stack(drafted, dim=1)
        probs = torch.stack(drafted_probs, dim=1) if drafted_probs else None
        lengths = torch.full((batch.size,), k, device=batch.device, dtype=torch.long)
        return Proposal(tokens, lengths, [k] * batch.size, probs)

    def commit(self, accepted_counts: list[int]) -> None:
        # The cache holds each row's committed prefix plus drafts 1..K-1 (draft K is sampled,
        # never fed back); a row that kept `a` drafts keeps the prefix and min(a, K-1) of them.
        drafted_minus_one = [c - n for c, n in zip(self.cache.lengths, self._lengths_at_proposal)]
        self.cache.set_lengths(
            [n + min(a, k) for n, a, k in zip(self._lengths_at_proposal, accepted_counts, drafted_minus_one)]
        )

    def select_rows(self, rows: list[int]) -> None:
        self.cache.select_rows(rows)
        self._lengths_at_proposal = [self._lengths_at_proposal[r] for r in rows]


class SelfDrafter(ModelDrafter):
    """Early exit: the target's first N decoder layers, its final norm and head."""

    def __init__(self, target: CausalLM | torch.nn.Module, num_layers: int) -> None:
        target = CausalLM.wrap(target)
        super().__init__(target.truncated(num_layers), name=f"self:{num_layers}")
        self._shares_weights_with = target


class NGramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (n = max_ngram
    down to min_ngram) in the row's own sequence and propose what followed it (`earliest=True`:
    the first occurrence instead, as transformers' prompt_lookup_num_tokens does). Deterministic,
    so its q is one-hot and rejection sampling stays exact."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, earliest: bool = False) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes need 1 <= min <= max, got {min_ngram}..{max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.earliest = earliest
        self.name = f"ngram:{max_ngram}" + (" (earliest match)" if earliest else "")

    def _lookup(self, sequence: np.ndarray, k: int) -> np.ndarray:
        length = len(sequence)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            pattern = sequence[length - n :]
            # Windows starting at i < length - n, i.e. earlier than the suffix itself.
            windows = np.lib.stride_tricks.sliding_window_view(sequence[: length - 1], n)
            matches = np.flatnonzero((windows == pattern).all(axis=1))
            if len(matches):
                start = (matches[0] if self.earliest else matches[-1]) + n
                return sequence[start : start + k]
        return sequence[:0]

    def propose(
        self, batch: SequenceBatch, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        drafted = np.zeros((batch.size, k), dtype=np.int64)
        lengths = []
        for row in range(batch.size):
            continuation = self._lookup(batch.host_tokens[row, : batch.lengths[row]], k)
            drafted[row, : len(continuation)] = continuation
            lengths.append(len(continuation))
        return Proposal(to_device(drafted, batch.device), to_device(lengths, batch.device), lengths, None)
