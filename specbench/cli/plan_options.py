"""Which of `specbench plan`'s options apply to which planning question: an option typed for a
question it does not change is refused in one line (exit 2) naming the option that does apply,
never dropped."""

from __future__ import annotations

from specbench.cli.common import UsageError, option_flag

# The planning questions, by what was given: a run's fit, the kernel tables' static batch, one
# replica under closed-loop clients, a fleet at a trace (each on the tables or on a served run).
MODES = {
    "run": "a plan on a run's fit (RUN_DIR)",
    "tables": "a static-batch plan on the kernel tables (--target)",
    "tables-concurrency": "a simulated replica on the kernel tables (--target with --concurrency)",
    "tables-trace": "a fleet sized on the kernel tables (--target with --trace)",
    "run-concurrency": "a run's servers under closed-loop clients (RUN_DIR with --concurrency)",
    "run-trace": "a fleet sized on a run's servers (RUN_DIR with --trace)",
}

_ALL = set(MODES)
_TABLES = {"tables", "tables-concurrency", "tables-trace"}
_SERVED = {"tables-concurrency", "tables-trace", "run-concurrency", "run-trace"}
_CLOSED_LOOP = {"tables-concurrency", "run-concurrency"}
_TRACE = {"tables-trace", "run-trace"}

# option (the plan() parameter) -> the modes it applies to, where it is used with one meaning.
APPLIES = {
    "run_dir": {"run", "run-concurrency", "run-trace"},
    "timings": {"run"},
    "acceptance": {"run"} | _TABLES,
    "alpha": {"run"} | _TABLES,
    "k": {"run"} | _TABLES,
    "batch_sizes": {"run", "tables"},
    "context_lengths": {"run", "tables"},
    "max_new_tokens": {"run", "tables"},
    "device": {"run"} | _TABLES,
    "gpu_price": _ALL,
    "gpus": {"run"},
    "json_output": _ALL,
    "target": _TABLES,
    "drafts": _TABLES,
    "tp": _TABLES,
    "draft_tp": _TABLES,
    "dp": {"tables"},
    "ep": _TABLES,
    "backend": _TABLES,
    "slo": _ALL - {"run"},
    "concurrency": _CLOSED_LOOP,
    "input_len": _CLOSED_LOOP,
    "output_len": _CLOSED_LOOP,
    "clients": _CLOSED_LOOP,
    "prefix_len": _CLOSED_LOOP,
    "dtype": _TABLES,
    "draft_dtype": _TABLES,
    "kv_cache_dtype": _TABLES,
    "max_num_seqs": {"tables-concurrency", "tables-trace"},
    "max_num_batched_tokens": {"tables-concurrency", "tables-trace"},
    "async_scheduling": {"tables-concurrency", "tables-trace"},
    "prefix_caching": _SERVED,
    "trace": _TRACE,
    "trace_window": _TRACE,
    "trace_speedup": _TRACE,
    "headroom": _TRACE,
    "replicas": _TRACE,
    "router": _TRACE,
    "chart": _SERVED,
    "calibrate": {"tables"},
    "extrapolate": {"run-concurrency", "run-trace"},
}

# What to type instead, where an option has a counterpart in the other questions.
INSTEAD = {
    ("input_len", "tables"): "a static plan's prompts are --context-lengths (e.g. --context-lengths 8192)",
    ("output_len", "tables"): "a static plan's output tokens are --max-new-tokens",
    ("input_len", "run"): "a run's plan sets its prompts with --context-lengths",
    ("output_len", "run"): "a run's plan sets its output tokens with --max-new-tokens",
    ("context_lengths", "served"): "a closed loop's prompts are --input-len; a trace's are its own",
    ("max_new_tokens", "served"): "a closed loop's output tokens are --output-len; a trace's are its own",
    ("batch_sizes", "served"): "a served replica batches what its clients send: --concurrency sets them",
    ("slo", "run"): "an SLO is judged on the kernel tables (--target) or on served load (--concurrency, --trace)",
    ("dp", "served"): "a data-parallel replica is priced as a static batch (plan --target M --dp N), not "
                      "simulated: its ranks' schedulers are not modelled",
    ("gpus", "served"): "a replica's GPUs are its --tp",
    ("gpus", "tables"): "with --target, a replica's GPUs are its --tp",
    ("run_dir", "tables"): "--target plans on the kernel tables, without a run (a run's acceptance: --acceptance RUN)",
    ("timings", "tables"): "--target plans on the kernel tables, without a run's step times (a run's acceptance: "
                           "--acceptance RUN)",
    ("calibrate", "served"): "--calibrate corrects a static plan's steps (--target alone); a simulated replica is "
                             "priced on the tables as they are",
    ("input_len", "trace"): "a trace's requests keep their own lengths",
    ("output_len", "trace"): "a trace's requests keep their own lengths",
    ("clients", "trace"): "a trace's requests arrive as it recorded them",
    ("prefix_len", "trace"): "a trace says what its prompts share by its hash ids",
    ("replicas", "served"): "--replicas simulates a given fleet at a trace (--trace)",
}


def plan_mode(given: set[str], target: bool) -> str:
    """The planning question the given options ask (`given`: plan()'s parameters typed)."""
    load = "-trace" if "trace" in given else "-concurrency" if "concurrency" in given else ""
    if "trace" in given and "concurrency" in given:
        raise UsageError("--concurrency (closed-loop clients) and --trace (a trace's arrivals) are two loads: give one")
    return ("tables" if target else "run") + load if (target or load) else "run"


def check_options(given: set[str], target: bool) -> str:
    """The mode asked; one line and exit 2 for the first option typed that does not apply to it."""
    mode = plan_mode(given, target)
    for parameter in sorted(given, key=list(APPLIES).index):
        modes = APPLIES.get(parameter, _ALL)
        if mode in modes:
            continue
        where = "served" if mode in _SERVED else mode
        hint = INSTEAD.get((parameter, mode.split("-")[-1] if mode in _TRACE else where)) \
            or INSTEAD.get((parameter, where))
        raise UsageError(f"{option_flag(parameter)} does not apply to {MODES[mode]}"
                         + (f": {hint}" if hint else f"; it applies {where_it_applies(modes)}"))
    return mode


def where_it_applies(modes: set[str]) -> str:
    """The questions an option applies to, as the options that ask them."""
    named = {frozenset(_TABLES): "with --target", frozenset(_CLOSED_LOOP): "with --concurrency",
             frozenset(_TRACE): "with --trace", frozenset(_SERVED): "with --concurrency or --trace",
             frozenset({"tables-concurrency", "tables-trace"}): "with --target and --concurrency or --trace",
             frozenset({"run-concurrency", "run-trace"}): "with RUN_DIR and --concurrency or --trace",
             frozenset({"run", "tables"}): "to a run's plan and to --target's static-batch plan",
             frozenset({"run"} | _TABLES): "to a run's plan and with --target"}
    return named.get(frozenset(modes)) or "to " + "; ".join(MODES[m] for m in MODES if m in modes)


def help_mode(args: list[str]) -> str | None:
    """The planning question a command line asks, read from its raw words for --help (None where it
    asks none yet: `plan --help` shows every option)."""
    flags = {word.split("=", 1)[0] for word in args if word.startswith("--")}
    given = {name for name in ("target", "trace", "concurrency") if f"--{name}" in flags}
    if given:
        return plan_mode(given, "target" in given)
    positional = [word for word in args if not word.startswith("-")]
    return "run" if positional and len(positional) == 1 and not flags - {"--help"} else None
