"""The measured constants and validation figures specbench ships as data (specbench/data/): each says
where it was measured, the code prices with exactly the file's values, the figures a plan prints are
the file's, and the file's figures are what their commands compute from the committed results."""

import json
import math
import re
from dataclasses import asdict
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specbench import measured

ROOT = Path(__file__).parents[1]


def _paths(text: str) -> list[str]:
    """The repository paths a source or command names (globs and options left out)."""
    return [word.rstrip(",;)") for word in re.split(r"[\s(]+", text)
            if word.startswith("benchmarks/") and "*" not in word and "$" not in word]


def _where_is_said(entry: dict, name: str) -> None:
    for field in measured.WHERE_FIELDS:
        assert isinstance(entry.get(field), str) and entry[field].strip(), (name, field)
    date.fromisoformat(entry["date"])
    for path in _paths(entry["source"]) + _paths(entry["command"]) + entry.get("results", []):
        assert (ROOT / path).exists(), (name, path)


def test_every_constant_and_finding_says_where_it_was_measured():
    assert measured.constants() and measured.findings()
    for name, entry in measured.constants().items():
        assert set(measured.CONSTANT_FIELDS) <= set(entry), name
        assert entry["unit"] in ("ms", "s"), name
        values = entry["value"].values() if isinstance(entry["value"], dict) else [entry["value"]]
        assert all(isinstance(v, float) and v > 0 for v in values), name
        _where_is_said(entry, name)
    for name, entry in measured.findings().items():
        _where_is_said(entry, name)
    for section in ("silicon", "replay", "direction_by_effect"):
        _where_is_said(measured.validation(section), section)


def test_the_code_prices_with_the_files_values():
    from specbench.fit import host_cost
    from specbench.fleet.plan import BURST_SPACING_S

    in_code = {"vllm_host_step": (host_cost.VLLM_HOST_STEP, host_cost.VLLM_HOST_STEP_SOURCE),
               "multiproc_executor_step": (host_cost.MULTIPROC_EXECUTOR_STEP, host_cost.MULTIPROC_EXECUTOR_STEP_SOURCE),
               "ngram_host_step": (host_cost.NGRAM_HOST_STEP, host_cost.NGRAM_HOST_STEP_SOURCE),
               "vllm_api_server_request": (host_cost.VLLM_API_SERVER_REQUEST, host_cost.VLLM_API_SERVER_REQUEST_SOURCE),
               "compiled_launch": (host_cost.COMPILED_LAUNCH, host_cost.COMPILED_LAUNCH_SOURCE),
               "piecewise_layer_ms": (host_cost.PIECEWISE_LAYER_MS, host_cost.PIECEWISE_SOURCE),
               "burst_spacing_s": (BURST_SPACING_S, None)}
    assert set(in_code) == set(measured.constants())
    for name, (constant, source) in in_code.items():
        entry = measured.constants()[name]
        assert (asdict(constant) if isinstance(entry["value"], dict) else constant) == entry["value"], name
        if source is not None:  # what --json says of where the host time a plan priced was measured
            assert source == f"{entry['what']} (specbench's {entry['source']})" == measured.described(name)
            assert "specbench's benchmarks/" in source
    assert host_cost.described(host_cost.VLLM_HOST_STEP) == {**entry_value("vllm_host_step"),
                                                           "measured": measured.described("vllm_host_step")}


def entry_value(name: str):
    return measured.constants()[name]["value"]


def test_the_fitted_constants_are_their_committed_results():
    """A constant fitted by a benchmark (its results' json holds the same terms) is that fit, to the
    digits the file keeps; the launch and graph-piece constants are the medians of their cells."""
    fitted = 0
    for name, entry in measured.constants().items():
        for path in entry["results"]:
            if not path.endswith(".json") or not isinstance(entry["value"], dict):
                continue
            result = json.loads((ROOT / path).read_text())
            for term, value in entry["value"].items():
                assert value == pytest.approx(result[term], rel=0.005), (name, term)
                fitted += 1
    assert fitted == 13  # host step 4, executor 4, ngram 3, API server 2
    launch = entry_value("compiled_launch")
    rows = [json.loads(line) for line in (ROOT / measured.constants()["compiled_launch"]["results"][0]).read_text()
            .splitlines()]
    per_layer = [(r["tp"], r["host_ms"] / r["layers"]) for r in rows
                 if r.get("mode") == "compiled" and "error" not in r and r["tokens"] <= 1024]
    assert launch["per_layer_ms"] == pytest.approx(np.median([ms for tp, ms in per_layer if tp == 1]), rel=0.005)
    assert launch["per_layer_tp_ms"] == pytest.approx(np.median([ms for tp, ms in per_layer if tp > 1]), rel=0.005)
    cells = [json.loads(line) for folder in measured.constants()["piecewise_layer_ms"]["results"]
             for path in sorted((ROOT / folder).glob("piecewise_decode*.jsonl")) for line in path.read_text().splitlines()]
    extra = [(c["piecewise_ms"] - c["full_ms"]) / c["layers"] for c in cells if c.get("width") == "real" and "error" not in c]
    assert entry_value("piecewise_layer_ms") == pytest.approx(np.median(extra), rel=0.005)
    burst = json.loads((ROOT / measured.constants()["burst_spacing_s"]["results"][0]).read_text())
    assert entry_value("burst_spacing_s") == round(burst["serial_ms_per_request"], 1) / 1e3  # to a tenth of a ms


def test_the_checks_a_plan_prints_are_the_validation_files():
    from specbench.fleet.served import DIRECTION_BY_EFFECT, REPLAY_CHECK, replay_check
    from specbench.fleet.tables import SILICON_CHECKS, SILICON_CHECKS_BY_TP, silicon_check

    silicon = measured.validation("silicon")
    assert {system: asdict(check) for system, check in SILICON_CHECKS.items()} == silicon["by_system"]
    assert {(system, tp): asdict(check) for (system, tp), check in SILICON_CHECKS_BY_TP.items()} == {
        (system, int(tp)): figures for system, by_tp in silicon["by_system_tp"].items() for tp, figures in by_tp.items()}
    h200 = silicon["by_system"]["h200_sxm"]
    assert silicon_check("h200_sxm").startswith(
        f"checked on {h200['rows']} of NVIDIA's measured vLLM rows on h200_sxm: median |error| TPOT "
        f"{h200['tpot_median_abs']:.1%}, TTFT {h200['ttft_median_abs']:.1%}; signed medians "
        f"{h200['tpot_median']:+.1%} and {h200['ttft_median']:+.1%}")
    replay = measured.validation("replay")
    assert asdict(REPLAY_CHECK) == {name: replay[name] for name in asdict(REPLAY_CHECK)}
    assert replay_check({"engine": {"name": "vllm"}, "hardware": {"gpus": []}}).startswith(
        f"checked on {replay['cells']} vLLM CPU replays it never saw")
    bands = measured.validation("direction_by_effect")["bands"]
    assert [asdict(band) for band in DIRECTION_BY_EFFECT] == [
        {**band, "below": math.inf if band["below"] is None else band["below"]} for band in bands]


def test_the_validation_figures_are_what_their_commands_compute_from_the_committed_rows(tmp_path):
    """silicon.py and cpu_replays.py --validation write their sections through `silicon_figures` and
    `replay_figures`: from the committed rows those give the file's figures, in the file's schema;
    decided_signs.py's bands are the committed decided_signs.md's table."""
    silicon, replay = measured.validation("silicon"), measured.validation("replay")
    from_rows = measured.silicon_figures(pd.read_csv(ROOT / silicon["source"]))
    assert from_rows == {key: silicon[key] for key in from_rows}
    from_cells = measured.replay_figures(pd.read_csv(ROOT / replay["source"]))
    assert from_cells == {key: replay[key] for key in from_cells}
    direction = measured.validation("direction_by_effect")
    text = (ROOT / direction["source"]).read_text()
    table = re.findall(r"^\| (?:under 10%|10% to 20%|20% or more) \| (\d+) \| (\d+) \|", text, re.M)
    assert [(band["predictions"], band["right"]) for band in direction["bands"]] == [
        (int(n), int(right)) for n, right in table]
    # the writer: one section replaced, the others kept, the same schema as the committed file
    written = tmp_path / "validation.json"
    written.write_text(measured.VALIDATION_PATH.read_text())
    where = {field: silicon[field] for field in measured.WHERE_FIELDS if field != "date"}
    measured.write_validation("silicon", from_rows, when=silicon["date"], path=written, **where)
    assert json.loads(written.read_text()) == json.loads(measured.VALIDATION_PATH.read_text())
    assert written.read_text() == measured.VALIDATION_PATH.read_text()


def test_the_data_files_ship_with_the_package():
    tomllib = pytest.importorskip("tomllib")
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "data/*.json" in package_data["specbench"]
    assert {path.name for path in (ROOT / "specbench" / "data").glob("*.json")} == {"measured.json", "validation.json",
                                                                                 "published_acceptance.json"}


def test_no_code_under_specbench_reads_or_cites_the_benchmarks_folder():
    """Where a figure was measured is said by the data files' source fields alone."""
    citing = [f"{path.relative_to(ROOT)}:{number}" for path in sorted((ROOT / "specbench").rglob("*"))
              if path.is_file() and path.suffix != ".pyc" and path.parent.name != "data"
              for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if "benchmarks/" in line]
    assert citing == []
