"""A step's shape: what the engine computes in one step, as every step model reads it."""

from __future__ import annotations

from typing import NamedTuple


class StepShape(NamedTuple):
    """One engine step. A tuple, not a dataclass: the replica builds one per step it simulates.

    The drafter is not part of the shape: a step model prices one configuration (a target, its
    drafter and their parallelism), as a replica runs one."""

    prefill_tokens: int = 0  # prompt tokens the step computes, every chunk's
    decode_rows: int = 0  # rows decoding (each drafting `k` tokens and verifying k + 1)
    k: int = 0
    # (tokens, tokens computed before it) for each prompt chunk, in the order the step schedules them;
    # a chunk after earlier tokens (its prompt's earlier chunk, or a prefix found cached) attends over them
    prefill_chunks: tuple[tuple[int, int], ...] = ()
    # the tokens the decoding rows attend over (their KV caches, summed); filled for a model that
    # `reads_context`, 0 otherwise
    decode_context: float = 0.0

    def prefill_pairs(self) -> float:
        """The (query, key) pairs the prompt chunks' attention computes: n × (o + n / 2) for a chunk
        of n tokens after o."""
        return sum(n * (o + n / 2) for n, o in self.prefill_chunks)

    def held_pairs(self, keys_limit: float) -> float:
        """The same with each query's keys capped at `keys_limit` (`capped_pairs`)."""
        return sum(capped_pairs(o, n, keys_limit) for n, o in self.prefill_chunks)


def capped_pairs(computed: float, tokens: float, limit: float) -> float:
    """A prefill chunk's (query, key) pairs (`tokens` queries after `computed` ones, each query's
    position its keys) with each query's keys capped at `limit`."""
    end = computed + tokens
    if end <= limit:
        return tokens * (computed + tokens / 2)
    if computed >= limit:
        return tokens * limit
    return (limit - computed) * (computed + limit) / 2 + (end - limit) * limit
