import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import specbench.measuring as measuring_module
import specbench.native.runner as native_runner
from specbench.cli import app
from specbench.results import load_run
from specbench.schema import EVERY_ROW, MEASURED, TABLE_COLUMNS, unknown_columns

runner = CliRunner()

def written_by_every_measured_row(table: str) -> set[str]:
    """The contract's columns (specbench/schema.py) that every measured row of `table` has."""
    return {c.name for c in TABLE_COLUMNS[table] if c.written_by in (EVERY_ROW, MEASURED)}


def sweep_args(dirs, output, extra=()):
    return ["sweep", "--target", dirs["target"], "--drafts", f"{dirs['draft']},ngram:2", "--k", "1,3",
            "--batch-sizes", "1,3", "--temperatures", "0,0.8", "--workloads", "chat", "--max-new-tokens", "10",
            "--num-prompts", "3", "--dtype", "fp64", "--output", str(output), *extra]


@pytest.fixture(scope="module")
def finished_run(tiny_model_dirs, tmp_path_factory):
    output = tmp_path_factory.mktemp("run") / "grid"
    result = runner.invoke(app, sweep_args(tiny_model_dirs, output))
    assert result.exit_code == 0, result.output
    return output, result.output


def test_sweep_writes_every_table_with_documented_columns(finished_run):
    output, printed = finished_run
    run = load_run(output)
    assert len(run.cells) == 2 * 2 * (1 + 2 * 2)  # B x T x (AR + drafts x K)
    native = {c.name for c in TABLE_COLUMNS["cells"] if c.written_by.startswith("native")}
    assert written_by_every_measured_row("cells") | native <= set(run.cells.columns)
    assert written_by_every_measured_row("requests") <= set(run.requests.columns)
    assert written_by_every_measured_row("steps") <= set(run.steps.columns)
    for name, frame in (("cells", run.cells), ("requests", run.requests), ("steps", run.steps)):
        assert not unknown_columns(name, frame.columns)  # every column it writes is in the contract
    for name in ("cells", "requests", "steps"):
        assert (output / f"{name}.csv").exists() and (output / f"{name}.parquet").exists()
    assert not (output / "parts").exists()  # merged when the sweep stopped
    meta = json.loads((output / "run.json").read_text())
    assert meta["status"] == "complete"
    assert {"python", "torch", "transformers", "specbench", "specbench_git"} <= set(meta["versions"])
    assert meta["hardware"]["cpu"] and meta["config"]["grid"]["seed"] == 0
    # the vector extensions a CPU run's speed turns on, as /proc/cpuinfo and torch's dispatch say them
    from specbench.results import SIMD_FLAGS

    assert set(meta["hardware"]["cpu_flags"]) <= set(SIMD_FLAGS) and meta["hardware"]["cpu_capability"]
    if Path("/proc/cpuinfo").exists():
        assert "avx2" in meta["hardware"]["cpu_flags"] or "avx2" not in Path("/proc/cpuinfo").read_text()
    # each model's bare forward, measured up to twice the widest step planned (B=3 x K+1=4 rows x positions)
    target = meta["profiles"]["target"]
    assert target["tokens"][0] == 1 and 12 <= target["tokens"][-1] <= 24 and all(s > 0 for s in target["seconds"])
    assert list(meta["profiles"]["drafts"]) == [tiny_model_dirs_draft(meta)]
    assert "results:" in printed and "specbench report" in printed


def test_report_on_a_run_without_speed_ups_says_what_it_could_not_draw(finished_run, tmp_path):
    import shutil

    from specbench.results import write_table

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run[0], run_dir)
    cells = pd.read_parquet(run_dir / "cells.parquet")
    speculative = cells["mode"] == "speculative"
    cells.loc[speculative, "speedup"] = float("nan")  # every baseline failed, say
    cells.loc[speculative, "speedup_runs"] = pd.Series([[]] * int(speculative.sum()), index=cells.index[speculative])
    write_table(run_dir, "cells", cells)
    result = runner.invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    page = (run_dir / "report" / "report.html").read_text()
    assert "charts not drawn" in page and "no speed-up was measured" in page
    assert not (run_dir / "report" / "speedup_vs_batch.png").exists()


def tiny_model_dirs_draft(meta: dict) -> str:
    return next(d for d in meta["config"]["grid"]["drafts"] if not d.startswith("ngram"))


def test_sweep_log_has_a_plain_line_per_cell(finished_run):
    """Without a terminal (CliRunner, CI, nohup) each finished cell prints one line as it ends."""
    lines = [line for line in finished_run[1].splitlines() if line.startswith("[") and "/20]" in line]
    assert len(lines) == 20
    assert all(re.search(r"^\[\d+/20\]  chat\|B[13]\|T0(\.8)?\|\S+  [\d.]+ tok/s  .*\bok  \(\d+m\d\ds\)$", line)
               for line in lines), lines


def test_cells_hold_plausible_measurements(finished_run):
    run = load_run(finished_run[0])
    cells = run.cells
    assert (cells["status"] == "ok").all()
    speculative = cells[cells["mode"] == "speculative"]
    assert speculative["alpha"].between(0, 1).all()
    assert ((speculative["tau"] >= 1) & (speculative["tau"] <= speculative["k"] + 1)).all()
    assert (speculative["speedup"] > 0).all() and (cells["tokens_per_s"] > 0).all()
    assert (cells["peak_memory_bytes"] > 0).all()
    assert (cells["output_tokens"] == cells["requests"] * 10).all()
    for row in speculative.to_dict("records"):
        assert len(row["acceptance_by_position"]) == row["k"]
    model_drafts = speculative[~speculative["draft"].str.startswith("ngram")]
    assert (model_drafts["draft_memory_bytes"] > 0).all()
    baseline = cells[cells["mode"] == "autoregressive"]
    assert (baseline["roofline_fraction"] > 0).all() and (baseline["roofline_step_s"] > 0).all()
    assert run.meta["hardware"]["copy_bandwidth_bytes_per_s"] > 1e8


def test_every_greedy_cell_is_lossless(finished_run):
    cells = load_run(finished_run[0]).cells
    greedy = cells[(cells["mode"] == "speculative") & (cells["temperature"] == 0)]
    assert len(greedy) == 8 and (greedy["lossless"] == "exact").all()


def test_burstiness_shows_in_itl(finished_run):
    run = load_run(finished_run[0])
    requests = run.requests.merge(run.cells[["cell_id", "mode", "draft"]], on="cell_id")
    for row in requests.to_dict("records"):
        assert len(row["itl_s"]) == row["output_tokens"] - 1
    accepted_any = run.steps.groupby("cell_id")["accepted"].sum()
    bursty = requests[requests["cell_id"].isin(accepted_any[accepted_any > 0].index)]
    assert any(min(gaps) == 0 for gaps in bursty["itl_s"])  # tokens accepted together arrive together


def test_batches_start_one_after_another(finished_run):
    requests = load_run(finished_run[0]).requests
    one_at_a_time = requests[requests["cell_id"].str.contains(r"\|B1\|")]  # 3 prompts: 3 batches per repeat
    for _, cell in one_at_a_time.groupby(["cell_id", "repeat"]):
        cell = cell.sort_values("batch_index")
        assert cell["start_offset_s"].iloc[0] == 0
        starts, ends = cell["start_offset_s"].to_numpy(), (cell["start_offset_s"] + cell["e2e_s"]).to_numpy()
        assert (starts[1:] >= ends[:-1] - 1e-9).all()  # the next batch starts once the last one ended


def test_resume_runs_no_new_cells(finished_run, tiny_model_dirs):
    output, _ = finished_run
    before = load_run(output).cells
    calls = []
    original = native_runner.CellRun.measure
    native_runner.CellRun.measure = lambda run, repeat: calls.append(run.cell) or original(run, repeat)
    try:
        result = runner.invoke(app, sweep_args(tiny_model_dirs, output, ["--resume"]))
    finally:
        native_runner.CellRun.measure = original
    assert result.exit_code == 0, result.output
    assert calls == []
    pd.testing.assert_frame_equal(load_run(output).cells, before)


def test_failing_cell_is_recorded_and_the_rest_complete(tiny_model_dirs, tmp_path, monkeypatch):
    original = native_runner.CellRun.measure

    def flaky(run, repeat):
        if run.cell.id == "chat|B1|T0|ngram:2|K1":
            raise RuntimeError("injected failure")
        return original(run, repeat)

    monkeypatch.setattr(native_runner.CellRun, "measure", flaky)
    result = runner.invoke(app, sweep_args(tiny_model_dirs, tmp_path / "run", ["--temperatures", "0",
                                                                                 "--batch-sizes", "1"]))
    assert result.exit_code == 0, result.output
    cells = load_run(tmp_path / "run").cells.set_index("cell_id")
    assert cells.loc["chat|B1|T0|ngram:2|K1", "status"] == "failed"
    assert "injected failure" in cells.loc["chat|B1|T0|ngram:2|K1", "message"]
    assert (cells.drop("chat|B1|T0|ngram:2|K1")["status"] == "ok").all() and len(cells) == 5


def test_out_of_memory_skips_larger_batches(tiny_model_dirs, tmp_path, monkeypatch):
    original = native_runner.CellRun.measure

    def small_device(run, repeat):
        cell = run.cell
        if cell.draft != "autoregressive" and cell.batch_size >= 3 and cell.k == 3:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(run, repeat)

    monkeypatch.setattr(native_runner.CellRun, "measure", small_device)
    args = sweep_args(tiny_model_dirs, tmp_path / "run", ["--temperatures", "0", "--batch-sizes", "1,3,5"])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    cells = load_run(tmp_path / "run").cells.set_index("cell_id")
    assert cells.loc["chat|B3|T0|ngram:2|K3", "status"] == "oom"
    assert cells.loc["chat|B5|T0|ngram:2|K3", "status"] == "skipped"
    assert "batch size 3" in cells.loc["chat|B5|T0|ngram:2|K3", "message"]
    assert cells.loc["chat|B5|T0|ngram:2|K1", "status"] == "ok"


def test_out_of_memory_at_a_long_context_skips_only_longer_ones(tiny_model_dirs, tmp_path, monkeypatch):
    """Out of memory at B=3 and 600 tokens: B=3 at 800 is skipped, B=3 at 400 (run first) is not."""
    original = native_runner.CellRun.measure

    def small_device(run, repeat):
        if run.cell.batch_size >= 3 and run.cell.context_length >= 600:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(run, repeat)

    monkeypatch.setattr(native_runner.CellRun, "measure", small_device)
    args = sweep_args(tiny_model_dirs, tmp_path / "run", ["--temperatures", "0", "--batch-sizes", "1,3", "--k", "1",
                                                         "--context-lengths", "400,600,800", "--max-new-tokens", "3"])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    cells = load_run(tmp_path / "run").cells.set_index("cell_id")
    assert cells.loc["chat|C400|B3|T0|autoregressive", "status"] == "ok"
    assert cells.loc["chat|C600|B3|T0|autoregressive", "status"] == "oom"
    assert cells.loc["chat|C800|B1|T0|autoregressive", "status"] == "ok"
    assert cells.loc["chat|C800|B3|T0|autoregressive", "status"] == "skipped"
    assert "at context length 600" in cells.loc["chat|C800|B3|T0|autoregressive", "message"]


@pytest.mark.parametrize("args, message", [
    (["--k", "0"], "K must be >= 1"),
    (["--batch-sizes", "0,2"], "batch sizes must be >= 1"),
    (["--temperatures", "-0.5"], "temperatures must be"),
    (["--workloads", "nope"], "unknown workload"),
    (["--drafts", ""], "--drafts needs a comma-separated list"),
    (["--k", "1,,2"], "--k needs a comma-separated list"),
    (["--k", "a"], "not a list of ints"),
])
def test_bad_input_is_rejected_before_loading(args, message, monkeypatch, tmp_path):
    monkeypatch.setattr(native_runner, "load_models", lambda *a: pytest.fail("loaded models"))
    result = runner.invoke(app, ["sweep", "--output", str(tmp_path / "x"), *args])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_dry_run_prints_the_plan(tiny_model_dirs, tmp_path):
    result = runner.invoke(app, sweep_args(tiny_model_dirs, tmp_path / "x", ["--dry-run"]))
    assert result.exit_code == 0, result.output
    assert "20 cells (4 autoregressive, 16 speculative)" in result.output
    assert not (tmp_path / "x").exists()
    # each row's own output tokens per cell (it printed the grid's mean on every row)
    args = sweep_args(tiny_model_dirs, tmp_path / "x", ["--dry-run", "--repeats", "2"])
    args[args.index("--batch-sizes") + 1] = "1,4"
    rows = [line.split("│") for line in runner.invoke(app, args).output.splitlines() if line.startswith("│ chat")]
    shown = {(cells[2].strip(), cells[5].strip(), cells[6].strip()) for cells in rows}
    assert ("1", "6", "60") in shown and ("4", "8", "80") in shown, shown


def test_a_16_bit_model_on_a_cpu_without_bf16_instructions_is_said_before_it_is_timed(tiny_model_dirs, tmp_path,
                                                                                       monkeypatch):
    """The offline default's self-draft runs at bf16: on a CPU with AVX2 alone torch's 16-bit matmuls
    are tens of times slower than fp32's, and the draft's cells measure that. The sweep says so in one
    line before it runs (the dry run too); a CPU with AVX512-BF16 or AMX, fp32 models, n-grams and
    served engines are not told."""
    import specbench.sweep as sweep_module
    from specbench.grid import EngineOptions, GridOptions, SweepConfig

    default = SweepConfig()  # ngram and smollm2-135m@bf16, fp32 target, native, CPU
    note = sweep_module.slow_bf16_note(default, ["avx2"])
    assert note.startswith("note: this CPU has no bf16 instructions") and "smollm2-135m@bf16" in note
    assert "it lists avx2" in note and "smollm2-135m " not in note  # the fp32 target is not named
    assert sweep_module.slow_bf16_note(default, ["avx2", "avx512f", "avx512_bf16"]) is None
    assert sweep_module.slow_bf16_note(default, ["avx2", "amx_bf16", "amx_tile"]) is None
    assert sweep_module.slow_bf16_note(SweepConfig(grid=GridOptions(drafts=["ngram", "smollm2-135m"])), []) is None
    bf16 = SweepConfig(engine=EngineOptions(dtype="bf16"))
    assert "smollm2-135m, smollm2-135m@bf16" in sweep_module.slow_bf16_note(bf16, [])
    assert sweep_module.slow_bf16_note(SweepConfig(engine=EngineOptions(name="vllm")), []) is None
    monkeypatch.setattr(sweep_module, "cpu_flags", lambda: ["avx2"])
    args = sweep_args(tiny_model_dirs, tmp_path / "x", ["--dry-run"])
    args[args.index("--drafts") + 1] = f"{tiny_model_dirs['draft']}@bf16,ngram:2"
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"{tiny_model_dirs['draft']}@bf16 will be timed so" in result.output.replace("\n", "")
    args[args.index("--drafts") + 1] = f"{tiny_model_dirs['draft']},ngram:2"
    assert "no bf16 instructions" not in runner.invoke(app, args).output
    # the run itself says it once its input is known good, before the models load
    monkeypatch.setattr(native_runner, "load_models", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    args = sweep_args(tiny_model_dirs, tmp_path / "run", [])
    args[args.index("--drafts") + 1] = f"{tiny_model_dirs['draft']}@bf16,ngram:2"
    assert "no bf16 instructions" in runner.invoke(app, args).output
    args[args.index("--workloads") + 1] = "nonesuch"
    args[args.index("--output") + 1] = str(tmp_path / "bad")
    bad = runner.invoke(app, args)
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and "no bf16" not in bad.output


def test_the_sweep_states_its_time_and_fits_a_default_run_to_a_slow_cpu(monkeypatch):
    """The header's estimate comes from the probe's rates (injected here: this machine's and a
    2-core AVX2 VM's). On a CPU whose bf16 products are tens of times slower than fp32's, the
    default self-draft runs in fp32 and a default run gives up grid values until it fits 15
    minutes; options given are never changed: the header says which cells are slow and the
    options that cut them."""
    import specbench.sweep as sweep_module
    from specbench.grid import EngineOptions, SweepConfig
    from specbench.native.estimate import Rates
    from specbench.sweep import DEFAULT_RUN_BUDGET_S, plan_time
    from specbench.workloads import load_workload

    workloads = {name: load_workload(name) for name in ("chat", "code")}
    fast = Rates({"float32": 190e9, "bfloat16": 850e9}, 37e9)
    slow = Rates({"float32": 30e9, "bfloat16": 0.5e9}, 10e9)
    monkeypatch.setattr(sweep_module, "cpu_flags", lambda: ["avx2"])
    here = plan_time(SweepConfig(), workloads, set(), rates=fast)
    assert here.config.grid.drafts == ["ngram", "smollm2-135m@bf16"] and not here.chosen
    assert len(here.estimate.cells) == 60 and here.estimate.seconds < DEFAULT_RUN_BUDGET_S
    assert here.lines == [here.lines[-1]] and here.lines[-1].startswith("estimate: about ")
    fitted = plan_time(SweepConfig(), workloads, set(), rates=slow)
    assert fitted.config.grid.drafts == ["ngram", "smollm2-135m@fp32"] and fitted.config.grid.temperatures == [0.0]
    assert fitted.chosen == ["--drafts ngram,smollm2-135m@fp32", "--temperatures 0"]
    assert fitted.estimate.seconds <= DEFAULT_RUN_BUDGET_S
    assert "it has no bf16 instructions" in fitted.lines[0] and fitted.lines[1].startswith("estimate: about ")
    assert fitted.record()["defaults_chosen"] == fitted.chosen
    assert fitted.record()["time_estimate"]["seconds"] == round(fitted.estimate.seconds, 1)
    given = plan_time(SweepConfig(), workloads, {"grid.drafts"}, rates=slow)
    assert given.config == SweepConfig() and not given.chosen and given.estimate.seconds > DEFAULT_RUN_BUDGET_S
    assert given.lines[-1].startswith("slow: the 24 smollm2-135m@bf16 cells take about ")
    assert "bf16 products run at 0.5 GFLOP/s on this CPU against fp32's 30" in given.lines[-1]
    assert "cut it with --drafts ngram,smollm2-135m@fp32 (about " in given.lines[-1]
    assert "--drafts ngram (about " in given.lines[-1]
    assert plan_time(SweepConfig(), workloads, None, rates=slow).chosen == []  # a resume runs the run's own
    assert plan_time(SweepConfig(engine=EngineOptions(name="vllm")), workloads, set(), rates=slow).estimate is None
    # the command line, its rates injected
    monkeypatch.setenv("SPECBENCH_PROBE_RATES", "float32=30e9,bfloat16=0.5e9,bandwidth=10e9")
    result = runner.invoke(app, ["sweep", "--dry-run"])
    assert result.exit_code == 0, result.output
    text = result.output.replace("\n", " ")
    assert "30 cells (6 autoregressive, 24 speculative)" in text
    assert "defaults for this CPU: --drafts ngram,smollm2-135m@fp32 --temperatures 0 (" in text
    explicit = runner.invoke(app, ["sweep", "--dry-run", "--drafts", "ngram,smollm2-135m@bf16"]).output
    assert "60 cells" in explicit and "slow: the 24 smollm2-135m@bf16" in explicit.replace("\n", " ")
    assert "defaults for this CPU" not in explicit
    monkeypatch.setenv("SPECBENCH_PROBE_RATES", "float32=190e9,bfloat16=850e9,bandwidth=37e9")
    default = runner.invoke(app, ["sweep", "--dry-run"]).output
    assert "60 cells" in default and "defaults for this CPU" not in default and "estimate: about" in default
    monkeypatch.setenv("SPECBENCH_PROBE_RATES", "float32=fast")
    bad = runner.invoke(app, ["sweep", "--dry-run"])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and "SPECBENCH_PROBE_RATES" in bad.output


def test_a_flat_run_config_loads_into_the_groups():
    """run.json keeps SweepConfig's groups; a flat config (every setting at the top level) loads
    into the same groups, and the flat keys are the settings, each in one place."""
    from dataclasses import asdict, fields, is_dataclass

    from specbench.grid import EndpointOptions, EngineOptions, GateOptions, GridOptions, LoadOptions, SweepConfig
    from specbench.results import CONFIG_GROUPS, FLAT_CONFIG, nested_config

    def leaves(cls, prefix=()):
        for item in fields(cls):
            group = item.default_factory
            if is_dataclass(group) and group.__name__ != "VllmOptions":  # vLLM's options are one setting
                yield from leaves(group, (*prefix, item.name))
            else:
                yield (*prefix, item.name)

    assert sorted(FLAT_CONFIG.values()) == sorted(leaves(SweepConfig))
    assert tuple(item.name for item in fields(SweepConfig)) == CONFIG_GROUPS
    config = SweepConfig(
        grid=GridOptions(target="llama3-8b", drafts=["ngram"], ks=[3], max_new_tokens=64),
        load=LoadOptions(batch_sizes=[], request_rates=[2.0]),
        engine=EngineOptions(name="endpoint", endpoint=EndpointOptions(urls="http://a:8000", router="round-robin")),
        gate=GateOptions(slo="ttft=1.0"))
    nested = asdict(config)
    flat = {key: nested[path[0]][path[1]] if len(path) == 2 else nested[path[0]][path[1]][path[2]]
            for key, path in FLAT_CONFIG.items()}
    assert flat["engine"] == "endpoint" and flat["endpoint"] == "http://a:8000" and flat["vllm"]["pairing"] == "auto"
    assert nested_config(flat) == nested_config(nested) == nested
    assert SweepConfig.from_dict(flat) == SweepConfig.from_dict(nested) == config
    # a setting it does not know is left out; one it lacks takes its default
    assert SweepConfig.from_dict({"target": "llama3-8b", "retired_option": 1}) == SweepConfig(
        grid=GridOptions(target="llama3-8b"))
    assert nested_config({}) == {group: {} for group in CONFIG_GROUPS}


def test_a_resume_of_a_flat_run_keeps_its_settings_and_names_the_options():
    from specbench.grid import EngineOptions, GridOptions, LoadOptions, SweepConfig
    from specbench.sweep import resumed_config

    flat = {"target": "smollm2-135m", "drafts": ["ngram"], "ks": [2], "batch_sizes": [1], "temperatures": [0.0],
            "workloads": ["chat"], "seed": 0, "dtype": "fp64", "vllm": {"pairing": "auto"}}
    asked = SweepConfig(grid=GridOptions(ks=[2, 4], seed=3), load=LoadOptions(batch_sizes=[1, 4]),
                        engine=EngineOptions(dtype="fp64"))
    config, notes = resumed_config(flat, asked, {"grid.ks", "load.batch_sizes"})
    assert config.grid.drafts == ["ngram"] and config.grid.ks == [2, 4] and config.load.batch_sizes == [1, 4]
    assert config.grid.seed == 0 and config.engine.dtype == "fp64" and config.grid.workloads == ["chat"]
    assert notes == ["--k 2,4 replaces the run's 2: its cells already measured are kept",
                     "--batch-sizes 1,4 replaces the run's 1: its cells already measured are kept"]
    with pytest.raises(ValueError, match=r"--seed 3 \(the run: 0\)"):
        resumed_config(flat, asked, {"grid.seed"})


def test_every_stored_run_reads_its_config_in_groups():
    from specbench.grid import SweepConfig
    from specbench.results import CONFIG_GROUPS, read_meta

    stored = sorted({path.parent for root in ("tests/fixtures", "benchmarks") for path in Path(root).rglob("run.json")})
    assert stored
    for run in stored:
        meta = read_meta(run)
        assert set(CONFIG_GROUPS) <= set(meta["config"]), run
        assert SweepConfig.from_dict(meta["config"]).grid.target == meta["config"]["grid"]["target"], run


def test_the_run_header_and_run_json_carry_the_estimate(finished_run):
    output, log = finished_run
    assert "estimate: about " in log and "from the probe, measured:" in log.replace("\n", " ")
    estimate = json.loads((output / "run.json").read_text())["time_estimate"]
    assert estimate["seconds"] > 0 and estimate["source"] == "measured"
    assert estimate["matmul_flops_per_s_by_dtype"]["float64"] > 0


def ctrl_c_at(cell_id: str, monkeypatch) -> None:
    """Make the native engine raise KeyboardInterrupt when it starts measuring `cell_id`."""
    original = native_runner.CellRun.measure

    def interrupted(run, repeat):
        if run.cell.id == cell_id:
            raise KeyboardInterrupt
        return original(run, repeat)

    monkeypatch.setattr(native_runner.CellRun, "measure", interrupted)


def test_interrupt_keeps_finished_cells_and_resume_finishes(tiny_model_dirs, tmp_path, monkeypatch):
    args = sweep_args(tiny_model_dirs, tmp_path / "run", ["--temperatures", "0", "--batch-sizes", "1"])
    ctrl_c_at("chat|B1|T0|ngram:2|K1", monkeypatch)
    result = runner.invoke(app, args)
    assert result.exit_code == 130
    run = load_run(tmp_path / "run")
    assert len(run.cells) == 3 and run.meta["status"] == "interrupted"
    monkeypatch.undo()
    result = runner.invoke(app, args + ["--resume"])
    assert result.exit_code == 0, result.output
    run = load_run(tmp_path / "run")
    assert len(run.cells) == 5 and (run.cells["status"] == "ok").all() and run.meta["status"] == "complete"


def test_a_dry_run_of_a_resume_shows_the_cells_it_will_run(tiny_model_dirs, tmp_path, monkeypatch):
    """`--resume --output RUN --dry-run` plans with the run's stored settings (not the default grid)
    and shows only the cells left; on a finished run, the resume says there is nothing to do
    before it loads a model."""
    run_dir = tmp_path / "run"
    args = sweep_args(tiny_model_dirs, run_dir, ["--temperatures", "0", "--batch-sizes", "1"])
    ctrl_c_at("chat|B1|T0|ngram:2|K1", monkeypatch)
    assert runner.invoke(app, args).exit_code == 130
    monkeypatch.undo()
    finished = set(load_run(run_dir).cells["cell_id"])
    assert len(finished) == 3
    monkeypatch.setattr(native_runner, "load_models", lambda *a: pytest.fail("loaded models"))
    dry = runner.invoke(app, ["sweep", "--resume", "--output", str(run_dir), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    text = dry.output.replace("\n", "")
    assert "2 cells left to run (3 finished already) (0 autoregressive, 2 speculative)" in text, dry.output
    assert f"target {tiny_model_dirs['target']}" in text and "60 cells" not in text
    assert "ngram:2" in text and "smollm2" not in text
    monkeypatch.undo()
    assert runner.invoke(app, args + ["--resume"]).exit_code == 0
    monkeypatch.setattr(native_runner, "load_models", lambda *a: pytest.fail("loaded models"))
    for extra in (["--dry-run"], []):
        done = runner.invoke(app, ["sweep", "--resume", "--output", str(run_dir), *extra])
        assert done.exit_code == 0, done.output
        assert f"--resume: all 5 cells of {run_dir} are finished: nothing to do" in done.output.replace("\n", "")
        assert "sweep results" not in done.output  # the table is the run's own; not printed again


def test_ctrl_c_between_repeats_keeps_the_measured_ones(tiny_model_dirs, tmp_path, monkeypatch):
    """With --repeats, a group's cells take turns; Ctrl-C in the second round still records every
    cell with the repeats it has (nothing measured is lost), marked in its message."""
    args = sweep_args(tiny_model_dirs, tmp_path / "run", ["--temperatures", "0", "--batch-sizes", "1",
                                                          "--repeats", "3"])
    original = native_runner.CellRun.measure

    def measure(run, repeat):
        if repeat == 1 and run.cell.id == "chat|B1|T0|ngram:2|K1":
            raise KeyboardInterrupt
        return original(run, repeat)

    monkeypatch.setattr(native_runner.CellRun, "measure", measure)
    assert runner.invoke(app, args).exit_code == 130
    cells = load_run(tmp_path / "run").cells.set_index("cell_id")
    assert len(cells) == 5 and (cells["status"] == "ok").all()
    # Cells before the interrupted one in the round have 2 repeats; it and those after, 1.
    assert cells["repeats"].tolist() == [2, 2, 2, 1, 1]
    assert cells["message"].str.startswith("interrupted:").all()
    assert (cells.loc[cells["mode"] == "speculative", "lossless"] == "exact").all()


def test_a_killed_sweep_keeps_its_parts_and_resume_merges_them(tiny_model_dirs, tmp_path, monkeypatch):
    """A process killed hard never merges its part files: they still load, and the resume's
    lossless check finds the baseline's outputs in them."""
    args = sweep_args(tiny_model_dirs, tmp_path / "run", ["--temperatures", "0", "--batch-sizes", "1"])
    ctrl_c_at("chat|B1|T0|ngram:2|K1", monkeypatch)
    monkeypatch.setattr(measuring_module, "merge_parts", lambda run_dir: None)
    assert runner.invoke(app, args).exit_code == 130
    assert len(list((tmp_path / "run" / "parts").glob("requests-*.parquet"))) == 3
    run = load_run(tmp_path / "run")
    assert len(run.cells) == 3 and set(run.requests["cell_id"]) == set(run.cells["cell_id"])
    monkeypatch.undo()
    result = runner.invoke(app, args + ["--resume"])
    assert result.exit_code == 0, result.output
    run = load_run(tmp_path / "run")
    assert not (tmp_path / "run" / "parts").exists()
    assert len(run.cells) == 5 and set(run.requests["cell_id"]) == set(run.cells["cell_id"])
    speculative = run.cells[run.cells["mode"] == "speculative"]
    assert (speculative["lossless"] == "exact").all()
    assert len(pd.read_csv(tmp_path / "run" / "steps.csv")) == len(run.steps)


def test_report_writes_every_chart_and_an_html_page_embedding_them(finished_run):
    import base64
    import re

    from specbench.report.charts import CHARTS

    output, _ = finished_run
    result = runner.invoke(app, ["report", str(output), "--slo", "ttft=60,tpot=10"])  # an SLO adds goodput
    assert result.exit_code == 0, result.output
    report = output / "report"
    page = (report / "report.html").read_text()
    assert "<p class=answer>Under p99 TTFT" in page and "capacity: the highest concurrency (B)" in page
    drawn = [name for name in CHARTS if not name.startswith("trace_")]  # the trace charts: trace runs only
    for name in drawn:
        png = (report / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000
        assert base64.b64encode(png).decode() in page
    assert "src='http" not in page and len(re.findall(r"data:image/png;base64", page)) == len(drawn)
    answer, contents = page.index("<p class=answer>"), page.index("<nav><b>Contents</b>")
    assert answer < contents < page.index("<h2 id=s1>")  # the answer first, then the table of contents
    assert page.count("<li><a href='#s") == page.count("<h2 id=s")
    summary = (report / "summary.md").read_text()
    assert "## alpha fit" in summary and "## predicted vs measured" in summary
    assert "accepted / drafted" in summary  # what each α is, said beside the fitted one
    assert "α fit" in result.output and "in-sample (fitted on the same cells)" in result.output


def test_check_and_plan_on_a_real_run(finished_run):
    output, _ = finished_run
    result = runner.invoke(app, ["check", str(output), "--batch-sizes", "1,3"])
    assert result.exit_code in (0, 1) and result.output.startswith(("PASS (exit 0)", "FAIL (exit 1)")), result.output
    result = runner.invoke(app, ["plan", str(output), "--k", "1,2,6", "--batch-sizes", "1,2,8"])
    assert result.exit_code == 0, result.output
    assert "PREDICTIONS" in result.output
    result = runner.invoke(app, ["plan", str(output), "--k", "2", "--batch-sizes", "16", "--json"])
    records = json.loads(result.output)["predictions"]
    assert {r["batch_size"] for r in records} == {16} and all(r["predicted"] for r in records)
    assert all(r["extrapolated_b"] and not r["measured_b"] for r in records)


def test_repeats_take_turns_within_a_group(tiny_model_dirs, tmp_path, monkeypatch):
    """With --repeats, the group's cells alternate repeat by repeat, so machine drift hits the
    baseline and the speculative cells alike."""
    order = []
    original = native_runner.CellRun.measure

    def logged(self, repeat):
        order.append((self.cell.id, repeat))
        return original(self, repeat)

    monkeypatch.setattr(native_runner.CellRun, "measure", logged)
    args = sweep_args(tiny_model_dirs, tmp_path / "run", ["--temperatures", "0", "--batch-sizes", "1", "--k", "2",
                                                          "--drafts", "ngram", "--repeats", "3"])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    ar, sd = "chat|B1|T0|autoregressive", "chat|B1|T0|ngram|K2"
    assert order == [(ar, 0), (sd, 0), (ar, 1), (sd, 1), (ar, 2), (sd, 2)]
    cells = load_run(tmp_path / "run").cells.set_index("cell_id")
    assert len(cells.loc[sd, "tokens_per_s_runs"]) == 3 and cells.loc[sd, "lossless"] == "exact"
    assert cells.loc[sd, "tokens_per_s"] == pytest.approx(float(np.median(cells.loc[sd, "tokens_per_s_runs"])))


def test_sweep_with_fixed_shape_steps(tiny_model_dirs, tmp_path, monkeypatch):
    """--cuda-graphs' code path on CPU (steps at fixed shapes, run eagerly): still lossless, and the
    full-length warm-up builds every shape the measured repeats use."""
    import specbench.native.runner as native_runner
    from specbench.grid import EngineOptions, GridOptions, LoadOptions, with_setting
    from specbench.sweep import SweepConfig, run_sweep

    validate = native_runner.validate_native  # the native engine's check refuses --cuda-graphs on a CPU
    monkeypatch.setattr(native_runner, "validate_native",
                        lambda config: validate(with_setting(config, "engine.cuda_graphs", False)))
    config = SweepConfig(grid=GridOptions(target=tiny_model_dirs["target"],
                                          drafts=[tiny_model_dirs["draft"], "ngram:2"], ks=[2], temperatures=[0.0],
                                          workloads=["chat"], max_new_tokens=10, num_prompts=3, repeats=2),
                         load=LoadOptions(batch_sizes=[3]), engine=EngineOptions(dtype="fp64", cuda_graphs=True))
    cells = load_run(run_sweep(config, tmp_path)).cells
    assert (cells["status"] == "ok").all() and cells["cuda_graphs"].all()
    assert (cells.loc[cells["mode"] == "speculative", "lossless"] == "exact").all()
    assert (cells["graph_captures_timed"] == 0).all()
    assert (cells["speedup_runs"].apply(len) == 2).all()  # repeat by repeat against the group's baseline
    assert list(cells.loc[cells["mode"] == "autoregressive", "speedup_runs"].iloc[0]) == [1.0, 1.0]


def test_warnings_travel_to_the_report_and_drifted_groups_are_marked(finished_run, tmp_path, monkeypatch):
    import specbench.report.analysis as analysis_module
    import specbench.report.charts as charts_module
    from specbench.report import write_report

    warning = "chat B=1: the same autoregressive decode step took 10.0 ms at T=0 and 20.0 ms at T=0.8 (2.00×)"
    monkeypatch.setattr(analysis_module, "measurement_warnings", lambda cells, copies=None, noise=None: [warning])
    monkeypatch.setattr(charts_module, "drifted_keys", lambda cells: {("chat", 1)})
    out_dir, _ = write_report(load_run(finished_run[0]), tmp_path / "report")
    summary, page = (out_dir / "summary.md").read_text(), (out_dir / "report.html").read_text()
    assert "## measurement warnings" in summary and warning in summary
    assert "<pre class=warn>" in page and "(2.00×)" in page
    assert page.index("measurement warnings") < page.index("speedup_vs_batch")  # above the charts
    assert "overflow-x:auto" in page and "white-space:pre-wrap" in page  # no sideways scrolling of the page


def test_plan_carries_the_runs_warnings(finished_run, monkeypatch):
    import specbench.fit as fit_module

    monkeypatch.setattr(fit_module, "measurement_warnings", lambda cells, copies=None, noise=None: ["the machine was busy (test)"])
    result = runner.invoke(app, ["plan", str(finished_run[0]), "--k", "1,3", "--batch-sizes", "1,3"])
    assert result.exit_code == 0, result.output
    assert "warning: the machine was busy (test)" in result.output and "B* = " in result.output


def test_report_compares_the_baseline_with_a_reference_run(finished_run, tmp_path):
    """`report --reference RUN`: the baseline's tokens/s against another engine's on the same cells,
    with a warning where it is far slower (here: the reference made twice as fast at B=1)."""
    import shutil

    output, _ = finished_run
    reference = tmp_path / "reference"
    shutil.copytree(output, reference, ignore=shutil.ignore_patterns("report"))
    meta = json.loads((reference / "run.json").read_text())
    meta["engine"] = {"name": "vllm", "version": "0.32.0"}
    (reference / "run.json").write_text(json.dumps(meta))
    cells = pd.read_parquet(reference / "cells.parquet")
    faster = (cells["mode"] == "autoregressive") & (cells["batch_size"] == 1)
    cells.loc[faster, "tokens_per_s"] *= 2
    cells.to_parquet(reference / "cells.parquet")
    cells.to_csv(reference / "cells.csv", index=False)

    result = runner.invoke(app, ["report", str(output), "--reference", str(reference), "--output",
                                 str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert "far slower than vLLM 0.32.0 (chat B=1 T=0: 0.50×, chat B=1 T=0.8: 0.50×" in result.output
    assert "B=3" not in result.output.split("far slower")[1].split("\n")[0]
    assert "tokens/s were 0.50–1.00× vLLM 0.32.0's on the same cells" in result.output
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "## autoregressive baseline vs vLLM 0.32.0 (the reference run)" in summary
    assert "memory-bandwidth roofline" in summary  # native runs record the roofline too
    missing = runner.invoke(app, ["report", str(output), "--reference", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "not a specbench run" in missing.output


def test_pairing_groups_keep_each_speed_up_beside_its_baseline():
    from specbench.executors.groups import WorkEstimate, pairing_groups
    from specbench.grid import EngineOptions, GridOptions, LoadOptions
    from specbench.sweep import SweepConfig, plan_cells

    config = SweepConfig(grid=GridOptions(drafts=["ngram", "ngram:3", "smollm2-135m"], ks=[2], temperatures=[0.0],
                                          workloads=["chat"]),
                         load=LoadOptions(batch_sizes=[1, 4]), engine=EngineOptions(name="vllm"))
    cells = plan_cells(config)
    groups = pairing_groups(cells, cells, 2, WorkEstimate.of(config))
    assert len(groups) == 2
    for group in groups:
        ids = {cell.id for cell in group.cells}
        assert all(cell.baseline_id in ids for cell in group.speculative)  # paired on its own node
    # a speculative configuration (one server) is never split while there are more than slots;
    # the draft model's configuration costs about as much as both n-gram ones
    configs = [{(c.draft, c.k) for c in group.speculative} for group in groups]
    assert sorted(len(c) for c in configs) == [1, 2] and not (configs[0] & configs[1])
    assert {("smollm2-135m", 2)} in configs
    assert abs(sum(g.share for g in groups) - 1) < 1e-9 and all(0.3 < g.share < 0.7 for g in groups)
    # fewer configurations than slots: split by pairing group, which measures no baseline twice
    one = SweepConfig(grid=GridOptions(drafts=["ngram"], ks=[2], temperatures=[0.0, 0.7], workloads=["chat"]),
                      load=LoadOptions(batch_sizes=[1, 4]))
    cells = plan_cells(one)
    groups = pairing_groups(cells, cells, 4, WorkEstimate.of(one))
    assert len(groups) == 4 and sum(len(g.cells) for g in groups) == len(cells)
    # a resume: only unfinished cells, with the baselines they pair with
    todo = [cell for cell in cells if cell.is_speculative and cell.batch_size == 4]
    again = pairing_groups(todo, cells, 4, WorkEstimate.of(one))
    assert sorted(cell.id for g in again for cell in g.cells if not cell.is_speculative) == \
        sorted(cell.baseline_id for cell in todo)


def test_pairing_groups_are_balanced_by_estimated_work_not_cell_count():
    from specbench.executors.groups import WorkEstimate, pairing_groups
    from specbench.grid import EngineOptions, GridOptions, LoadOptions
    from specbench.sweep import SweepConfig, plan_cells

    # native: no server to start, so a baseline measured twice is the only price of a cut
    config = SweepConfig(grid=GridOptions(drafts=["ngram", "smollm2-135m@bf16"], ks=[2, 4], temperatures=[0.0],
                                          workloads=["chat"], max_new_tokens=32),
                         load=LoadOptions(batch_sizes=[1, 4]))
    estimate = WorkEstimate.of(config)
    cells = {cell.id: cell for cell in plan_cells(config)}
    ngram, model = cells["chat|B1|T0|ngram|K2"], cells["chat|B1|T0|smollm2-135m@bf16|K2"]
    assert estimate.cell(model) > 1.2 * estimate.cell(ngram)  # a bf16 copy of the fp32 target: half its bytes
    assert estimate.cell(cells["chat|B4|T0|autoregressive"]) < estimate.cell(cells["chat|B1|T0|autoregressive"])
    groups = pairing_groups(list(cells.values()), list(cells.values()), 2, estimate)
    work = sorted(estimate.group(g.cells) for g in groups)
    assert work[1] / work[0] < 1.3, work
    assert all({c.baseline_id for c in g.speculative} <= {c.id for c in g.cells} for g in groups)
    # vLLM: a server start is dear, so configurations stay whole and each group starts few servers
    served = SweepConfig(grid=GridOptions(drafts=["ngram", "smollm2-135m"], ks=[2, 4], temperatures=[0.0],
                                          workloads=["chat"]),
                         load=LoadOptions(batch_sizes=[1, 4, 16]), engine=EngineOptions(name="vllm"))
    cells = plan_cells(served)
    groups = pairing_groups(cells, cells, 2, WorkEstimate.of(served))
    whole = [{(c.draft, c.k) for c in g.speculative} for g in groups]
    assert sorted(map(len, whole)) == [2, 2] and not (whole[0] & whole[1])
    assert WorkEstimate.of(served).group(groups[0].cells) > WorkEstimate.of(config).group(groups[0].cells)
