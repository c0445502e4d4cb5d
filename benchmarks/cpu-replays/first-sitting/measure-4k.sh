#!/usr/bin/env bash
# More calibration, after the first fit under-priced the 4k-token prompts the replays hold (the
# calibration reached 2k): the same closed-loop sweep at 4k tokens, B 1 and 2. Fitted together
# with cpu/calibration; still no trace in it.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=benchmarks/cpu-replays/first-sitting
[ -e "$out/calibration-4k/run.json" ] || specbench sweep --engine vllm --drafts ngram,smollm2-135m --k 2 \
    --temperatures 0 --dtype fp32 --enforce-eager --workloads chat --batch-sizes 1,2 --context-lengths 4k \
    --max-new-tokens 64 --num-prompts 2 --output "$out/calibration-4k"
