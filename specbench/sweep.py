"""A sweep: every cell of the grid measured by one engine (native, vLLM or an endpoint), written to
a run directory as it goes, each speculative cell paired with its group's autoregressive baseline
and, when greedy, checked token for token against it.

This module plans and checks (`preflight`, `resumed_config`), opens the run directory, and hands
the cells to an executor (this process or a Ray cluster), which runs the measuring loop
(`measuring.py`). `run_sweep` is the notebook entry point; the CLI only renders its events.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from specbench.drafter_kinds import drafter_kind
from specbench.grid import (  # noqa: F401  (SweepConfig and plan_cells are the sweep's vocabulary too)
    AR, Cell, SweepConfig, VllmOptions, build_replay, check_context_limit, context_limit, describe_plan, plan_cells,
    positions_needed, setting, split_schedule, target_shape, with_setting,
)
from specbench.measuring import (
    CellLoop, SweepEvent, SweepTables, SweepWork, check_engine, close_brackets, pair_with_baseline,
)
from specbench.models import dtype_name, load_tokenizer, model_family, parse_draft_spec, resolve_model
from specbench.results import (
    FLAT_CONFIG, cpu_flags, hardware_info, new_run_dir, nested_config, now_iso, read_table, versions, write_json,
)
from specbench.schema import BRACKETED
from specbench.synthetic import shipped_config
from specbench.traces import Replay
from specbench.workloads import Workload, encode_prompt, load_workload


def endpoint_context_limit(config: SweepConfig) -> int:
    """On the user's endpoints, the context they say they serve (0: another engine, or none says):
    what a trace's rows, the context lengths and the prompts must fit there."""
    if config.engine.name != "endpoint":
        return 0
    from specbench.served.endpoint import served_context_limit

    return served_context_limit(config)


def check_config(config: SweepConfig, replay: Replay | None = None) -> Replay | None:
    """One-line errors for bad input, before anything loads: the grid's values (`SweepConfig.validate`),
    the trace (read here into its replay, unless `replay` is given: returned), the SLO, where the
    cells run (the executor) and what the chosen engine can run."""
    from specbench.executors import validate_executor
    from specbench.fit.slo import parse_slo

    config.validate()
    if replay is None and config.load.trace:
        replay = build_replay(config, endpoint_context_limit(config))
    if config.gate.slo:
        parse_slo(config.gate.slo)
    validate_executor(config)
    check_engine(config)
    return replay


def preflight(config: SweepConfig, replay: Replay | None = None) -> tuple[dict[str, Workload], Replay | None]:
    """Everything checkable without loading weights: grid values, model references, workloads, the
    trace, and what must fit the target (its context, its layers). Returns the loaded workloads and
    the trace's replay (built here once, unless `check_config` built it already: None without --trace)."""
    replay = check_config(config, replay)
    if config.engine.name == "endpoint":  # an unreachable server is the likelier mistake than a missing tokenizer
        from specbench.served.endpoint import check_reachable

        check_reachable(config)
    served = endpoint_context_limit(config)
    shape = target_shape(config)
    check_context_limit(config, shape, served)
    check_self_drafts(config, shape)
    workloads = {name: load_workload(name) for name in config.grid.workloads}
    check_prompt_lengths(config, workloads, shape, served)
    if config.engine.name == "vllm":
        import sys

        from specbench.served.vllm_engine import installed_vllm_version

        installed_vllm_version(config.engine.vllm.python or sys.executable)  # one line saying how to install it
    if config.grid.synthetic:
        target_alias, _ = shipped_config(config.grid.target)
        family = model_family(target_alias)
        for draft in config.grid.drafts:
            spec = parse_draft_spec(split_schedule(draft)[0], allow_served=config.engine.name != "native")
            if drafter_kind(spec.kind).separate_model:
                shipped_config(spec.model, family)
        return workloads, replay
    target = resolve_model(config.grid.target, allow_download=config.engine.allow_download)
    family = target.spec.family if target.spec else None
    for draft in config.grid.drafts if config.engine.name != "endpoint" else []:  # an endpoint's draft is a label
        spec = parse_draft_spec(split_schedule(draft)[0], allow_served=config.engine.name != "native")
        if drafter_kind(spec.kind).separate_model:
            resolve_model(spec.model, family=family, allow_download=config.engine.allow_download)
    return workloads, replay


BF16_INSTRUCTIONS = {"avx512_bf16", "amx_bf16"}  # a CPU flag of either: torch's bf16 products run at speed


def slow_bf16_note(config: SweepConfig, flags: list[str] | None = None) -> str | None:
    """One line where the native engine is to run a 16-bit model on a CPU without bf16 instructions
    (AVX512-BF16 or AMX; `flags`: the CPU's, results.cpu_flags): torch falls back to kernels there
    that a 2-core AVX2 VM ran at 0.2-1.5 GFLOP/s against fp32's 20-66, so such a draft's cells
    measure that CPU's bf16, not the draft. None where it does not apply."""
    if config.engine.name != "native" or not config.engine.device.startswith("cpu") or config.grid.synthetic:
        return None
    def sixteen_bit(dtype: str | None) -> bool:  # None: the CPU's default, fp32
        return dtype is not None and dtype_name(dtype) in ("bfloat16", "float16")

    models = [config.grid.target] * sixteen_bit(config.engine.dtype)
    for draft in config.grid.drafts:
        spec = parse_draft_spec(split_schedule(draft)[0])
        if drafter_kind(spec.kind).separate_model and sixteen_bit(spec.dtype or config.engine.dtype):
            models.append(f"{spec.model}@{spec.dtype or config.engine.dtype}")
    flags = cpu_flags() if flags is None else flags
    if not models or BF16_INSTRUCTIONS & set(flags):
        return None
    return (f"note: this CPU has no bf16 instructions (AVX512-BF16 or AMX; it lists {', '.join(flags) or 'neither'}): "
            f"torch runs 16-bit matmuls there far slower than fp32, and {', '.join(models)} will be timed so")


def check_self_drafts(config: SweepConfig, shape: dict | None) -> None:
    """self:N drafts with the target's first N layers: N must be fewer than the target has."""
    layers = (shape or {}).get("num_hidden_layers")
    for draft in config.grid.drafts:
        base = split_schedule(draft)[0]
        if layers and base.startswith("self:"):
            n = parse_draft_spec(base, allow_served=True).layers
            if n >= layers:
                raise ValueError(f"draft {draft!r}: {config.grid.target} has {layers} layers; a self-draft uses fewer "
                                 f"(self:1 to self:{layers - 1})")


MAX_PROMPT_CHARS = 1 << 22  # 4 Mi characters: more than any model's context holds, whatever it is


def check_prompt_lengths(config: SweepConfig, workloads: dict[str, Workload], shape: dict | None,
                         served_limit: int = 0) -> None:
    """A prompt that cannot fit the context the sweep's servers take (`grid.context_limit`), or is
    over MAX_PROMPT_CHARS, is refused before anything loads: generating from it would fail, or
    exhaust memory first. A prompt of at most as many characters as there are free positions fits
    (a token covers at least one character); only longer ones are tokenized to know."""
    context = context_limit(config, shape, served_limit)
    limit = context.tokens
    room = limit - positions_needed(config, 0) if limit else None
    tokenizer = None
    for name, workload in workloads.items():
        if config.grid.context_lengths or config.load.trace or not workload.records:
            continue  # prompts built to the context lengths or a trace's, checked against the context already
        longest = max(workload.records, key=lambda record: len(record.text))
        chars = len(longest.text)
        if chars > MAX_PROMPT_CHARS or (room is not None and chars > 32 * room):
            where = f"; {context.whose}" if limit else ""
            raise ValueError(f"workload {name}: prompt {longest.id} is {chars:,} characters, over the size limit"
                             f"{where}")
        if room is None or chars + 64 <= room or config.grid.synthetic:
            continue
        if tokenizer is None:

            tokenizer = load_tokenizer(config.grid.target, config.engine.allow_download,
                                       config.engine.trust_remote_code)
        tokens = len(encode_prompt(longest, tokenizer, config.engine.chat_template))
        if tokens > room:
            raise ValueError(f"workload {name}: prompt {longest.id} is {tokens} tokens; with --max-new-tokens "
                             f"{config.grid.max_new_tokens} it needs {positions_needed(config, tokens)} positions and "
                             f"{context.whose}")


# --- the run's time, told before it starts ----------------------------------------------------

DEFAULT_RUN_BUDGET_S = 15 * 60  # what a default run may take on a slow 2-core CPU: a quarter of an hour
# options that size a run: given any, the user sized it, and the grid is run as given (and told)
SIZE_FIELDS = {"grid.target", "grid.drafts", "grid.ks", "load.batch_sizes", "grid.temperatures", "grid.workloads",
               "grid.context_lengths", "grid.max_new_tokens", "grid.num_prompts", "grid.repeats", "engine.dtype",
               "grid.alphas", "gate.until_decided"}
# grid values a default run (no option of SIZE_FIELDS given) gives up, in this order, while its
# estimate is over the budget: sampled cells first (greedy ones are checked exactly), then K 4,
# the code workload, batch size 16
TRIMS = (("grid.temperatures", [0.0], "--temperatures 0"), ("grid.ks", [2], "--k 2"),
         ("grid.workloads", ["chat"], "--workloads chat"), ("load.batch_sizes", [1, 4], "--batch-sizes 1,4"))


@dataclass
class TimePlan:
    """What the run header says about time: the config to run (defaults fitted to this CPU), the
    estimate of the cells left to run, and the lines that say both."""

    config: SweepConfig
    estimate: object | None  # native.estimate.Estimate; None where the native CPU estimate does not apply
    lines: list[str] = field(default_factory=list)
    chosen: list[str] = field(default_factory=list)  # the defaults changed, as options

    def record(self) -> dict:
        """For run.json: the estimate and what was chosen."""
        if self.estimate is None:
            return {}
        rates = self.estimate.rates
        return {"time_estimate": {"seconds": round(self.estimate.seconds, 1), "source": rates.source,
                                  "matmul_flops_per_s_by_dtype": rates.flops,
                                  "copy_bandwidth_bytes_per_s": rates.bandwidth},
                **({"defaults_chosen": self.chosen} if self.chosen else {})}


def plan_time(config: SweepConfig, workloads: dict, given: set[str] | None = None, cells: list[Cell] | None = None,
              rates=None) -> TimePlan:
    """The estimate of a native CPU sweep's `cells` (default: all) from this machine's probe
    (`rates`: native.estimate.Rates, measured here when None). Where `given` names the options the
    user gave (None: all of them, as a resume or a notebook), the defaults left are fitted to this
    CPU: a 16-bit model draft runs in fp32 where its products are many times slower than fp32's
    (SLOW_16_BIT), and while the estimate of a default run (no option of SIZE_FIELDS given) is over
    DEFAULT_RUN_BUDGET_S its grid gives up TRIMS in turn. Over the budget after that, the lines say
    which cells are slow, why, and the options that cut them."""
    from specbench.native.estimate import estimate_native, native_dtypes, probe_rates, prompt_tokens

    if config.engine.name != "native" or not config.engine.device.startswith("cpu") or config.grid.synthetic \
            or config.executor.name != "local":  # a cluster's nodes are not this machine
        return TimePlan(config, None)
    if rates is None:
        rates = probe_rates(sorted(set(native_dtypes(config).values()) | {"float32"}))
    tokens = prompt_tokens(config, workloads)
    chosen, why = [], []
    if given is not None and "grid.drafts" not in given:
        drafts = [_in_fp32(draft) if _slower_16_bit(draft, config, rates) else draft for draft in config.grid.drafts]
        if drafts != config.grid.drafts:
            slow = estimate_native(config, rates, tokens)
            config = with_setting(config, "grid.drafts", drafts)
            chosen.append(f"--drafts {','.join(drafts)}")
            bf16 = rates.flops.get("bfloat16", float("nan"))
            why.append(f"bf16 products run at {bf16 / 1e9:.3g} GFLOP/s on this CPU against fp32's "
                       f"{rates.flops['float32'] / 1e9:.3g}{_no_bf16_instructions()}: a bf16 draft would take the "
                       f"grid to {minutes_of(slow.seconds) if slow else 'hours'}")
    estimate = estimate_native(config, rates, tokens, cells)
    if estimate is None:
        return TimePlan(config, None)
    if given is not None and not given & SIZE_FIELDS and estimate.seconds > DEFAULT_RUN_BUDGET_S:
        before, trims = estimate.seconds, []
        for path, values, option in TRIMS:
            if estimate.seconds <= DEFAULT_RUN_BUDGET_S:
                break
            if list(setting(config, path)) != values and set(values) <= set(setting(config, path)):
                config = with_setting(config, path, values)
                estimate = estimate_native(config, rates, tokens)
                trims.append(option)
        chosen += trims
        # (named only beside another reason: alone, the line above names them)
        why.append(f"{' '.join(trims) + ': ' if why else ''}the default grid was estimated at {minutes_of(before)}, "
                   f"over a default run's {minutes_of(DEFAULT_RUN_BUDGET_S)}")
    lines = []
    if chosen:
        lines.append(f"defaults for this CPU: {' '.join(chosen)} ({'; '.join(why)})"
                     + ("; the options you gave are kept" if given else ""))
    count = len(estimate.cells)
    lines.append(f"estimate: about {minutes_of(estimate.seconds)} for {count} cell{'s' * (count != 1)} "
                 f"(from the probe, {estimate.rates.describe()}; assumed acceptance, prompts sized by characters)")
    if estimate.seconds > DEFAULT_RUN_BUDGET_S:
        lines.append(_slow_cells(config, estimate, rates, tokens, cells))
    return TimePlan(config, estimate, lines, chosen)


def minutes_of(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _no_bf16_instructions() -> str:
    flags = cpu_flags()
    return "" if BF16_INSTRUCTIONS & set(flags) else " (it has no bf16 instructions: AVX512-BF16 or AMX)"


def _in_fp32(draft: str) -> str:
    return f"{parse_draft_spec(draft).model}@fp32"


SLOW_16_BIT = 8  # fp32 over 16-bit product rate past which a 16-bit draft costs more than it saves:
# 13-100 on CPUs without bf16 instructions, under 1 with them; a busy machine moves it a few-fold


def _slower_16_bit(draft: str, config: SweepConfig, rates) -> bool:
    """A model draft in bf16 or fp16 whose products the probe found SLOW_16_BIT times slower than fp32's."""
    from specbench.native.estimate import native_dtypes

    dtype = native_dtypes(config).get(draft)
    return dtype in ("bfloat16", "float16") and dtype in rates.flops and \
        rates.flops[dtype] * SLOW_16_BIT < rates.flops.get("float32", 0.0)


def _slow_cells(config: SweepConfig, estimate, rates, tokens: dict, cells: list[Cell] | None) -> str:
    """Which cells take the time, why, and each option that cuts it with the time it leaves."""
    from specbench.native.estimate import estimate_native

    shares = estimate.by_draft()
    slowest = max(shares, key=shares.get)
    count = sum(cell.draft == slowest for cell in estimate.cells)
    line = f"slow: the {count} {slowest} cells take about {minutes_of(shares[slowest])} of it"
    if _slower_16_bit(slowest, config, rates):
        line += (f": bf16 products run at {rates.flops.get('bfloat16', 0) / 1e9:.3g} GFLOP/s on this CPU against "
                 f"fp32's {rates.flops['float32'] / 1e9:.3g}{_no_bf16_instructions()}")
    cuts = []
    if slowest != AR:
        others = [draft for draft in config.grid.drafts if draft != slowest]
        if _slower_16_bit(slowest, config, rates):
            cuts.append(("grid.drafts", [*others, _in_fp32(slowest)]))
        if others:
            cuts.append(("grid.drafts", others))
    if len(config.grid.temperatures) > 1:
        cuts.append(("grid.temperatures", [min(config.grid.temperatures)]))
    if len(config.load.batch_sizes) > 1:
        cuts.append(("load.batch_sizes", sorted(config.load.batch_sizes)[:-1]))
    if len(config.grid.ks) > 1:
        cuts.append(("grid.ks", [min(config.grid.ks)]))
    told = []
    for path, values in cuts:
        changed = with_setting(config, path, values)
        left = None if cells is None else [cell for cell in plan_cells(changed) if cell.id in {c.id for c in cells}]
        after = estimate_native(changed, rates, tokens, left)
        if after is not None and after.seconds < estimate.seconds:
            option = OPTION_NAMES[path].replace("_", "-")
            told.append(f"--{option} {','.join(f'{v:g}' if isinstance(v, float) else str(v) for v in values)} "
                        f"(about {minutes_of(after.seconds)})")
    return line + ("; cut it with " + ", ".join(told) if told else "")


# --- resuming a run ----------------------------------------------------------------------------

# SweepConfig settings that name cells (a resume may add values: new cells, old ones kept), and
# those that change what a cell measures (a resume must keep them). The rest (--slo, downloads) may change.
GRID_FIELDS = ("grid.drafts", "grid.ks", "load.batch_sizes", "load.request_rates", "grid.temperatures",
               "grid.workloads", "grid.context_lengths", "grid.alphas")
MEASURED_FIELDS = ("grid.target", "grid.max_new_tokens", "grid.num_prompts", "grid.repeats", "grid.seed",
                   "engine.dtype", "engine.device", "grid.top_p", "grid.top_k", "engine.chat_template", "grid.weights",
                   "grid.target_layers", "engine.cuda_graphs", "engine.name", "engine.vllm", "load.burstiness",
                   "engine.endpoint.urls", "engine.endpoint.baseline_urls", "engine.endpoint.router", "load.trace",
                   "load.trace_window", "load.trace_speedup", "load.trace_max_requests")
# each setting (its path in SweepConfig's groups) -> the sweep option that sets it: a flat
# config's key, but for these
RENAMED_OPTIONS = {"ks": "k", "alphas": "alpha", "allow_download": "download"}
OPTION_NAMES = {".".join(path): RENAMED_OPTIONS.get(key, key) for key, path in FLAT_CONFIG.items()}


def resumed_config(previous: dict, config: SweepConfig, given: set[str] | None = None) -> tuple[SweepConfig, list[str]]:
    """The config to resume a run with: the run's own settings (`previous`: run.json's config),
    except those given on the command line (`given`: settings' paths, "grid.ks"; None = all). A grid
    setting given replaces the run's (cells already measured are kept, new ones added); a measurement
    setting given must equal the run's, or the resume is refused with one line naming each
    difference. Returns the config and notes."""
    previous, asked = nested_config(previous), asdict(config)
    merged, conflicts, notes = asdict(config), [], []
    for path, option in OPTION_NAMES.items():
        recorded, before = _recorded(previous, path)
        if not recorded:
            continue
        now = _recorded(asked, path)[1]
        if given is not None and path not in given:
            _record(merged, path, before)
        elif path in MEASURED_FIELDS and _normal(before) != _normal(now):
            conflicts.append(f"--{option.replace('_', '-')} {_shown(now)} (the run: {_shown(before)})")
        elif path in GRID_FIELDS and _normal(before) != _normal(now):
            notes.append(f"--{option.replace('_', '-')} {_shown(now)} replaces the run's {_shown(before)}: its cells "
                         f"already measured are kept")
    if conflicts:
        raise ValueError("--resume would mix cells measured under other settings: " + "; ".join(conflicts)
                         + ". Leave those options out to resume with the run's, or start a new run")
    return SweepConfig.from_dict(merged), notes


def _recorded(config: dict, path: str) -> tuple[bool, object]:
    """(whether `config`, a nested config dict, holds the setting at `path`, its value)."""
    *groups, name = path.split(".")
    for group in groups:
        config = config.get(group)
        if not isinstance(config, dict):
            return False, None
    return name in config, config.get(name)


def _record(config: dict, path: str, value) -> None:
    *groups, name = path.split(".")
    for group in groups:
        config = config[group]
    config[name] = value


def _normal(value):
    """Settings as JSON has them (tuples as lists, ints and floats alike)."""
    if isinstance(value, dict):
        return {key: _normal(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normal(item) for item in value]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _shown(value) -> str:
    if isinstance(value, list):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return "default" if value is None else str(value)


# --- the sweep ---------------------------------------------------------------------------------

def served_cpu_rate(config: SweepConfig) -> dict:
    """This CPU's matmul rate in the servers' dtype, probed before they start (about a second): a
    vLLM run on this machine's CPU records the compute roof a plan on its fitted steps is held to
    past what it measured (fleet.served.held_price), as a native run records its own."""
    from specbench.native.measure import matmul_rate

    dtype = config.engine.torch_dtype  # the servers' dtype: --dtype, else fp32 on a CPU
    return {"matmul_flops_per_s": matmul_rate("cpu", dtype), "matmul_dtype": str(dtype).replace("torch.", "")}


def run_sweep(
    config: SweepConfig,
    results_root: Path = Path("results"),
    resume_dir: Path | None = None,
    on_event: Callable[[SweepEvent], None] = lambda event: None,
    replay: Replay | None = None,
    notes: dict | None = None,
) -> Path:
    """Run every cell not already finished; returns the run directory. Where the cells run is the
    executor's business (--executor: this process, or a Ray cluster); the run directory is written
    here only, as each cell finishes. Ctrl-C stops after writing what finished (KeyboardInterrupt
    propagates). `replay`: a trace sweep's replay if `check_config` built it already; `notes`: more
    for run.json (`TimePlan.record`: the time estimate, the defaults chosen for this CPU)."""
    from specbench.executors import open_executor

    workloads, replay = preflight(config, replay)
    executor = open_executor(config)
    executor.preflight()  # an unreachable cluster fails here, before a run directory says "running"
    if note := slow_bf16_note(config):  # once the sweep is sure to run: bad input stays one line
        on_event(SweepEvent("stage", message=note))
    run_dir = resume_dir or new_run_dir(Path(results_root), config.grid.target)
    tables = SweepTables(run_dir)
    meta = {"config": asdict(config), "plan": describe_plan(config, replay), "started": now_iso(), "status": "running",
            "hardware": hardware_info(), "versions": versions(), "seed": config.grid.seed,
            "synthetic": config.grid.synthetic, "engine": {"name": config.engine.name}, **(notes or {})}
    if config.engine.name == "vllm" and config.engine.device.startswith("cpu") and config.executor.name == "local":
        meta["hardware"].update(served_cpu_rate(config))
    if replay is not None:
        meta["trace"] = replay.to_dict()
    previous = run_dir / "run.json"
    if resume_dir and previous.exists():
        import json

        meta["resumed_from_started"] = json.loads(previous.read_text()).get("started")
    write_json(run_dir / "run.json", meta)

    cells = plan_cells(config, replay)
    done = tables.finished_ids()
    work = SweepWork(config, cells, [cell for cell in cells if cell.id not in done], tables, workloads, on_event,
                     meta, lambda: write_json(run_dir / "run.json", meta), replay=replay,
                     more_repeats=add_repeats_until_decided if config.gate.until_decided else None)
    try:
        executor.run(work)
        meta["status"] = "complete"
    except KeyboardInterrupt:
        # a signal after the last cell finished leaves a complete run: every planned cell has its row
        meta["status"] = "complete" if {cell.id for cell in cells} <= tables.finished_ids() else "interrupted"
        raise
    except Exception as error:
        meta["status"] = "failed"
        meta["error"] = (str(error).splitlines() or [type(error).__name__])[0]
        raise
    finally:
        tables.close()
        meta["finished"] = now_iso()
        write_json(run_dir / "run.json", meta)
    return run_dir


# --- repeats until the verdict is decided ------------------------------------------------------

def add_repeats_until_decided(sweep: CellLoop, planned: list[Cell]) -> str:
    """--until-decided: while `check` (every measured batch size, --min-speedup) would say
    inconclusive, measure the cells that leave it open again (the judged draft's and their
    baselines, taking turns), doubling their repeats up to --max-repeats. Returns what happened."""
    from specbench.fit import closed_loop
    from specbench.gate import INCONCLUSIVE, evaluate, undecided_cells

    config, tables = sweep.config, sweep.tables
    by_id = {cell.id: cell for cell in planned}
    while True:
        ok = closed_loop(tables.cells[tables.cells["status"] == "ok"])
        sizes = sorted(int(b) for b in ok["batch_size"].unique())
        requests, steps = read_table(tables.run_dir, "requests"), read_table(tables.run_dir, "steps")
        # mid-sweep: judged on the cells measured so far, as complete
        result = evaluate(tables.cells, sizes, state=None, requests=requests, steps=steps,
                          min_speedup=config.gate.min_speedup)
        if result.exit_code != INCONCLUSIVE:
            return f"decided: {result.verdict}: {result.message}"
        groups = {by_id[c].group for c in undecided_cells(tables.cells, result.draft, sizes, config.gate.min_speedup,
                                                                requests=requests, steps=steps)
                  if c in by_id}
        chosen = [by_id[c] for c in ok["cell_id"] if c in by_id and by_id[c].group in groups
                  and by_id[c].draft in (AR, result.draft)]
        done = max(int(tables.row(cell.id)["repeats"]) for cell in chosen) if chosen else config.gate.max_repeats
        if done >= config.gate.max_repeats:
            return (f"budget spent: {config.gate.max_repeats} repeats (--max-repeats) and still INCONCLUSIVE: "
                    f"{result.message}")
        extra = min(max(done, 2), config.gate.max_repeats - done)
        sweep.on_event(SweepEvent("stage", message=f"--until-decided: {result.message}; {extra} more repeat(s) of "
                                                   f"{len(chosen)} cells ({', '.join(sorted(groups))})"))
        more = sweep.again(first_repeat=done, repeats=extra)
        for stage in sweep.engine.stages(chosen):
            more.run_stage(stage)
        if getattr(sweep.engine, "pairing", "") == BRACKETED:  # the baselines again, after the speculative cells
            close_brackets(sweep, planned, [cell for cell in chosen if cell.is_speculative])
        for cell in chosen:  # speed-ups again, repeat by repeat over every repeat
            row = tables.row(cell.id)
            if cell.is_speculative and row["status"] == "ok":
                pair_with_baseline(tables, cell, row)
                tables.replace(row, [], [])
