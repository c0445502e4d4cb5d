"""`specbench plan`: predictions for K, batch sizes and context lengths a run did not measure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from specbench.cli.common import (UsageError, check_price, console, fail, known_errors, split_list, token_counts,
                                  typed_options)
from specbench.cli.plan_options import check_options
from specbench.cli.render import print_plan, print_trust, print_warnings


def plan(
    ctx: typer.Context,
    run_dir: Optional[Path] = typer.Argument(None, help="Run to plan from (default: the latest under results/)."),
    timings: Optional[Path] = typer.Option(None, help="Run whose step times (hardware) to use (default: RUN_DIR)."),
    acceptance: Optional[Path] = typer.Option(None, help="Run whose fitted α to use (default: RUN_DIR; a "
                                                          "--weights random run: the α it simulated)."),
    alpha: Optional[str] = typer.Option(None, "--alpha", help="Predict at this i.i.d. α for every draft instead "
                                                                 "(with --target: a list, 0.6,0.7,0.8, or a per-position "
                                                                 "profile 0.9/0.8/0.7)."),
    k: str = typer.Option("1,2,3,4,6,8", "--k", help="K values to predict."),
    batch_sizes: str = typer.Option("1,2,4,8,16,32,64", help="Batch sizes to predict."),
    context_lengths: Optional[str] = typer.Option(None, help="Prompt lengths in tokens to predict too (4k = 4096), "
                                                             "with each traffic's measured α (with --target: the "
                                                             "prompt lengths, default 1k)."),
    device: Optional[str] = typer.Option(None, help="With --target: the GPU whose kernel tables price the plan "
                                                    "(h100, h200, b200, a100, ... or a tables' system name; default "
                                                    "h100). With a GPU run: carry its fitted efficiencies to this "
                                                    "GPU's datasheet bandwidth and FLOP/s: h100, h200, a100 or l40s "
                                                    "(an ESTIMATE). With a CPU run: price its models on this GPU's "
                                                    "kernel tables, with its measured α."),
    gpu_price: Optional[float] = typer.Option(None, help="$ per GPU-hour (default: the GPU's price where specbench has one: the run's, or --device's on the tables)."),
    gpus: int = typer.Option(1, help="Devices the deployment uses."),
    max_new_tokens: Optional[int] = typer.Option(None, help="Output tokens per request the predictions assume "
                                                            "(default: the run's --max-new-tokens; with --target: "
                                                            "128)."),
    json_output: bool = typer.Option(False, "--json", help="Print the predictions, the held-out errors and what "
                                                           "they rest on as one JSON object."),
    target: Optional[str] = typer.Option(None, rich_help_panel="On kernel tables, no run",
                                         help="Plan this target on NVIDIA's measured kernel tables instead of a "
                                              "run: an alias (llama3-70b), or a directory with its config.json. "
                                              "Needs pip install 'specbench\\[gpu-tables]'."),
    drafts: str = typer.Option("1b,8b", rich_help_panel="On kernel tables, no run",
                               help="Drafters to price with --target: model aliases or sizes in the target's "
                                    "family, config directories, ngram, eagle (a 1-layer head), mtp or mtp:N."),
    tp: str = typer.Option("1", "--tp", rich_help_panel="On kernel tables, no run",
                           help="Tensor-parallel sizes of the target, e.g. 4,8."),
    draft_tp: Optional[str] = typer.Option(None, "--draft-tp", rich_help_panel="On kernel tables, no run",
                                           help="The draft model's TP: 1 or the target's (default: the "
                                                "target's, as vLLM)."),
    backend: str = typer.Option("vllm", rich_help_panel="On kernel tables, no run",
                                help="Whose kernels: vllm, sglang or trtllm."),
    slo: Optional[str] = typer.Option(None, "--slo", rich_help_panel="On kernel tables, no run",
                                      help="tpot=SECONDS: per TP, the batch that meets it with and without "
                                           "speculation, and the cheaper. With --trace (ttft=,tpot=,e2e=,pNN): "
                                           "the fleet that meets it; with --concurrency: who meets it at each."),
    concurrency: Optional[str] = typer.Option(None, rich_help_panel="Served, simulated on kernel tables",
                                              help="With --target: simulate one vLLM-like replica step by step, "
                                                   "these many clients each sending its next request when the last "
                                                   "finished (4,16,64), with and without speculation. With a "
                                                   "vLLM RUN_DIR: that run's servers, on its fitted steps."),
    input_len: int = typer.Option(1024, rich_help_panel="Served, simulated on kernel tables",
                                  help="--concurrency: prompt tokens per request."),
    output_len: int = typer.Option(1024, rich_help_panel="Served, simulated on kernel tables",
                                   help="--concurrency: output tokens per request."),
    clients: str = typer.Option("steady", rich_help_panel="Served, simulated on kernel tables",
                                help="--concurrency: how the clients send. steady: started apart, the steady "
                                     "state measured; inferencemax: as InferenceMAX's benchmark_serving run (all "
                                     "at once, 10 requests each, lengths 0.8-1× the given, every request "
                                     "measured), to compare with such a benchmark; bench: all at once, 10 "
                                     "requests each at the given lengths, every request measured (vllm bench "
                                     "serve --max-concurrency C, a sweep cell at batch size C)."),
    dtype: Optional[str] = typer.Option(None, rich_help_panel="On kernel tables, no run",
                                        help="With --target: the target's GEMMs (its weights): bf16 (default), fp8 "
                                             "or fp4; a draft model's: --draft-dtype."),
    draft_dtype: Optional[str] = typer.Option(None, rich_help_panel="On kernel tables, no run",
                                              help="With --target: a draft model's GEMMs as its checkpoint holds "
                                                   "them: bf16 (default), fp8 or fp4; an EAGLE head stays "
                                                   "16-bit."),
    kv_cache_dtype: str = typer.Option("auto", rich_help_panel="On kernel tables, no run",
                                       help="With --target: the KV cache as vLLM's --kv-cache-dtype: auto (16-bit) "
                                            "or fp8 (twice the tokens in the same memory, decode attention reading "
                                            "half the bytes)."),
    max_num_seqs: Optional[int] = typer.Option(None, rich_help_panel="Served, simulated on kernel tables",
                                               help="--concurrency, --trace: vLLM's --max-num-seqs for each replica "
                                                    "(default: vLLM's on that GPU)."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, rich_help_panel="Served, simulated on kernel tables",
                                                         help="--concurrency, --trace: vLLM's "
                                                              "--max-num-batched-tokens, the token budget of a step "
                                                              "(default: vLLM's on that GPU)."),
    async_scheduling: Optional[bool] = typer.Option(None, "--async-scheduling/--no-async-scheduling",
                                                    rich_help_panel="Served, simulated on kernel tables",
                                                    help="--concurrency, --trace: schedule each step while the one "
                                                         "before runs, as vLLM does by default on a GPU since 0.14 "
                                                         "(never with n-gram drafting); --no-async-scheduling for "
                                                         "an older vLLM or a server that turns it off."),
    prefix_caching: Optional[bool] = typer.Option(None, "--prefix-caching/--no-prefix-caching",
                                                  rich_help_panel="Served, simulated on kernel tables",
                                                  help="--concurrency, --trace: vLLM's automatic prefix caching "
                                                       "(on by default): a prompt's prefix found cached is not "
                                                       "computed again; a Mooncake trace's hash_ids say what "
                                                       "prompts share. RUN --trace: the run's servers as "
                                                       "measured (specbench's cache nothing) unless given."),
    prefix_len: int = typer.Option(0, rich_help_panel="Served, simulated on kernel tables",
                                   help="--concurrency: every prompt opens with this many tokens in common (a "
                                        "system prompt, part of --input-len), found in the prefix cache after "
                                        "the first."),
    trace: Optional[str] = typer.Option(None, rich_help_panel="Served, simulated on kernel tables",
                                        help="With --slo: serve this trace (azure-conv, azure-code, mooncake-conv "
                                             "or a file) by a fleet of simulated vLLM-like replicas behind a router "
                                             "and find the fewest that meet the SLO, with and without speculation; "
                                             "steps priced on the kernel tables (--target) or fitted on a vLLM run "
                                             "(RUN_DIR)."),
    trace_window: str = typer.Option("", rich_help_panel="Served, simulated on kernel tables",
                                     help="--trace: which seconds of the trace, START:DURATION (default: all)."),
    trace_speedup: str = typer.Option("1", rich_help_panel="Served, simulated on kernel tables",
                                      help="--trace: traffic scales to size for, 1,2,4 (2: twice the requests per "
                                           "second: next quarter's traffic)."),
    headroom: float = typer.Option(0.2, rich_help_panel="Served, simulated on kernel tables",
                                   help="--trace: the SLO must hold at this much more traffic (0.2: 1.2×), a "
                                        "margin from the knee where small errors are large latencies."),
    router: str = typer.Option("least-outstanding", rich_help_panel="Served, simulated on kernel tables",
                               help="--trace: how requests are spread: least-outstanding, round-robin, or "
                                    "prefix-aware (llm-d's default: prefix cache hits and queue length)."),
    chart: Optional[Path] = typer.Option(None, rich_help_panel="Served, simulated on kernel tables",
                                         help="--trace: draw replicas needed against traffic scale to this PNG; "
                                              "--concurrency: tokens/s per GPU and TPOT against the clients."),
    extrapolate: bool = typer.Option(False, "--extrapolate", rich_help_panel="Served, simulated on kernel tables",
                                     help="RUN_DIR with --trace or --concurrency: plan prompts (p90) or clients more "
                                          "than 2× past what the run measured (refused without it), the fitted "
                                          "step held linear past the run (docs/fleet.md)."),
    calibrate: Optional[Path] = typer.Option(None, rich_help_panel="On kernel tables, no run",
                                             help="A native or vLLM run measured on a GPU the tables hold, "
                                                  "the plan's or another: what it measured corrects the tables "
                                                  "(decode, verify, draft, prefill; vLLM: per step), any model "
                                                  "size."),
) -> None:
    """What-if: predicted speed-up, tokens/s, B* and cost for K, batch sizes and context lengths
    not measured, from the roofline performance model fitted on the run (docs/performance-model.md);
    with --target, from NVIDIA's measured kernel tables at any GPU and TP size, with no run."""
    import pandas as pd

    try:
        mode = check_options(typed_options(ctx), target is not None)
    except UsageError as error:
        fail(str(error))
    if mode in ("tables-concurrency", "tables-trace"):
        _plan_fleet(run_dir, target, drafts, device, backend, tp, draft_tp, k, concurrency, input_len, output_len,
                    alpha, acceptance, dtype, json_output, slo, calibrate, trace, trace_window, trace_speedup,
                    headroom, router, chart, gpu_price, clients, kv_cache_dtype, max_num_seqs, max_num_batched_tokens,
                    async_scheduling, draft_dtype, prefix_caching, prefix_len)
        return
    if mode == "run-trace":
        _plan_served_fleet(run_dir, trace, trace_window, trace_speedup, slo, headroom, router, chart, gpu_price,
                           json_output, prefix_caching, extrapolate)
        return
    if mode == "run-concurrency":
        _plan_served_closed_loop(run_dir, concurrency, input_len, output_len, clients, slo, prefix_len, trace,
                                 prefix_caching, chart, gpu_price, json_output, extrapolate)
        return
    if mode == "tables":
        _plan_on_tables(run_dir, timings, target, drafts, device, backend, tp, draft_tp, k, batch_sizes,
                        context_lengths, max_new_tokens, alpha, acceptance, gpu_price, gpus, slo, json_output,
                        calibrate, dtype, kv_cache_dtype, draft_dtype)
        return
    try:
        alpha = _one_alpha(alpha)
    except known_errors() as error:
        fail(str(error))

    from specbench import fit
    from specbench.fit.noise import run_noise
    from specbench.results import load_run

    try:
        ks, sizes, contexts = _grid(k, batch_sizes, context_lengths, max_new_tokens)
        check_price(gpu_price, gpus)
        timings = load_run(timings or run_dir)
        if device is not None and _ran_on_a_cpu(timings.meta):
            _cpu_run_on_tables(timings, acceptance, device, ks, sizes, contexts, max_new_tokens, alpha, gpu_price,
                               gpus, json_output)
            return
        if device is not None and device.lower() not in fit.DEVICES:
            raise UsageError(f"--device must be one of {', '.join(fit.DEVICES)}, got {device!r}")
        run_tokens = int((timings.meta.get("config") or {}).get("max_new_tokens", 1))
        output_tokens = max_new_tokens or run_tokens
        if contexts or max_new_tokens:  # as the sweep would refuse them: prompts of that length plus the run's output must fit
            from specbench.grid import SweepConfig, check_context_limit, target_shape

            recorded = timings.meta.get("config") or {}
            asked = SweepConfig(target=recorded.get("target", ""), ks=ks, context_lengths=contexts,
                                max_new_tokens=output_tokens)
            check_context_limit(asked, target_shape(asked))
        accept_run = load_run(acceptance or run_dir) if (acceptance or run_dir) else timings
        models = fit.cost_models(timings.cells, timings.steps, timings.requests, timings.meta)
        engine = (timings.meta.get("engine") or {}).get("name", "native")
        if not models and engine != "native":
            raise UsageError(f"{timings.path}: a {'vLLM' if engine == 'vllm' else engine} run has no decode step "
                             f"times (a served engine is timed per request, not per step), and plan fits its model on "
                             f"them; measure the target on the native engine (`specbench sweep --target ...`) and "
                             f"plan from that run (its acceptance may still come from this one: --acceptance)")
        if not models:
            raise UsageError(f"{timings.path}: no finished autoregressive cells with step times to fit (or the "
                             f"target's shapes are unknown)")
        models = fit.with_output_tokens(models, output_tokens) if max_new_tokens else models
        alphas = fit.model_alphas(accept_run.cells, accept_run.steps)
        drafts = _plan_drafts(models, alphas, alpha)
        left_out = _drafts_left_out(models, alphas, alpha, drafts, timings.path, accept_run.path)
        if not drafts:
            raise UsageError("no draft has both step times and an α (give --acceptance RUN or --alpha)"
                             + (f": {'; '.join(left_out)}" if left_out else ""))
        transferred = _transferred(timings, accept_run) if alpha is None else ""
        if alpha is not None:
            alphas = pd.DataFrame([{"draft": d, "workload": w, "temperature": t, "context_length": c,
                                    "alpha_iid": alpha} for d in drafts for (w, t, c) in models])
        note = ""
        if device is not None:
            models, note = _on_device(models, timings.meta, device.lower())
        price, price_note = (gpu_price, "given") if gpu_price is not None else \
            fit.default_gpu_price({"gpus": [{"name": fit.DEVICES[device.lower()]["name"]}]} if device else
                                  timings.meta.get("hardware", {}))
        table = fit.plan_table(models, alphas, drafts, ks, sizes, price, gpus, contexts)
        comparable = alpha is None and accept_run.path == timings.path and device is None \
            and output_tokens == run_tokens  # the run measured what the model predicts at its cells
        table = fit.attach_measured(table, timings.cells) if comparable else table.assign(speedup_measured=float("nan"))
    except known_errors() as error:
        fail(str(error))
    unit = "$/1M tok" if price is not None else "device-h/1M tok"
    trust = fit.trust_lines(timings, pd.DataFrame(), fit.held_out(timings.cells, timings.steps, timings.requests,
                                                              timings.meta))
    stopped = fit.completeness(timings.meta, timings.cells).describe()
    warnings = ([stopped] if stopped else []) + fit.measurement_warnings(
        timings.cells, noise=run_noise(timings.cells, timings.requests, timings.steps))
    simulated = alpha is None and not alphas.empty and "alpha_source" in alphas \
        and (alphas[alphas["draft"].isin(drafts)]["alpha_source"] == "simulated").any()
    alpha_source = f"--alpha {alpha:g}" if alpha is not None else \
        str(accept_run.path) + (" (the α it simulated: a timing-only run)" if simulated else "")
    if json_output:
        print(json.dumps({"step_times_from": str(timings.path), "alpha_from": alpha_source,
                          "output_tokens": output_tokens, "estimate": note or None, "price": price_note,
                          "acceptance_transferred": transferred or None, "drafts_left_out": left_out,
                          "trust": trust, "warnings": warnings,
                          "predictions": json.loads(table.to_json(orient="records"))}, indent=2))
        return
    label = "[bold red]ESTIMATE[/] for " + note if note else "[bold yellow]PREDICTIONS[/]"
    console.print(f"{label} from step times of {timings.path} and α of {alpha_source} (not measurements; "
                  f"{price_note}); {output_tokens} output tokens per request"
                  + (" (--max-new-tokens)" if max_new_tokens else " (the run's; --max-new-tokens to change)"),
                  highlight=False, soft_wrap=True)
    for line in ([f"TRANSFERRED ACCEPTANCE: {transferred}"] if transferred else []) + \
            [f"left out: {why}" for why in left_out]:
        console.print(line, highlight=False, soft_wrap=True)
    print_warnings(warnings)
    print_trust(trust)
    print_plan(table, sizes, unit)
    console.print(f"{fit.b_star_rule()}; {fit.best_draft_rule()}", highlight=False, soft_wrap=True)


def _plan_drafts(models: dict, alphas, alpha: float | None) -> list[str]:
    """Drafts with step times in the timing run and an α (from the acceptance run, or --alpha)."""
    from specbench.fit import base_draft

    timed = {base_draft(d) for m in models.values() for d in list(m.times.drafts) + list(m.measured_ks)}
    if alpha is not None:
        return sorted({d for m in models.values() for d in m.measured_ks})
    known = set(alphas["draft"]) if not alphas.empty else set()
    return sorted(d for d in known if base_draft(d) in timed)


def _drafts_left_out(models: dict, alphas, alpha: float | None, planned: list[str], timings: Path,
                     acceptance: Path) -> list[str]:
    """Each draft one run has and the other lacks, and why it is not planned: never dropped silently."""
    from specbench.fit import base_draft

    timed = {base_draft(d) for m in models.values() for d in list(m.times.drafts) + list(m.measured_ks)}
    known = set(alphas["draft"]) if alpha is None and not alphas.empty else set()
    chosen = {base_draft(d) for d in planned}
    why = [f"{d}: an α in {acceptance} but no step times in {timings}" for d in sorted(known)
           if base_draft(d) not in timed]
    why += [f"{d}: step times in {timings} but no α in {acceptance} (give --alpha to plan it)"
            for d in sorted(timed - chosen - {base_draft(k) for k in known}) if alpha is None]
    return why


def _transferred(timings, acceptance) -> str:
    """The label of acceptance measured with another target than the step times' (or a timing-only
    run's simulated α on a real run's times): a transfer, never silent."""
    theirs = (acceptance.meta.get("config") or {}).get("target", "?")
    ours = (timings.meta.get("config") or {}).get("target", "?")
    if acceptance.path == timings.path or theirs == ours:
        return ""
    return (f"the α was measured with target {theirs} ({acceptance.path}) and is applied to {ours}'s step times "
            f"({timings.path}); a draft accepted by one target is not always accepted as often by another")


def _on_device(models: dict, meta: dict, device: str) -> tuple[dict, str]:
    """Every model's step times carried to `device`'s datasheet peaks (the efficiencies kept)."""
    import copy

    from specbench import fit

    gpus = (meta.get("hardware") or {}).get("gpus") or []
    measured = fit.device_key(gpus[0]["name"]) if gpus else None
    if measured is None:
        raise UsageError(f"--device needs a run on a known GPU ({', '.join(fit.DEVICES)}); this one ran on "
                         f"{gpus[0]['name'] if gpus else 'a CPU'}, whose efficiencies do not carry to a GPU")
    moved = {}
    for key, model in models.items():
        clone = copy.copy(model)
        clone.times = model.times.on_datasheet(measured, device)
        moved[key] = clone
    return moved, (f"{fit.DEVICES[device]['name']}: efficiencies fitted on {gpus[0]['name']} carried to its "
                   f"datasheet bandwidth and FLOP/s; overheads kept")


def _ran_on_a_cpu(meta: dict) -> bool:
    return not (meta.get("hardware") or {}).get("gpus")


def _cpu_run_on_tables(run, acceptance: Path | None, device: str, ks: list[int], sizes: list[int],
                       contexts: list[int] | None, max_new_tokens: int | None, alpha: float | None,
                       gpu_price: float | None, gpus: int, json_output: bool) -> None:
    """`plan CPU_RUN --device GPU`: a CPU's fitted efficiencies say nothing of a GPU's, so the run's
    target and drafts are priced on that GPU's kernel tables instead, with the α the run measured
    (as `plan --target T --drafts D --acceptance RUN --device GPU` would)."""
    from specbench.cli.plan_tables import plan_from_tables
    from specbench.fit.calibration import run_configs

    if gpus != 1:
        raise UsageError("--gpus: a CPU run planned on a GPU's kernel tables is priced per replica at TP1; for "
                         "other TP sizes use --target with --tp")
    config = run.meta.get("config") or {}
    target, _, model_drafts = run_configs(run.meta)
    drafts = list(dict.fromkeys([name for name, _ in model_drafts.values()]
                                + ["ngram" for label in config.get("drafts", []) if str(label).startswith("ngram")]))
    if not drafts:
        raise UsageError(f"{run.path} ran on a CPU and has no draft the kernel tables can price (a model draft of a "
                         f"known alias, or n-gram)")
    asked = f"--target {target} --drafts {','.join(drafts)} --acceptance {acceptance or run.path} --device {device}"
    note = (f"NOTE: {run.path} ran on a CPU, whose efficiencies do not carry to a GPU: its models are priced on the "
            f"{device} kernel tables with its measured α (as `specbench plan {asked}`)")
    given, measured = (f"{alpha:g}", None) if alpha is not None else (None, acceptance or run.path)
    plan_from_tables(target, ",".join(drafts), device, "vllm", "1", None, ks, sizes, contexts or [1024],
                     max_new_tokens or int(config.get("max_new_tokens") or 128), given, measured, gpu_price, None,
                     json_output, notes=[note])


def _one_alpha(text: str | None) -> float | None:
    """A run's plan takes one i.i.d. α."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--alpha: with a run, one number in [0, 1) (lists and profiles plan with --target), "
                         f"got {text!r}") from None
    if not 0 <= value < 1:
        raise UsageError(f"--alpha must be in [0, 1), got {value:g}")
    return value


def _plan_on_tables(run_dir, timings, target, drafts, device, backend, tp, draft_tp, k, batch_sizes, context_lengths,
                    max_new_tokens, alpha, acceptance, gpu_price, gpus, slo, json_output, calibrate, dtype=None,
                    kv_cache_dtype="auto", draft_dtype=None) -> None:
    from specbench.cli.plan_tables import check_precision, plan_from_tables

    try:
        gemm_quant, draft_gemm_quant = check_precision(dtype, kv_cache_dtype, draft_dtype)
        if calibrate is not None and (gemm_quant or draft_gemm_quant or kv_cache_dtype != "auto"):
            raise UsageError("--calibrate corrects the tables' 16-bit forwards by what a run measured: leave --dtype, "
                             "--draft-dtype and --kv-cache-dtype out with it")
        ks, sizes, contexts = _grid(k, batch_sizes, context_lengths, max_new_tokens)
        check_price(gpu_price, 1)
        plan_from_tables(target, drafts, device or "h100", backend, tp, draft_tp, ks, sizes, contexts or [1024],
                         max_new_tokens or 128, alpha, acceptance, gpu_price, slo, json_output, calibrate,
                         gemm_quant=gemm_quant, kv_cache_dtype=kv_cache_dtype, draft_gemm_quant=draft_gemm_quant)
    except known_errors() as error:  # TablesUnavailable is a ValueError
        fail(str(error))


def _plan_fleet(run_dir, target, drafts, device, backend, tp, draft_tp, k, concurrency, input_len, output_len, alpha,
                acceptance, dtype, json_output, slo, calibrate, trace, trace_window, trace_speedup, headroom, router,
                chart, gpu_price, clients, kv_cache_dtype="auto", max_num_seqs=None, max_num_batched_tokens=None,
                async_scheduling=None, draft_dtype=None, prefix_caching=None, prefix_len=0) -> None:
    from specbench.cli.plan_fleet import FleetAsk, TrafficAsk, plan_fleet

    try:
        if chart is not None and chart.suffix.lower() != ".png":
            raise UsageError(f"--chart {chart}: write a .png file")
        if trace is not None and slo is None:
            raise UsageError("--trace sizes the fleet that meets an SLO: give --slo (e.g. ttft=2,tpot=0.05,p90)")
        ks = split_list(k, int, "--k")
        if any(x < 1 for x in ks):
            raise UsageError("--k must be >= 1")
        check_price(gpu_price, 1)
        traffic = TrafficAsk(trace, trace_window, split_list(trace_speedup, float, "--trace-speedup"), slo, headroom,
                             router, chart, gpu_price) if trace is not None else None
        ask = FleetAsk(target=target, drafts=drafts, device=device or "h100", backend=backend, tps=tp,
                       draft_tp=draft_tp, ks=ks, alpha=alpha, acceptance=acceptance, dtype=dtype,
                       concurrencies=split_list(concurrency, int, "--concurrency") if concurrency else [],
                       input_len=input_len, output_len=output_len, traffic=traffic, clients=clients,
                       kv_cache_dtype=kv_cache_dtype, draft_dtype=draft_dtype, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens, async_scheduling=async_scheduling,
                       prefix_caching=prefix_caching, prefix_len=prefix_len, gpu_price=gpu_price, slo=slo if trace is None else None,
                       chart=chart if trace is None else None)
        plan_fleet(ask, json_output)
    except known_errors() as error:
        fail(str(error))


def _plan_served_fleet(run_dir, trace, trace_window, trace_speedup, slo, headroom, router, chart, gpu_price,
                       json_output, prefix_caching=None, extrapolate=False) -> None:
    from specbench.cli.plan_fleet import TrafficAsk, plan_served_fleet

    try:
        if slo is None:
            raise UsageError("--trace sizes the fleet that meets an SLO: give --slo (e.g. ttft=2,tpot=0.05,p90)")
        check_price(gpu_price, 1)
        plan_served_fleet(run_dir, TrafficAsk(trace, trace_window, split_list(trace_speedup, float, "--trace-speedup"),
                                              slo, headroom, router, chart, gpu_price), json_output, prefix_caching,
                          extrapolate)
    except known_errors() as error:
        fail(str(error))


def _plan_served_closed_loop(run_dir, concurrency, input_len, output_len, clients, slo, prefix_len, trace,
                             prefix_caching, chart, gpu_price, json_output, extrapolate=False) -> None:
    from specbench.cli.plan_fleet import ClosedLoopAsk, plan_served_closed_loop

    try:
        if run_dir is None:
            raise UsageError("--concurrency simulates served replicas: give --target MODEL (on the kernel tables) "
                             "or RUN_DIR (the servers a vLLM run measured)")
        check_price(gpu_price, 1)
        plan_served_closed_loop(run_dir, ClosedLoopAsk(split_list(concurrency, int, "--concurrency"), input_len,
                                                       output_len, clients, prefix_len, slo, chart),
                                json_output, prefix_caching, gpu_price, extrapolate)
    except known_errors() as error:
        fail(str(error))


def _grid(k: str, batch_sizes: str, context_lengths: str | None, max_new_tokens: int | None):
    """(K, batch sizes, context lengths) asked, each >= 1 (no context lengths: [])."""
    ks, sizes = split_list(k, int, "--k"), split_list(batch_sizes, int, "--batch-sizes")
    contexts = token_counts(context_lengths, "--context-lengths") if context_lengths else []
    if any(x < 1 for x in ks + sizes + contexts + [max_new_tokens or 1]):
        raise UsageError("--k, --batch-sizes, --context-lengths and --max-new-tokens must be >= 1")
    return ks, sizes, contexts
