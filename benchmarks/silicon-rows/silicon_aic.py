"""aiconfigurator's own estimate of every row `silicon.py` simulates, to report beside the
simulator's (issue 40, part 2): `aiconfigurator.cli.api.cli_estimate` (the `aiconfigurator cli
estimate` command's function) at the row's model, GPU, TP, GEMM precision, concurrency (as the batch
size) and lengths, under vLLM, everything else its defaults.

aiconfigurator (the CLI package) is not a specbench dependency; run this in its own environment:

    python -m venv /tmp/aic && /tmp/aic/bin/pip install aiconfigurator==0.12.0
    /tmp/aic/bin/python benchmarks/silicon-rows/silicon_aic.py     # about 6 minutes

Writes silicon_aic.csv (id, aic_ttft_ms, aic_tpot_ms, or why it gave none) next to this file;
silicon.py reads it when it is there.
"""

from __future__ import annotations

import csv
import logging
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the rows' model ids -> the configs aiconfigurator ships (same architecture; the FP8 8B is
# Llama-3.1-8B with FP8 GEMMs, which the row's precision gives). silicon.py uses these too: this file
# imports nothing of specbench, so that it runs in aiconfigurator's own environment.
MODELS = {"meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
          "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
          "Qwen/Qwen3-32B": "Qwen/Qwen3-32B"}


def dense_vllm_rows(source: Path) -> list[dict]:
    """The dense aggregated vLLM rows of `source` (a silicon_sample.csv) whose models MODELS maps."""
    with open(source) as handle:
        return [row for row in csv.DictReader(handle)
                if row["backend"] == "vllm" and row["mode"] == "agg" and row["model_path"] in MODELS]


def main() -> None:
    import aiconfigurator_core
    from aiconfigurator.cli.api import cli_estimate

    logging.disable(logging.WARNING)
    rows = dense_vllm_rows(Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv")
    started = time.perf_counter()
    out = []
    for row in rows:
        found = {"id": row["id"], "aic_ttft_ms": "", "aic_tpot_ms": "", "aic_error": ""}
        try:
            result = cli_estimate(MODELS[row["model_path"]], row["system"], backend_name="vllm", isl=int(row["isl"]),
                                  osl=int(row["osl"]), batch_size=int(row["batch_size"]), tp_size=int(row["tp_size"]),
                                  gemm_quant_mode=row["gemm_quant_mode"] or None)
            found["aic_ttft_ms"], found["aic_tpot_ms"] = float(result.ttft), float(result.tpot)
        except Exception as error:  # noqa: BLE001 - a row aiconfigurator cannot estimate is counted with its reason
            found["aic_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
        out.append(found)
    with open(HERE / "silicon_aic.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(out[0]))
        writer.writeheader()
        writer.writerows(out)
    estimated = sum(1 for row in out if not row["aic_error"])
    print(f"{estimated} of {len(out)} rows estimated in {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
