"""`plan RUN`: the roofline performance model fitted on a run (docs/reference/equations.md), predicting
speed-up, tokens/s, B* and cost at the K, batch sizes and context lengths it did not measure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.api.errors import UsageError
from specbench.api.inputs import check_alpha, check_grid, check_price

if TYPE_CHECKING:
    from specbench.results import Run


@dataclass
class Prediction:
    """Predictions, not measurements: `table` holds one row per draft, K, batch size, workload,
    temperature and context length (fit.plan_table's columns), with `speedup_measured` where the
    run measured that very cell."""
    table: Any  # a pandas DataFrame
    batch_sizes: list[int]
    step_times_from: Path  # the run whose step times were fitted
    alpha_from: str  # the run whose α, or "--alpha A"
    output_tokens: int
    output_tokens_given: bool  # False: the run's own --max-new-tokens
    price: float | None  # $ per GPU-hour; None: costs are in device-hours
    price_note: str
    estimate: str = ""  # the GPU the step times were carried to, when not the run's (an ESTIMATE)
    transferred: str = ""  # the α measured with another target than the step times'
    left_out: list[str] = field(default_factory=list)  # drafts not planned, and why
    trust: list[str] = field(default_factory=list)  # the model's held-out and in-sample errors
    warnings: list[str] = field(default_factory=list)  # the run's measurement warnings

    @property
    def answer(self) -> str:
        """The answer in one sentence: where each drafter stops paying, its best K at each batch size,
        over every workload, temperature and context length predicted."""
        from specbench.fit.decisions import speedup_cases, where_it_pays
        from specbench.schema import AR

        speculative = self.table[self.table["draft"] != AR]
        cases = speedup_cases(speculative, ["workload", "temperature", "context_length"], "batch_size", "speedup")
        label = f"ESTIMATE for {self.estimate}" if self.estimate else "PREDICTED from the run's fit"
        return f"{label}: {where_it_pays(cases) or 'no drafter predicted'}."

    def to_dict(self) -> dict:
        """As `plan RUN --json` prints it."""
        import json

        return {"answer": self.answer, "step_times_from": str(self.step_times_from), "alpha_from": self.alpha_from,
                "output_tokens": self.output_tokens, "estimate": self.estimate or None, "price": self.price_note,
                "acceptance_transferred": self.transferred or None, "drafts_left_out": self.left_out,
                "trust": self.trust, "warnings": self.warnings,
                "predictions": json.loads(self.table.to_json(orient="records"))}


def predict(run: Path | str | None = None, *, timings: Path | str | Run | None = None,
            acceptance: Path | str | None = None, alpha: float | None = None,
            ks: Sequence[int] = (1, 2, 3, 4, 6, 8), batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
            context_lengths: Sequence[int] = (), device: str | None = None, gpu_price: float | None = None,
            gpus: int = 1, max_new_tokens: int | None = None) -> Prediction:
    """`plan RUN`: the model fitted on the step times of `timings` (default: `run`, else the latest
    run under results/) with the α of `acceptance` (default: `run`; `alpha`: this i.i.d. α for every
    draft instead). `context_lengths`: prompt lengths in tokens to predict too; `device`: carry a GPU
    run's fitted efficiencies to this GPU's datasheet (h100, h200, a100, l40s: an ESTIMATE);
    `max_new_tokens`: output tokens per request (default: the run's). A CPU run is priced on a GPU's
    kernel tables instead, not here."""
    import pandas as pd

    from specbench import fit
    from specbench.fit.noise import run_noise
    from specbench.results import Run, load_run, recorded_config

    ks, sizes, contexts = list(ks), list(batch_sizes), list(context_lengths)
    check_grid(ks, sizes, contexts, max_new_tokens)
    check_price(gpu_price, gpus)
    check_alpha(alpha)
    timings = timings if isinstance(timings, Run) else load_run(timings or run)
    if device is not None and device.lower() not in fit.DEVICES:
        raise UsageError(f"--device must be one of {', '.join(fit.DEVICES)}, got {device!r}")
    recorded = recorded_config(timings.meta)["grid"]
    run_tokens = int(recorded.get("max_new_tokens", 1))
    output_tokens = max_new_tokens or run_tokens
    if contexts or max_new_tokens:  # as the sweep would refuse them: prompts of that length plus the run's output must fit
        from specbench.grid import GridOptions, SweepConfig, check_context_limit, target_shape

        asked = SweepConfig(grid=GridOptions(target=recorded.get("target", ""), ks=ks, context_lengths=contexts,
                                             max_new_tokens=output_tokens))
        check_context_limit(asked, target_shape(asked))
    accept_run = load_run(acceptance or run) if (acceptance or run) else timings
    models = fit.cost_models(timings.cells, timings.steps, timings.requests, timings.meta)
    engine = (timings.meta.get("engine") or {}).get("name", "native")
    if not models and engine != "native":
        raise UsageError(f"{timings.path}: a {'vLLM' if engine == 'vllm' else engine} run has no decode step "
                         f"times (a served engine is timed per request, not per step), and plan fits its model on "
                         f"them; measure the target on the native engine (`specbench sweep --target ...`) and "
                         f"plan from that run (its acceptance may still come from this one: --acceptance)")
    if not models:
        raise UsageError(f"{timings.path}: no finished autoregressive cells with step times to fit (or the "
                         f"target's shapes are unknown)")
    models = fit.with_output_tokens(models, output_tokens) if max_new_tokens else models
    alphas = fit.model_alphas(accept_run.cells, accept_run.steps)
    drafts = _plan_drafts(models, alphas, alpha)
    left_out = _drafts_left_out(models, alphas, alpha, drafts, timings.path, accept_run.path)
    if not drafts:
        raise UsageError("no draft has both step times and an α (give --acceptance RUN or --alpha)"
                         + (f": {'; '.join(left_out)}" if left_out else ""))
    transferred = _transferred(timings, accept_run) if alpha is None else ""
    if alpha is not None:
        alphas = pd.DataFrame([{"draft": d, "workload": w, "temperature": t, "context_length": c,
                                "alpha_iid": alpha} for d in drafts for (w, t, c) in models])
    note = ""
    if device is not None:
        models, note = _on_device(models, timings.meta, device.lower())
    price, price_note = (gpu_price, "given") if gpu_price is not None else \
        fit.default_gpu_price({"gpus": [{"name": fit.DEVICES[device.lower()]["name"]}]} if device else
                              timings.meta.get("hardware", {}))
    table = fit.plan_table(models, alphas, drafts, ks, sizes, price, gpus, contexts)
    comparable = alpha is None and accept_run.path == timings.path and device is None \
        and output_tokens == run_tokens  # the run measured what the model predicts at its cells
    table = fit.attach_measured(table, timings.cells) if comparable else table.assign(speedup_measured=float("nan"))
    trust = fit.trust_lines(timings, pd.DataFrame(), fit.held_out(timings.cells, timings.steps, timings.requests,
                                                              timings.meta))
    stopped = fit.completeness(timings.meta, timings.cells).describe()
    warnings = ([stopped] if stopped else []) + fit.measurement_warnings(
        timings.cells, noise=run_noise(timings.cells, timings.requests, timings.steps))
    simulated = alpha is None and not alphas.empty and "alpha_source" in alphas \
        and (alphas[alphas["draft"].isin(drafts)]["alpha_source"] == "simulated").any()
    alpha_source = f"--alpha {alpha:g}" if alpha is not None else \
        str(accept_run.path) + (" (the α it simulated: a timing-only run)" if simulated else "")
    return Prediction(table, sizes, timings.path, alpha_source, output_tokens, bool(max_new_tokens), price,
                      price_note, note, transferred, left_out, trust, warnings)


def _plan_drafts(models: dict, alphas, alpha: float | None) -> list[str]:
    """Drafts with step times in the timing run and an α (from the acceptance run, or --alpha)."""
    from specbench.fit import base_draft

    timed = {base_draft(d) for m in models.values() for d in list(m.times.drafts) + list(m.measured_ks)}
    if alpha is not None:
        return sorted({d for m in models.values() for d in m.measured_ks})
    known = set(alphas["draft"]) if not alphas.empty else set()
    return sorted(d for d in known if base_draft(d) in timed)


def _drafts_left_out(models: dict, alphas, alpha: float | None, planned: list[str], timings: Path,
                     acceptance: Path) -> list[str]:
    """Each draft one run has and the other lacks, and why it is not planned: never dropped silently."""
    from specbench.fit import base_draft

    timed = {base_draft(d) for m in models.values() for d in list(m.times.drafts) + list(m.measured_ks)}
    known = set(alphas["draft"]) if alpha is None and not alphas.empty else set()
    chosen = {base_draft(d) for d in planned}
    why = [f"{d}: an α in {acceptance} but no step times in {timings}" for d in sorted(known)
           if base_draft(d) not in timed]
    why += [f"{d}: step times in {timings} but no α in {acceptance} (give --alpha to plan it)"
            for d in sorted(timed - chosen - {base_draft(k) for k in known}) if alpha is None]
    return why


def _transferred(timings, acceptance) -> str:
    """The label of acceptance measured with another target than the step times' (or a timing-only
    run's simulated α on a real run's times): a transfer, never silent."""
    from specbench.results import recorded_config

    theirs = recorded_config(acceptance.meta)["grid"].get("target", "?")
    ours = recorded_config(timings.meta)["grid"].get("target", "?")
    if acceptance.path == timings.path or theirs == ours:
        return ""
    return (f"the α was measured with target {theirs} ({acceptance.path}) and is applied to {ours}'s step times "
            f"({timings.path}); a draft accepted by one target is not always accepted as often by another")


def _on_device(models: dict, meta: dict, device: str) -> tuple[dict, str]:
    """Every model's step times carried to `device`'s datasheet peaks (the efficiencies kept)."""
    import copy

    from specbench import fit

    gpus = (meta.get("hardware") or {}).get("gpus") or []
    measured = fit.device_key(gpus[0]["name"]) if gpus else None
    if measured is None:
        raise UsageError(f"--device needs a run on a known GPU ({', '.join(fit.DEVICES)}); this one ran on "
                         f"{gpus[0]['name'] if gpus else 'a CPU'}, whose efficiencies do not carry to a GPU")
    moved = {}
    for key, model in models.items():
        clone = copy.copy(model)
        clone.times = model.times.on_datasheet(measured, device)
        moved[key] = clone
    return moved, (f"{fit.DEVICES[device]['name']}: efficiencies fitted on {gpus[0]['name']} carried to its "
                   f"datasheet bandwidth and FLOP/s; overheads kept")


