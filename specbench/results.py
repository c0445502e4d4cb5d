"""A run on disk: one directory holding cells, requests and steps tables (Parquet and CSV) and
run.json (grid, seeds, hardware, versions, times).

While a sweep runs, the small cells table is rewritten atomically after every cell and each cell's
requests and steps go to their own part file under parts/, so the cost of saving a cell does not
grow with the run. The sweep merges the parts into requests/steps tables when it stops (finished,
failed or interrupted); a run killed before that still loads, parts included, and a resume merges
them."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from specbench.schema import EVERY_ROW, REQUIRED_CELL_COLUMNS, TABLE_COLUMNS

TABLES = ("cells", "requests", "steps")
# a cluster run: each baseline measured again on every other node that measured its speculative
# cells (their speed-ups pair with that node's copy); the cells table holds the first
COPIES = "baseline_copies"
PART_TABLES = ("requests", "steps")  # written per cell while a sweep runs
DEFAULT_RESULTS_DIR = Path("results")


class RunNotFound(FileNotFoundError):
    pass


class DamagedRun(ValueError):
    """A run directory whose files are not as a sweep writes them: bad input, named by file."""




class OutputError(ValueError):
    """--output (or results/) cannot take a run."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_dir(root: Path, target: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-._" else "-" for c in Path(target).name)
    path = root / f"{stamp}_{safe}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = root / f"{stamp}_{safe}_{suffix}"
    path.mkdir(parents=True)
    return path


def has_cells(run_dir: Path) -> bool:
    """A directory is a run once a cell finished (measured or failed): before that it holds only
    run.json (and maybe server logs) of a sweep that stopped early."""
    return (Path(run_dir) / "cells.parquet").exists()


def latest_run(root: Path = DEFAULT_RESULTS_DIR, finished_only: bool = True) -> Path:
    """The newest run with at least one finished cell (any run with finished_only=False); runs that
    stopped before their first cell are skipped."""
    runs = sorted((p.parent for p in Path(root).glob("*/run.json")), key=lambda p: (p / "run.json").stat().st_mtime)
    finished = [run for run in runs if has_cells(run) or not finished_only]
    if not finished:
        skipped = f" ({len(runs)} stopped before their first cell, e.g. {runs[-1]})" if runs else ""
        raise RunNotFound(f"no runs under {root}/{skipped}: run `specbench sweep` first, or name a run directory")
    return finished[-1]


def prepare_output(output: Path) -> bool:
    """Check that --output can hold a new run; returns True when it holds an earlier attempt that
    stopped before its first cell (retried in place). Raises OutputError with one line otherwise."""
    if output.exists() and not output.is_dir():
        raise OutputError(f"--output {output} is a file, not a directory")
    retry = output.is_dir() and (output / "run.json").exists() and not has_cells(output)
    if output.is_dir() and any(output.iterdir()) and not retry:
        raise OutputError(f"--output {output} exists and is not empty (add --resume to continue it)")
    check_writable(output)
    return retry


def check_writable(directory: Path, hint: str = "") -> None:
    """`directory` exists (created if missing) and takes a file: by trying, which also holds for
    root, read-only mounts and ACLs, where permission bits mislead. OutputError with one line if not."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".specbench-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise OutputError(f"cannot write results to {directory}: {error.strerror or error}{hint}") from None


def _csv_ready(frame: pd.DataFrame) -> pd.DataFrame:
    """Lists (ITL gaps, token ids, per-position acceptance) become JSON strings in CSV."""
    import numpy as np

    def encode(value):
        if isinstance(value, np.ndarray):
            value = value.tolist()
        return json.dumps(value) if isinstance(value, (list, tuple)) else value

    out = frame.copy()
    for column in out.columns:
        if out[column].map(lambda v: isinstance(v, (list, tuple, np.ndarray))).any():
            out[column] = out[column].map(encode)
    return out


def write_table(run_dir: Path, name: str, frame: pd.DataFrame) -> None:
    for suffix, write in (("parquet", lambda f, p: f.to_parquet(p, index=False)),
                          ("csv", lambda f, p: _csv_ready(f).to_csv(p, index=False))):
        path = run_dir / f"{name}.{suffix}"
        staging = path.with_name(path.name + ".tmp")
        write(frame, staging)
        os.replace(staging, path)


def _part_paths(run_dir: Path, name: str) -> list[Path]:
    return sorted((run_dir / "parts").glob(f"{name}-*.parquet"))


def append_part(run_dir: Path, name: str, frame: pd.DataFrame) -> None:
    """One cell's rows of a table, in a part file of their own (written atomically)."""
    parts = run_dir / "parts"
    parts.mkdir(exist_ok=True)
    existing = _part_paths(run_dir, name)
    index = int(existing[-1].stem.rsplit("-", 1)[1]) + 1 if existing else 0
    path = parts / f"{name}-{index:06d}.parquet"
    staging = path.with_name(path.name + ".tmp")
    frame.to_parquet(staging, index=False)
    os.replace(staging, path)


def read_table(run_dir: Path, name: str) -> pd.DataFrame:
    """A table as merged so far plus any part files not merged yet."""
    merged = run_dir / f"{name}.parquet"
    frames = [pd.read_parquet(merged)] if merged.exists() else []
    frames += [pd.read_parquet(part) for part in _part_paths(run_dir, name)]
    frames = [frame for frame in frames if len(frame)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def merge_parts(run_dir: Path) -> None:
    """Fold the part files into the Parquet and CSV tables, then remove them."""
    for name in PART_TABLES:
        parts = _part_paths(run_dir, name)
        if parts or not (run_dir / f"{name}.parquet").exists():
            write_table(run_dir, name, read_table(run_dir, name))
        for part in parts:
            part.unlink()
    try:
        (run_dir / "parts").rmdir()
    except OSError:
        pass


def write_json(path: Path, payload: dict) -> None:
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps(payload, indent=2, default=str))
    os.replace(staging, path)


@dataclass
class Run:
    path: Path
    meta: dict
    cells: pd.DataFrame
    requests: pd.DataFrame
    steps: pd.DataFrame
    baseline_copies: pd.DataFrame | None = None


def load_run(run_dir: Path | str | None = None, root: Path = DEFAULT_RESULTS_DIR) -> Run:
    path = Path(run_dir) if run_dir else latest_run(root)
    if not (path / "run.json").exists():
        raise RunNotFound(f"{path} is not a specbench run (no run.json)")
    meta = read_meta(path)
    if not has_cells(path):
        if meta.get("status") == "complete":
            raise DamagedRun(f"{path / 'cells.parquet'} is missing, although the sweep wrote cells "
                             "(run.json: status complete): the run directory is damaged")
        error = f": {meta['error']}" if meta.get("error") else ""
        raise RunNotFound(f"{path} has no finished cells (its sweep is {meta.get('status', 'unknown')}{error}); "
                          f"retry it with `specbench sweep --output {path}`")
    try:
        tables = {name: read_table(path, name) for name in TABLES}
        copies = read_table(path, COPIES)
    except (OSError, ValueError) as error:  # pyarrow's errors are both
        raise DamagedRun(f"{path}: a table cannot be read as Parquet ({(str(error).splitlines() or [''])[0]})") from None
    check_cells(tables["cells"], path / "cells.parquet")
    tables["cells"] = with_speculative_columns(tables["cells"])
    for name in ("requests", "steps"):
        check_table(tables[name], name, path / f"{name}.parquet")
    return Run(path, meta, tables["cells"], tables["requests"], tables["steps"], copies)


def pool_runs(runs: list[Run]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Several runs' cells, requests and steps as one set of tables. A cell id that more than one
    run holds (the same grid measured twice) is prefixed with its run's place in the list
    (`1:chat|C512|B1|...`), so a cell's requests and steps stay its own."""
    counts = Counter(cell_id for run in runs for cell_id in set(run.cells["cell_id"]))
    repeated = {cell_id for cell_id, n in counts.items() if n > 1}
    pooled: dict[str, list[pd.DataFrame]] = {"cells": [], "requests": [], "steps": []}
    for index, run in enumerate(runs):
        for name, frame in (("cells", run.cells), ("requests", run.requests), ("steps", run.steps)):
            if repeated and not frame.empty and "cell_id" in frame:
                frame = frame.copy()
                frame["cell_id"] = frame["cell_id"].map(lambda c: f"{index}:{c}" if c in repeated else c)
            pooled[name].append(frame)
    return tuple(pd.concat([f for f in frames if not f.empty] or frames[:1], ignore_index=True)
                 for frames in pooled.values())


def read_meta(path: Path) -> dict:
    where = path / "run.json"
    try:
        meta = json.loads(where.read_text())
    except json.JSONDecodeError as error:
        raise DamagedRun(f"{where} is not valid JSON ({error.msg}, line {error.lineno}): the run directory is "
                         "damaged") from None
    if not isinstance(meta, dict) or "status" not in meta or not isinstance(meta.get("config", {}), dict):
        raise DamagedRun(f"{where} is not a specbench run.json (a JSON object with the sweep's status and config)")
    if meta.get("config"):  # none recorded stays none: nothing is planned from it
        meta["config"] = nested_config(meta["config"])
    return meta


# --- run.json's config -------------------------------------------------------------------------

CONFIG_GROUPS = ("grid", "load", "engine", "executor", "gate")  # SweepConfig's, as run.json nests them
# a flat config's settings (every one at the top level of run.json's "config"; in its order, which
# resume's messages keep) -> each one's place in the groups
FLAT_CONFIG: dict[str, tuple[str, ...]] = {
    "target": ("grid", "target"), "drafts": ("grid", "drafts"), "ks": ("grid", "ks"),
    "batch_sizes": ("load", "batch_sizes"), "temperatures": ("grid", "temperatures"),
    "workloads": ("grid", "workloads"), "max_new_tokens": ("grid", "max_new_tokens"),
    "num_prompts": ("grid", "num_prompts"), "repeats": ("grid", "repeats"), "seed": ("grid", "seed"),
    "dtype": ("engine", "dtype"), "device": ("engine", "device"), "top_p": ("grid", "top_p"),
    "top_k": ("grid", "top_k"), "chat_template": ("engine", "chat_template"), "warmup": ("engine", "warmup"),
    "allow_download": ("engine", "allow_download"), "trust_remote_code": ("engine", "trust_remote_code"),
    "weights": ("grid", "weights"), "alphas": ("grid", "alphas"), "target_layers": ("grid", "target_layers"),
    "cuda_graphs": ("engine", "cuda_graphs"), "engine": ("engine", "name"), "vllm": ("engine", "vllm"),
    "request_rates": ("load", "request_rates"), "burstiness": ("load", "burstiness"), "slo": ("gate", "slo"),
    "endpoint": ("engine", "endpoint", "urls"), "baseline_endpoint": ("engine", "endpoint", "baseline_urls"),
    "api_key_env": ("engine", "endpoint", "api_key_env"), "router": ("engine", "endpoint", "router"),
    "context_lengths": ("grid", "context_lengths"), "until_decided": ("gate", "until_decided"),
    "max_repeats": ("gate", "max_repeats"), "min_speedup": ("gate", "min_speedup"), "trace": ("load", "trace"),
    "trace_window": ("load", "trace_window"), "trace_speedup": ("load", "trace_speedup"),
    "trace_max_requests": ("load", "trace_max_requests"), "executor": ("executor", "name"),
    "ray_address": ("executor", "ray_address"),
}


def nested_config(config: dict) -> dict:
    """run.json's config in SweepConfig's groups, every group present (empty where none is
    recorded). A flat config's settings are moved into their groups; keys it does not know stay at
    the top level."""
    flat = any(key in FLAT_CONFIG and not (key in CONFIG_GROUPS and isinstance(value, dict))
               for key, value in config.items())
    nested: dict = {} if flat else dict(config)
    if flat:
        for key, value in config.items():
            *groups, name = FLAT_CONFIG.get(key, (key,))
            place = nested
            for group in groups:
                place = place.setdefault(group, {})
            place[name] = value
    for group in CONFIG_GROUPS:
        if not isinstance(nested.get(group), dict):
            nested[group] = {}
    return nested


def recorded_config(meta: dict) -> dict:
    """A run's config (run.json's "config", `meta` its dict) in SweepConfig's groups (`nested_config`)."""
    return nested_config(meta.get("config") or {})


def check_cells(cells: pd.DataFrame, where: Path) -> None:
    """The cells table as a sweep writes it, else bad input naming the file and the column."""
    if cells.empty:
        raise DamagedRun(f"{where} has no rows: the run directory is damaged")
    missing = [column for column in REQUIRED_CELL_COLUMNS if column not in cells]
    if missing:
        raise DamagedRun(f"{where} lacks column(s) {', '.join(missing)}: not a cells table specbench wrote "
                         "(damaged, or edited)")
    _check_numbers(cells, "cells", where)


def with_speculative_columns(cells: pd.DataFrame) -> pd.DataFrame:
    """A run of baselines only (a plain fleet measured with --baseline-endpoint) has no speculative
    cell to write α, τ and their kin: those columns are added empty, so every reader finds them."""
    missing = [c for c in TABLE_COLUMNS["cells"] if c.written_by == "speculative cells" and c.name not in cells]
    if not missing:
        return cells
    cells = cells.copy()
    for column in missing:
        cells[column.name] = pd.Series([None] * len(cells), dtype=object) if column.dtype.startswith("list") \
            else float("nan")
    return cells


def check_table(frame: pd.DataFrame, name: str, where: Path) -> None:
    """A requests or steps table against the contract (schema.py): the columns every row has, and
    numbers where numbers belong; else bad input naming the file and the column. Empty is fine (an
    engine without step-level detail writes no steps)."""
    if frame.empty:
        return
    missing = [c.name for c in TABLE_COLUMNS[name] if c.written_by == EVERY_ROW and c.name not in frame]
    if missing:
        raise DamagedRun(f"{where} lacks column(s) {', '.join(missing)}: not a {name} table specbench wrote "
                         "(damaged, or edited)")
    _check_numbers(frame, name, where)


def _check_numbers(frame: pd.DataFrame, name: str, where: Path) -> None:
    """Every column the contract types as a number holds numbers (or nothing at all)."""
    for column in TABLE_COLUMNS[name]:
        if column.numeric and column.name in frame and not (pd.api.types.is_numeric_dtype(frame[column.name])
                                                            or frame[column.name].isna().all()):
            values = frame[column.name]
            shown = next((v for v in values if not isinstance(v, (int, float)) and v is not None), "?")
            raise DamagedRun(f"{where}: column {column.name} holds {type(shown).__name__} values ({shown!r}), not "
                             "numbers: the run directory is damaged")


# --- provenance --------------------------------------------------------------------------------

def git_revision() -> str:
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + ("-dirty" if dirty else "")) if sha else "unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The CPU's vector and matrix extensions that decide a CPU run's speed: a 2-core VM named "AMD EPYC"
# with AVX2 and no AVX-512 ran the offline default's bf16 self-draft at B=16 at 14 tok/s, where an
# earlier VM of the same name had run it at 121 (data/measured.json: cpu_name_not_machine): the name alone
# does not say which machine a run had
SIMD_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_flags() -> list[str]:
    """Of SIMD_FLAGS, those /proc/cpuinfo lists (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                listed = set(line.split(":", 1)[1].split())
                return [flag for flag in SIMD_FLAGS if flag in listed]
    except OSError:
        pass
    return []


def gpu_info() -> list[dict]:
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append({"index": index, "name": name.decode() if isinstance(name, bytes) else name,
                         "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                         "driver": driver.decode() if isinstance(driver, bytes) else driver})
        return gpus
    except Exception:
        return []


def hardware_info() -> dict:
    import psutil
    import torch

    return {
        "cpu": cpu_name(),
        "cpu_flags": cpu_flags(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the kernels torch dispatches to
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_bytes": psutil.virtual_memory().total,
        "gpus": gpu_info(),
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
    }


def versions() -> dict:
    import torch
    import transformers

    from specbench import __version__

    return {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
            "specbench": __version__, "specbench_git": git_revision()}
