"""`specbench plan`: predictions for K, batch sizes and context lengths a run did not measure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperCommand

from specbench.api.inputs import check_grid
from specbench.cli.common import UsageError, check_price, fail, known_errors, split_list, token_counts, typed_options
from specbench.cli.plan_options import check_options
from specbench.cli.render import print_prediction


class PlanCommand(TyperCommand):
    """`plan`, whose --help after the options that pick a question (`plan --target M --help`) shows
    only the options that apply to that question."""

    help_mode: str | None = None

    def parse_args(self, ctx, args):
        from specbench.cli.plan_options import help_mode

        self.help_mode = help_mode(list(args)) if "--help" in args else None
        return super().parse_args(ctx, args)

    def get_params(self, ctx):
        from specbench.cli.plan_options import APPLIES

        params = super().get_params(ctx)
        if self.help_mode is None:
            return params
        return [p for p in params if p.name not in APPLIES or self.help_mode in APPLIES[p.name]]

    def format_help(self, ctx, formatter):
        from specbench.cli.plan_options import MODES

        epilog = self.epilog
        if self.help_mode is not None:
            self.epilog = f"The options of {MODES[self.help_mode]}; specbench plan --help shows every option."
        try:
            return super().format_help(ctx, formatter)
        finally:
            self.epilog = epilog


def plan(
    ctx: typer.Context,
    run_dir: Optional[Path] = typer.Argument(None, help="Run to plan from (default: the latest under results/)."),
    timings: Optional[Path] = typer.Option(None, help="Run whose step times (hardware) to use (default: RUN_DIR)."),
    acceptance: Optional[Path] = typer.Option(None, help="Run whose fitted α to use (default: RUN_DIR; a "
                                                          "--weights random run: the α it simulated). With --target: "
                                                          "or published:NAME, a published preset (deepseek-v3-mtp, "
                                                          "gpt-oss-120b-eagle3, llama3.1-8b-eagle3), labelled as "
                                                          "such in the answer."),
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
                                    "family, config directories, ngram, eagle (a 1-layer head), eagle3 (that "
                                    "head over 3 target layers), mtp or mtp:N."),
    tp: str = typer.Option("1", "--tp", rich_help_panel="On kernel tables, no run",
                           help="Tensor-parallel sizes of the target, e.g. 4,8."),
    draft_tp: Optional[str] = typer.Option(None, "--draft-tp", rich_help_panel="On kernel tables, no run",
                                           help="The draft model's TP: 1 or the target's (default: the "
                                                "target's, as vLLM)."),
    dp: int = typer.Option(1, "--dp", rich_help_panel="On kernel tables, no run",
                           help="A mixture-of-experts target's data-parallel attention ranks (vLLM's "
                                "--data-parallel-size): tp × dp GPUs a replica, the batch split over the "
                                "ranks, the experts over all the GPUs."),
    ep: bool = typer.Option(False, "--ep", rich_help_panel="On kernel tables, no run",
                            help="A mixture-of-experts target's experts whole on each GPU (vLLM's "
                                 "--enable-expert-parallel), not each split over them."),
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
    replicas: Optional[int] = typer.Option(None, rich_help_panel="Served, simulated on kernel tables",
                                           help="--trace: simulate this many replicas as they are, not sized: "
                                                "TTFT, TPOT and E2E p50/p90/p99 with and without speculation at "
                                                "each --trace-speedup, and where speculation stops paying as the "
                                                "traffic rises (--slo optional)."),
    router: str = typer.Option("least-outstanding", rich_help_panel="Served, simulated on kernel tables",
                               help="--trace: how requests are spread: least-outstanding, round-robin, or "
                                    "prefix-aware (llm-d's default: prefix cache hits and queue length)."),
    chart: Optional[Path] = typer.Option(None, rich_help_panel="Served, simulated on kernel tables",
                                         help="--trace: draw replicas needed against traffic scale to this PNG; "
                                              "--concurrency: tokens/s per GPU and TPOT against the clients."),
    extrapolate: bool = typer.Option(False, "--extrapolate", rich_help_panel="Served, simulated on kernel tables",
                                     help="RUN_DIR with --trace or --concurrency: plan prompts (p90) or clients more "
                                          "than 2× past what the run measured (refused without it), the fitted "
                                          "step held linear past the run (docs/guides/size-a-fleet.md)."),
    calibrate: Optional[Path] = typer.Option(None, rich_help_panel="On kernel tables, no run",
                                             help="A native or vLLM run measured on a GPU the tables hold, "
                                                  "the plan's or another: what it measured corrects the tables "
                                                  "(decode, verify, draft, prefill; vLLM: per step), any model "
                                                  "size."),
) -> None:
    """What-if: speed-up, tokens/s and cost of speculative decoding where nothing was measured.

    \b
    The options given pick the question:
    RUN_DIR: the model fitted on a run, at K, batch sizes and context lengths it did not measure.
    --target MODEL --tp 4,8: static batches priced on NVIDIA's kernel tables at any GPU, no run.
    --concurrency 4,16 (with --target, or a vLLM RUN_DIR): one replica under closed-loop clients.
    --trace T --slo S (with --target, or a vLLM RUN_DIR): the fewest replicas that meet the SLO.
    --trace T --replicas N: N replicas as they are, at the trace's traffic and faster.
    An option that does not apply to the question asked is refused, naming the one that does;
    --help after a question's options (plan --target M --help) shows only that question's."""
    try:
        mode = check_options(typed_options(ctx), target is not None)
    except UsageError as error:
        fail(str(error))
    from specbench import api

    def on_tables() -> dict:  # the replica on the tables, as --target's options say
        return {"drafts": split_list(drafts, str, "--drafts"), "tp": split_list(tp, int, "--tp"),
                "draft_tp": None if draft_tp in (None, "tp") else split_list(draft_tp, int, "--draft-tp")[0],
                "alpha": alpha, "acceptance": acceptance, "device": device or "h100", "backend": backend,
                "dtype": dtype, "draft_dtype": draft_dtype, "kv_cache_dtype": kv_cache_dtype,
                "expert_parallel": ep, **({"dp": dp} if mode == "tables" else {})}

    def served() -> dict:  # vLLM's server flags, for a replica on the tables
        return {"ks": split_list(k, int, "--k"), "max_num_seqs": max_num_seqs,
                "max_num_batched_tokens": max_num_batched_tokens, "async_scheduling": async_scheduling}

    try:
        if mode == "tables":
            ks, sizes, contexts = _grid(k, batch_sizes, context_lengths, max_new_tokens)
            answer = api.price(target, **on_tables(), ks=ks, batch_sizes=sizes, context_lengths=contexts or [1024],
                               output_tokens=max_new_tokens or 128, gpu_price=gpu_price, slo=slo, calibrate=calibrate)
        elif mode.endswith("-concurrency"):
            from specbench.cli.plan_fleet import progress

            load = {"concurrency": split_list(concurrency, int, "--concurrency"), "input_len": input_len,
                    "output_len": output_len, "clients": clients, "prefix_len": prefix_len,
                    "prefix_caching": prefix_caching, "gpu_price": gpu_price, "slo": slo, "chart": chart}
            with progress("simulating") as on_progress:
                answer = api.closed_loop(target, **load, **on_tables(), **served(), on_progress=on_progress) \
                    if target is not None else \
                    api.closed_loop_on_run(run_dir, **load, extrapolate=extrapolate, on_progress=on_progress)
        elif mode.endswith("-trace"):
            from specbench.cli.plan_fleet import progress

            load = {"trace": trace, "slo": slo, "trace_window": trace_window, "router": router,
                    "scales": split_list(trace_speedup, float, "--trace-speedup"), "prefix_caching": prefix_caching,
                    "gpu_price": gpu_price, "chart": chart}
            if replicas is not None:
                if "headroom" in typed_options(ctx):
                    raise UsageError("--headroom does not apply to a given fleet (--replicas): it is the margin a "
                                     "sized fleet (--trace without --replicas) keeps")
                with progress("simulating") as on_progress:
                    answer = api.fleet_as_is(target, **load, replicas=replicas, **on_tables(), **served(),
                                             on_progress=on_progress) if target is not None else \
                        api.fleet_as_is_on_run(run_dir, **load, replicas=replicas, extrapolate=extrapolate,
                                               on_progress=on_progress)
            else:
                with progress("sizing") as on_progress:
                    answer = api.size_fleet(target, **load, headroom=headroom, **on_tables(), **served(),
                                            on_progress=on_progress) if target is not None else \
                        api.size_fleet_on_run(run_dir, **load, headroom=headroom, extrapolate=extrapolate,
                                              on_progress=on_progress)
        else:
            answer = _on_run(run_dir, timings, acceptance, alpha, k, batch_sizes, context_lengths, max_new_tokens,
                             device, gpu_price, gpus)
    except known_errors() as error:  # TablesUnavailable is a ValueError
        fail(str(error))
    _show(answer, json_output)


def _show(answer, json_output: bool) -> None:
    """An api answer as --json prints it, or as tables and lines."""
    from specbench import api

    if json_output:
        print(json.dumps(answer.to_dict(), indent=2))
    elif isinstance(answer, api.Prediction):
        print_prediction(answer)
    elif isinstance(answer, api.TablePrice):
        from specbench.cli.plan_tables import print_price

        print_price(answer)
    else:
        from specbench.cli.plan_fleet import print_closed_loop, print_fleet, print_fleet_as_is

        {api.ClosedLoop: print_closed_loop, api.FleetSizes: print_fleet, api.FleetAsIs: print_fleet_as_is}[
            type(answer)](answer)


def _on_run(run_dir, timings, acceptance, alpha, k, batch_sizes, context_lengths, max_new_tokens, device, gpu_price,
            gpus):
    """`plan RUN`: api.predict on the run's fit; a CPU run with --device: priced on that GPU's tables."""
    from specbench import api
    from specbench.results import load_run

    alpha = _one_alpha(alpha)
    if acceptance is not None and str(acceptance).startswith("published:"):
        raise UsageError("--acceptance published:NAME plans on the kernel tables: give --target (a run's plan takes "
                         "a run's α)")
    ks, sizes, contexts = _grid(k, batch_sizes, context_lengths, max_new_tokens)
    check_price(gpu_price, gpus)
    timings = load_run(timings or run_dir)
    if device is not None and _ran_on_a_cpu(timings.meta):
        return _cpu_run_on_tables(timings, acceptance, device, ks, sizes, contexts, max_new_tokens, alpha, gpu_price,
                                  gpus)
    return api.predict(run_dir, timings=timings, acceptance=acceptance, alpha=alpha, ks=ks, batch_sizes=sizes,
                       context_lengths=contexts, device=device, gpu_price=gpu_price, gpus=gpus,
                       max_new_tokens=max_new_tokens)


def _ran_on_a_cpu(meta: dict) -> bool:
    return not (meta.get("hardware") or {}).get("gpus")


def _cpu_run_on_tables(run, acceptance: Path | None, device: str, ks: list[int], sizes: list[int],
                       contexts: list[int] | None, max_new_tokens: int | None, alpha: float | None,
                       gpu_price: float | None, gpus: int):
    """`plan CPU_RUN --device GPU`: a CPU's fitted efficiencies say nothing of a GPU's, so the run's
    target and drafts are priced on that GPU's kernel tables instead, with the α the run measured
    (as `plan --target T --drafts D --acceptance RUN --device GPU` would)."""
    from dataclasses import replace

    from specbench import api
    from specbench.fit.calibration import run_configs
    from specbench.results import recorded_config

    if gpus != 1:
        raise UsageError("--gpus: a CPU run planned on a GPU's kernel tables is priced per replica at TP1; for "
                         "other TP sizes use --target with --tp")
    config = recorded_config(run.meta)["grid"]
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
    priced = api.price(target, drafts=drafts, device=device, ks=ks, batch_sizes=sizes,
                       context_lengths=contexts or [1024],
                       output_tokens=max_new_tokens or int(config.get("max_new_tokens") or 128), alpha=given,
                       acceptance=measured, gpu_price=gpu_price)
    return replace(priced, notes=[note])


def _one_alpha(text: str | None) -> float | None:
    """A run's plan takes one i.i.d. α."""
    from specbench.api.inputs import check_alpha

    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--alpha: with a run, one number in [0, 1) (lists and profiles plan with --target), "
                         f"got {text!r}") from None
    check_alpha(value)
    return value


def _grid(k: str, batch_sizes: str, context_lengths: str | None, max_new_tokens: int | None):
    """(K, batch sizes, context lengths) asked, each >= 1 (no context lengths: [])."""
    ks, sizes = split_list(k, int, "--k"), split_list(batch_sizes, int, "--batch-sizes")
    contexts = token_counts(context_lengths, "--context-lengths") if context_lengths else []
    check_grid(ks, sizes, contexts, max_new_tokens)
    return ks, sizes, contexts
