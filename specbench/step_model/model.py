"""The contract every step's price goes through."""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from specbench.step_model.shape import StepShape


@runtime_checkable
class StepModel(Protocol):
    """Seconds of one engine step of a shape, for one configuration (target, drafter, parallelism).

    `reads_context`: whether `seconds` reads the shape's `decode_context` (the replica fills it
    only then, and prices a stretch of decode-only steps at its middle context)."""

    reads_context: bool

    def seconds(self, shape: StepShape) -> float: ...


class StepFunction:
    """A function of (prefill tokens, decode rows[, K]) as a step model: a test's or a what-if's
    price. K is passed only when the step speculates, so a function of two arguments prices
    steps without it."""

    reads_context = False

    def __init__(self, function: Callable[..., float]) -> None:
        self.function = function

    def seconds(self, shape: StepShape) -> float:
        if shape.k:
            return self.function(shape.prefill_tokens, shape.decode_rows, shape.k)
        return self.function(shape.prefill_tokens, shape.decode_rows)


def as_step_model(cost: StepModel | Callable[..., float]) -> StepModel:
    """`cost` itself where it is a step model, else the plain function as one (`StepFunction`)."""
    return cost if isinstance(cost, StepModel) else StepFunction(cost)
