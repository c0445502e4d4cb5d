"""The kernel tables' mixed prefill + decode step: a replica's step on a GPU a run did not measure."""

from __future__ import annotations

from specbench.drafter_kinds import DrafterKind, drafter_kind
from specbench.fit import kernel_tables
from specbench.step_model.overheads import Overheads
from specbench.step_model.shape import StepShape


class MixedTablesStep:
    """Seconds per engine step from the tables' mixed prefill+decode step, for requests of `isl`
    tokens in and `osl` out (decode attention at their mean context), memoised per step shape. A
    prompt chunk is priced as aiconfigurator prices a mixed step's (its share of a fresh `isl`-token
    prefill); one that attends over tokens before it (an earlier chunk of its prompt, or a prefix
    found cached) adds what that context adds to its attention on the tables
    (`Forward.over_context_ms`). A speculative step (k > 0) adds the draft's k decode steps (none
    for n-gram drafting: no `draft`) and the verify's k extra positions per row (the target's verify
    of k + 1 positions less its one-token decode); the draft's forwards are as `drafter` states them
    (`DrafterKind.draft_ms`): its first runs over `first_draft_positions` a row, which adds
    `Forward.extra_positions_ms` to its K decodes, and an EAGLE-3 head adds its fusing GEMM. A
    draft model also runs over every prompt chunk a step carries (its KV cache needs the prompt,
    and it proposes from the prompt's last token). A drafter whose layers run in the target's
    forward (MTP) is priced as the tables price it: `forward` is the target compiled with its K
    layers (`nextn`), whose every step carries them and verifies K + 1 positions a decoding row.

    The `overheads` are added as `Overheads` composes them: a step's prompt tokens count as
    ceil(tokens / isl) requests, each new and running; a host-drafting kind's proposer works at the
    step's decoding rows and their mean context; the launch floor holds the target's kernels and
    the draft's first forward; graph pieces are counted for each layer of each forward the step
    runs (the target's, and the draft's prefill and K decodes)."""

    reads_context = False  # decode attention is priced at the requests' mean context

    def __init__(self, forward: kernel_tables.Forward, isl: int, osl: int, draft: kernel_tables.Forward | None = None,
                 drafter: str | DrafterKind = "model", overheads: Overheads = Overheads()) -> None:
        self.forward, self.draft, self.isl, self.osl = forward, draft, isl, osl
        self.drafter, self.overheads = drafter_kind(drafter), overheads
        self.context = isl + osl // 2
        self.launch_ms = overheads.launch_ms([(forward.layers, forward.tp)] + (
            [] if draft is None else [(draft.layers, draft.tp)]))
        self._parts: dict[tuple[int, int, int], tuple[float, int, float | None]] = {}
        self._over_context: dict[tuple[int, int], float] = {}
        # a step's seconds when no chunk attends over earlier tokens
        self._fresh: dict[tuple[int, int, int], float] = {}

    def _step_parts(self, prefill_tokens: int, decode_rows: int, k: int) -> tuple[float, int, float | None]:
        """(the kernels' ms, the layers the step's forwards run, the host's ms or None), memoised."""
        key = (prefill_tokens, decode_rows, k)
        if key not in self._parts:
            forward, draft, kind, isl, osl = self.forward, self.draft, self.drafter, self.isl, self.osl
            ms = forward.mixed_ms(prefill_tokens, decode_rows, isl, osl)
            if draft is not None and prefill_tokens > 0:
                ms += draft.mixed_ms(prefill_tokens, 0, isl, osl)
            if k > 0 and decode_rows > 0 and not kind.in_target_forward:
                ms += forward.verify_ms(decode_rows, self.context, k + 1) - forward.decode_ms(decode_rows, self.context)
                if draft is not None:
                    ms += kind.draft_ms(draft, k, draft.mixed_ms(0, decode_rows, isl, osl), decode_rows, self.context,
                                        kind.first_draft_positions(k))
            draft_forwards = 0 if draft is None else (prefill_tokens > 0) + (k if decode_rows > 0 else 0)
            layers = forward.layers + (0 if draft is None else draft_forwards * draft.layers)
            prompts = -(-prefill_tokens // max(isl, 1))
            host_ms = self.overheads.host_ms(decode_rows + prompts, prompts, prefill_tokens, forward.tp, kind,
                                             decode_rows if k > 0 else 0, self.context)
            self._parts[key] = ms, layers, host_ms
        return self._parts[key]

    def _over_context_ms(self, chunks) -> float:
        """What the step's prompt chunks add by attending over the tokens before them (the target's
        and a draft model's prefill), memoised at 16 tokens of each (a KV block)."""
        extra = 0.0
        for tokens, before in chunks:
            if before <= 0 or tokens <= 0:
                continue
            key = (-(-tokens // 16) * 16, before // 16 * 16)
            if key not in self._over_context:
                self._over_context[key] = self.forward.over_context_ms(*key) + (
                    0.0 if self.draft is None else self.draft.over_context_ms(*key))
            extra += self._over_context[key]
        return extra

    def _priced(self, prefill_tokens: int, decode_rows: int, k: int, extra_ms: float) -> float:
        ms, layers, host_ms = self._step_parts(prefill_tokens, decode_rows, k)
        return self.overheads.step_ms(ms + extra_ms, prefill_tokens + decode_rows * (k + 1), prefill_tokens, layers,
                                      self.launch_ms, host_ms, self.drafter) / 1e3

    def seconds(self, shape: StepShape) -> float:
        prefill_tokens, decode_rows, k, chunks = shape.prefill_tokens, shape.decode_rows, shape.k, shape.prefill_chunks
        extra_ms = self._over_context_ms(chunks) if chunks else 0.0
        if extra_ms:
            return self._priced(prefill_tokens, decode_rows, k, extra_ms)
        key = (prefill_tokens, decode_rows, k)
        if key not in self._fresh:
            self._fresh[key] = self._priced(prefill_tokens, decode_rows, k, 0.0)
        return self._fresh[key]
