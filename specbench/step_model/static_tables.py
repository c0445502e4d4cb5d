"""The kernel tables' static-batch step: `plan --target`'s, every row decoding at one context."""

from __future__ import annotations

from specbench.step_model.shape import StepShape


class StaticTablesStep:
    """Seconds of a static batch's step as the static planner (fit.table_plan.TablePlanner) prices
    it at `tp`, for `drafter` (None: the baseline) at `draft_tp`: a step of prompt chunks alone is
    the batch's prefill (the target's, then a draft model's), one of decoding rows a decode, or with
    K a speculative step (K draft forwards and the verify of K + 1 positions), each at its rows'
    mean context. The planner composes the kernels with the host, launch and executor overheads
    (`TablePlanner.overheads`)."""

    reads_context = True

    def __init__(self, planner, tp: int, drafter=None, draft_tp: int | None = None) -> None:
        self.planner, self.tp, self.drafter = planner, tp, drafter
        self.draft_tp = tp if draft_tp is None else draft_tp

    def seconds(self, shape: StepShape) -> float:
        planner, tp = self.planner, self.tp
        if shape.decode_rows == 0:
            lengths = {tokens for tokens, _ in shape.prefill_chunks}
            if len(lengths) != 1 or any(before for _, before in shape.prefill_chunks):
                raise ValueError("a static batch's prefill is one fresh prompt length per row")
            rows, prompt = len(shape.prefill_chunks), lengths.pop()
            return planner.prefill_ms(self.drafter, rows, prompt, tp, self.draft_tp) / 1000
        if shape.prefill_tokens:
            raise ValueError("a static batch's step decodes or prefills, not both (MixedTablesStep mixes them)")
        rows = shape.decode_rows
        context = int(round(shape.decode_context / rows))
        if shape.k:
            return planner.step_ms(self.drafter, shape.k, rows, context, tp, self.draft_tp) / 1000
        return planner.decode_ms(rows, context, tp) / 1000

    @staticmethod
    def decoding(rows: int, context: int, k: int = 0) -> StepShape:
        """The shape of `rows` rows decoding at `context` tokens each (K drafts each where k > 0)."""
        return StepShape(decode_rows=rows, k=k, decode_context=float(rows * context))

    @staticmethod
    def prefilling(rows: int, prompt: int) -> StepShape:
        """The shape of `rows` fresh prompts of `prompt` tokens computed in one step."""
        return StepShape(prefill_tokens=rows * prompt, prefill_chunks=((prompt, 0),) * rows)
