"""A served engine's step price fitted on what a vLLM run measured (issue 40: "fit what the served
engine measured"), so the fleet simulator can predict traffic that server never saw.

A served run has no step times, only each request's arrival, lengths, TTFT and TPOT. The fit runs
the simulator itself over the run's cells (each cell's requests at their measured arrival times,
with their prompt and output lengths, through one replica as the server was configured) and
chooses the step price whose simulated per-cell median TTFT and TPOT come closest to the measured
ones (least squares on their logarithms):

- the target's step: the engine's own work, then the forward as a roofline: the weights' read (a
  floor) or the compute of the tokens it runs (a decode row runs 1 + K when speculating, and each
  of those sampled positions also runs the output head, which a prompt's tokens skip: its share
  from the model's shape), whichever is longer; then attention: per token the decoding rows attend
  over (their KV cache) and per (query, key) pair of the prompt chunks;
- a verify's K extra query positions read each row's KV cache again: free while the step's
  decoding context fits `reread_cached_tokens` (a cache), at the first read's price beyond it
  (vLLM's CPU attention; fitted with the drafts, on a grid);
- a request's first token also waits `overhead` (the API server's own work: HTTP, tokenizing);
- each speculative configuration adds, per step that drafts, `spec_fixed + per_draft × K × rows`
  (the proposer's and rejection sampler's work: per step, and per draft position of every
  decoding row, as vLLM looks up n-grams and samples row by row) and, for a draft model (a self
  draft: the target's own), its forwards at the target's price: its prefill of the prompt and its
  K decodes of every row.

The target is fitted on the autoregressive cells, then each draft on its own cells with the
target's price held. Acceptance is an input (measured per position), not fitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from specbench.fit.acceptance import row_step_acceptance
from specbench.fleet.replica import ReplicaSpec, Speculation, simulate
from specbench.fleet.router import simulate_fleet
from specbench.fleet.sizing import COMMON_SEED, Configuration
from specbench.measured import validation
from specbench.results import recorded_config
from specbench.schema import AR
from specbench.shapes import Architecture
from specbench.synthetic import shipped_config
from specbench.step_model.served_fit import DraftPrice, Held, ServedPrice

# vLLM 0.32's defaults for an OpenAI API server on a CPU (engine/arg_utils.py: 2048 batched tokens,
# 128 sequences per worker); the KV cache is what the server logged
CPU_SERVER_DEFAULTS = (2048, 128)


# How hard a served fit holds each parameter to the value read off the calibration (per e-fold
# away, against per-cell log errors of TTFT and TPOT): weak, so the cells decide where they can.
PRIOR_WEIGHT = 0.02


def head_share(meta: dict) -> float:
    """The output head's compute per sampled position as a share of a prompt token's (its layers'),
    from the shape the run recorded; 0 where it recorded none. SmolLM2-135M: 0.27 (a 49k vocabulary
    on a small model); Llama-3.1-70B: 0.015."""
    recorded = (meta.get("architectures") or {}).get("target")
    if not recorded:
        return 0.0
    shape = Architecture.from_dict(recorded)
    return shape.vocab * shape.hidden / (shape.layers * shape.layer_parameters)


@dataclass(frozen=True)
class ReplayCheck:
    """How far the simulator on a served run's fitted steps was from vLLM CPU replays it never saw
    (one sitting: azure-conv and azure-code each below and past the knee, the baseline, ngram K=2 and
    the self draft, priced on that sitting's closed-loop calibration): specbench/data/validation.json's
    "replay", which the replay check's command writes and names."""

    cells: int
    ttft_median_abs: float
    tpot_median_abs: float
    e2e_median_abs: float
    signs_right: int  # speculation's effect on p50 TTFT, TPOT and E2E: its direction predicted right
    signs: int


REPLAY_CHECK = ReplayCheck(**{name: validation("replay")[name] for name in ReplayCheck.__dataclass_fields__})


@dataclass(frozen=True)
class EffectBand:
    """Over every committed CPU-replay sitting's predictions (a replay predicted from two calibrations
    counted twice): of the predicted effects of speculation on a p50 (TTFT, TPOT, E2E) smaller than
    `below`, how many had the measured direction. specbench/data/validation.json's
    "direction_by_effect", which its command writes and names."""

    below: float
    right: int
    predictions: int


DIRECTION_BY_EFFECT = tuple(EffectBand(math.inf if band["below"] is None else band["below"], band["right"],
                                       band["predictions"]) for band in validation("direction_by_effect")["bands"])


def effect_bands(bands: tuple[EffectBand, ...] = DIRECTION_BY_EFFECT):
    """(name, low, band) for each band of |predicted change|: "under 10%", "10% to 20%", "20% or more"."""
    low = 0.0
    for band in bands:
        name = (f"under {band.below:.0%}" if low == 0 else f"{low:.0%} or more" if band.below == math.inf
                else f"{low:.0%} to {band.below:.0%}")
        yield name, low, band
        low = band.below


def direction_note(change: float) -> str:
    """What the CPU replays say of a predicted change this size (speculation against the baseline):
    "" where such effects had the measured direction nearly always (20 % or more)."""
    for name, low, band in effect_bands():
        if low <= abs(change) < band.below and band.below != math.inf:
            return (f"an effect {name} had the measured direction in {band.right} of the CPU replays' "
                    f"{band.predictions} predictions: measure it")
    return ""


def replay_check(meta: dict) -> str:
    """One line on how far to trust a simulation on a run's fitted steps: its check on vLLM CPU
    replays, or that a GPU's or an endpoint's servers were never checked so."""
    engine = (meta.get("engine") or {}).get("name")
    if engine != "vllm" or (meta.get("hardware") or {}).get("gpus"):
        where = "a GPU's vLLM servers" if engine == "vllm" else "an endpoint's servers"
        return (f"UNCHECKED on {where}: the simulator on a run's fitted steps was checked on vLLM CPU replays "
                f"alone (docs/validation.md)")
    check, bands = REPLAY_CHECK, list(effect_bands())
    (small_name, _, small), (large_name, _, large) = bands[0], bands[-1]
    return (f"checked on {check.cells} vLLM CPU replays it never saw (one sitting: azure-conv and azure-code below "
            f"and past the knee; the baseline, ngram K=2 and the self draft): median |error| of p50 TTFT "
            f"{check.ttft_median_abs:.1%}, TPOT {check.tpot_median_abs:.1%}, E2E {check.e2e_median_abs:.1%}; "
            f"speculation's direction right in {check.signs_right} of {check.signs}; over every sitting, where the "
            f"predicted effect was {small_name} in {small.right} of {small.predictions}, where {large_name} in "
            f"{large.right} of {large.predictions} (docs/validation.md)")


def served_context(meta: dict) -> int:
    """The longest request (prompt + output tokens) a run's servers took: what an endpoint run's
    servers said they serve (their /v1/models max_model_len), a vLLM run's --max-model-len, else the
    target's max_position_embeddings (vLLM's default) where the target is a registry model; 0 where
    none is known (a local path's model, an endpoint that did not say)."""
    config = recorded_config(meta)
    limit = (meta.get("engine") or {}).get("context_limit") or (config["engine"].get("vllm") or {}).get("max_model_len")
    if limit:
        return int(limit)
    try:
        return int(shipped_config(str(config["grid"].get("target")))[1].get("max_position_embeddings") or 0)
    except Exception:  # noqa: BLE001 - not a registry alias: its context is not known here
        return 0


def served_replica(meta: dict, draft: str = AR, k: int = 0) -> ReplicaSpec:
    """The replica a run's vLLM CPU server for `draft` at `k` was (a draft model's server holds a
    smaller KV cache): its logged KV cache, vLLM's CPU defaults."""
    servers = (meta.get("engine") or {}).get("servers") or []
    label = AR if draft == AR or not k else f"{draft} K={k}"
    logged = [s for s in servers if s.get("kv_cache")]
    mine = [s for s in logged if s.get("label") == label] or logged
    kv = mine[0].get("kv_cache") if mine else {}
    tokens, block = int(kv.get("kv_cache_size_tokens") or 1 << 20), int(kv.get("block_size") or 16)
    budget, seqs = CPU_SERVER_DEFAULTS
    return ReplicaSpec(max_num_seqs=seqs, max_num_batched_tokens=budget, kv_capacity_tokens=tokens, block_size=block)


@dataclass(frozen=True)
class CellLoad:
    """One measured cell's requests (one repeat): what the simulator replays and what it is
    compared with."""

    cell_id: str
    draft: str
    k: int
    acceptance: tuple[float, ...]
    arrivals_s: np.ndarray
    prompts: np.ndarray
    outputs: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    spec: ReplicaSpec | None = None  # the server this cell ran on, where the run logged it
    replicas: int = 1  # servers the load was spread over (an --endpoint list)
    router: str = "least-outstanding"  # ... by this router
    # a closed-loop cell (request_rate 0): its clients, each sending its next request when its last
    # one finished, and how long after that finish the next one reached the server (measured)
    concurrency: int | None = None
    turnaround_s: float = 0.0


def cell_loads(cells: pd.DataFrame, requests: pd.DataFrame, repeat: int = 0,
               meta: dict | None = None) -> list[CellLoad]:
    """Every finished cell's requests of one repeat, in arrival order (with `meta`: each on the
    replica its server was; a load spread over several servers, an --endpoint list, on as many
    replicas behind the run's router)."""
    loads = []
    router = str((recorded_config(meta or {})["engine"].get("endpoint") or {}).get("router") or "least-outstanding")
    for cell in cells[cells["status"] == "ok"].to_dict("records"):
        mine = requests[(requests["cell_id"] == cell["cell_id"]) & (requests["repeat"] == repeat)]
        mine = mine[mine["output_tokens"] >= 1].sort_values("arrival_s")
        if mine.empty:
            continue
        arrivals, e2e = mine["arrival_s"].to_numpy(float), mine["e2e_s"].to_numpy(float)
        clients = _clients(cell)
        loads.append(CellLoad(cell["cell_id"], cell["draft"], int(cell["k"]), row_step_acceptance(cell, requests),
                              arrivals, mine["prompt_tokens"].to_numpy(int), mine["output_tokens"].to_numpy(int),
                              mine["ttft_s"].to_numpy(float), mine["tpot_s"].to_numpy(float), e2e,
                              served_replica(meta, cell["draft"], int(cell["k"])) if meta else None,
                              _servers(cell), router, clients,
                              _turnaround(arrivals, arrivals + e2e, clients) if clients else 0.0))
    return loads


def _clients(cell: dict) -> int | None:
    """A closed-loop cell's clients (its batch size; `request_rate` 0), None for an open loop."""
    rate, batch = cell.get("request_rate"), cell.get("batch_size")
    if pd.isna(rate) or float(rate) != 0.0 or pd.isna(batch) or int(batch) < 1:
        return None
    return int(batch)


def _turnaround(arrivals: np.ndarray, finishes: np.ndarray, clients: int) -> float:
    """The median time from a request's end to the next request a closed loop sent (each request
    after the clients' first: its arrival less the latest finish before it)."""
    gaps = []
    for at in arrivals[clients:]:
        before = finishes[finishes <= at]
        if len(before):
            gaps.append(at - before.max())
    return float(np.median(gaps)) if gaps else 0.0


def _servers(cell: dict) -> int:
    """How many servers a cell's load was spread over (its `endpoint` column lists them)."""
    endpoint = cell.get("endpoint")
    return max(1, len(str(endpoint).split(","))) if isinstance(endpoint, str) and endpoint else 1


def simulate_load(price: ServedPrice, spec: ReplicaSpec, load: CellLoad,
                  acceptance: tuple[float, ...] | None = None) -> dict:
    """The cell's requests through one replica at `price` (`spec`: the server's, `load.spec` where
    the cell recorded its own), or through as many as its load was spread over, behind its router:
    median TTFT, TPOT and E2E (seconds), TTFT and E2E with the per-request overhead (the replica's
    `request_overhead_s`)."""
    spec = replace(load.spec or spec, request_overhead_s=price.overhead_s)
    speculative = load.draft != AR and load.k > 0
    reach = acceptance if acceptance is not None else load.acceptance
    speculation = Speculation(load.k, _monotone(reach, load.k), seed=1) if speculative else None
    cost, arrivals = price.cost(load.draft if speculative else None), load.arrivals_s - load.arrivals_s[0]
    if load.replicas > 1:
        out = simulate_fleet(load.prompts, load.outputs, arrivals, cost, spec, load.replicas, load.router,
                             speculation).outcome
    elif load.concurrency:
        # a closed loop is simulated as one: replayed at its measured arrival times instead, a
        # request the simulation ends later than the server did collides with its client's next
        # prompt, and a cell's median TPOT jumps 3x on a price a few per cent off
        out = simulate(load.prompts, load.outputs, cost, spec, concurrency=load.concurrency,
                       client_starts_s=arrivals[:load.concurrency], client_turnaround_s=load.turnaround_s,
                       speculation=speculation)
    else:
        out = simulate(load.prompts, load.outputs, cost, spec, arrivals_s=arrivals, speculation=speculation)
    return {"ttft_p50_s": float(np.median(out.ttft_s)), "tpot_p50_s": float(np.nanmedian(out.tpot_s)),
            "e2e_p50_s": float(np.median(out.e2e_s))}


def _monotone(reach: tuple[float, ...], k: int) -> tuple[float, ...]:
    """K positions of acceptance, non-increasing (a measured profile can rise by noise)."""
    values = list(reach[:k]) + [0.0] * max(0, k - len(reach))
    for i in range(1, len(values)):
        values[i] = min(values[i], values[i - 1])
    return tuple(min(1.0, max(0.0, v)) for v in values)


def _residuals(price: ServedPrice, spec: ReplicaSpec, loads: list[CellLoad]) -> np.ndarray:
    """log(simulated / measured) of each cell's median TTFT and TPOT."""
    found = []
    for load in loads:
        predicted = simulate_load(price, spec, load)
        for name, measured in (("ttft_p50_s", np.median(load.ttft_s)), ("tpot_p50_s", np.nanmedian(load.tpot_s))):
            if measured > 0 and predicted[name] > 0:
                found.append(math.log(predicted[name] / measured))
    return np.array(found)


def _least_squares(residuals, *starts: np.ndarray) -> np.ndarray:
    """Positive parameters minimising the residuals' squares (fitted on their logarithms, so a
    price spanning orders of magnitude is found as readily as one near its start), from each of
    `starts`, the best kept. The residuals come from a simulation of discrete steps, piecewise in
    the parameters: a descent by finite differences can stop within a few dozen evaluations far
    from the minimum (a calibration fitted at rms log error 0.33 where 0.06 was there to find), so
    each descent is finished by Nelder-Mead's simplex, which needs no gradient."""
    from scipy.optimize import least_squares, minimize

    squares = lambda x: float(np.sum(residuals(np.exp(x)) ** 2))  # noqa: E731
    best_x, best_cost = None, math.inf
    for start in starts:
        descent = least_squares(lambda x: residuals(np.exp(x)), np.log(start), method="trf", diff_step=1e-3,
                                x_scale=1.0, max_nfev=400)
        simplex = minimize(squares, descent.x, method="Nelder-Mead",
                           options={"maxfev": 200 * len(start), "xatol": 1e-3, "fatol": 1e-5})
        for x, cost in ((descent.x, 2 * descent.cost), (simplex.x, float(simplex.fun))):
            if cost < best_cost:
                best_x, best_cost = x, cost
    return np.exp(best_x)


def _measured_start(base: list[CellLoad], tpot: float) -> np.ndarray:
    """A starting price read off the calibration itself: the decode step of its lone requests (B = 1,
    the shortest prompts' TPOT) as the floor, their prompts' TTFT per token as the token price, and
    the longest prompts' TTFT beyond that as the prefill's attention pairs."""
    lone = [load for load in base if len(load.prompts) and load.outputs.max() > 1] or base
    shortest = min(lone, key=lambda load: float(np.median(load.prompts)))
    longest = max(lone, key=lambda load: float(np.median(load.prompts)))
    floor = float(np.nanmin([np.nanmedian(load.tpot_s) for load in lone]))
    floor = floor if floor > 0 else tpot
    short_n = float(np.median(shortest.prompts))
    per_token = float(np.median(shortest.ttft_s)) / max(short_n, 1.0)
    long_n = float(np.median(longest.prompts))
    beyond = float(np.median(longest.ttft_s)) - per_token * long_n
    per_pair = beyond / (long_n * long_n / 2) if beyond > 0 and long_n > short_n else per_token / 1e3
    return np.array([floor, per_token, floor / 10, floor / 1e4, per_pair])


def fit_served(cells: pd.DataFrame, requests: pd.DataFrame, meta: dict, source: str = "",
               self_drafts: tuple[str, ...] = (), reread_cached_tokens: float | None = None
               ) -> tuple[ServedPrice, ReplicaSpec]:
    """The step price that makes the simulator reproduce a vLLM run's cells (see the module's
    docstring), and the replica its server was. `self_drafts`: drafts that are the target's own
    model (their prefill costs the target's). `reread_cached_tokens`: held at this instead of
    fitted (the machine's, from a calibration that reached past it, for one that did not)."""
    spec = served_replica(meta)
    loads = cell_loads(cells, requests, meta=meta)
    base = [load for load in loads if load.draft == AR]
    if not base:
        raise ValueError(f"{source}: no finished autoregressive cell to fit the target's step on")
    tpot = float(np.nanmedian(np.concatenate([load.tpot_s for load in base])))
    start = np.array([tpot * 0.9, tpot / 50, tpot / 10, tpot / 1e4, tpot / 1e6])

    prior = _measured_start(base, tpot)
    head = head_share(meta)

    def target(x: np.ndarray) -> np.ndarray:
        # a weak pull towards the price read off the calibration: a parameter the cells cannot tell
        # apart from another (attention pairs, where every prompt is short) stays near its reading
        # instead of wandering to whatever extrapolates worst
        return np.concatenate([_residuals(ServedPrice(*x, head_share=head), spec, base),
                               PRIOR_WEIGHT * np.log(x / prior)])

    price = ServedPrice(*_least_squares(target, start, prior), {}, source, head)
    if all(load.draft == AR for load in loads):
        return price, spec
    grid = (reread_cached_tokens,) if reread_cached_tokens else REREAD_CACHED_TOKENS
    found = [_fit_drafts(replace(price, reread_cached_tokens=cached), spec, loads, self_drafts) for cached in grid]
    return min(found, key=lambda pair: pair[1])[0], spec


# The decoding context (tokens) a verify's re-reads find in a cache, tried in turn: a simulation of
# discrete steps is piecewise in it, so a grid on a log scale rather than a descent; infinity, every
# re-read free (a GPU kernel that reads a row's KV once for all its query positions), is one of them
REREAD_CACHED_TOKENS = (250.0, 500.0, 1000.0, 1500.0, 2000.0, 3000.0, 4500.0, 7000.0, 10000.0, 15000.0,
                        25000.0, 50000.0, math.inf)


def _fit_drafts(price: ServedPrice, spec: ReplicaSpec, loads: list[CellLoad],
                self_drafts: tuple[str, ...]) -> tuple[ServedPrice, float]:
    """Each draft's price on its own cells, the target's held: `price` with them, and the sum of
    squared residuals over every speculative cell."""
    drafts, squares = {}, 0.0
    for draft in sorted({load.draft for load in loads} - {AR}):
        mine = [load for load in loads if load.draft == draft and load.k > 0]
        share = 1.0 if draft in self_drafts else 0.0

        def speculative(x: np.ndarray, draft: str = draft, mine: list = mine, share: float = share) -> np.ndarray:
            trial = replace(price, drafts={draft: DraftPrice(x[0], x[1], share)})
            return _residuals(trial, spec, mine)

        spec_fixed, per_draft = _least_squares(speculative, np.array([price.fixed_s, price.fixed_s / 4]))
        drafts[draft] = DraftPrice(spec_fixed, per_draft, share)
        squares += float(np.sum(speculative(np.array([spec_fixed, per_draft])) ** 2))
    return replace(price, drafts=drafts), squares


@dataclass(frozen=True)
class MeasuredReach:
    """How far a run's cells of one configuration reached: the most requests they ran at once (the
    server's sampled running count, or a closed loop's clients) and the longest prompt."""

    rows: int
    prompt_tokens: int
    context_tokens: int = 0  # the most KV cache its decoding rows can have read in one step (tokens, summed)


def measured_reach(cells: pd.DataFrame, requests: pd.DataFrame) -> dict[str, MeasuredReach]:
    """Per draft (the baseline under AR), how far its finished cells reached."""
    reach = {}
    for draft, group in cells[cells["status"] == "ok"].groupby("draft"):
        sampled = pd.to_numeric(group.get("running_max", pd.Series(dtype=float)), errors="coerce")
        closed = group[pd.to_numeric(group["request_rate"], errors="coerce").fillna(0) == 0]
        rows = max([*sampled.dropna().tolist(), *closed["batch_size"].tolist(), 0])
        mine = requests.loc[requests["cell_id"].isin(group["cell_id"])]
        prompts = mine["prompt_tokens"]
        outputs = mine["output_tokens"] if "output_tokens" in mine else 0
        longest = int((prompts + outputs).max()) if len(mine) else 0
        reach[str(draft)] = MeasuredReach(int(rows), int(prompts.max()) if len(prompts) else 0, int(rows) * longest)
    return reach


# How far past a run's longest prompt (or its most requests at once) a plan on its fitted step is
# answered without --extrapolate: past it the fit is read where nothing was measured
REACH_FACTOR = 2.0


def out_of_reach(reach: dict[str, MeasuredReach], meta: dict, prompts: np.ndarray | None = None,
                 concurrency: int = 0) -> str:
    """One line why a plan asks too far past what a run measured (the p90 of `prompts`, or a
    closed loop's `concurrency`, past REACH_FACTOR x the run's longest prompt or most requests at
    once), naming what to measure; "" where it is within reach."""
    longest = max((r.prompt_tokens for r in reach.values()), default=0)
    rows = max((r.rows for r in reach.values()), default=0)
    wanted = float(np.percentile(prompts, 90)) if prompts is not None and len(prompts) else 0.0
    past = []
    if longest and wanted > REACH_FACTOR * longest:
        past.append(f"prompts of {wanted:,.0f} tokens (p90; the run's longest: {longest:,})")
    if rows and concurrency > REACH_FACTOR * rows:
        past.append(f"{concurrency} requests at once (the run's most: {rows})")
    if not past:
        return ""
    config = recorded_config(meta)["grid"]
    drafts = ",".join(str(d) for d in config.get("drafts") or [])
    lengths = 1 << max(int(wanted) - 1, 1).bit_length() if wanted > REACH_FACTOR * longest else max(longest, 1)
    batches = sorted({1, 4, max(rows, 1), *([concurrency] if concurrency > REACH_FACTOR * rows else [])})
    command = (f"specbench sweep --engine vllm --target {config.get('target', 'MODEL')}"
               + (f" --drafts {drafts}" if drafts else "")
               + f" --context-lengths {lengths} --batch-sizes {','.join(map(str, batches))}")
    return (f"{' and '.join(past)} are more than {REACH_FACTOR:g}× past what the run measured, where its fitted "
            f"step is no evidence; measure there (`{command}`) and plan on that run, or pass --extrapolate (the "
            f"step held linear past the run, an estimate)")


def held_price(price: ServedPrice, reach: dict[str, MeasuredReach], meta: dict) -> ServedPrice:
    """`price` held past what the run measured (`Held`): a step's tokens past its longest prompt
    priced linearly, at the compute roof of the run's machine where it recorded its matmul rate
    (else at the fitted token price); a prompt's attention linear past that length; and a verify's
    re-read cache edge the run never reached (fitted where any edge past its contexts fits alike)
    taken as none."""
    longest = max((r.prompt_tokens for r in reach.values()), default=0)
    context = max((r.context_tokens for r in reach.values()), default=0)
    rate = float((meta.get("hardware") or {}).get("matmul_flops_per_s") or 0.0)
    recorded = (meta.get("architectures") or {}).get("target")
    token_s = pair_s = None
    if rate > 0 and recorded:
        shape = Architecture.from_dict(recorded)
        token_s = 2.0 * shape.layers * shape.layer_parameters / rate  # a prompt token's layers (the head: head_share)
        pair_s = float(shape.attention_flops(1, 1, 1)) / rate
    reread = price.reread_cached_tokens if price.reread_cached_tokens <= context else math.inf
    return replace(price, held=Held(max(longest, 1), token_s, pair_s), reread_cached_tokens=reread)


def beyond_measured(table: pd.DataFrame, reach: dict[str, MeasuredReach], prompts: np.ndarray,
                    traffic: str, running_said: str = "p90 of the busiest replica's time",
                    who: str = "the sized fleets") -> list[str]:
    """Where sized fleets (size_fleets' table) run a price fitted on a run beyond what the run
    measured: more requests at once than a configuration's cells ran, prompts longer than any it
    measured. There the fitted price is read where nothing was measured: a roofline's knee or a
    cache's edge past the run's batches would not be in it. (On the committed CPU replays such cells
    were not predicted worse: measured.json's finding beyond_calibration; it is a label of
    where the price is read, not an error bar.) One sentence each, none where the run covers the fleets.
    `table` has a `configuration` and a `running_p90` column (`running_said` says what it is; `who`
    names what ran it)."""
    notes = []
    longest = max((r.prompt_tokens for r in reach.values()), default=0)
    wanted = float(np.percentile(prompts, 90)) if len(prompts) else 0.0
    if longest and wanted > longest:
        notes.append(f"{traffic}'s prompts run to {wanted:,.0f} tokens (p90); the run's longest was {longest:,}: "
                     f"prefill and attention past it are extrapolated")
    if "running_p90" not in table:
        return notes
    past: dict[int, list[str]] = {}  # the run's most rows at once: the configurations sized past it
    for configuration, group in table.groupby("configuration", sort=False):
        measured = reach.get(str(group["draft"].iloc[0]))
        ran = float(group["running_p90"].max())
        if measured is not None and ran == ran and ran > measured.rows:
            past.setdefault(measured.rows, []).append(f"{configuration} {ran:.0f}")
    for rows, sized in past.items():
        notes.append(f"{who} run more requests at once than the run measured ({rows} at most): "
                     f"{', '.join(sized)} ({running_said}); their step prices there are "
                     f"extrapolated: measure cells at those batch sizes")
    return notes


def served_configurations(cells: pd.DataFrame, requests: pd.DataFrame, meta: dict, source: str = "",
                          held: bool = False):
    """A vLLM run's configurations for the fleet simulator: its baseline and each draft × K it
    measured, priced by the step fitted on the run, each with the acceptance per position the run
    measured (its longest prompts' cell; per decoding row-step, `row_step_acceptance`). One replica
    is one server (`tp` 1). A draft that is the run's target model is a self draft (its prefill
    costs the target's). `held`: the price held past what the run measured (`held_price`)."""
    target = str(recorded_config(meta)["grid"].get("target", ""))
    drafts = tuple(d for d in cells["draft"].unique() if d != AR and target and d == target)
    price, spec = fit_served(cells, requests, meta, source, drafts)
    if held:
        price = held_price(price, measured_reach(cells, requests), meta)
    found = [Configuration(1, AR, 0, "", price.cost(None), replace(spec, request_overhead_s=price.overhead_s), None)]
    ok = cells[(cells["status"] == "ok") & (cells["draft"] != AR) & (cells["k"] > 0)]
    for (draft, k), group in ok.groupby(["draft", "k"], sort=True):
        group = group.sort_values("context_length") if "context_length" in group else group
        reach = row_step_acceptance(group.iloc[-1].to_dict(), requests)
        if not reach:
            continue
        acceptance = _monotone(reach, int(k))
        found.append(Configuration(1, draft, int(k), "measured α", price.cost(draft),
                                   replace(served_replica(meta, draft, int(k)), request_overhead_s=price.overhead_s),
                                   Speculation(int(k), acceptance, seed=COMMON_SEED)))
    return found, price
