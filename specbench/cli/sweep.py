"""`specbench sweep`: run the measured grid, speculative against autoregressive."""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from specbench.cli.common import (
    INTERRUPTED, TERMINATED, Terminated, UsageError, console, errors, fail, known_errors, quiet_libraries,
    raise_if_stopped, signals_received, split_drafts, split_list, stop_code, token_counts, option_flag,
    typed_options,
)
from specbench.cli.render import as_text, cells_table, load_text, print_table, print_warnings, progress_line


def sweep(
    ctx: typer.Context,
    target: str = typer.Option("smollm2-135m", help="Target model: alias, local dir, .gguf file or hub id."),
    drafts: Optional[str] = typer.Option(
        None, help="Comma list: model alias/path (bare sizes like 1b resolve in the target's family), ALIAS@DTYPE, "
                   "ngram[:N] (prompt lookup), self:N (first N layers); on vLLM also DRAFT@schedule:{1-8: 4, 9+: 2} "
                   "(a K per batch size). Default ngram,smollm2-135m@bf16 (@fp32 on a CPU whose bf16 products are "
                   "many times slower; on vLLM, which runs a draft in the target's dtype, ngram,smollm2-135m); "
                   "with --endpoint a label (endpoint)."),
    k: Optional[str] = typer.Option(None, "--k", help="Draft tokens per step, comma list (default 2,4; with "
                                                      "--endpoint the K its server runs, 0 = unknown)."),
    batch_sizes: Optional[str] = typer.Option(None, help="Comma list (default 1,4,16; for a served engine: "
                                                         "requests in flight, a closed loop)."),
    request_rates: Optional[str] = typer.Option(None, help="Served engines: requests per second, comma list, inf "
                                                           "= all at once (an open loop, instead of --batch-sizes)."),
    burstiness: float = typer.Option(1.0, help="Open loop: gamma shape of the gaps between arrivals (1 = Poisson, "
                                               "< 1 burstier), as vllm bench serve."),
    slo: Optional[str] = typer.Option(None, help="Service-level objective in seconds, e.g. ttft=1.0,tpot=0.05[,p90] "
                                                 "(default p99): report and check judge goodput against it."),
    endpoint: Optional[str] = typer.Option(None, help="Measure a running OpenAI-compatible server (its URL) "
                                                      "instead of starting one; URL1,URL2: servers of one model "
                                                      "that each load is spread over (a small fleet)."),
    baseline_endpoint: Optional[str] = typer.Option(None, help="The same model served without speculation (the "
                                                               "baseline; URL1,URL2 as well); alone, only the "
                                                               "baseline is measured."),
    router: str = typer.Option("least-outstanding", help="Several endpoints: which one gets each request, "
                                                         "least-outstanding, round-robin or prefix-aware "
                                                         "(llm-d's default: prefix cache, queue, KV cache)."),
    api_key_env: str = typer.Option("OPENAI_API_KEY", help="Endpoints: the environment variable holding an API "
                                                           "key (sent as a bearer token, never written)."),
    temperatures: str = typer.Option("0,0.7", help="Comma list; 0 is greedy (checked lossless)."),
    workloads: Optional[str] = typer.Option(None, help="Comma list: chat, code, humaneval, mtbench, a file, or "
                                                       "hf:ORG/NAME (default chat,code; with --trace, the trace's "
                                                       "kind: code for azure-code, chat otherwise)."),
    context_lengths: Optional[str] = typer.Option(
        None, help="Comma list of prompt lengths in tokens (512,4k,16k; k = 1024): each workload's prompts are built "
                   "to these lengths, a long document excerpt before the question (workloads/long/). Default: the "
                   "prompts as they are."),
    max_new_tokens: int = typer.Option(48, help="Tokens generated per request (EOS ignored; with --trace its "
                                                "rows give them)."),
    num_prompts: int = typer.Option(4, help="Prompts per cell (rounded up to whole batches; with --trace, "
                                          "--trace-max-requests)."),
    repeats: int = typer.Option(1, help="Measured repeats per cell; tokens/s is their median."),
    seed: int = typer.Option(0),
    dtype: Optional[str] = typer.Option(None, help="fp32, bf16 or fp16 (default: bf16 on CUDA, fp32 on CPU); "
                                                 "native or vLLM, not --endpoint."),
    device: str = typer.Option("cpu", help="Native or vLLM, not --endpoint: cpu, cuda[:N], or cuda:0,cuda:1,… to spread the target over several GPUs (a bare cuda spreads it when it does not fit on one)."),
    top_p: float = typer.Option(1.0, help="Top-p for sampled cells."),
    top_k: int = typer.Option(0, help="Top-k for sampled cells (0 = off)."),
    chat_template: bool = typer.Option(True, help="Apply the target's chat template to prompts."),
    output: Optional[Path] = typer.Option(None, help="Run directory (default: results/<time>_<target>)."),
    resume: bool = typer.Option(False, "--resume", help="Skip cells already finished in --output (default: the latest run)."),
    until_decided: bool = typer.Option(False, "--until-decided", help="After the grid, while `check` (every measured batch size, "
                                                   "--min-speedup) would be inconclusive, measure the cells that leave "
                                                   "it open again, doubling their repeats up to --max-repeats."),
    max_repeats: Optional[int] = typer.Option(None, help="--until-decided: the most repeats a cell gets "
                                                          "(default 12)."),
    min_speedup: float = typer.Option(1.0, help="--until-decided: the bar the verdict is about (as check's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (a resume's cells left to run) and the time "
                                             "estimate, and exit."),
    download: bool = typer.Option(False, "--download", help="Allow downloading models from the hub."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow model code from the hub (off by default)."),
    weights: str = typer.Option("real", help="real, or random: timing-only runs of the real architectures "
                                             "with random weights (no download), needs --alpha."),
    alpha: Optional[str] = typer.Option(None, "--alpha", help="With --weights random: acceptance to simulate, comma "
                                                               "list; 0.8 (i.i.d.) or 0.9/0.8/0.7 (per position)."),
    target_layers: Optional[int] = typer.Option(None, help="With --weights random: build only this many target "
                                                           "layers and scale step times to full depth "
                                                           "(automatic when the target does not fit)."),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help="Replay decode, draft and verify steps from CUDA graphs "
                                                 "(fixed shapes over one reused cache; one CUDA device)."),
    engine: str = typer.Option("native", help="native (specbench's own exact engine, step-level detail) or vllm "
                                              "(a vLLM server per speculative configuration; batch size = "
                                              "requests in flight)."),
    tensor_parallel_size: int = typer.Option(1, help="vLLM: GPUs the target is split over (tensor parallel)."),
    pipeline_parallel_size: int = typer.Option(1, help="vLLM: pipeline-parallel stages."),
    max_model_len: Optional[int] = typer.Option(None, help="vLLM: --max-model-len of every server."),
    gpu_memory_utilization: Optional[float] = typer.Option(None, help="vLLM: --gpu-memory-utilization."),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="vLLM: no CUDA graphs or compilation (starts in ~1 min on a CPU)."),
    vllm_args: str = typer.Option("", help="vLLM: more server arguments, e.g. '--max-num-seqs 64'."),
    vllm_python: Optional[str] = typer.Option(None, help="vLLM: the Python that runs the servers (another "
                                                         "environment); default: this one."),
    server_timeout: float = typer.Option(900.0, help="vLLM: seconds a server may take to answer /health."),
    distributed_executor_backend: str = typer.Option("", help="vLLM: its backend for a server spread over "
                                                                  "several nodes (ray); default vLLM's choice. "
                                                                  "--executor ray sets ray for a server bigger "
                                                                  "than a node."),
    allow_pp_speculation: bool = typer.Option(False, "--allow-pp-speculation", help="vLLM: run speculative decoding with "
                                                          "--pipeline-parallel-size > 1 although vLLM has open bugs "
                                                          "there (#49355, #57755)."),
    trace: Optional[str] = typer.Option(None, help="Served engines: replay a request trace, its arrivals and lengths "
                                                   "with real content (azure-code, azure-conv, mooncake-conv, or a "
                                                   "Mooncake .jsonl, Azure or BurstGPT .csv); replaces --batch-sizes and "
                                                   "--request-rates."),
    trace_window: str = typer.Option("", help="--trace: which seconds of the trace, START:DURATION (e.g. 600:300)."),
    trace_speedup: float = typer.Option(1.0, help="--trace: time scale; 0.5 replays at half speed (a slow server "
                                                  "can replay a slice)."),
    trace_max_requests: int = typer.Option(0, help="--trace: at most this many requests of the window (0: all)."),
    executor: str = typer.Option("local", help="Where cells run: local (this process) or ray (a Ray cluster: "
                                               "pairing groups spread over its nodes, each speed-up measured on "
                                               "one node; pip install 'specbench\\[ray]')."),
    ray_address: Optional[str] = typer.Option(None, help="--executor ray: the cluster to join (default "
                                                         "RAY_ADDRESS, else a local Ray instance)."),
    served_pairing: str = typer.Option("auto", help="vLLM: side-by-side (the baseline server stays up and repeats "
                                                    "alternate with each speculative server's), bracketed (the "
                                                    "baseline measured again after the speculative servers: an "
                                                    "unpaired interval), or auto (side-by-side where two servers "
                                                    "fit: CPU memory, or --gpu-memory-utilization <= 0.5)."),
) -> None:
    """Run the measured grid: speculative against autoregressive, same engine, same prompts."""
    from specbench.grid import (
        EndpointOptions, EngineOptions, ExecutorOptions, GateOptions, GridOptions, LoadOptions, SweepConfig,
        VllmOptions,
    )

    try:
        if batch_sizes is not None and request_rates is not None:
            raise UsageError("--batch-sizes (closed loop) and --request-rates (open loop): a run uses one or the other")
        if endpoint or baseline_endpoint:
            if engine != "native":
                raise UsageError("--endpoint measures a running server: leave out --engine")
            engine = "endpoint"
        baseline_only = bool(baseline_endpoint) and not endpoint  # plain servers alone: no speculative cells
        if baseline_only and (drafts is not None or k is not None):
            raise UsageError("--drafts and --k name what --endpoint runs: --baseline-endpoint alone measures the "
                             "baseline only")
        if router != "least-outstanding" and "," not in (endpoint or "") + (baseline_endpoint or ""):
            raise UsageError("--router spreads each load over several servers: give them as --endpoint URL1,URL2")
        if trace and (batch_sizes is not None or request_rates is not None):
            raise UsageError("--trace replays the trace's own arrivals: leave out --batch-sizes and --request-rates")
        if not trace and (trace_window or trace_speedup != 1.0 or trace_max_requests):
            raise UsageError("--trace-window, --trace-speedup and --trace-max-requests need --trace")
        if max_repeats is not None and not until_decided:
            raise UsageError("--max-repeats is --until-decided's budget: add --until-decided (a fixed number of "
                             "repeats is --repeats)")
        vllm = VllmOptions(tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
                           max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                           enforce_eager=enforce_eager, extra_args=vllm_args, python=vllm_python,
                           startup_timeout_s=server_timeout, pairing=served_pairing,
                           distributed_executor_backend=distributed_executor_backend,
                           allow_pp_speculation=allow_pp_speculation)
        # parsed in this order (drafts, K, the load, the grid's other lists): of two bad lists the first is named
        draft_list = split_drafts(drafts) if drafts is not None else None  # None: the engine's own (SweepConfig)
        ks = split_list(k, int, "--k") if k is not None else None
        load = LoadOptions(
            batch_sizes=split_list(batch_sizes, int, "--batch-sizes") if batch_sizes is not None
            else ([] if request_rates is not None or trace else [1, 4, 16]),
            request_rates=split_list(request_rates, float, "--request-rates") if request_rates is not None else [],
            burstiness=burstiness, trace=trace or "", trace_window=trace_window, trace_speedup=trace_speedup,
            trace_max_requests=trace_max_requests)
        grid = GridOptions(
            target=target, drafts=draft_list, ks=ks, temperatures=split_list(temperatures, float, "--temperatures"),
            workloads=split_list(workloads, str, "--workloads") if workloads is not None
            else ([trace_workload(trace)] if trace else ["chat", "code"]),
            max_new_tokens=max_new_tokens, num_prompts=num_prompts, repeats=repeats, seed=seed, top_p=top_p,
            top_k=top_k, weights=weights, alphas=split_list(alpha, str, "--alpha") if alpha is not None else [],
            target_layers=target_layers,
            context_lengths=token_counts(context_lengths, "--context-lengths") if context_lengths else [])
        endpoints = EndpointOptions(urls=endpoint or "", baseline_urls=baseline_endpoint or "",
                                    api_key_env=api_key_env, router=router)
        config = SweepConfig(
            grid=grid, load=load,
            engine=EngineOptions(name=engine, dtype=dtype, device=device, chat_template=chat_template,
                                 allow_download=download, trust_remote_code=trust_remote_code, cuda_graphs=cuda_graphs,
                                 vllm=vllm, endpoint=endpoints),
            executor=ExecutorOptions(name=executor, ray_address=ray_address or ""),
            gate=GateOptions(slo=slo or "", until_decided=until_decided,
                             max_repeats=12 if max_repeats is None else max_repeats, min_speedup=min_speedup))
        config.validate()  # the grid's values, refused before the engines are imported (seconds on a slow CPU)
        from specbench.sweep import check_config

        replay = check_config(config)  # a trace read here once, into the replay the sweep runs
        # what the checks above leave: an option given where it does nothing is refused, not dropped
        refuse_what_does_not_apply(ctx, sweep_mode(config))
    except known_errors() as error:
        fail(str(error))
    _run_sweep(config, output, resume, dry_run, _given_fields(ctx), replay)


# --- which options apply where -----------------------------------------------------------------

# the modes a sweep runs in: its engine, and on a served engine its load (closed loop, request
# rates, a trace's arrivals); each with the words an error says it in
MODES = {
    "native": "on the native engine", "random": "with --weights random (the native engine)",
    "vllm": "on --engine vllm's closed loop", "vllm-rates": "with --request-rates on --engine vllm",
    "vllm-trace": "with --trace on --engine vllm", "endpoint": "with --endpoint's closed loop",
    "endpoint-rates": "with --request-rates on --endpoint", "endpoint-trace": "with --trace on --endpoint",
}
EVERY = frozenset(MODES)
TRACE = frozenset({"vllm-trace", "endpoint-trace"})
OPEN = frozenset({"vllm-rates", "endpoint-rates"})
VLLM = frozenset({"vllm", "vllm-rates", "vllm-trace"})
ENDPOINT = frozenset({"endpoint", "endpoint-rates", "endpoint-trace"})
STARTED = EVERY - ENDPOINT  # engines specbench starts: native, or vLLM servers
CLOSED = frozenset({"native", "random", "vllm", "endpoint"})
NATIVE = frozenset({"native", "random"})
VLLM_HERE = "with --engine vllm (the servers specbench starts)"

# every sweep option -> (the modes it applies in, where it applies, an option it needs given too);
# an option the user typed outside its modes is refused in one line naming where it applies
APPLIES: dict[str, tuple[frozenset, str, str]] = {
    "target": (EVERY, "", ""), "drafts": (EVERY, "", ""), "k": (EVERY, "", ""),
    "batch_sizes": (CLOSED, "to a closed loop (no --request-rates or --trace)", ""),
    "request_rates": (OPEN, "with --engine vllm or --endpoint, without --trace", ""),
    "burstiness": (OPEN, "to an open loop: --request-rates on --engine vllm or --endpoint", ""),
    "slo": (EVERY, "", ""),
    "endpoint": (ENDPOINT, "alone: it measures a running server", ""),
    "baseline_endpoint": (ENDPOINT, "alone: it measures a running server", ""),
    "router": (ENDPOINT, "with --endpoint URL1,URL2", ""),
    "api_key_env": (ENDPOINT, "with --endpoint", ""),
    "temperatures": (EVERY, "", ""), "workloads": (EVERY, "", ""),
    "context_lengths": (EVERY - TRACE, "without --trace (a trace's rows give the prompt lengths)", ""),
    "max_new_tokens": (EVERY - TRACE, "without --trace (a trace's rows give the output lengths)", ""),
    "num_prompts": (EVERY - TRACE, "without --trace (--trace-max-requests caps a replay's requests)", ""),
    "repeats": (EVERY, "", ""), "seed": (EVERY, "", ""),
    "dtype": (STARTED, "on the native engine or --engine vllm (an endpoint's server runs its own)", ""),
    "device": (STARTED, "on the native engine or --engine vllm (an endpoint's server runs where it was started)",
               ""),
    "top_p": (EVERY, "", ""), "top_k": (EVERY, "", ""), "chat_template": (EVERY, "", ""),
    "output": (EVERY, "", ""), "resume": (EVERY, "", ""), "dry_run": (EVERY, "", ""),
    "until_decided": (CLOSED, "to batch-size cells (no --request-rates or --trace)", ""),
    "max_repeats": (CLOSED, "with --until-decided", "until_decided"),
    "min_speedup": (CLOSED, "with --until-decided (check takes its own --min-speedup)", "until_decided"),
    "download": (EVERY - {"random"}, "where models load (--weights random builds them, no download)", ""),
    "trust_remote_code": (EVERY - {"random"}, "where models load (--weights random builds registry models)", ""),
    "weights": (STARTED, "on the native engine or --engine vllm", ""),
    "alpha": (STARTED, "with --weights random", ""),
    "target_layers": (frozenset({"random"}), "with --weights random on the native engine", ""),
    "cuda_graphs": (NATIVE, "on the native engine (vLLM captures its own; --enforce-eager turns them off)", ""),
    "engine": (EVERY, "", ""),
    "tensor_parallel_size": (VLLM, VLLM_HERE, ""), "pipeline_parallel_size": (VLLM, VLLM_HERE, ""),
    "max_model_len": (VLLM, VLLM_HERE, ""), "gpu_memory_utilization": (VLLM, VLLM_HERE, ""),
    "enforce_eager": (VLLM, VLLM_HERE, ""), "vllm_args": (VLLM, VLLM_HERE, ""), "vllm_python": (VLLM, VLLM_HERE, ""),
    "server_timeout": (VLLM, VLLM_HERE, ""), "distributed_executor_backend": (VLLM, VLLM_HERE, ""),
    "allow_pp_speculation": (VLLM, VLLM_HERE, ""), "served_pairing": (VLLM, VLLM_HERE, ""),
    "trace": (TRACE, "on a served engine: --engine vllm or --endpoint", ""),
    "trace_window": (TRACE, "with --trace", ""), "trace_speedup": (TRACE, "with --trace", ""),
    "trace_max_requests": (TRACE, "with --trace", ""),
    "executor": (EVERY, "", ""), "ray_address": (EVERY, "", ""),
}


def sweep_mode(config) -> str:
    """The mode (a key of MODES) a sweep config runs in."""
    if config.engine.name in ("vllm", "endpoint"):
        return config.engine.name + ("-trace" if config.load.trace else "-rates" if config.load.request_rates else "")
    return "random" if config.grid.synthetic else "native"


def refuse_what_does_not_apply(ctx: typer.Context, mode: str) -> None:
    """A UsageError for the first option typed (not left at its default) that does not apply in
    `mode` (APPLIES), or is given without the option it needs."""
    given = typed_options(ctx)
    for name in (name for name in ctx.params if name in given):
        modes, where, needs = APPLIES[name]
        if mode not in modes:
            raise UsageError(f"{option_flag(name)} does not apply {MODES[mode]}: it applies {where}")
        if needs and needs not in given:
            raise UsageError(f"{option_flag(name)} applies {where}: add {option_flag(needs)}")


def trace_workload(trace: str) -> str:
    """The workload whose questions a trace's prompts take: the shipped trace's kind, else chat."""
    from specbench.traces import SHIPPED

    return SHIPPED[trace][1] if trace in SHIPPED else "chat"


def trace_line(replay) -> str:
    """The replay a sweep runs, in one line: its slice and speed, its requests, and what it left out."""
    return (f"trace: {replay.describe()}, {len(replay.requests)} requests over {replay.duration_s:.0f} s as replayed"
            + "".join(f"; {note}" for note in replay.notes()))


def _given_fields(ctx: typer.Context) -> set[str]:
    """SweepConfig settings (their paths: "grid.ks") set by an option on the command line (not left
    at its default)."""
    from specbench.sweep import OPTION_NAMES

    # sweep options -> the SweepConfig settings they set
    fields_of = {option: {path} for path, option in OPTION_NAMES.items()}
    fields_of["endpoint"] = {"engine.endpoint.urls", "engine.name"}
    fields_of["baseline_endpoint"] = {"engine.endpoint.baseline_urls", "engine.name"}
    fields_of.update({name: {"engine.vllm"} for name in (
        "tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "gpu_memory_utilization", "enforce_eager",
        "vllm_args", "vllm_python", "server_timeout", "served_pairing", "distributed_executor_backend",
        "allow_pp_speculation")})
    return {field for name in typed_options(ctx) for field in fields_of.get(name, {name})}


def _run_sweep(config, output: Path | None, resume: bool, dry_run: bool, given: set[str] | None = None,
               replay=None) -> None:
    from specbench.grid import plan_cells
    from specbench.results import DEFAULT_RESULTS_DIR, check_writable, latest_run, prepare_output, read_table
    from specbench.sweep import check_config, plan_time, preflight, resumed_config, run_sweep

    quiet_libraries(config.engine.allow_download)
    resume_dir, finished, status = None, set(), ""
    try:  # what the real run would refuse, refused first (the dry run too): then the plan
        if resume:
            resume_dir = output or latest_run(finished_only=False)
            if not (resume_dir / "run.json").exists():
                raise UsageError(f"--resume: {resume_dir} is not a specbench run")
            if not dry_run:
                check_writable(resume_dir, " (--resume writes into the run)")
            meta = json.loads((resume_dir / "run.json").read_text())
            config, notes = resumed_config(meta.get("config") or {}, config, given)
            replay, status = None, meta.get("status", "")  # the run's own settings now: its trace replayed as they ask
            for note in notes:
                console.print(f"--resume: {escape(note)}", highlight=False, soft_wrap=True)
            cells = read_table(resume_dir, "cells")
            finished = set(cells["cell_id"]) if len(cells) else set()
        elif dry_run:
            if output is not None and output.exists() and not output.is_dir():
                raise UsageError(f"--output {output} is a file, not a directory")
        elif output is not None:
            if prepare_output(output):
                console.print(f"{output} holds a sweep that stopped before its first cell: running it again there",
                              highlight=False, soft_wrap=True)
            resume_dir = output
        else:
            check_writable(DEFAULT_RESULTS_DIR, " (use --output DIR)")
        if dry_run or config.engine.name == "native":  # the estimate needs the workloads; run_sweep checks the rest
            workloads, replay = preflight(config, replay)
        else:
            workloads, replay = {}, check_config(config, replay)  # a resumed trace's replay, for its cells
        planned = plan_cells(config, replay)
        left = [cell for cell in planned if cell.id not in finished]
        if resume and not left and status == "complete" and not config.gate.until_decided:
            console.print(f"--resume: all {len(planned)} cells of {resume_dir} are finished: nothing to do",
                          highlight=False, soft_wrap=True)
            if not dry_run:  # its table is the run's own: report and check read it
                console.print(f"next:    specbench report {resume_dir}  ·  specbench check {resume_dir}",
                              highlight=False, soft_wrap=True)
            return
        # the defaults fitted to this CPU where the user left them (a resume runs the run's own)
        timing = plan_time(config, workloads, None if resume else given, left if resume else None)
        config = timing.config
        if not resume:
            left = plan_cells(config, replay)
    except known_errors() as error:
        fail(str(error))
    if dry_run:
        _print_plan(config, replay, left, len(planned) - len(left) if resume else 0, timing.lines)
        return
    header = list(timing.lines)  # told once the models load, before the first cell (a load that fails stays one line)

    if replay is not None:  # what it replays, and the rows it leaves out (run.json's trace says them too)
        console.print(trace_line(replay), highlight=False, soft_wrap=True)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False)
    # the plan's size, told again by the sweep once it has planned (a trace's cells need its replay)
    total = [len(plan_cells(config)) if not config.load.trace else None]
    task = progress.add_task("loading models", total=total[0])
    finished: list[dict] = []
    completed = [0]  # cells finished, earlier runs' included (a served engine runs them out of plan order)
    interactive = console.is_terminal
    live = Live(Group(progress), console=console, refresh_per_second=4, transient=True) if interactive else nullcontext()
    started = time.monotonic()

    def on_event(event) -> None:
        if event.kind == "start":  # a Ctrl-C lost on its way stops the sweep before the next cell
            raise_if_stopped()
        if event.kind == "loaded":
            console.print(escape(event.message), highlight=False, soft_wrap=True)
            for line in header:
                console.print(escape(line), highlight=False, soft_wrap=True)
            header.clear()
            completed[0], total[0] = event.index, event.total
            progress.update(task, completed=completed[0], total=total[0])
        elif event.kind == "stage":
            if event.message != "native engine":
                console.print(escape(event.message), highlight=False, soft_wrap=True)
        elif event.kind == "stage_failed":
            errors.print(f"[bold red]error:[/] {escape(event.message)}", highlight=False, soft_wrap=True)
        elif event.kind == "start":
            progress.update(task, description=f"{event.cell.id}")
        elif event.kind == "done":
            finished.append(event.row)
            completed[0] += 1
            progress.update(task, completed=completed[0])
            if interactive:
                live.update(Group(progress, cells_table(finished, "finished cells", limit=12)))
            else:
                console.print(escape(progress_line(event.row, completed[0], total[0], time.monotonic() - started)),
                              highlight=False, soft_wrap=True)
            if event.row.get("lossless") == "MISMATCH":
                errors.print(f"[bold red]LOSSLESS CHECK FAILED[/] {event.cell.id}: {escape(as_text(event.row.get('lossless_detail')))}")

    run_dir = None
    try:
        with live:
            run_dir = run_sweep(config, resume_dir=resume_dir, on_event=on_event, replay=replay,
                                notes=timing.record())
    except KeyboardInterrupt as stop:
        errors.print("[yellow]interrupted:[/] finished cells are saved; continue with --resume")
        raise typer.Exit(TERMINATED if isinstance(stop, Terminated) else INTERRUPTED)
    except known_errors() as error:
        fail(str(error))
    print_summary(run_dir)
    if signals_received:  # it came as the last cell finished and was lost on its way: the run is complete
        errors.print("[yellow]stopped[/] after the last cell: the run is complete", highlight=False)
        raise typer.Exit(stop_code())



def _print_plan(config, replay, cells: list, finished: int, time_lines: list[str]) -> None:
    """--dry-run: the cells left to run (all of them, unless a resume finished some), grouped by
    workload, load and temperature, and what the run header would say."""
    from specbench.grid import requests_per_cell
    from specbench.sweep import slow_bf16_note

    table = Table(title="plan", title_justify="left")
    for column in ("workload", "load", "T", "cells", "requests/cell", "output tokens/cell"):
        table.add_column(column, overflow="fold")
    groups: dict = {}
    for cell in cells:
        groups.setdefault((cell.traffic, cell.batch_size, cell.request_rate, cell.temperature), []).append(cell)
    # --max-new-tokens per request, or the trace's mean
    per_request = replay.output_tokens_mean if config.load.trace and replay is not None else config.grid.max_new_tokens
    requests = outputs = 0
    for (workload, batch, rate, temperature), group in groups.items():
        each = requests_per_cell(config, batch, replay) * config.grid.repeats
        requests += each * len(group)
        outputs += round(each * per_request) * len(group)
        baselines = sum(not c.is_speculative for c in group)
        table.add_row(workload, load_text({"batch_size": batch, "request_rate": rate}), f"{temperature:g}",
                      f"{len(group)} ({baselines} AR + {len(group) - baselines} SD)",
                      str(each), str(round(each * per_request)))
    print_table(table)
    if replay is not None:
        console.print(trace_line(replay), highlight=False, soft_wrap=True)
    baselines = sum(not c.is_speculative for c in cells)
    done = f" left to run ({finished} finished already)" if finished else ""
    console.print(f"{len(cells)} cells{done} ({baselines} autoregressive, {len(cells) - baselines} "
                  f"speculative), {requests} requests, {outputs} output tokens; "
                  f"target {config.grid.target}, drafts {', '.join(config.grid.drafts)}", highlight=False,
                  soft_wrap=True)
    for line in time_lines:
        console.print(escape(line), highlight=False, soft_wrap=True)
    if note := slow_bf16_note(config):
        console.print(note, highlight=False, soft_wrap=True)
    # the worst case: every cell undecided
    if config.gate.until_decided and config.gate.max_repeats > config.grid.repeats:
        most = requests // config.grid.repeats * config.gate.max_repeats
        console.print(f"--until-decided: at most {most} requests, {most * config.grid.max_new_tokens} output tokens, "
                      f"if every cell stays undecided up to --max-repeats {config.gate.max_repeats}")


def print_summary(run_dir: Path) -> None:
    from specbench.fit import measurement_warnings
    from specbench.fit.nodes import node_spread, spread_text
    from specbench.fit.noise import run_noise
    from specbench.results import load_run
    from specbench.synthetic import random_model_lines

    from specbench.fit.decisions import measured_answer

    run = load_run(run_dir)
    console.print(f"[bold]{escape(measured_answer(run.cells))}[/]", highlight=False, soft_wrap=True)
    print_table(cells_table(run.cells, f"sweep results ({len(run.cells)} cells)"), keep=5)
    for line in random_model_lines(run.meta):
        console.print(escape(line), highlight=False, soft_wrap=True)
    failed = run.cells[run.cells["status"] != "ok"]
    mismatches = run.cells[run.cells["lossless"] == "MISMATCH"] if "lossless" in run.cells else []
    for row in failed.to_dict("records"):
        errors.print(f"[yellow]{row['status']}[/] {row['cell_id']}: {escape(as_text(row.get('message')))}", highlight=False)
    print_warnings(measurement_warnings(run.cells, run.baseline_copies, run_noise(run.cells, run.requests, run.steps)))
    spread = spread_text(node_spread(run.cells, run.baseline_copies))
    if spread:
        console.print(f"nodes: {spread}", highlight=False, soft_wrap=True)
    if run.meta.get("until_decided"):
        console.print(f"--until-decided: {escape(run.meta['until_decided'])}", highlight=False, soft_wrap=True)
    console.print(f"results: [bold]{run_dir}[/]  (cells, requests, steps as .parquet and .csv; run.json)")
    console.print(f"next:    specbench report {run_dir}")
    if len(mismatches):
        errors.print(f"[bold red]{len(mismatches)} speculative cell(s) failed the lossless check[/]")
        raise typer.Exit(1)
    ok = run.cells[run.cells["status"] == "ok"]
    for mode in ("autoregressive", "speculative"):
        if (run.cells["mode"] == mode).any() and not (ok["mode"] == mode).any():
            fail(f"no {mode} cell was measured (statuses: {', '.join(sorted(set(run.cells['status'])))}): "
                 f"nothing to compare; the cells' messages above say why")

