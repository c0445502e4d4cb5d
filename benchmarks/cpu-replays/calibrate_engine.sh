#!/usr/bin/env bash
# A closed-loop calibration at the batches the 2026-11-25 one lacked (B 8 and 16 beside 1; that
# one had B <= 4, and under load ngram K=2 was slower than the baseline on this CPU where the
# fit predicted faster): the vLLM engine's own servers (compute on core 0, as vLLM binds one
# alone), the baseline and ngram K=2, 512 and 2k-token prompts, 16 each, 64 tokens out. No trace.
# (~32 min; cpu_replays.py fits it together with benchmarks/cpu-replays/first-sitting/calibration-4k.)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=benchmarks/cpu-replays
[ -e "$out/calibration/run.json" ] || specbench sweep --engine vllm --drafts ngram --k 2 --enforce-eager \
    --workloads chat --max-new-tokens 64 --temperatures 0 --dtype fp32 --batch-sizes 1,8,16 \
    --context-lengths 512,2k --num-prompts 16 --output "$out/calibration"
