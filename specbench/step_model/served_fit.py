"""A served run's fitted step (`fleet.served.fit_served` fits it by simulating the run's cells):
the engine's own work, the forward as a roofline (the weights' read, a floor, or the tokens'
compute), attention over the decoding rows' KV cache and the prompt chunks' (query, key) pairs, and
each draft's fitted speculation time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specbench.step_model.shape import StepShape

# The one-row decode step's part that is the engine's own work (scheduling, sampling) rather than the
# forward's floor (reading the weights). Batches of at most 4 rows, as a CPU calibration has, cannot
# tell the two apart, yet past the floor (about 20 tokens a step on one CPU core) the tokens' compute
# adds time and the overhead does not: an assumption, stated, not fitted.
STEP_OVERHEAD_SHARE = 0.1


@dataclass(frozen=True)
class DraftPrice:
    spec_fixed_s: float = 0.0  # per step that drafts (the proposer's and rejection sampler's own work)
    # per draft position of each decoding row (an n-gram lookup, a position's rejection sampling);
    # per position alone (constant in the rows) fitted the calibration worse: rms 0.071 / 0.088 against
    # 0.061 / 0.071 for ngram / a self draft (measured.json's finding draft_price_per_row)
    per_draft_s: float = 0.0
    model_share: float = 0.0  # a draft model's forwards (prefill and K decodes) as a share of the target's


@dataclass(frozen=True)
class Held:
    """How a served price is read past what its run measured (`held_price`, plan --extrapolate):
    linear in the tokens instead of the fitted curve. A price fitted on short prompts carries their
    per-request costs in its token and attention prices (SmolLM2-135M on a vLLM CPU server, 41- to
    64-token prompts: 2.7 ms a token and 2.9 us a (query, key) pair, 7x its machine's roof); read
    quadratically at 1,100 tokens, that predicted 4-7x the TPOT a replay measured
    (docs/guides/size-a-fleet.md, "On a vLLM run you measured")."""

    prompt_tokens: int  # the run's longest prompt: a step's tokens, and a query's keys, past it are held
    # a token's and a (query, key) pair's compute at the roof of the run's machine (its recorded
    # matmul rate); None where the run recorded none
    token_s: float | None = None
    pair_s: float | None = None

    def token_rate_s(self, price: "ServedPrice") -> float:
        """Seconds a token past the run's steps: the compute roof where known (a larger product runs
        nearer the machine's rate), never dearer than the run's own token price."""
        return min(price.per_token_s, self.token_s) if self.token_s else price.per_token_s


@dataclass(frozen=True)
class ServedPrice:
    """Seconds per engine step of one served target (and its drafts), fitted on a run: the
    engine's own work, then the forward as a roofline (the weights' read, a floor, or the tokens'
    compute, whichever is longer), then attention over the KV cache and the prompt chunks."""

    floor_s: float  # one forward's floor: the weights read once (with the step's own work, `fixed_s`)
    per_token_s: float  # compute per token the forward runs (prompt or decode alike)
    overhead_s: float = 0.0  # per request before its first token (the API server's work)
    per_context_token_s: float = 0.0  # per token a decoding row attends over (its KV cache, read once)
    per_prefill_pair_s: float = 0.0  # per (query, key) pair a prefill chunk's attention computes
    drafts: dict[str, DraftPrice] = field(default_factory=dict)
    source: str = ""
    # A sampled position (each decoding row's 1 + K) also runs the output head, which a prompt's
    # other tokens skip (vLLM computes logits only where it samples): its compute as a share of a
    # prompt token's, from the model's shape (`head_share`), not fitted
    head_share: float = 0.0
    # A verify's K extra query positions attend over each decoding row's KV cache again. Where the
    # step's decoding context (tokens, every row's) fits this many tokens the re-reads come from a
    # cache, free; the part beyond it pays the first read's price again (fitted on the speculative
    # cells; infinite, every re-read free, where a run has none). On vLLM's CPU kernel the re-reads
    # alone turn dear past ~15k tokens (measured.json's finding verify_reread_attention); a fit
    # finds less, as the term also carries the rest of a verify's cost that grows with the context
    reread_cached_tokens: float = math.inf
    # past what the run measured, the price held (`held_price`; plan --extrapolate); None: as fitted
    held: "Held | None" = None

    def reread_share(self, context: float) -> float:
        """The share of a step's decoding context a verify's extra positions read again at full price."""
        return max(0.0, 1.0 - self.reread_cached_tokens / context) if context > 0 else 0.0

    @property
    def fixed_s(self) -> float:
        return self.floor_s * STEP_OVERHEAD_SHARE

    def forward_s(self, tokens: float) -> float:
        held = self.held
        if held is not None and tokens > held.prompt_tokens:  # past the run's steps: on at a linear rate
            return self.forward_s(held.prompt_tokens) + (tokens - held.prompt_tokens) * held.token_rate_s(self)
        return max(self.floor_s * (1 - STEP_OVERHEAD_SHARE), self.per_token_s * tokens)

    def pairs_s(self, pairs: float, held_pairs: float | None) -> float:
        """A prefill's attention over `pairs` (query, key) pairs; held (`held_pairs`: the pairs with
        each query's keys capped at the run's longest prompt), the keys past it at the compute roof's
        price where the run recorded its machine's, else free: a token's attention held at its price
        at the run's longest prompt, linear in the tokens instead of quadratic."""
        if self.held is None or held_pairs is None:
            return self.per_prefill_pair_s * pairs
        return self.per_prefill_pair_s * held_pairs + (self.held.pair_s or 0.0) * max(0.0, pairs - held_pairs)

    def cost(self, draft: str | None = None) -> "ServedStep":
        """The replica's step on this fit, without a drafter (None) or with `draft`'s."""
        return ServedStep(self, draft)


class ServedStep:
    """A served run's fitted step (`ServedPrice`) as a step model: the fixed time, the forward over
    the prompt tokens and each decoding row's 1 + K sampled positions, the decoding rows' attention
    over their context (a verify's extra positions re-reading it past what a cache holds) and the
    prompt chunks' over their pairs (held past the run's longest prompt, `ServedPrice.held`); with a
    draft, its fitted speculation time and, for a draft model, its share of the prefill and its K
    decodes of every row."""

    reads_context = True

    def __init__(self, price: ServedPrice, draft: str | None = None) -> None:
        self.price, self.draft = price, draft
        self.draft_price = price.drafts.get(draft or "", DraftPrice())

    def seconds(self, shape: StepShape) -> float:
        own, price, draft = self.price, self.draft_price, self.draft
        prefill_tokens, decode_rows, k, context = shape.prefill_tokens, shape.decode_rows, shape.k, shape.decode_context
        held_pairs = None if own.held is None else shape.held_pairs(own.held.prompt_tokens)
        prefill_attention = own.pairs_s(shape.prefill_pairs(), held_pairs)
        attention = own.per_context_token_s * context * (1 + k * own.reread_share(context)) + prefill_attention
        sampled = decode_rows * (1 + k)
        seconds = own.fixed_s + own.forward_s(prefill_tokens + sampled * (1 + own.head_share)) + attention
        if draft and price.model_share and prefill_tokens:  # a draft model prefills the prompt too
            seconds += price.model_share * (own.forward_s(prefill_tokens) + prefill_attention)
        if draft and k and decode_rows:
            seconds += price.spec_fixed_s + k * decode_rows * price.per_draft_s
            if price.model_share:  # its K decodes of every row
                seconds += k * price.model_share * (own.forward_s(decode_rows * (1 + own.head_share))
                                                    + own.per_context_token_s * context)
        return seconds
