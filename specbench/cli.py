"""`specbench` command line: a thin layer over specbench.sweep, .fit, .report and .gate."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=False, pretty_exceptions_enable=False,
                  help="Measure whether speculative decoding pays off on your models, traffic and hardware. "
                       "Exit codes: 0 pass, 1 fail, 2 cannot answer or bad input, 3 inconclusive, 4 internal "
                       "error, 130/143 stopped by SIGINT/SIGTERM, 141 output pipe closed.")
# Without a terminal (a log file, CI, nohup) rich would cut lines at 80 columns: there, lines are as
# wide as their content unless COLUMNS says otherwise; in a terminal, table cells fold, never cut.
_LOG_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 1000
console = Console(width=_LOG_WIDTH)
errors = Console(stderr=True, width=_LOG_WIDTH)


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


def fail(message: str, code: int = 2) -> None:
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _quiet_libraries(allow_download: bool = False) -> None:
    if not allow_download:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def split_list(text: str, cast, name: str) -> list:
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise UsageError(f"{name} needs a comma-separated list, got {text!r}")
    try:
        return [cast(item) for item in items]
    except UsageError:
        raise
    except ValueError:
        raise UsageError(f"{name}: {text!r} is not a list of {cast.__name__}s") from None


def token_count(text: str, name: str = "--context-length") -> int:
    """A number of tokens: 512, 4k (4096), 1.5k (1536), 16K, 1m (1048576)."""
    value = text.strip().lower()
    scale = {"k": 1 << 10, "m": 1 << 20}.get(value[-1:], 1)
    try:
        count = float(value[:-1] if scale > 1 else value) * scale
    except ValueError:
        raise UsageError(f"{name}: {text!r} is not a number of tokens (512, 4k, 1.5k, 1m)") from None
    if not (math.isfinite(count) and count == int(count) and count > 0):
        raise UsageError(f"{name}: {text!r} is not a whole, positive number of tokens") from None
    return int(count)


def token_counts(text: str, name: str) -> list[int]:
    return split_list(text, lambda item: token_count(item, name), name)


def split_drafts(text: str) -> list[str]:
    """--drafts: a comma list whose items may be json:{...} with commas inside the braces."""
    items, depth, current = [], 0, ""
    for char in text:
        depth += {"{": 1, "[": 1, "}": -1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    items = [item.strip() for item in items]
    if not text.strip() or any(not item for item in items):
        raise UsageError(f"--drafts needs a comma-separated list, got {text!r}")
    return items


def _known_errors():
    from specbench.engines import StageFailed
    from specbench.models import IncompatibleModels, ModelNotAvailable
    from specbench.results import RunNotFound
    from specbench.served.server import ServerError
    from specbench.workloads import WorkloadError

    return (UsageError, ModelNotAvailable, IncompatibleModels, WorkloadError, RunNotFound, ValueError, ServerError,
            StageFailed)


def _fmt(value, spec: str = ".2f", empty: str = "–") -> str:
    try:
        if value is None or value != value:
            return empty
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def load_text(row: dict) -> str:
    """A cell's load: its batch size (B=4) or, open-loop, its request rate (4/s)."""
    from specbench.grid import format_rate

    rate = row.get("request_rate")
    if rate is not None and rate == rate and rate > 0:
        return format_rate(rate) + "/s"
    return _text(row.get("batch_size"))


def cells_table(cells, title: str = "cells", limit: int | None = None) -> Table:
    """The key columns of a cells table: one row per cell."""
    table = Table(title=title, title_justify="left", header_style="bold")
    for column, justify in (("workload", "left"), ("load", "right"), ("T", "right"), ("draft", "left"), ("K", "right"),
                            ("tok/s", "right"), ("speed-up", "right"), ("α", "right"), ("τ", "right"),
                            ("TPOT p50 ms", "right"), ("lossless", "left"), ("status", "left")):
        table.add_column(column, overflow="fold", justify=justify)
    import pandas as pd

    from specbench.fit import label_cells

    frame = cells if isinstance(cells, pd.DataFrame) else pd.DataFrame(list(cells))
    rows = label_cells(frame).to_dict("records")  # synthetic acceptance and context length in the labels
    for row in rows[-limit:] if limit else rows:
        baseline = row.get("draft") == "autoregressive"
        speedup = row.get("speedup")
        speed_text = "–"
        if baseline:
            speed_text = "1×"
        elif speedup is not None and speedup == speedup:
            speed_text = f"[green]{speedup:.2f}×[/]" if speedup >= 1 else f"[red]{speedup:.2f}×[/]"
        lossless = _text(row.get("lossless")).replace("n/a (sampled)", "n/a")
        if lossless == "MISMATCH":
            lossless = f"[bold red]{lossless}[/]"
        status = _text(row.get("status"))
        tpot = row.get("tpot_p50_s")
        table.add_row(
            _text(row.get("workload")), load_text(row), _fmt(row.get("temperature"), "g"),
            "AR" if baseline else _text(row.get("draft")), "" if baseline else _text(row.get("k")),
            _fmt(row.get("tokens_per_s"), ".1f"), speed_text, _fmt(row.get("alpha")), _fmt(row.get("tau")),
            _fmt(tpot * 1e3 if tpot is not None else None, ".1f"), lossless,
            status if status == "ok" else f"[red]{status}[/]",
        )
    return table


@app.command()
def sweep(
    ctx: typer.Context,
    target: str = typer.Option("smollm2-135m", help="Target model: alias, local dir, .gguf file or hub id."),
    drafts: Optional[str] = typer.Option(
        None, help="Comma list: model alias/path (bare sizes like 1b resolve in the target's family), ALIAS@DTYPE, "
                   "ngram[:N] (prompt lookup), self:N (first N layers); on vLLM also DRAFT@schedule:{1-8: 4, 9+: 2} "
                   "(a K per batch size). Default ngram,smollm2-135m@bf16; with --endpoint a label (endpoint)."),
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
                                                      "instead of starting one."),
    baseline_endpoint: Optional[str] = typer.Option(None, help="With --endpoint: the same model served without "
                                                               "speculation (the baseline)."),
    api_key_env: str = typer.Option("OPENAI_API_KEY", help="Endpoints: the environment variable holding an API "
                                                           "key (sent as a bearer token, never written)."),
    temperatures: str = typer.Option("0,0.7", help="Comma list; 0 is greedy (checked lossless)."),
    workloads: str = typer.Option("chat,code", help="Comma list: chat, code, humaneval, mtbench, a file, or hf:ORG/NAME."),
    context_lengths: Optional[str] = typer.Option(
        None, help="Comma list of prompt lengths in tokens (512,4k,16k; k = 1024): each workload's prompts are built "
                   "to these lengths, a long document excerpt before the question (workloads/long/). Default: the "
                   "prompts as they are."),
    max_new_tokens: int = typer.Option(48, help="Tokens generated per request (EOS ignored)."),
    num_prompts: int = typer.Option(4, help="Prompts per cell (rounded up to whole batches)."),
    repeats: int = typer.Option(1, help="Measured repeats per cell; tokens/s is their median."),
    seed: int = typer.Option(0),
    dtype: Optional[str] = typer.Option(None, help="fp32, bf16 or fp16 (default: bf16 on CUDA, fp32 on CPU)."),
    device: str = typer.Option("cpu", help="cpu, cuda[:N], or cuda:0,cuda:1,… to spread the target over several GPUs (a bare cuda spreads it when it does not fit on one)."),
    top_p: float = typer.Option(1.0, help="Top-p for sampled cells."),
    top_k: int = typer.Option(0, help="Top-k for sampled cells (0 = off)."),
    chat_template: bool = typer.Option(True, help="Apply the target's chat template to prompts."),
    output: Optional[Path] = typer.Option(None, help="Run directory (default: results/<time>_<target>)."),
    resume: bool = typer.Option(False, help="Skip cells already finished in --output (default: the latest run)."),
    until_decided: bool = typer.Option(False, help="After the grid, while `check` (every measured batch size, "
                                                   "--min-speedup) would be inconclusive, measure the cells that leave "
                                                   "it open again, doubling their repeats up to --max-repeats."),
    max_repeats: Optional[int] = typer.Option(None, help="--until-decided: the most repeats a cell gets "
                                                          "(default 12)."),
    min_speedup: float = typer.Option(1.0, help="--until-decided: the bar the verdict is about (as check's)."),
    dry_run: bool = typer.Option(False, help="Print the plan and exit."),
    download: bool = typer.Option(False, help="Allow downloading models from the hub."),
    trust_remote_code: bool = typer.Option(False, help="Allow model code from the hub (off by default)."),
    weights: str = typer.Option("real", help="real, or random: timing-only runs of the real architectures "
                                             "with random weights (no download), needs --alpha."),
    alpha: Optional[str] = typer.Option(None, "--alpha", help="With --weights random: acceptance to simulate, comma "
                                                               "list; 0.8 (i.i.d.) or 0.9/0.8/0.7 (per position)."),
    target_layers: Optional[int] = typer.Option(None, help="With --weights random: build only this many target "
                                                           "layers and scale step times to full depth "
                                                           "(automatic when the target does not fit)."),
    cuda_graphs: bool = typer.Option(False, help="Replay decode, draft and verify steps from CUDA graphs "
                                                 "(fixed shapes over one reused cache; one CUDA device)."),
    engine: str = typer.Option("native", help="native (specbench's own exact engine, step-level detail) or vllm "
                                              "(a vLLM server per speculative configuration; batch size = "
                                              "requests in flight)."),
    tensor_parallel_size: int = typer.Option(1, help="vLLM: GPUs the target is split over (tensor parallel)."),
    pipeline_parallel_size: int = typer.Option(1, help="vLLM: pipeline-parallel stages."),
    max_model_len: Optional[int] = typer.Option(None, help="vLLM: --max-model-len of every server."),
    gpu_memory_utilization: Optional[float] = typer.Option(None, help="vLLM: --gpu-memory-utilization."),
    enforce_eager: bool = typer.Option(False, help="vLLM: no CUDA graphs or compilation (starts in ~1 min on a CPU)."),
    vllm_args: str = typer.Option("", help="vLLM: more server arguments, e.g. '--max-num-seqs 64'."),
    vllm_python: Optional[str] = typer.Option(None, help="vLLM: the Python that runs the servers (another "
                                                         "environment); default: this one."),
    server_timeout: float = typer.Option(900.0, help="vLLM: seconds a server may take to answer /health."),
    distributed_executor_backend: str = typer.Option("", help="vLLM: its backend for a server spread over "
                                                                  "several nodes (ray); default vLLM's choice. "
                                                                  "--executor ray sets ray for a server bigger "
                                                                  "than a node."),
    allow_pp_speculation: bool = typer.Option(False, help="vLLM: run speculative decoding with "
                                                          "--pipeline-parallel-size > 1 although vLLM has open bugs "
                                                          "there (#49355, #57755)."),
    executor: str = typer.Option("local", help="Where cells run: local (this process) or ray (a Ray cluster: "
                                               "pairing groups spread over its nodes, each speed-up measured on "
                                               "one node; pip install 'specbench[ray]')."),
    ray_address: Optional[str] = typer.Option(None, help="--executor ray: the cluster to join (default "
                                                         "RAY_ADDRESS, else a local Ray instance)."),
    served_pairing: str = typer.Option("auto", help="vLLM: side-by-side (the baseline server stays up and repeats "
                                                    "alternate with each speculative server's), bracketed (the "
                                                    "baseline measured again after the speculative servers: an "
                                                    "unpaired interval), or auto (side-by-side where two servers "
                                                    "fit: CPU memory, or --gpu-memory-utilization <= 0.5)."),
) -> None:
    """Run the measured grid: speculative against autoregressive, same engine, same prompts."""
    from specbench.sweep import SweepConfig, VllmOptions

    try:
        if batch_sizes is not None and request_rates is not None:
            raise UsageError("--batch-sizes (closed loop) and --request-rates (open loop): a run uses one or the other")
        if endpoint:
            if engine != "native":
                raise UsageError("--endpoint measures a running server: leave out --engine")
            engine = "endpoint"
        elif baseline_endpoint:
            raise UsageError("--baseline-endpoint needs --endpoint (the server with speculation)")
        if max_repeats is not None and not until_decided:
            raise UsageError("--max-repeats is --until-decided's budget: add --until-decided (a fixed number of "
                             "repeats is --repeats)")
        vllm = VllmOptions(tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
                           max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                           enforce_eager=enforce_eager, extra_args=vllm_args, python=vllm_python,
                           startup_timeout_s=server_timeout, pairing=served_pairing,
                           distributed_executor_backend=distributed_executor_backend,
                           allow_pp_speculation=allow_pp_speculation)
        config = SweepConfig(
            target=target,
            drafts=split_drafts(drafts) if drafts is not None else (["endpoint"] if endpoint else ["ngram", "smollm2-135m@bf16"]),
            ks=split_list(k, int, "--k") if k is not None else ([0] if endpoint else [2, 4]),
            batch_sizes=split_list(batch_sizes, int, "--batch-sizes") if batch_sizes is not None
            else ([] if request_rates is not None else [1, 4, 16]),
            request_rates=split_list(request_rates, float, "--request-rates") if request_rates is not None else [],
            burstiness=burstiness, slo=slo or "", endpoint=endpoint or "", baseline_endpoint=baseline_endpoint or "",
            api_key_env=api_key_env,
            temperatures=split_list(temperatures, float, "--temperatures"),
            workloads=split_list(workloads, str, "--workloads"), max_new_tokens=max_new_tokens,
            num_prompts=num_prompts, repeats=repeats, seed=seed, dtype=dtype, device=device, top_p=top_p,
            top_k=top_k, chat_template=chat_template, allow_download=download, trust_remote_code=trust_remote_code,
            weights=weights, alphas=split_list(alpha, str, "--alpha") if alpha is not None else [],
            target_layers=target_layers, cuda_graphs=cuda_graphs, engine=engine, vllm=vllm,
            context_lengths=token_counts(context_lengths, "--context-lengths") if context_lengths else [],
            until_decided=until_decided, max_repeats=12 if max_repeats is None else max_repeats,
            min_speedup=min_speedup, executor=executor,
            ray_address=ray_address or "")
        config.validate()
    except _known_errors() as error:
        fail(str(error))
    _run_sweep(config, output, resume, dry_run, _given_fields(ctx))


def _given_fields(ctx: typer.Context) -> set[str]:
    """SweepConfig fields set by an option on the command line (not left at its default)."""
    from specbench.sweep import OPTION_NAMES

    # sweep options -> the SweepConfig fields they set (the rest have the same name)
    fields_of = {option: {field} for field, option in OPTION_NAMES.items()}
    fields_of["endpoint"] = {"endpoint", "engine"}
    fields_of.update({name: {"vllm"} for name in ("tensor_parallel_size", "pipeline_parallel_size", "max_model_len",
                                                  "gpu_memory_utilization", "enforce_eager", "vllm_args",
                                                  "vllm_python", "server_timeout", "served_pairing",
                                                  "distributed_executor_backend", "allow_pp_speculation")})
    given = set()
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            given |= fields_of.get(name, {name})
    return given


def _run_sweep(config, output: Path | None, resume: bool, dry_run: bool, given: set[str] | None = None) -> None:
    from specbench.results import DEFAULT_RESULTS_DIR, check_writable, latest_run, prepare_output
    from specbench.sweep import describe_plan, plan_cells, preflight, requests_per_cell, resumed_config, run_sweep

    _quiet_libraries(config.allow_download)
    if dry_run:
        plan = describe_plan(config)
        table = Table(title="plan", title_justify="left")
        for column in ("workload", "load", "T", "cells", "requests/cell", "output tokens/cell"):
            table.add_column(column, overflow="fold")
        groups: dict = {}
        for cell in plan_cells(config):
            groups.setdefault((cell.traffic, cell.batch_size, cell.request_rate, cell.temperature), []).append(cell)
        for (workload, batch, rate, temperature), cells in groups.items():
            requests = requests_per_cell(config, batch) * config.repeats
            baselines = sum(not c.is_speculative for c in cells)
            table.add_row(workload, load_text({"batch_size": batch, "request_rate": rate}), f"{temperature:g}",
                          f"{len(cells)} ({baselines} AR + {len(cells) - baselines} SD)",
                          str(requests), str(requests * config.max_new_tokens))
        console.print(table)
        console.print(f"{plan['cells']} cells ({plan['baseline_cells']} autoregressive, {plan['speculative_cells']} "
                      f"speculative), {plan['requests']} requests, {plan['output_tokens']} output tokens; "
                      f"target {config.target}, drafts {', '.join(config.drafts)}")
        if config.until_decided and config.max_repeats > config.repeats:  # the worst case: every cell undecided
            most = plan["requests"] // config.repeats * config.max_repeats
            console.print(f"--until-decided: at most {most} requests, {most * config.max_new_tokens} output tokens, "
                          f"if every cell stays undecided up to --max-repeats {config.max_repeats}")
        try:
            preflight(config)
        except _known_errors() as error:
            fail(str(error))
        return

    resume_dir = None
    try:
        if resume:
            resume_dir = output or latest_run(finished_only=False)
            if not (resume_dir / "run.json").exists():
                raise UsageError(f"--resume: {resume_dir} is not a specbench run")
            check_writable(resume_dir, " (--resume writes into the run)")
            previous = json.loads((resume_dir / "run.json").read_text()).get("config") or {}
            config, notes = resumed_config(previous, config, given)
            for note in notes:
                console.print(f"--resume: {escape(note)}", highlight=False, soft_wrap=True)
        elif output is not None:
            if prepare_output(output):
                console.print(f"{output} holds a sweep that stopped before its first cell: running it again there",
                              highlight=False, soft_wrap=True)
            resume_dir = output
        else:
            check_writable(DEFAULT_RESULTS_DIR, " (use --output DIR)")
    except _known_errors() as error:
        fail(str(error))

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False)
    total = len(plan_cells(config))
    task = progress.add_task("loading models", total=total)
    finished: list[dict] = []
    completed = [0]  # cells finished, earlier runs' included (a served engine runs them out of plan order)
    interactive = console.is_terminal
    live = Live(Group(progress), console=console, refresh_per_second=4, transient=True) if interactive else nullcontext()
    started = time.monotonic()

    def on_event(event) -> None:
        if event.kind == "loaded":
            console.print(escape(event.message), highlight=False, soft_wrap=True)
            completed[0] = event.index
            progress.update(task, completed=completed[0])
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
                console.print(escape(progress_line(event.row, completed[0], total, time.monotonic() - started)),
                              highlight=False, soft_wrap=True)
            if event.row.get("lossless") == "MISMATCH":
                errors.print(f"[bold red]LOSSLESS CHECK FAILED[/] {event.cell.id}: {escape(_text(event.row.get('lossless_detail')))}")

    run_dir = None
    try:
        with live:
            run_dir = run_sweep(config, resume_dir=resume_dir, on_event=on_event)
    except KeyboardInterrupt as stop:
        errors.print("[yellow]interrupted:[/] finished cells are saved; continue with --resume")
        raise typer.Exit(TERMINATED if isinstance(stop, Terminated) else INTERRUPTED)
    except _known_errors() as error:
        fail(str(error))
    _print_summary(run_dir)


def progress_line(row: dict, done: int, total: int, elapsed_s: float) -> str:
    """One finished cell as a plain line, for logs: id, tokens/s, speed-up, acceptance, checks, status."""
    parts = [f"[{done}/{total}]", _text(row.get("cell_id")), f"{_fmt(row.get('tokens_per_s'), '.1f')} tok/s"]
    if row.get("draft") not in (None, "autoregressive"):
        parts.append(f"{_fmt(row.get('speedup'), '.2f')}×")
        parts.append(f"α {_fmt(row.get('alpha'))}")
    if _text(row.get("lossless")):
        parts.append(_text(row.get("lossless")))
    status = _text(row.get("status"))
    parts.append(status if status == "ok" else f"{status}: {_text(row.get('message'))}")
    minutes, seconds = divmod(int(elapsed_s), 60)
    parts.append(f"({minutes}m{seconds:02d}s)")
    return "  ".join(parts)


def _print_summary(run_dir: Path) -> None:
    from specbench.fit import measurement_warnings
    from specbench.fit.nodes import node_spread, spread_text
    from specbench.results import load_run

    run = load_run(run_dir)
    console.print(cells_table(run.cells, f"sweep results ({len(run.cells)} cells)"))
    failed = run.cells[run.cells["status"] != "ok"]
    mismatches = run.cells[run.cells["lossless"] == "MISMATCH"] if "lossless" in run.cells else []
    for row in failed.to_dict("records"):
        errors.print(f"[yellow]{row['status']}[/] {row['cell_id']}: {escape(_text(row.get('message')))}", highlight=False)
    _print_warnings(measurement_warnings(run.cells, run.baseline_copies))
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


@app.command()
def models() -> None:
    """Model aliases, their sizes, and where each is available on this machine."""
    _quiet_libraries()
    from specbench.models import REGISTRY, local_availability

    table = Table(title="model aliases", title_justify="left", header_style="bold")
    for column in ("alias", "family", "size", "params", "hub id", "available here"):
        table.add_column(column, overflow="fold")
    for spec in REGISTRY.values():
        where = local_availability(spec)
        table.add_row(spec.alias, spec.family, spec.size, f"{spec.params_b:g}B", spec.hub_id,
                      f"[green]{where}[/]" if where else "[dim]no[/]")
    console.print(table)
    console.print("Drafts: an alias, a bare size in the target's family (llama3-70b + 1b -> llama3.2-1b), "
                  "ALIAS@DTYPE, ngram[:N], self:N. Missing models: `hf download HUB_ID` on an online machine.")


@app.command()
def workloads(
    tokenizer: str = typer.Option("smollm2-135m", help="Model whose tokenizer measures prompt lengths."),
    chat_template: bool = typer.Option(True),
) -> None:
    """Prompt sets, their sizes and prompt-length statistics."""
    _quiet_libraries()
    from specbench.models import ModelNotAvailable, load_tokenizer
    from specbench.workloads import WorkloadError, available_workloads, encode_prompt, length_stats, load_workload

    try:
        tok = load_tokenizer(tokenizer)
    except ModelNotAvailable as error:
        errors.print(f"[yellow]{error}; prompt lengths in characters instead[/]")
        tok = None
    unit = "tokens" if tok is not None else "chars"
    table = Table(title=f"workloads (prompt lengths in {unit})", title_justify="left", header_style="bold")
    for column in ("name", "prompts", "categories", "mean", "p50", "max", "source"):
        table.add_column(column, overflow="fold")
    for name in available_workloads():
        try:
            workload = load_workload(name)
        except WorkloadError as error:
            table.add_row(name, "–", "–", "–", "–", "–", f"[dim]{error}[/]")
            continue
        lengths = [len(encode_prompt(r, tok, chat_template)) if tok else len(r.text) for r in workload.records]
        stats = length_stats(lengths)
        categories = len({r.category.split("/")[0] for r in workload.records})
        table.add_row(name, str(stats["count"]), str(categories), f"{stats['mean']:.0f}", str(stats["p50"]),
                      str(stats["max"]), workload.source)
    console.print(table)
    console.print("Also: any .jsonl/.csv/.parquet file (FILE::COLUMN to pick the column) or hf:ORG/NAME[:SPLIT[:COLUMN]].")


@app.command()
def report(
    run_dir: Optional[Path] = typer.Argument(None, help="Run directory (default: the latest under results/)."),
    gpu_price: Optional[float] = typer.Option(None, help="$ per GPU-hour (per machine-hour on a CPU run)."),
    gpus: int = typer.Option(1, help="Devices the deployment uses (multiplies the hourly price)."),
    output: Optional[Path] = typer.Option(None, help="Where to write (default: RUN_DIR/report)."),
    slo: Optional[str] = typer.Option(None, help="Goodput and capacity under this SLO, e.g. ttft=1.0,tpot=0.05[,p90] "
                                                 "(default: the run's --slo)."),
    reference: Optional[Path] = typer.Option(None, help="A run of the same grid on another engine (e.g. --engine vllm): "
                                                       "the baseline's tokens/s is compared with its baseline's, and a "
                                                       "baseline far slower is a warning."),
    hardware: Optional[str] = typer.Option(None, help="A cluster run on several kinds of GPU: report the cells of "
                                                      "this one (a part of its name, e.g. H100)."),
) -> None:
    """Charts (PNG), one self-contained HTML page and a Markdown summary of a run."""
    from specbench.fit import completeness, parse_slo
    from specbench.gate import evaluate, evaluate_slo
    from specbench.report import write_report
    from specbench.results import load_run
    from specbench.served.vllm_engine import base_speculative_configs

    try:
        _check_price(gpu_price, gpus)
        run = _on_hardware(load_run(run_dir), hardware)
        if slo:
            parse_slo(slo)
        measured = measured_batch_sizes(run.cells)
        state = completeness(run.meta, run.cells)
        verdict = evaluate(run.cells, measured, base_configs=base_speculative_configs(run.meta, run.cells["draft"]),
                           state=state, allow_incomplete=True, requests=run.requests, steps=run.steps,
                           copies=run.baseline_copies) if measured else None
        gate_text = _gate_text(verdict) if verdict else ""
        sections = {"rollout check at every measured batch size": gate_text} if gate_text else {}
        slo_text = slo or (run.meta.get("config") or {}).get("slo") or ""
        if slo_text:
            slo_result = evaluate_slo(run.cells, run.requests, parse_slo(slo_text), state=state,
                                      allow_incomplete=True)
            sections["rollout check under the SLO"] = _slo_gate_text(slo_result)
        reference_run = load_run(reference) if reference is not None else None
        out_dir, analysis = write_report(run, output, gpu_price, gpus, sections, slo_text or None, verdict,
                                         reference_run)
    except _known_errors() as error:
        fail(str(error))
    if analysis.answer:
        console.print(f"[bold]{escape(analysis.answer)}[/]", highlight=False, soft_wrap=True)
    if analysis.baseline_note:
        console.print(escape(analysis.baseline_note), highlight=False, soft_wrap=True)
    _print_analysis(analysis)
    _print_warnings(analysis.warnings)
    for text in sections.values():
        console.print(text, highlight=False, soft_wrap=True)
    console.print(f"report: [bold]{out_dir / 'report.html'}[/] (charts: {', '.join(p.name for p in sorted(out_dir.glob('*.png')))}; "
                  f"summary.md)")


def _check_price(gpu_price: float | None, gpus: int) -> None:
    if gpu_price is not None and not (math.isfinite(gpu_price) and gpu_price >= 0):
        raise UsageError(f"--gpu-price must be a number of dollars >= 0, got {gpu_price:g}")
    if gpus < 1:
        raise UsageError(f"--gpus must be >= 1, got {gpus}")


def _frame_table(frame, title: str, columns: list[str], formats: dict[str, str] | None = None) -> Table:
    from pandas.api.types import is_numeric_dtype

    formats = formats or {}
    table = Table(title=title, title_justify="left", header_style="bold")
    present = [c for c in columns if c in frame]
    for column in present:
        table.add_column(column, overflow="fold", justify="right" if is_numeric_dtype(frame[column]) else "left")
    for row in frame[present].itertuples(index=False):
        table.add_row(*[_fmt(v, formats.get(c, ".3g")) if isinstance(v, float) else _text(v) for c, v in zip(present, row)])
    return table


def _print_warnings(warnings: list[str]) -> None:
    """measurement_warnings' messages, as warnings."""
    for message in warnings:
        errors.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def _print_analysis(analysis) -> None:
    from specbench.fit import b_star_rule

    if not analysis.alphas.empty:
        console.print(_frame_table(analysis.alphas, "α fit (i.i.d. MLE, 95% interval)",
                                   ["draft", "workload", "temperature", "alpha_iid", "alpha_low", "alpha_high",
                                    "acceptance_rate"], {"alpha_iid": ".3f", "alpha_low": ".3f", "alpha_high": ".3f",
                                                         "acceptance_rate": ".3f", "temperature": "g"}))
    if not analysis.predicted.empty:
        p = analysis.predicted
        console.print(_frame_table(p, "performance model: predicted vs measured (in-sample)",
                                   ["draft", "workload", "temperature", "context_length", "batch_size", "k",
                                    "tau_measured", "tau_predicted", "speedup_measured", "speedup_predicted",
                                    "speedup_error"], {"speedup_error": "+.1%", "temperature": "g"}))
    _print_trust(analysis.trust)
    if not analysis.crossovers.empty:
        console.print(_frame_table(analysis.crossovers, "crossover batch size B*",
                                   ["draft", "workload", "temperature", "crossover"], {"temperature": "g"}))
        console.print(f"  {b_star_rule()}; `worst case` rows: at each batch size the least favourable workload and "
                      f"temperature (what `check` judges)", highlight=False, soft_wrap=True)


def _on_hardware(run, hardware: str | None):
    """The run's cells on one kind of hardware: a speed-up is never taken across two (fit.nodes).
    A run on several kinds needs --hardware; one on a single kind is returned as it is."""
    from specbench.fit.nodes import hardware_kinds

    kinds = hardware_kinds(run.cells)
    if hardware is None:
        if len(kinds) > 1:
            raise UsageError(f"the run's cells ran on {len(kinds)} kinds of hardware ({'; '.join(kinds)}): no speed-up "
                             f"is taken across two; pass --hardware to pick one")
        return run
    chosen = [kind for kind in kinds if hardware.lower() in kind.lower()]
    if len(chosen) != 1:
        raise UsageError(f"--hardware {hardware}: the run's cells ran on {'; '.join(kinds) or 'unrecorded hardware'}"
                         + (" (it names several)" if chosen else ""))
    return _keep_cells(run, run.cells[run.cells["gpu_model"] == chosen[0]])


def _keep_cells(run, chosen):
    """The run with only the `chosen` cells, and their requests, steps and baseline copies."""
    from dataclasses import replace

    keep = set(chosen["cell_id"])
    pick = lambda frame: frame[frame["cell_id"].isin(keep)] if frame is not None and not frame.empty else frame  # noqa: E731
    return replace(run, cells=chosen, requests=pick(run.requests), steps=pick(run.steps),
                   baseline_copies=pick(run.baseline_copies))


def _at_context(run, length: int):
    """The run with only its cells (and their requests and steps) at one context length."""
    from specbench.fit import with_context

    cells = with_context(run.cells)
    chosen = cells[cells["context_length"] == length]
    if chosen.empty:
        measured = sorted(int(c) for c in cells["context_length"].unique())
        raise UsageError(f"--context-length {length}: the run measured context lengths "
                         f"{', '.join(str(c) if c else '0 (the prompts as they are)' for c in measured)}")
    return _keep_cells(run, chosen)


def _print_trust(lines: list[str]) -> None:
    """The performance model's held-out and in-sample errors, before any prediction is read."""
    if lines:
        console.print("[bold]how far the performance model's predictions can be trusted[/]")
        for line in lines:
            console.print(f"  {line}", highlight=False, soft_wrap=True)


def measured_batch_sizes(cells) -> list[int]:
    """Batch sizes with at least one finished cell, ascending."""
    if cells.empty or "batch_size" not in cells:
        return []
    from specbench.fit import closed_loop

    ok = closed_loop(cells[cells["status"] == "ok"] if "status" in cells else cells)
    return sorted(int(b) for b in ok["batch_size"].dropna().unique())


def _gate_text(result) -> str:
    from specbench.fit import b_star_rule, best_draft_rule
    from specbench.gate import DECISION_LABELS, evidence_text, format_speedup

    lines = [result.headline] if result.headline else []
    for v in result.verdicts:
        speedups = ", ".join(
            f"B={b}: {format_speedup(s, result.min_speedup)} (K={v.best_k[b]}, "
            f"{DECISION_LABELS.get(v.decisions.get(b), 'N/A').strip()}{evidence_text(v, b)})"
            for b, s in v.speedups.items()) or "none measured"
        missing = f"; not measured at B={','.join(map(str, v.missing))}" if v.missing else ""
        single = " (one K measured: no K comparison)" if v.ks_measured == 1 else ""
        lines.append(f"{DECISION_LABELS.get(v.decision, 'N/A ')} {v.draft}: {speedups}{missing}; K schedule {v.schedule}{single}; "
                     f"{v.crossover}")
    lines.append(f"verdict: {result.verdict}: {result.message} (exit {result.exit_code})")
    if result.advice:
        lines.append(f"  next: {result.advice}")
    if result.noise.get("text") and any(n == 1 for v in result.verdicts for n in v.repeats.values()):
        lines.append(f"  {result.noise['text']}")
    lines.append(f"  {best_draft_rule(result.min_speedup)}")
    lines.append(f"  {b_star_rule(result.min_speedup)}, over the worst workload and temperature")
    lines.append("  K schedule = at each measured batch size the fastest K shown to pay there (its interval, or one "
                 "repeat's noise band, above the bar; one repeat above what acceptance allows never), off elsewhere")
    for v in result.verdicts:
        if v.speculative_config:
            lines.append(f"vLLM, {v.draft}: --speculative-config '{json.dumps(v.speculative_config)}'")
    return "\n".join(lines)


def _slo_gate_text(result) -> str:
    from specbench.fit import capacity_text
    from specbench.gate import DECISION_LABELS, bounds_text

    lines = []
    for v in result.verdicts:
        state = DECISION_LABELS.get(v.decision, "N/A ")
        with_k = f" (K={v.k})" if v.k is not None else ""
        if v.bounds[0] != v.bounds[1] or v.baseline_bounds[0] != v.baseline_bounds[1]:
            with_k += f" [within noise: {bounds_text(v.bounds, result.load)} with, " \
                      f"{bounds_text(v.baseline_bounds, result.load)} without]"
        lines.append(f"{state} {v.workload}, T={v.temperature:g}: with {result.draft} "
                     f"{capacity_text(v.capacity, v.max_measured, result.load)}{with_k}, {_fmt(v.tokens_per_s, '.1f')} tok/s; "
                     f"without {capacity_text(v.baseline_capacity, v.max_measured, result.load)}, "
                     f"{_fmt(v.baseline_tokens_per_s, '.1f')} tok/s")
    lines.append(f"verdict: {result.verdict}: {result.message} (exit {result.exit_code})")
    if result.advice:
        lines.append(f"  next: {result.advice}")
    lines.append("  capacity = the highest measured load up to which every measured load meets the SLO (at each load "
                 "the best K); a load meets it when the SLO's percentile of every bounded metric over its requests is "
                 "within the bound")
    return "\n".join(lines)


@app.command()
def check(
    run_dir: Optional[Path] = typer.Argument(None, help="Run directory (default: the latest under results/)."),
    batch_sizes: Optional[str] = typer.Option(None, help="Batch sizes that must meet the bar (default: every "
                                                         "batch size the run measured), e.g. 32,64."),
    min_speedup: float = typer.Option(1.0, help="The bar: speed-up at least this."),
    draft: Optional[str] = typer.Option(None, help="Judge this draft (default: the best one at those batch sizes)."),
    workloads: Optional[str] = typer.Option(None, help="Only these workloads (default: all; the worst counts)."),
    temperatures: Optional[str] = typer.Option(None, help="Only these temperatures (default: all; the worst counts)."),
    context_length: Optional[str] = typer.Option(None, help="Only cells at this context length in tokens (4k = "
                                                            "4096; default: every length, the worst counts)."),
    slo: Optional[str] = typer.Option(None, help="Judge the SLO instead: speculation must not lower the highest "
                                                 "load meeting it, e.g. ttft=1.0,tpot=0.05[,p90] (default: the "
                                                 "run's --slo on a request-rate run)."),
    allow_incomplete: bool = typer.Option(False, help="Judge a run that did not finish (stopped, failed cells) on "
                                                      "what it measured, instead of exit 2."),
    hardware: Optional[str] = typer.Option(None, help="A cluster run on several kinds of GPU: judge the cells of "
                                                      "this one (a part of its name, e.g. H100)."),
    json_output: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
) -> None:
    """Rollout gate: does speculation meet the bar at every named batch size (with --slo: not lower
    the highest load meeting the SLO)? Exit 0 pass, 1 fail, 2 cannot answer (bad input, missing
    cells, an incomplete run), 3 inconclusive (an interval straddles the bar), 4 internal error."""
    from specbench.fit import completeness, open_loop, parse_slo
    from specbench.gate import INTERNAL_ERROR, UNANSWERABLE, evaluate, evaluate_slo
    from specbench.results import load_run
    from specbench.served.vllm_engine import base_speculative_configs

    slo_result = None
    try:
        if not (math.isfinite(min_speedup) and min_speedup > 0):
            raise UsageError(f"--min-speedup must be a positive number, got {min_speedup:g}")
        run = _on_hardware(load_run(run_dir), hardware)
        state = completeness(run.meta, run.cells)  # of the whole run, before any filter
        if context_length is not None:
            run = _at_context(run, token_count(context_length))
            state = state.at_context(token_count(context_length))
        chosen_workloads = split_list(workloads, str, "--workloads") if workloads else None
        chosen_temperatures = split_list(temperatures, float, "--temperatures") if temperatures else None
        recorded = (run.meta.get("config") or {}).get("slo") or ""
        if slo or not open_loop(run.cells).empty:
            if not (slo or recorded):
                raise UsageError("a request-rate run is judged against an SLO: pass --slo ttft=SECONDS,tpot=SECONDS")
            if batch_sizes:
                raise UsageError("--batch-sizes judges speed-ups; with --slo (or on a request-rate run) the loads "
                                 "judged are every load the run measured")
            slo_result = evaluate_slo(run.cells, run.requests, parse_slo(slo or recorded), draft,
                                      chosen_workloads, chosen_temperatures, state, allow_incomplete)
        else:
            sizes = split_list(batch_sizes, int, "--batch-sizes") if batch_sizes else measured_batch_sizes(run.cells)
            if any(b < 1 for b in sizes):
                raise UsageError(f"--batch-sizes must be >= 1, got {batch_sizes}")
            result = evaluate(run.cells, sizes, min_speedup, draft, chosen_workloads, chosen_temperatures,
                              base_speculative_configs(run.meta, run.cells["draft"]), state, allow_incomplete,
                              run.requests, run.steps, run.baseline_copies)
    except _known_errors() as error:
        if json_output:
            print(json.dumps({"exit_code": UNANSWERABLE, "verdict": "CANNOT ANSWER", "message": str(error)}))
            raise typer.Exit(UNANSWERABLE)
        fail(str(error))
    except Exception as error:  # a bug: a pipeline's verdict.json still gets its JSON; exit 4 as always
        if json_output:
            print(json.dumps({"exit_code": INTERNAL_ERROR, "verdict": "ERROR",
                              "message": f"internal error (a bug in specbench, not a verdict): "
                                         f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"}))
        raise
    spent = str(run.meta.get("until_decided") or "").startswith("budget spent")
    for answered in (slo_result, None if slo_result is not None else result):
        if answered is not None:  # the commands that finish or decide it, runnable as printed
            answered.advice = answered.advice.replace("--output RUN", f"--output {run.path}")
            if spent and "--until-decided" in answered.advice:  # it ran: more of the same needs a bigger budget
                max_repeats = (run.meta.get("config") or {}).get("max_repeats", "?")
                answered.advice = (f"--until-decided already spent its budget here ({max_repeats} repeats): "
                                   f"`specbench sweep --resume --output {run.path} --until-decided --max-repeats "
                                   f"{2 * max_repeats if isinstance(max_repeats, int) else 'N'}` adds more, or "
                                   "a --min-speedup margin decides a speed-up that sits on the bar")
    if slo_result is not None:
        if json_output:
            print(json.dumps(slo_result.to_dict(), indent=2))
        else:
            unit = "request rate" if slo_result.load == "request_rate" else "concurrency"
            console.print(f"does speculation keep the highest {unit} meeting the SLO ({slo_result.slo})? "
                          f"(run {run.path})", highlight=False, soft_wrap=True)
            console.print(_slo_gate_text(slo_result), highlight=False, soft_wrap=True)
            _print_gate_warnings(slo_result.warnings)
        raise typer.Exit(slo_result.exit_code)
    if json_output:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        which = "" if batch_sizes else " (every batch size the run measured; --batch-sizes to choose)"
        console.print(f"does speculation keep ≥ {min_speedup:g}× at batch size(s) {', '.join(map(str, sizes))}?{which} "
                      f"(run {run.path})", highlight=False, soft_wrap=True)
        console.print(_gate_text(result), highlight=False, soft_wrap=True)
        _print_gate_warnings(result.warnings)
    raise typer.Exit(result.exit_code)


def _print_gate_warnings(warnings: list[str]) -> None:
    """A verdict's warnings, on stdout with the verdict (a pipeline's log keeps them together)."""
    for message in warnings:
        console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


@app.command()
def plan(
    run_dir: Optional[Path] = typer.Argument(None, help="Run to plan from (default: the latest under results/)."),
    timings: Optional[Path] = typer.Option(None, help="Run whose step times (hardware) to use (default: RUN_DIR)."),
    acceptance: Optional[Path] = typer.Option(None, help="Run whose fitted α to use (default: RUN_DIR; a "
                                                          "--weights random run: the α it simulated)."),
    alpha: Optional[float] = typer.Option(None, "--alpha", help="Predict at this i.i.d. α for every draft instead."),
    k: str = typer.Option("1,2,3,4,6,8", "--k", help="K values to predict."),
    batch_sizes: str = typer.Option("1,2,4,8,16,32,64", help="Batch sizes to predict."),
    context_lengths: Optional[str] = typer.Option(None, help="Prompt lengths in tokens to predict too (4k = 4096), "
                                                             "with each traffic's measured α."),
    device: Optional[str] = typer.Option(None, help="Carry the fitted efficiencies to another GPU's datasheet "
                                                    "bandwidth and FLOP/s: h100, h200, a100 or l40s (an ESTIMATE)."),
    gpu_price: Optional[float] = typer.Option(None, help="$ per GPU-hour (default: the run's GPU, if known)."),
    gpus: int = typer.Option(1, help="Devices the deployment uses."),
    json_output: bool = typer.Option(False, "--json", help="Print the predictions as JSON records."),
) -> None:
    """What-if: predicted speed-up, tokens/s, B* and cost for K, batch sizes and context lengths
    not measured, from the roofline performance model fitted on the run (README: the performance model)."""
    import pandas as pd

    from specbench import fit
    from specbench.results import load_run

    try:
        ks, sizes = split_list(k, int, "--k"), split_list(batch_sizes, int, "--batch-sizes")
        contexts = token_counts(context_lengths, "--context-lengths") if context_lengths else []
        if any(x < 1 for x in ks + sizes + contexts):
            raise UsageError("--k, --batch-sizes and --context-lengths must be >= 1")
        _check_price(gpu_price, gpus)
        if alpha is not None and not 0 <= alpha < 1:
            raise UsageError(f"--alpha must be in [0, 1), got {alpha}")
        if device is not None and device.lower() not in fit.DEVICES:
            raise UsageError(f"--device must be one of {', '.join(fit.DEVICES)}, got {device!r}")
        timings = load_run(timings or run_dir)
        if contexts:  # as the sweep would refuse them: prompts of that length plus the run's output must fit
            from specbench.sweep import SweepConfig, check_context_limit, target_shape

            recorded = timings.meta.get("config") or {}
            asked = SweepConfig(target=recorded.get("target", ""), ks=ks, context_lengths=contexts,
                                max_new_tokens=int(recorded.get("max_new_tokens", 1)))
            check_context_limit(asked, target_shape(asked))
        accept_run = load_run(acceptance or run_dir) if (acceptance or run_dir) else timings
        models = fit.cost_models(timings.cells, timings.steps, timings.requests, timings.meta)
        if not models:
            raise UsageError(f"{timings.path}: no finished autoregressive cells with step times to fit (or the "
                             f"target's shapes are unknown)")
        alphas = fit.model_alphas(accept_run.cells, accept_run.steps)
        drafts = _plan_drafts(models, alphas, alpha)
        if not drafts:
            raise UsageError("no draft has both step times and an α (give --acceptance RUN or --alpha)")
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
    except _known_errors() as error:
        fail(str(error))
    unit = "$/1M tok" if price is not None else "device-h/1M tok"
    if json_output:
        print(table.to_json(orient="records", indent=2))
        return
    trust = fit.held_out(timings.cells, timings.steps, timings.requests, timings.meta)
    label = "[bold red]ESTIMATE[/] for " + note if note else "[bold yellow]PREDICTIONS[/]"
    console.print(f"{label} from step times of {timings.path} and α of "
                  f"{'--alpha ' + format(alpha, 'g') if alpha is not None else accept_run.path} (not measurements; "
                  f"{price_note})", highlight=False)
    stopped = fit.completeness(timings.meta, timings.cells).describe()
    _print_warnings(([stopped] if stopped else []) + fit.measurement_warnings(timings.cells))
    from specbench.report import trust_lines

    _print_trust(trust_lines(timings, pd.DataFrame(), trust))
    _print_plan(table, sizes, unit)
    console.print(f"{fit.b_star_rule()}; {fit.best_draft_rule()}", highlight=False, soft_wrap=True)


def _plan_drafts(models: dict, alphas, alpha: float | None) -> list[str]:
    """Drafts with step times in the timing run and an α (from the acceptance run, or --alpha)."""
    from specbench.fit import base_draft

    timed = {base_draft(d) for m in models.values() for d in list(m.times.drafts) + list(m.measured_ks)}
    if alpha is not None:
        return sorted({d for m in models.values() for d in m.measured_ks})
    known = set(alphas["draft"]) if not alphas.empty else set()
    return sorted(d for d in known if base_draft(d) in timed)


def _on_device(models: dict, meta: dict, device: str) -> tuple[dict, str]:
    """Every model's step times carried to `device`'s datasheet peaks (the efficiencies kept)."""
    import copy

    from specbench import fit

    gpus = (meta.get("hardware") or {}).get("gpus") or []
    measured = fit.device_key(gpus[0]["name"]) if gpus else None
    if measured is None:
        raise UsageError(f"--device needs a run on a known GPU ({', '.join(fit.DEVICES)}); this one ran on "
                         f"{gpus[0]['name'] if gpus else 'a CPU'}, whose efficiencies do not carry to a GPU")
    dtype = "float32" if next(iter(models.values())).times.target.architecture.bytes_per_parameter >= 4 else "bfloat16"
    peaks = lambda key: (fit.DEVICES[key]["bandwidth"], fit.peak_flops(key, dtype))  # noqa: E731
    moved = {}
    for key, model in models.items():
        clone = copy.copy(model)
        clone.times = model.times.on_device(peaks(measured), peaks(device))
        moved[key] = clone
    return moved, (f"{fit.DEVICES[device]['name']}: efficiencies fitted on {gpus[0]['name']} carried to its "
                   f"datasheet bandwidth and FLOP/s; overheads kept")


def _print_plan(table, sizes: list[int], unit: str) -> None:
    from specbench.fit import AR, crossover, pick_best_draft

    keys = ["workload", "temperature", "context_length"]
    for (workload, temperature, context), group in table.groupby(keys):
        best = group[group["draft"] != AR].sort_values("speedup", ascending=False) \
            .drop_duplicates(["draft", "batch_size"]).sort_values(["draft", "batch_size"])
        if best.empty:
            continue
        where = f"{workload}" + (f" at {int(context)} tokens" if context else "") + f", T={temperature:g}"
        shown = Table(title=f"predicted best K per batch size: {where}", title_justify="left", header_style="bold")
        for column in ("draft", "B", "best K", "α", "τ", "speed-up", "tok/s", unit):
            shown.add_column(column, overflow="fold")
        for row in best.itertuples():
            shown.add_row(row.draft, f"{row.batch_size}{'*' if row.extrapolated_b else ''}",
                          f"{row.k}{'†' if row.extrapolated_k else ''}", f"{row.alpha_iid:.2f}", f"{row.tau:.2f}",
                          f"{row.speedup:.2f}×", f"{row.tokens_per_s:.1f}", f"{row.cost_per_1m:.3g}")
        console.print(shown)
        for draft, rows in best.groupby("draft"):
            found = crossover(rows["batch_size"].tolist(), rows["speedup"].tolist())
            console.print(f"  {draft}: predicted {found.text}", highlight=False)
        leader = pick_best_draft(best, sizes)
        if leader:
            console.print(f"  predicted best draft: {leader}", highlight=False)
        marks = []
        if group["extrapolated_b"].any():
            marks.append("* a batch size outside the measured ones")
        if best["extrapolated_k"].any():
            marks.append("† a K outside the measured ones (its draft and verify costs from the model alone)")
        if group["extrapolated_context"].any():
            marks.append("a context length not measured: prompts of that length, α as measured at the run's own")
        if marks:
            console.print("  " + "; ".join(marks) + ": sweep them before relying on them", highlight=False,
                          soft_wrap=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the program is, so that it stops as on Ctrl-C: finished cells kept,
    servers stopped, run.json `interrupted`."""


_signals_received: list[int] = []


def _raise_terminated(signum, frame) -> None:
    _signals_received.append(signum)
    raise Terminated()


INTERRUPTED, TERMINATED, PIPE_CLOSED = 130, 143, 141  # 128 + SIGINT, SIGTERM, SIGPIPE, as a shell reports them


def main(argv: list[str] | None = None) -> None:
    """The `specbench` command. Exit codes (README, "Using check in CI"): 0 pass, 1 fail, 2 cannot
    answer or bad input, 3 inconclusive, 4 internal error, 130/143 stopped by SIGINT/SIGTERM, 141
    its output pipe closed.
    Whatever goes wrong, a traceback never exits 0 or 1."""
    import errno
    import signal

    usage_errors: tuple = ()
    for module in ("typer._click.exceptions", "click.exceptions"):  # newer typer vendors its click
        try:
            usage_errors += (__import__(module, fromlist=["ClickException"]).ClickException,)
        except ImportError:
            pass

    from specbench.gate import INTERNAL_ERROR, UNANSWERABLE

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        code = app(args=argv, prog_name="specbench", standalone_mode=False)
    except usage_errors as error:  # bad usage: typer's own message
        error.show()
        code = UNANSWERABLE
    except SystemExit as stop:  # typer exits 1 when a reader closed the output pipe: never read as FAIL
        cause = stop.__context__
        if not (isinstance(cause, OSError) and cause.errno == errno.EPIPE):
            raise
        code = PIPE_CLOSED
    except (typer.Abort, KeyboardInterrupt):
        code = INTERRUPTED  # TERMINATED below when it was SIGTERM
        errors.print("[yellow]stopped[/]", highlight=False)
    except OSError as error:  # a file or directory that cannot be read or written
        where = f"{error.filename}: " if getattr(error, "filename", None) else ""
        errors.print(f"[bold red]error:[/] {escape(where + (error.strerror or str(error)))}", highlight=False,
                     soft_wrap=True)
        code = UNANSWERABLE
    except Exception as error:
        code = INTERNAL_ERROR
        errors.print(f"[bold red]internal error[/] (a bug in specbench, not a verdict): "
                     f"{escape(type(error).__name__)}: {escape((str(error).splitlines() or [''])[0])}; "
                     f"traceback in {_save_traceback()}", highlight=False, soft_wrap=True)
    finally:  # past the command, SIGTERM ends the process as it would have (no exception in atexit code)
        signal.signal(signal.SIGTERM, previous)
    if code == INTERRUPTED and _signals_received:  # typer reports any KeyboardInterrupt (Terminated too) as 130
        code = TERMINATED
    sys.exit(code if isinstance(code, int) else 0)


def _save_traceback() -> str:
    import tempfile
    import traceback

    with tempfile.NamedTemporaryFile("w", prefix="specbench-traceback-", suffix=".txt", delete=False) as file:
        traceback.print_exc(file=file)
    return file.name


if __name__ == "__main__":
    main()
