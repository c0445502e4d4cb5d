"""The kernel tables' static-batch step: `plan --target`'s, every row decoding at one context."""

from __future__ import annotations

from specbench.step_model.shape import StepShape


class StaticTablesStep:
    """Seconds of a static batch's step on the tables for one target at `tp`, for `drafter` (a
    fit.table_plan.Drafter; None: the baseline) at `draft_tp`: a step of prompt chunks alone is the
    batch's prefill (the target's, then a draft model's), one of decoding rows a decode, or with K a
    speculative step (K draft forwards, the first over `first_draft_positions`, and the verify of
    K + 1 positions), each at its rows' mean context. `planner` (fit.table_plan.TablePlanner) holds
    the forwards, a run's corrections and the overheads; each step's kernels become a served step
    as `Overheads.step_ms` composes them (none where corrections hold a run's own host time)."""

    reads_context = True

    def __init__(self, planner, tp: int, drafter=None, draft_tp: int | None = None) -> None:
        self.planner, self.tp, self.drafter = planner, tp, drafter
        self.draft_tp = tp if draft_tp is None else draft_tp

    def seconds(self, shape: StepShape) -> float:
        if shape.decode_rows == 0:
            lengths = {tokens for tokens, _ in shape.prefill_chunks}
            if len(lengths) != 1 or any(before for _, before in shape.prefill_chunks):
                raise ValueError("a static batch's prefill is one fresh prompt length per row")
            return self.prefill_ms(len(shape.prefill_chunks), lengths.pop()) / 1000
        if shape.prefill_tokens:
            raise ValueError("a static batch's step decodes or prefills, not both (MixedTablesStep mixes them)")
        rows = shape.decode_rows
        context = int(round(shape.decode_context / rows))
        if shape.k:
            return self.step_ms(shape.k, rows, context) / 1000
        return self.decode_ms(rows, context) / 1000

    def _served(self, kernels_ms: float, drafter, rows: int, new_requests: int = 0, prompt_tokens: int = 0,
                tokens: int = 0, draft_tp: int = 1, context: float | None = None) -> float:
        """A step's kernels as the served engine runs them (`Overheads.step_ms`): a step of `tokens`
        (`prompt_tokens` of them a prefill's) outside CUDA graphs lasts at least the host's launch of
        the target's kernels at TP and, for a draft model, its first forward's at `draft_tp`; a
        prefill replayed as graph pieces runs the target's layers and a draft model's (its decode and
        verify steps replay full graphs under vLLM's default FULL_AND_PIECEWISE). A host-drafting
        step's rows (speculating, at `context`) add the proposer's host time."""
        planner, tp = self.planner, self.tp
        overheads = planner.overheads
        target_layers = int(planner.target["num_hidden_layers"])
        draft_layers = int(drafter.config["num_hidden_layers"]) if drafter is not None \
            and drafter.draft_kind.separate_model and drafter.config else 0
        launch_ms = overheads.launch_ms([(target_layers, tp)] + ([(draft_layers, draft_tp)] if draft_layers else []))
        kind = drafter.draft_kind if drafter is not None else None
        host_ms = overheads.host_ms(rows, new_requests, prompt_tokens, tp, kind, rows if context is not None else 0,
                                    context or 0.0)
        return overheads.step_ms(kernels_ms, tokens, prompt_tokens, target_layers + draft_layers, launch_ms, host_ms,
                                 kind)

    def decode_ms(self, batch_size: int, context: int) -> float:
        """The target's decode of `batch_size` rows, without speculation."""
        planner = self.planner
        kernels = planner.forward(planner.target, self.tp).decode_ms(batch_size, context) \
            * planner.scale("decode", batch_size)
        return self._served(kernels, None, batch_size, tokens=batch_size)

    def step_ms(self, k: int, batch_size: int, context: int) -> float:
        """One speculative step of the drafter: K draft forwards (the first over
        `first_draft_positions`) plus the verify of K + 1 positions; MTP's layers in the target's
        forward (the target compiled with them)."""
        planner, tp, drafter = self.planner, self.tp, self.drafter
        kind = drafter.draft_kind
        if kind.in_target_forward:
            kernels = planner.forward(planner.target, tp, drafter.layers).decode_ms(batch_size, context) \
                * planner.scale("decode", batch_size)
            return self._served(kernels, drafter, batch_size, tokens=batch_size * (drafter.layers + 1))
        whole = "step" in planner.corrections  # a served run corrects the whole step, not its parts
        verify = planner.forward(planner.target, tp).verify_ms(batch_size, context, k + 1)
        verify *= 1.0 if whole else planner.scale("verify", batch_size)
        draft, draft_tp = 0.0, self.draft_tp
        if kind.forwards_per_step(k):
            draft_tp = kind.draft_tp(tp, draft_tp)
            drafter_forward = planner.draft_forward(drafter, draft_tp)
            # vLLM's first draft forward runs over every verified token; the engine a native run's
            # corrections describe (not a whole served step) feeds its draft only what it has not cached
            native = bool(planner.corrections) and not whole
            positions = 1 if native else kind.first_draft_positions(k)
            draft = kind.draft_ms(drafter_forward, k, drafter_forward.decode_ms(batch_size, context), batch_size,
                                  context, positions)
            draft *= 1.0 if whole else planner.draft_scale(drafter, "draft", batch_size)
        return self._served((draft + verify) * (planner.scale("step", batch_size) if whole else 1.0), drafter,
                            batch_size, tokens=batch_size * (k + 1), draft_tp=draft_tp, context=context)

    def prefill_ms(self, batch_size: int, prompt: int) -> float:
        """The batch's prefill: the target's, then a draft model's."""
        planner, drafter = self.planner, self.drafter
        total = planner.forward(planner.target, self.tp).prefill_ms(batch_size, prompt) \
            * planner.scale("prefill", batch_size)
        if drafter is not None and drafter.draft_kind.separate_model:
            draft = planner.draft_forward(drafter, self.draft_tp).prefill_ms(batch_size, prompt)
            total += draft * planner.draft_scale(drafter, "draft prefill", batch_size)
        return self._served(total, drafter, batch_size, batch_size, batch_size * prompt, tokens=batch_size * prompt,
                            draft_tp=self.draft_tp)

    @staticmethod
    def decoding(rows: int, context: int, k: int = 0) -> StepShape:
        """The shape of `rows` rows decoding at `context` tokens each (K drafts each where k > 0)."""
        return StepShape(decode_rows=rows, k=k, decode_context=float(rows * context))

    @staticmethod
    def prefilling(rows: int, prompt: int) -> StepShape:
        """The shape of `rows` fresh prompts of `prompt` tokens computed in one step."""
        return StepShape(prefill_tokens=rows * prompt, prefill_chunks=((prompt, 0),) * rows)
