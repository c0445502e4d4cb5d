"""A native run's fitted step (`fit.step_times.StepTimes`, fitted by `fit_step_times`): the
target's forward over each decoding row's 1 + K positions, the drafter's K proposals, and a
batch's prefill, each a forward-time model fitted on the run (a roofline over its forwards, or the
kernel tables corrected by them)."""

from __future__ import annotations

from specbench.step_model.shape import StepShape


class NativeFitStep:
    """Seconds of the native engine's step for `draft` (None: the target alone) on a run's fit. A
    step decodes (every row at the shape's mean context, K drafts each where k > 0; a verify of
    K + 1 positions without a draft where `draft` is None) or prefills a static batch's fresh
    prompts, the target's and the draft's, never both."""

    reads_context = True

    def __init__(self, times, draft: str | None = None) -> None:
        self.times, self.draft = times, draft

    def proposing_s(self, shape: StepShape) -> float:
        """The drafter's part of a decoding step: its K proposals (none without a draft or K)."""
        if not (self.draft and shape.k and shape.decode_rows):
            return 0.0
        rows = shape.decode_rows
        return float(self.times.draft_s(self.draft, shape.k, rows, shape.decode_context / rows))

    def seconds(self, shape: StepShape) -> float:
        times, rows = self.times, shape.decode_rows
        if rows == 0:
            lengths = [tokens for tokens, _ in shape.prefill_chunks]
            if any(before for _, before in shape.prefill_chunks):
                raise ValueError("a native run's prefill is of fresh prompts")
            draft = times.draft_prefill_s(self.draft, lengths) if self.draft else 0.0
            return times.prefill_s(lengths) + draft
        if shape.prefill_tokens:
            raise ValueError("a native run's step decodes or prefills, not both")
        verify = float(times.target_s(rows, shape.k + 1, shape.decode_context / rows))
        return verify + self.proposing_s(shape)

    @staticmethod
    def decoding(rows: int, context: float, k: int = 0) -> StepShape:
        """`rows` rows decoding at `context` tokens each (K drafts each where k > 0)."""
        return StepShape(decode_rows=rows, k=k, decode_context=float(rows * context))

    @staticmethod
    def prefilling(lengths) -> StepShape:
        """A static batch's fresh prompts of these lengths."""
        lengths = [int(length) for length in lengths]
        return StepShape(prefill_tokens=sum(lengths), prefill_chunks=tuple((length, 0) for length in lengths))
