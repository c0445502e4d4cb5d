"""The accepted drafts of each decoding row at each speculative step of the replica, drawn from the
measured acceptance by position (`AcceptanceDraws`)."""

from __future__ import annotations

import operator

import numpy as np


class AcceptanceDraws:
    """Each decoding row's tokens at each speculative step, drawn: one uniform u per row and step,
    the drafts at positions i with u < P(the first i + 1 drafts accepted) accepted. Accepted drafts
    are a prefix (rejection sampling stops at the first rejection), so one draw per row-step gives
    every position its measured share and the counts between them theirs (P(exactly j accepted) =
    P(j) - P(j + 1)). Uniforms come in blocks from one generator, turned into tokens a block and a K
    at a time: a stretch of few rows and steps adds them up in plain Python (numpy's calls cost more
    than the sums there), a large one with numpy; the same tokens either way."""

    BLOCK = 4096  # uniforms drawn at a time
    PYTHON_MOST = 512  # row-steps a stretch adds up in plain Python

    def __init__(self, acceptance, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        chance = np.minimum.accumulate(np.asarray(acceptance, float)) if len(acceptance) else np.zeros(0)
        self.ascending = [chance[:k][::-1].copy() for k in range(len(chance) + 1)]  # by K, the last position first
        self.block = np.zeros(0)
        self.tokens: dict[int, np.ndarray] = {}  # by K: the block's uniforms as tokens a row-step emits
        self.listed: dict[int, list[int]] = {}  # the same as lists
        self.at = 0

    def _take(self, count: int, k: int) -> tuple[np.ndarray, list[int], int]:
        """The block's tokens at K = `k` (an array and a list), and where the next `count` start."""
        if self.at + count > len(self.block):
            self.block = np.concatenate([self.block[self.at:], self.rng.random(max(self.BLOCK, count))])
            self.tokens, self.listed, self.at = {}, {}, 0
        if k not in self.tokens:  # 1 + the positions whose chance exceeds u
            self.tokens[k] = 1 + k - np.searchsorted(self.ascending[k], self.block, side="right")
            self.listed[k] = self.tokens[k].tolist()
        start, self.at = self.at, self.at + count
        return self.tokens[k], self.listed[k], start

    def stretch(self, k: int, left: list[int], steps: int) -> tuple[int, list[int], list[int]]:
        """Rows that each need `left` more tokens, at K = `k`, for at most `steps` steps: (the steps run,
        up to and with the first at which a row has all its tokens; each row's tokens over them, not
        capped at its `left`; each row's tokens in the first step). Every call takes steps × rows
        uniforms, however many steps run."""
        rows = len(left)
        tokens, listed, start = self._take(steps * rows, k)
        if steps * rows > self.PYTHON_MOST:
            drawn = tokens[start:start + steps * rows].reshape(steps, rows)
            running = drawn.cumsum(axis=0)
            reached = (running >= np.asarray(left)).any(axis=1)
            ran = int(reached.argmax()) + 1 if reached.any() else steps
            return ran, running[ran - 1].tolist(), drawn[0].tolist()
        first = totals = listed[start:start + rows]
        for step in range(1, steps + 1):
            if any(map(operator.ge, totals, left)):
                return step, totals, first
            if step < steps:
                at = start + step * rows
                totals = list(map(operator.add, totals, listed[at:at + rows]))
        return steps, totals, first
