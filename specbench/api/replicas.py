"""The replicas the served plans simulate (specbench.fleet; docs/guides/size-a-fleet.md): vLLM-like replicas
priced on the kernel tables, or the servers a vLLM run measured with their step price fitted on
it; and a trace read as the traffic they serve. Closed loops (api.closed_loop) and fleets
(api.size_fleet) share them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.api.errors import UsageError


@dataclass(kw_only=True)
class Simulated:
    """What the served plans' answers share besides their table: where the replicas ran, what they
    left out, the chart drawn and the seconds it took."""
    where: str = ""  # the tables' GPU, in sentences and a chart's title ("" for a run's servers)
    device: str = "GPU"  # what one replica's devices are called: GPU on the tables, server for a run's
    left_out: list[str] = field(default_factory=list)  # drafters not simulated, and why
    transferred: str = ""  # the α measured with another target
    chart: Path | None = None
    seconds: float = 0.0


@dataclass
class TablesReplica:
    """One vLLM-like replica on the kernel tables, the drafters it speculates with and their
    acceptance, and `head`: what `--json` and the header say it rests on."""
    planner: Any  # fit.table_plan.TablePlanner
    drafters: list
    accepted: list  # fit.table_plan.Acceptance rows
    tp: list[int]
    draft_tp: int | None
    target_config: dict
    server: Any  # fleet.tables.ServerFlags
    gemm_quant: str | None
    head: dict
    left_out: list[str] = field(default_factory=list)
    transferred: str = ""


def tables_replica(target: str, *, drafts: Sequence[str], alpha: str | float | None, acceptance: Path | str | None,
                   device: str, backend: str, tp: Sequence[int], draft_tp: int | None, dtype: str | None,
                   draft_dtype: str | None, kv_cache_dtype: str, clients: str, max_num_seqs: int | None,
                   max_num_batched_tokens: int | None, async_scheduling: bool | None, prefix_caching: bool | None,
                   check_load, fits: tuple[int, int] | None, expert_parallel: bool = False) -> TablesReplica:
    """The replica asked on the tables, its options checked in the command's order (`check_load`:
    the load's own checks); `fits`: (prompt, output) tokens a request must fit in the context."""
    from specbench.api.tables import check_fits_context, check_layout, check_precision, check_tp, gather_acceptance, \
        target_and_drafters
    from specbench.fit import kernel_tables
    from specbench.fit import table_plan as tp_plan
    from specbench.fit.host_cost import PIECEWISE_LAYER_MS, PIECEWISE_SOURCE, VLLM_API_SERVER_REQUEST, described
    from specbench.fleet.plan import CLIENTS
    from specbench.fleet.tables import ServerFlags, moe_silicon_check, silicon_check

    if clients not in CLIENTS:
        raise UsageError(f"--clients must be one of {', '.join(CLIENTS)}, got {clients!r}")
    gemm_quant, draft_gemm_quant = check_precision(dtype, kv_cache_dtype, draft_dtype)
    server = ServerFlags(kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, async_scheduling=async_scheduling,
                         prefix_caching=prefix_caching)  # its flags checked (one line each)
    check_load()
    tp_sizes = check_tp(tp, draft_tp)
    system = kernel_tables.check_device(device, backend)
    family, target_name, target_config, drafters = target_and_drafters(target, drafts)
    layout_notes = check_layout(target_name, target_config, 1, expert_parallel, gemm_quant, tp_sizes)
    if fits is not None:  # (a trace's rows past the context are left out, and counted, as it is read)
        check_fits_context(target_name, target_config, *fits, f"--input-len {fits[0]} + --output-len {fits[1]}")
    if alpha is None and acceptance is None:  # the baseline alone: speculation needs an acceptance
        left_out = [f"{', '.join(d.name for d in drafters)}: no acceptance to simulate speculation with (--alpha "
                    f"0.6,0.7,0.8 or --acceptance RUN): the baseline alone"]
        drafters, accepted, transferred, alpha_from = [], [], "", None  # the head says: no speculation simulated
    else:
        drafters, accepted, left_out, transferred, alpha_from = gather_acceptance(
            drafters, alpha, acceptance, target_name, family)
    planner = tp_plan.TablePlanner(target_config, target_name, system, backend, draft_gemm_quant=draft_gemm_quant,
                                   expert_parallel=expert_parallel)
    head = {"estimate": f"SIMULATED on {kernel_tables.label(system, backend)}", "target": target_name,
            "device": system, "backend": backend,
            "dtype": dtype or ("the checkpoint's precision" if layout_notes else "bf16"), "draft_dtype": draft_dtype or "bf16",
            "kv_cache_dtype": kv_cache_dtype, "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens, "async_scheduling": async_scheduling,
            "server_flags": server.described(), **planner.described_host(),
            "graph_pieces": {"per_layer_ms": PIECEWISE_LAYER_MS, "cudagraph_mode": server.cudagraph_mode,
                             "measured": PIECEWISE_SOURCE}, "api_server": described(VLLM_API_SERVER_REQUEST),
            "alpha_from": alpha_from,
            "acceptance_transferred": transferred or None,
            "checked": moe_silicon_check(system, target_name, backend) if layout_notes else
            silicon_check(system, backend, tuple(tp_sizes)),
            "layout": layout_notes, **({"expert_parallel": expert_parallel} if layout_notes else {})}
    return TablesReplica(planner, drafters, accepted, tp_sizes, draft_tp, target_config, server, gemm_quant, head,
                         left_out, transferred)


def check_chart(chart: Path | str | None) -> Path | None:
    if chart is not None and Path(chart).suffix.lower() != ".png":
        raise UsageError(f"--chart {chart}: write a .png file")
    return Path(chart) if chart is not None else None


def served_run(run: Path | str | None, prefix_caching: bool | None, held: bool = False, check=None):
    """A vLLM run's servers for the simulator: the run, its configurations (the step price fitted on
    it, `held` past what it measured; caching prefixes if `prefix_caching` says so, None: as
    specbench's servers run, not caching), the price, and the head --json and the header print.
    `check(run)` raises before the fit where the ask is out of the run's reach."""
    from specbench.fleet.served import replay_check, served_configurations
    from specbench.results import load_run, recorded_config

    run = load_run(run)
    engine = (run.meta.get("engine") or {}).get("name", "native")
    if engine not in ("vllm", "endpoint"):
        raise UsageError(f"{run.path}: a {engine} run; plan RUN --trace or --concurrency fits a served step on a "
                         f"served run's requests (sweep --engine vllm or --endpoint), or plans on the kernel tables "
                         f"with --target MODEL")
    if check is not None:
        check(run)
    config = recorded_config(run.meta)
    found, price = served_configurations(run.cells, run.requests, run.meta, str(run.path), held)
    if prefix_caching is not None:
        found = [dataclasses.replace(c, spec=dataclasses.replace(c.spec, prefix_caching=prefix_caching))
                 for c in found]
    head = {"estimate": f"SIMULATED on steps fitted on {run.path}",
            "target": str(config["grid"].get("target", "the target")),
            "device": "as measured", "backend": "vllm", "dtype": config["engine"].get("dtype") or "as measured",
            "alpha_from": f"{run.path} (each draft's measured acceptance per position)", "acceptance_transferred": None,
            "step_fitted": {**{name: float(getattr(price, name)) for name in (
                "floor_s", "fixed_s", "per_token_s", "per_context_token_s", "per_prefill_pair_s", "overhead_s",
                "head_share")}, "reread_cached_tokens": (None if math.isinf(price.reread_cached_tokens)
                                                         else float(price.reread_cached_tokens))},
            "server_flags": "" if prefix_caching is None else "prefix caching" if prefix_caching
            else "no prefix caching", "checked": replay_check(run.meta),
            "held": _held_said(price)}
    return run, found, price, head


def _held_said(price) -> str | None:
    """How the fitted step is read past the run (--extrapolate), in a sentence; None: as fitted."""
    held = price.held
    if held is None:
        return None
    tokens = (f"at its machine's compute roof ({held.token_rate_s(price) * 1e3:.2f} ms a token, from the matmul "
              f"rate the run recorded)" if held.token_s else
              f"at the fitted {price.per_token_s * 1e3:.2f} ms a token (the run recorded no matmul rate for a roof)")
    return (f"past the run's longest prompt ({held.prompt_tokens:,} tokens) a step's tokens are priced linearly "
            f"{tokens} and a prompt token's attention " + ("by the roof's pairs" if held.pair_s else
                                                          "as at that length") + "; a likely estimate only")


def server_note(head: dict) -> str:
    """", KV cache fp8, 4096 tokens a step" where the replica's server flags are not vLLM's defaults."""
    flags = head.get("server_flags") or ""
    return f", {flags}" if flags else ""


def replay_evidence(head: dict, device: str):
    """`fleet.served.direction_note` for a plan on a run whose servers the CPU replays checked (the
    sentences then say what those replays said of an effect that size), else None."""
    from specbench.fleet.served import direction_note

    return direction_note if device == "server" and head.get("checked", "").startswith("checked") else None


def load_traffic(trace: str, window: str, context_limit: int):
    """The trace's requests at 1× (rows beyond the target's context skipped), as a fleet.Traffic,
    and the replay it came from (what was skipped)."""
    import numpy as np

    from specbench import traces
    from specbench.fleet.sizing import Traffic

    replay = traces.replay(traces.load_trace(trace), window, 1.0, max_context=context_limit)
    if len(replay.requests) < 2:
        raise UsageError(f"--trace {trace}: {len(replay.requests)} request in the window; a traffic needs two or more")
    requests = replay.requests
    start, end = replay.window
    name = f"{replay.trace} {start:g}–{end:.0f} s" if window else replay.trace
    shared = replay.hash_block_tokens and any(r.hash_ids for r in requests)
    traffic = Traffic(name, np.array([r.arrival_s for r in requests]),
                      np.array([r.input_tokens for r in requests]), np.array([r.output_tokens for r in requests]),
                      [r.hash_ids for r in requests] if shared else None, replay.hash_block_tokens if shared else 0)
    return traffic, replay
