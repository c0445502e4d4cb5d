"""From a sweep's tables to a model of it, by concern:

- `cells`: which cells an analysis reads (finished, real or synthetic, closed or open loop).
- `acceptance`: α (i.i.d. MLE with a Wilson interval: a step that drafted k and kept a is a run of
  a successes and, when a < k, one failure), τ(α, K) = (1 - α^(K+1)) / (1 - α), the α table.
- `roofline`: the time of one forward from the model's shapes, max(bytes / bandwidth,
  flops / flop rate) plus attention and overheads, coefficients fitted on the run's own forwards.
- `step_times`, `prefill_times`: a native run's forwards and prefills as fitted times (the roofline on
  the run's own shapes and hardware).
- `cost`: speed-up predictions for one traffic group from those step times and α (native and served).
- `cell_predictions`: the run's own cells predicted; `validation`: the largest batch sizes predicted
  from the smaller ones, and what to know before trusting a prediction.
- `what_if`: the table of `plan RUN`, at sizes, K, drafts and lengths the run did not measure.
- `decisions`: best K per batch size, B* (where the best speed-up falls below the bar,
  interpolated in log2 B), the best draft, K schedules and vLLM's config for one.
- `trust`: drift, a busy machine (less specbench's own processes), repeat ranges, how fast the baseline is.
- `physics`: what acceptance allows: a speed-up's bound from its counted tokens per target forward.
- `noise`: each speed-up's interval by how its repeats paired (turns, side by side, bracketed), and
  the run's noise band for a single comparison.
- `slo`: goodput and capacity under an SLO.
- `prices`: $ per 1M output tokens = price per hour x devices / (tokens/s x 3600) x 1e6.
"""

from specbench.fit.acceptance import (  # noqa: F401
    Z95, AlphaFit, acceptance_counts, alpha_table, expected_max_normal, expected_tau, fit_alpha, leviathan_speedup,
    tokens_per_step_moments, wilson_interval,
)
from specbench.fit.cell_predictions import model_alphas, predictions  # noqa: F401
from specbench.fit.cells import (  # noqa: F401
    AR, TRAFFIC, base_draft, closed_loop, label_cells, label_context, label_synthetic, ok_closed_loop, ok_real, open_loop,
    with_context,
)
from specbench.fit.cost import CostModel, ServedCostModel, cost_models  # noqa: F401
from specbench.fit.decisions import (  # noqa: F401
    WORST_CASE, Crossover, b_star_rule, best_draft_rule, best_k_by_batch, crossover, crossover_table, k_schedule,
    pick_best_draft, schedule_ranges, speedup_headline, vllm_speculative_config, worst_case_by_batch,
)
from specbench.fit.evidence import (  # noqa: F401
    CONFIDENCE, Completeness, combine_all, combine_any, completeness, judge, percentile_interval, repeats_to_decide, requests_to_bound,
    speedup_interval,
)
from specbench.fit.prices import GPU_PRICES_PER_HOUR, cost_per_million, default_gpu_price  # noqa: F401
from specbench.fit.roofline import (  # noqa: F401
    DEVICES, Architecture, ForwardProfile, ForwardTimeModel, device_key, fit_forward_time, peak_flops,
)
from specbench.fit.slo import (  # noqa: F401
    SLO_METRICS, SLO_PERCENTILES, Slo, capacity_ratio, capacity_text, load_column, load_label, parse_slo,
    slo_capacity, slo_table,
)
from specbench.fit.step_times import (  # noqa: F401
    StepTimes, architectures, device_priors, fit_step_times, forward_table, step_time_notes,
)
from specbench.fit.trust import (  # noqa: F401
    BASELINE_KEYS, DRIFT_ADVICE, SLOW_BASELINE, baseline_drift, baseline_note, baseline_speed, busy_machine,
    drifted_groups, drifted_keys, marked_cells, repeat_range, slow_baseline_warning,
)
from specbench.fit.validation import (  # noqa: F401
    MIN_BATCH_SIZES_FOR_HOLDOUT, held_out, held_out_context, held_out_summary, trust_lines,
)
from specbench.fit.warnings import measurement_warnings  # noqa: F401
from specbench.fit.what_if import attach_measured, plan_table, with_output_tokens  # noqa: F401
