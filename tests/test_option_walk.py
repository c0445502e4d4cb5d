"""Every option of a command walked against every mode it runs in: an option given where it does
nothing is refused in one line (exit 2) naming the option, never silently dropped."""

import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from specbench.cli import app

runner = CliRunner()
TRACE_FILE = str(Path(__file__).parent / "fixtures" / "traces" / "azure.csv")

# sweep's modes (cli.sweep.MODES): the arguments that put a dry run in each
SWEEP_MODES = {
    "native": [],
    "random": ["--weights", "random", "--alpha", "0.8"],
    "vllm": ["--engine", "vllm"],
    "vllm-rates": ["--engine", "vllm", "--request-rates", "1"],
    "vllm-trace": ["--engine", "vllm", "--trace", TRACE_FILE],
    "endpoint": ["--endpoint", "http://127.0.0.1:9", "--baseline-endpoint", "http://127.0.0.1:10"],
}

# options that choose the mode: given in another mode they make that mode (or meet its conflicts)
MODE_OPTIONS = {"endpoint", "baseline_endpoint", "request_rates", "trace", "weights", "engine"}

# a value for every sweep option (None: a flag), valid where the option applies
SWEEP_VALUES = {
    "target": "smollm2-135m", "drafts": "ngram", "k": "2", "batch_sizes": "1,4", "request_rates": "2",
    "burstiness": "0.5", "slo": "ttft=1.0", "endpoint": "http://127.0.0.1:9",
    "baseline_endpoint": "http://127.0.0.1:10", "router": "round-robin", "api_key_env": "MY_KEY",
    "temperatures": "0", "workloads": "chat", "context_lengths": "512", "max_new_tokens": "16", "num_prompts": "2",
    "repeats": "2", "seed": "1", "dtype": "fp32", "device": "cpu", "top_p": "0.9", "top_k": "5",
    "chat_template": "SWITCH:--no-chat-template", "output": "OUTPUT", "resume": None, "until_decided": None,
    "max_repeats": "4", "min_speedup": "1.1", "dry_run": None, "download": None, "trust_remote_code": None,
    "weights": "real", "alpha": "0.8", "target_layers": "2", "cuda_graphs": None, "engine": "ENGINE",
    "tensor_parallel_size": "1", "pipeline_parallel_size": "1", "max_model_len": "2048",
    "gpu_memory_utilization": "0.5", "enforce_eager": None, "vllm_args": "--max-num-seqs 4",
    "vllm_python": sys.executable, "server_timeout": "60", "distributed_executor_backend": "mp",
    "allow_pp_speculation": None, "trace": TRACE_FILE, "trace_window": "0:60", "trace_speedup": "0.5",
    "trace_max_requests": "3", "executor": "local", "ray_address": "127.0.0.1:6379", "served_pairing": "bracketed",
}


def sweep_options() -> dict:
    command = typer.main.get_command(app).commands["sweep"]
    return {param.name: param for param in command.params}


def option_args(option, name: str, mode: str, tmp_path: Path) -> list[str]:
    value = SWEEP_VALUES[name]
    if value is not None and value.startswith("SWITCH:"):  # a --no- switch
        return [value.removeprefix("SWITCH:")]
    flag = option.opts[0]
    if name == "resume":  # a run directory that holds no run: the one-line refusal names --resume
        return [flag, "--output", str(tmp_path / "no-run")]
    if value is None:
        return [flag]
    if value == "OUTPUT":
        value = str(tmp_path / "out")
    if value == "ENGINE":
        value = "vllm" if mode.startswith("vllm") else "native"
    return [f"{flag}={value}"]


@pytest.fixture
def offline_sweep(monkeypatch):
    """Dry runs without a server to reach, a vLLM to import, or a probe to time."""
    import specbench.served.endpoint as endpoint
    import specbench.served.vllm_engine as vllm_engine

    monkeypatch.setattr(endpoint, "check_reachable", lambda config: None)
    monkeypatch.setattr(endpoint, "served_context_limit", lambda config: 0)
    monkeypatch.setattr(vllm_engine, "installed_vllm_version", lambda python: "0.0")
    monkeypatch.setenv("SPECBENCH_PROBE_RATES", "float32=190e9,bfloat16=850e9,bandwidth=37e9")


@pytest.mark.integration
def test_sweep_option_walk(offline_sweep, tmp_path):
    """Every (mode, option) pair of `specbench sweep --dry-run`: where cli.sweep.APPLIES says the
    option does not apply, exit 2 and one line naming it; elsewhere it runs, or a one-line error
    names the option at fault (a value the mode's own checks refuse)."""
    from specbench.cli.sweep import APPLIES, MODES

    options = sweep_options()
    assert set(APPLIES) == set(options) == set(SWEEP_VALUES), "classify every sweep option"
    assert set(SWEEP_MODES) <= set(MODES)
    tried = refused = applied = 0
    unexpected = []
    for mode, base in SWEEP_MODES.items():
        assert runner.invoke(app, ["sweep", *base, "--dry-run"]).exit_code == 0, mode
        for name, option in options.items():
            args = ["sweep", *base, *option_args(option, name, mode, tmp_path), "--dry-run"]
            result = runner.invoke(app, args)
            tried += 1
            lines = result.output.strip().splitlines()
            if result.exit_code == 0:
                applied += 1
                if mode not in APPLIES[name][0] and name not in MODE_OPTIONS:
                    unexpected.append(f"{mode}: {option.opts[0]} accepted where APPLIES says it does not apply")
                continue
            refused += 1
            if result.exit_code != 2 or len(lines) != 1 or not lines[0].startswith("error: ") or "--" not in lines[0]:
                unexpected.append(f"{mode}: {option.opts[0]}: exit {result.exit_code}: {result.output[-300:]}")
            elif mode not in APPLIES[name][0] and name not in MODE_OPTIONS and option.opts[0] not in lines[0]:
                unexpected.append(f"{mode}: {option.opts[0]} refused without naming it: {lines[0]}")
    print(f"sweep option walk: {tried} (mode, option) pairs tried, {refused} refused, {applied} applied")
    assert not unexpected, "\n".join(unexpected)
    assert tried == refused + applied == len(SWEEP_MODES) * len(options)
    assert refused > 50 and applied > 150  # the walk reached both answers (the counts are printed above)
