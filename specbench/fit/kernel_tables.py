"""NVIDIA's measured kernel tables (PyPI `aiconfigurator-core`, the `gpu-tables` extra) as forward
times: the one module that imports aiconfigurator_core.

aiconfigurator-core 0.12 is NVIDIA's last release of that package (its successor is published on
NVIDIA's own index), so every call to it lives here and a later swap touches this file alone. The
tables hold GEMM, attention, all-reduce and element-wise timings measured per GPU (h100_sxm,
h200_sxm, b200_sxm, ...) under vLLM, SGLang and TensorRT-LLM; `EngineHandle.compile` walks a Hugging
Face config's ops at a tensor-parallel size and prices a forward from those tables.

What specbench asks of a forward (all in milliseconds, per step of the whole batch):
- `decode_ms(B, context)`: one token per row over `context` cached tokens (autoregressive step,
  a draft model's step);
- `verify_ms(B, context, positions)`: `positions` new tokens per row over `context` as prefix,
  priced as a context-phase forward (FlashAttention over a query of `positions`, as vLLM verifies),
  plus the LM head on every position (the context phase prices it on each row's last token only);
- `prefill_ms(B, prompt)`: the prompts' prefill.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "aiconfigurator-core"
PIN = "0.12"
INSTALL_HINT = ("the kernel tables are not installed: pip install 'specbench[gpu-tables]' "
                f"(NVIDIA's {PACKAGE}=={PIN}.*, 82 MB, works offline)")
BACKENDS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
# The short names a user types for the systems the tables hold (any system name works too).
DEVICE_SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "b300": "b300_sxm",
                  "a100": "a100_sxm", "gb200": "gb200", "gb300": "gb300", "l40s": "l40s"}


class TablesUnavailable(ValueError):
    """The extra is missing, or the tables lack what was asked (a device, a backend, a model)."""


def _quiet() -> None:
    """aiconfigurator logs each low-fidelity table it loads (MLA, sparse attention: kernels a dense
    Llama never calls) at WARNING; specbench prints its own labels instead."""
    for name in ("aiconfigurator_core", "aiconfigurator"):
        logging.getLogger(name).setLevel(logging.ERROR)


@functools.cache
def _core():
    try:
        import aiconfigurator_core
    except ImportError:
        raise TablesUnavailable(INSTALL_HINT) from None
    _quiet()
    return aiconfigurator_core


def version() -> str:
    from importlib.metadata import version as installed

    _core()
    return installed(PACKAGE)


def _systems_dir() -> Path:
    return Path(_core().__file__).parent / "systems"


def system_name(device: str) -> str:
    """`h100` -> `h100_sxm`; a system's own name passes through."""
    return DEVICE_SYSTEMS.get(device.lower(), device.lower())


@functools.cache
def backend_version(system: str, backend: str) -> str | None:
    """The tables' current version of `backend` on `system`, None where they hold none."""
    _core()
    from aiconfigurator_core.sdk import perf_database

    try:
        found = perf_database.resolve_query_version(system, backend, "current")
    except Exception:  # noqa: BLE001 - "no queryable versions defined": the tables lack it
        return None
    return str(found) if (_systems_dir() / "data" / system / "gemm" / backend / str(found)).is_dir() else None


@functools.cache
def systems(backend: str) -> list[str]:
    """Every system whose tables hold `backend`'s GEMMs."""
    names = sorted(p.stem for p in _systems_dir().glob("*.yaml") if (_systems_dir() / "data" / p.stem).is_dir())
    return [name for name in names if backend_version(name, backend)]


def check_device(device: str, backend: str) -> str:
    """The system for `device`, or one line naming what the tables hold (or how to install them)."""
    _core()
    if backend not in BACKENDS:
        raise TablesUnavailable(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    system = system_name(device)
    if backend_version(system, backend) is None:
        held = systems(backend)
        raise TablesUnavailable(f"the {PACKAGE} {version()} tables hold no {BACKENDS[backend]} measurements for "
                                f"{device!r}; they have: {', '.join(held)} (or short: "
                                f"{', '.join(k for k, v in DEVICE_SYSTEMS.items() if v in held)})")
    return system


def label(system: str, backend: str) -> str:
    """What every figure rests on: 'aiconfigurator-core 0.12.0 tables (h100_sxm, vLLM 0.24.0)'."""
    return f"{PACKAGE} {version()} tables ({system}, {BACKENDS[backend]} {backend_version(system, backend)})"


@dataclass(frozen=True)
class Device:
    """What planning needs of one GPU besides its kernels."""

    system: str
    memory_bytes: int  # HBM per GPU
    gpus_per_node: int
    reserved_bytes: dict[int, int]  # per TP size: NCCL buffers plus the tables' other runtime memory


@functools.cache
def device(system: str) -> Device:
    import yaml

    spec = yaml.safe_load((_systems_dir() / f"{system}.yaml").read_text())
    misc = spec.get("misc") or {}
    nccl = {int(k): int(v) for k, v in (misc.get("nccl_mem") or {}).items()}
    other = int(misc.get("other_mem") or 0)
    return Device(system, int(spec["gpu"]["mem_capacity"]), int((spec.get("node") or {}).get("num_gpus_per_node", 8)),
                  {tp: other + nccl.get(tp, max(nccl.values(), default=0)) for tp in (1, 2, 4, 8, 16, 32, 64)})


def tensor_flops(system: str, precision: str = "bf16") -> float:
    """The GPU's dense tensor-core peak (FLOP/s) at `precision` (bf16, fp8, fp4), as the tables'
    system file states it."""
    import yaml

    gpu = yaml.safe_load((_systems_dir() / f"{system}.yaml").read_text())["gpu"]
    key = {"bf16": "bfloat16_tc_flops", "fp16": "bfloat16_tc_flops", "fp8": "fp8_tc_flops",
           "fp4": "fp4_tc_flops", "nvfp4": "fp4_tc_flops"}.get(precision, "bfloat16_tc_flops")
    return float(gpu.get(key) or gpu["bfloat16_tc_flops"])


def shipped_model_config(name: str) -> dict | None:
    """A Hugging Face config the tables' package ships (its `model_configs`: `meta-llama/Meta-Llama-3.1-70B`
    and the like), None where it has none."""
    from specbench.models import shipped_hub_config

    found = shipped_hub_config(name)
    return found[1] if found else None


def silicon_rows_path() -> Path:
    """NVIDIA's measured serving results the package ships (TTFT and TPOT per model, GPU, TP,
    precision, concurrency and lengths): the fleet simulator's ground truth at GPU scale."""
    return _systems_dir() / "silicon_sample.csv"


# A GEMM's time in the tables is one timing per shape. Where one shape's time is over 1.5x both its
# neighbours' along m (one row fewer and one row more of the same weights), the timing caught the GPU
# in a slow mode: vLLM's fp8 table on B200 has such spikes scattered over its m up to 256, at 2-8 % of
# its shapes at each (Llama-3.1-70B's TP4 qkv GEMM: 13 us at 3 and 5 rows, 32 us at 4), which priced
# a decode step of 4 rows above one of 8; H100's and H200's bf16 and fp8 tables have them at 0.0-0.1 %
# of their shapes. A spike takes the dearer of its two neighbours' times. What a kernel does at an m
# is left as measured:
# - an m where over a tenth of a table's shapes spike (vLLM's block-scaled fp8 on GB200/GB300 at m =
#   16j + 1, 12-28 % of shapes; H200's fp8 at m = 257): a dispatch choice at that m, not chance;
# - a time that rises and stays up (a kernel changing with m), and a table's first and last m
#   (B200's fp8 at m = 1 is about twice m = 2 over its shapes: a kernel of its own).
SPIKE_RATIO = 1.5
SYSTEMATIC_SHARE = 0.10


def despiked_gemm(table):
    """`table` (a gemm_perf table: gemm_dtype, m, n, k, latency) with every isolated spike along m
    replaced by the dearer of its two neighbours' times (SPIKE_RATIO and SYSTEMATIC_SHARE say which
    are spikes)."""
    import numpy as np
    import pandas as pd

    fixed = []
    for dtype, rows in table.groupby("gemm_dtype", sort=False):
        grid = rows.pivot(index="m", columns=["n", "k"], values="latency").sort_index()
        times = grid.to_numpy()
        edge = np.full((1, times.shape[1]), np.nan)
        fewer, more = np.vstack([edge, times[:-1]]), np.vstack([times[1:], edge])
        spike = (times > SPIKE_RATIO * fewer) & (times > SPIKE_RATIO * more)  # NaN (an edge, a gap): never
        spike[spike.mean(axis=1) > SYSTEMATIC_SHARE] = False
        cleaned = pd.DataFrame(np.where(spike, np.fmax(fewer, more), times), index=grid.index, columns=grid.columns)
        fixed.append(cleaned.stack(["n", "k"], future_stack=True).rename("despiked").reset_index()
                     .assign(gemm_dtype=dtype))
    merged = table.merge(pd.concat(fixed), on=["gemm_dtype", "m", "n", "k"], how="left")
    return merged.assign(latency=merged["despiked"].fillna(merged["latency"])).drop(columns="despiked")


def _mirror(source: Path, root: Path) -> None:
    """`root`: `source`'s tree of directories with a symlink for each file, built aside and renamed
    into place (another process building the same mirror at once is harmless)."""
    if root.is_dir():
        return
    building = Path(tempfile.mkdtemp(prefix=root.name + "-", dir=root.parent))
    for folder, _, files in os.walk(source):
        mirrored = building / Path(folder).relative_to(source)
        mirrored.mkdir(parents=True, exist_ok=True)
        for name in files:
            (mirrored / name).symlink_to(Path(folder) / name)
    try:
        building.rename(root)
    except OSError:  # built by another process meanwhile
        import shutil

        shutil.rmtree(building, ignore_errors=True)


@functools.cache
def despiked_systems(system: str, backend: str) -> str:
    """A systems directory for aiconfigurator's engine: the package's own, but `system`'s GEMM table
    for `backend` despiked (`despiked_gemm`); kept beside the model configs, one per installed
    package."""
    import pandas as pd

    home = Path(tempfile.gettempdir()) / f"specbench-tables-{os.getuid()}"
    home.mkdir(parents=True, exist_ok=True)
    source = hashlib.sha1(str(_systems_dir().resolve()).encode()).hexdigest()[:8]  # its links point there
    root = home / f"systems-{version()}-{source}-spikes-{SPIKE_RATIO}-{SYSTEMATIC_SHARE}"
    _mirror(_systems_dir(), root)
    table = root / "data" / system / "gemm" / backend / str(backend_version(system, backend)) / "gemm_perf.parquet"
    if table.is_symlink():
        aside = table.with_name(f".{table.name}.{os.getpid()}")
        despiked_gemm(pd.read_parquet(table)).to_parquet(aside, index=False)
        os.replace(aside, table)
    return str(root)


def _config_dir(config: dict) -> str:
    """A directory holding `config` as config.json (aiconfigurator reads a model path), one per
    distinct config, kept for the process."""
    text = json.dumps(config, sort_keys=True)
    folder = Path(tempfile.gettempdir()) / f"specbench-tables-{os.getuid()}" / hashlib.sha1(text.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "config.json").exists():
        (folder / "config.json").write_text(text)
    return str(folder)


# aiconfigurator's "data missing" errors print the key it looked up as a Rust struct: what each
# names, in a user's words.
_MISSING = (
    (r"generation attention data missing for \w+ \{(?P<fields>[^}]*)\}", "no decode-attention timings for {what}"),
    (r"context attention data missing for \w+ \{(?P<fields>[^}]*)\}", "no prefill-attention timings for {what}"),
    (r"GEMM perf data missing for quant '(?P<quant>[^']+)'", "no GEMM timings at {quant}"),
    (r"(?:NCCL|custom_allreduce) data missing", "no all-reduce timings for this TP size"),
    (r"OneCCL data not configured", "no collective timings at this many GPUs"),
    (r"Parallelism width mismatch", "its parallel sizes do not multiply to the same number of GPUs"),
    (r"moe_intermediate_size=(?P<width>\d+) / moe_tp_size=(?P<split>\d+)\) % weight_block_size=(?P<block>\d+)",
     "its experts' {width}-wide MLP split {split} ways breaks the checkpoint's {block}-wide quantisation blocks"),
)


def what_is_missing(message: str) -> str:
    """aiconfigurator's error in one line a user can act on: the kernel, head size and precision
    its tables lack, never its lookup key's dump."""
    first = message.splitlines()[0].split(": tried lane_order")[0] if message else "an unknown error"
    for pattern, text in _MISSING:
        found = re.search(pattern, first)
        if found is None:
            continue
        fields = dict(re.findall(r'(\w+): "?([\w.]+)"?', found.groupdict().get("fields") or ""))
        parts = [f"{fields['head_size']}-wide heads" if "head_size" in fields else "",
                 f"the KV cache in {fields['kv_quant']}" if "kv_quant" in fields else "",
                 f"a {fields['window_size']}-token sliding window" if fields.get("window_size", "0") != "0" else ""]
        return text.format(what=" with ".join(p for p in parts if p) or "this shape", **found.groupdict())
    return re.sub(r"\w+Key \{[^}]*\}", "its shape", first.replace("perf database error: ", ""))


def moe_sizes(tp: int, dp: int, expert_parallel: bool) -> dict:
    """aiconfigurator's parallel sizes of a mixture-of-experts replica as vLLM lays it out: attention
    split over `tp` GPUs in each of `dp` data-parallel ranks, and the routed experts over all
    tp × dp GPUs, whole experts per GPU with `expert_parallel` (vLLM's --enable-expert-parallel),
    else each expert split across them."""
    gpus = tp * dp
    return {"attention_dp_size": dp, "moe_tp_size": 1 if expert_parallel else gpus,
            "moe_ep_size": gpus if expert_parallel else 1}


@functools.cache
def _model_quants(config_dir: str, backend: str) -> dict[str, str]:
    from aiconfigurator_core.sdk.engine import build_model_config
    from aiconfigurator_core.sdk.models import get_model

    model_config = build_model_config(tp_size=1, pp_size=1, attention_dp_size=1, moe_tp_size=1, moe_ep_size=1,
                                      gemm_quant_mode=None, kvcache_quant_mode=None, fmha_quant_mode=None,
                                      moe_quant_mode=None, comm_quant_mode=None, forward_model=None,
                                      attention_backend=None)
    resolved = get_model(config_dir, model_config, backend).config
    return {"gemm": resolved.gemm_quant_mode.name, "moe": resolved.moe_quant_mode.name,
            "kv": resolved.kvcache_quant_mode.name}


def model_quants(config: dict, backend: str = "vllm") -> dict[str, str]:
    """The precisions the tables price a checkpoint's weights and KV cache at, read from its config's
    quantization_config as aiconfigurator reads it: {"gemm": …, "moe": …, "kv": …} by the tables'
    names (bfloat16, fp8_block, w4a16_mxfp4, int4_wo, …)."""
    _core()
    try:
        return dict(_model_quants(_config_dir(config), backend))
    except Exception as error:  # noqa: BLE001 - an architecture its model builders do not know
        raise TablesUnavailable(f"the tables cannot read this model's precision: {what_is_missing(str(error))}") \
            from None


class Forward:
    """One model at one parallel layout on one system's tables: forward times in ms. A dense model
    runs at `tp`; a mixture-of-experts one at `tp` within each of `dp` data-parallel attention ranks,
    its experts over all tp × dp GPUs (`moe_sizes`), and every batch size given to it is one rank's
    (its experts' GEMMs see the tokens of all `dp` ranks)."""

    def __init__(self, config: dict, system: str, backend: str, tp: int, nextn: int = 0, name: str = "the model",
                 gemm_quant: str | None = None, kv_quant: str | None = None, dp: int = 1,
                 expert_parallel: bool = False):
        _core()
        from aiconfigurator_core.sdk.engine import EngineHandle
        from specbench.models import routed_experts

        self.tp, self.nextn, self.name, self.dp = tp, nextn, name, dp
        text = config.get("text_config") or config
        self.layers = int(text.get("num_hidden_layers", 0))  # what a step's kernel launches scale with
        self.hidden_size = int(text.get("hidden_size", 0))
        self._where = f"{system} {BACKENDS.get(backend, backend)} {backend_version(system, backend)}"
        quant = {"gemm_quant_mode": gemm_quant} if gemm_quant else {}
        if kv_quant:  # the KV cache's precision (vLLM's --kv-cache-dtype fp8): what decode attention reads
            quant["kvcache_quant_mode"] = kv_quant
        parallel = {}
        if routed_experts(config) is not None:
            parallel = moe_sizes(tp, dp, expert_parallel)
            if gemm_quant:  # --dtype sets the experts' precision as well as the other GEMMs'
                quant["moe_quant_mode"] = gemm_quant
        elif dp != 1 or expert_parallel:
            raise ValueError(f"{name} has no routed experts: data-parallel attention and expert parallelism "
                             f"apply to a mixture-of-experts model")
        self.layout = f"TP{tp}" + (f" × DP{dp}" if dp > 1 else "") + (" with EP" if expert_parallel else "")
        tables = despiked_systems(system, backend)
        try:
            self._engine = EngineHandle.compile(_config_dir(config), system, backend, tp_size=tp, nextn=nextn,
                                                systems_path=tables, **parallel, **quant)
        except Exception as error:  # noqa: BLE001 - its errors name the config field it could not use
            raise self._unavailable(error) from None
        self._logits_cache: dict[int, float] = {}
        self._gemm_cache: dict[tuple[int, int, int], float] = {}

    def _unavailable(self, error: Exception) -> TablesUnavailable:
        """A kernel the tables did not measure (a head size, a quantisation): one line naming it."""
        flops = re.search(r"missing system flops: quant mode '([^']+)' needs '([^']+)'", str(error))
        if flops:  # an fp8 or fp4 GEMM on a GPU without such tensor cores (fp8 on an A100)
            return TablesUnavailable(f"the {self._where} tables cannot price {self.name} at {self.layout}: "
                                     f"{self._where.split()[0]} has no {flops.group(1)} tensor cores (its system "
                                     f"file gives no {flops.group(2)}; vLLM runs such weights there as weight-only "
                                     f"Marlin GEMMs, which the tables did not time): plan it at bf16")
        return TablesUnavailable(f"the {self._where} tables cannot price {self.name} at {self.layout}: "
                                 f"{(missing := what_is_missing(str(error)))}; {self._instead(missing)}")

    def _instead(self, missing: str) -> str:
        """What to try: another TP size where the all-reduce is missing, else another GPU's tables."""
        if "all-reduce" in missing or "collective timings" in missing:
            return "try another --tp"
        if "quantisation blocks" in missing:
            return "try --ep (whole experts on each GPU) or a smaller --tp"
        system = self._where.split()[0]
        others = [name for name, key in DEVICE_SYSTEMS.items() if key != system and name in ("h100", "h200", "b200")]
        return f"try another GPU's tables (--device {' or '.join(others)})"

    def _ms(self, call, *args) -> float:
        try:
            return float(call(*args))
        except Exception as error:  # noqa: BLE001 - PerfDataNotAvailableError and its kin
            raise self._unavailable(error) from None

    def decode_ms(self, batch_size: int, context: int) -> float:
        """One decode step of `batch_size` rows at `context` cached tokens (MTP: the step with its
        `nextn` layers and the verify of nextn + 1 tokens per row, as aiconfigurator prices it)."""
        return self._ms(self._engine.predict_decode_latency, batch_size, max(context, 1), 2)

    def prefill_ms(self, batch_size: int, prompt: int) -> float:
        return self._ms(self._engine.predict_prefill_latency, batch_size, max(prompt, 1), 0)

    def over_context_ms(self, tokens: int, context: int) -> float:
        """What a prompt chunk of `tokens` adds to its prefill by attending over `context` tokens
        before it (computed by an earlier chunk, or found in the prefix cache): the tables' prefill
        of the chunk after that many cached tokens less the same chunk as a fresh prompt (their
        GEMMs, on the chunk's tokens alike, cancel)."""
        if tokens <= 0 or context <= 0:
            return 0.0
        after = self._ms(self._engine.predict_prefill_latency, 1, tokens + context, context)
        return max(0.0, after - self.prefill_ms(1, tokens))

    def _logits_ms(self, tokens: int) -> float:
        """The LM head over `tokens` rows (the decode phase's logits GEMM is priced per row)."""
        if tokens not in self._logits_cache:
            try:
                ops = self._engine.decode_step_per_op(tokens, 1024, 2)
            except Exception as error:  # noqa: BLE001
                raise self._unavailable(error) from None
            self._logits_cache[tokens] = sum(float(op[1]) for op in ops if op[0] == "generation_logits_gemm")
        return self._logits_cache[tokens]

    def gemm_ms(self, tokens: int, n: int, k: int) -> float:
        """One 16-bit GEMM of `tokens` rows through an n × k weight held whole on each GPU (not split
        over TP), on the tables' GEMM timings: an op the model's own forward does not run (EAGLE-3's
        fusing of the target's features)."""
        key = (tokens, n, k)
        if key not in self._gemm_cache:
            from aiconfigurator_core.sdk import common, operations
            from aiconfigurator_core.sdk.engine import build_ops_json

            ops_json = build_ops_json([operations.GEMM("gemm", 1, n, k, common.GEMMQuantMode.bfloat16)])
            try:
                values = self._engine.evaluate_ops_json(ops_json, is_context=True, batch_size=max(tokens, 1), s=1)
            except Exception as error:  # noqa: BLE001
                raise self._unavailable(error) from None
            self._gemm_cache[key] = sum(float(value[1]) for value in values)
        return self._gemm_cache[key]

    def mixed_ms(self, prefill_tokens: int, decode_rows: int, isl: int, osl: int) -> float:
        """One continuous-batching step: `prefill_tokens` prompt tokens (chunks of requests of `isl`
        tokens) beside `decode_rows` decodes (requests of `isl` in, `osl` out, priced at their mean
        context), as aiconfigurator prices its aggregated serving's steps."""
        if prefill_tokens <= 0:
            return self._ms(self._engine.decode_step_latency, decode_rows, max(isl, 1), max(osl, 2))
        return self._ms(self._engine.mixed_step_latency, prefill_tokens, decode_rows, max(isl, 1), max(osl, 2))

    def extend_ms(self, batch_size: int, context: int, positions: int) -> float:
        """`positions` new tokens per row over `context` cached ones, with logits at one position a row."""
        return self._ms(self._engine.predict_prefill_latency, batch_size, context + positions, context)

    def extra_positions_ms(self, batch_size: int, context: int, positions: int) -> float:
        """What `positions` - 1 more positions a row add to a one-position forward, logits at one a row
        (both ends priced on the tables' prefill path: their decode path prices attention otherwise)."""
        if positions <= 1:
            return 0.0
        return max(0.0, self.extend_ms(batch_size, context, positions) - self.extend_ms(batch_size, context, 1))

    def verify_ms(self, batch_size: int, context: int, positions: int) -> float:
        """`positions` new tokens per row over `context` cached ones, with logits at every position."""
        step = self.extend_ms(batch_size, context, positions)
        return step + self._logits_ms(batch_size * positions) - self._logits_ms(batch_size)
