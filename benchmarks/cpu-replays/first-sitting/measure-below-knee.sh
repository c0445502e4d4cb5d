#!/usr/bin/env bash
# Issue 40, part 3: replays below the one-core server's knee (the first three are all past it), and
# a probe of this machine's speed against the calibration's (its B 1, 512-token baseline cell again).
# The loads were chosen with the simulator on the calibration's fit (a request's TTFT near a lone
# request's): azure-conv 2400-2520 s at 0.01x and azure-code 1200-1260 s at 0.002x, their first
# 8 and 6 requests. Same servers and settings as measure.sh. About 30 minutes on a quiet 2-core VM.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=benchmarks/cpu-replays/first-sitting
common=(--engine vllm --drafts ngram,smollm2-135m --k 2 --temperatures 0 --dtype fp32 --enforce-eager)
[ -e "$out/probe-2026-11-26/run.json" ] || specbench sweep --engine vllm --drafts ngram --k 2 --temperatures 0 \
    --dtype fp32 --enforce-eager --workloads chat --batch-sizes 1 --context-lengths 512 --max-new-tokens 64 \
    --num-prompts 4 --output "$out/probe-2026-11-26"
replay() {  # name, then the trace options
    local name=$1; shift
    [ -e "$out/replays-below-knee/$name/run.json" ] || specbench sweep "${common[@]}" "$@" \
        --output "$out/replays-below-knee/$name"
}
replay conv-2400-0.01 --trace azure-conv --trace-window 2400:120 --trace-speedup 0.01 --trace-max-requests 8
replay code-1200-0.002 --trace azure-code --trace-window 1200:60 --trace-speedup 0.002 --trace-max-requests 6
