"""The step model: a step's shape in, seconds out, and the served overheads composed in one place."""

import re
from pathlib import Path

import pytest

from specbench.drafter_kinds import drafter_kind
from specbench.fit.host_cost import COMPILED_LAUNCH, MULTIPROC_EXECUTOR_STEP, NGRAM_HOST_STEP, VLLM_HOST_STEP
from specbench.step_model import NO_OVERHEADS, Overheads, StepFunction, StepModel, StepShape, as_step_model

PACKAGE = Path(__file__).resolve().parent.parent / "specbench"


def test_only_the_step_model_composes_a_steps_overheads():
    """The CUDA-graph rule and the host's time beside the kernels are applied in `Overheads` alone:
    the static planner and the replica's tables step both go through it."""
    composing = re.compile(r"\b(graph_bound_ms|served_step_ms)\(")
    callers = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                     if any(composing.search(line) and not line.lstrip().startswith("def ")
                            for line in path.read_text().splitlines()))
    assert callers == ["step_model/overheads.py"]


def test_nothing_reads_a_price_from_attributes_set_on_a_function():
    """What a step model needs is its own attribute (`reads_context`), not one set on a function."""
    found = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
             if re.search(r"uses_context|uses_prefill_chunks|pair_keys_limit|getattr\(cost", path.read_text())]
    assert found == []


def test_a_shape_counts_its_chunks_pairs_and_holds_them_past_a_limit():
    shape = StepShape(300, 4, 2, prefill_chunks=((100, 0), (200, 50)))
    assert shape.prefill_pairs() == 100 * 50 + 200 * (50 + 100)
    assert shape.held_pairs(10_000) == shape.prefill_pairs()
    # each query's keys capped at 64: the first 64 queries of the first chunk as before, every later one 64 keys
    assert shape.held_pairs(64) == (64 * 64 / 2 + 36 * 64) + (14 * (50 + 64) / 2 + 186 * 64)
    assert StepShape(64, 0, prefill_chunks=((1000, 0),)).held_pairs(64) == pytest.approx(64 * 32 + 936 * 64)


def test_a_plain_function_is_a_step_model_told_k_only_when_speculating():
    calls = []
    model = as_step_model(lambda *args: calls.append(args) or 0.25)
    assert isinstance(model, StepFunction) and not model.reads_context
    assert model.seconds(StepShape(10, 2)) == 0.25 and model.seconds(StepShape(0, 2, 3)) == 0.25
    assert calls == [(10, 2), (0, 2, 3)]
    assert as_step_model(model) is model and isinstance(model, StepModel)


def test_overheads_compose_the_host_the_executor_and_a_host_drafters_work():
    overheads = Overheads()
    ngram, model = drafter_kind("ngram"), drafter_kind("model")
    host = VLLM_HOST_STEP.ms(8, 1, 512)
    assert overheads.host_ms(8, 1, 512, 1, model) == host
    assert overheads.host_ms(8, 1, 512, 4, model) == host + MULTIPROC_EXECUTOR_STEP.ms(8, 1, 512)
    assert overheads.host_ms(8, 0, 0, 1, ngram, 8, 1000.0) == VLLM_HOST_STEP.ms(8) + NGRAM_HOST_STEP.ms(8, 1000.0)
    assert overheads.host_ms(8, 0, 0, 1, model, 8, 1000.0) == VLLM_HOST_STEP.ms(8)  # a draft model drafts on the GPU
    # beside the kernels with async scheduling; after them for a host-drafting kind, which vLLM runs synchronously
    assert overheads.step_ms(5.0, 8, 0, 32, 0.0, 1.0, model) == 5.0
    assert overheads.step_ms(5.0, 8, 0, 32, 0.0, 1.0, ngram) == 6.0
    assert Overheads(async_scheduling=False).step_ms(5.0, 8, 0, 32, 0.0, 1.0, model) == 6.0
    # outside CUDA graphs (past 512 tokens) a step lasts at least its kernels' launch
    launch = overheads.launch_ms([(80, 4), (16, 1)])
    assert launch == COMPILED_LAUNCH.ms(80, 4) + COMPILED_LAUNCH.ms(16, 1)
    assert overheads.step_ms(1.0, 1024, 1024, 96, launch, None, None) == launch
    assert NO_OVERHEADS.step_ms(1.0, 1024, 1024, 96, NO_OVERHEADS.launch_ms([(80, 4)]), None, None) == 1.0
    with pytest.raises(ValueError):
        Overheads(cudagraph_mode="sometimes")


def test_the_static_planner_adds_no_overheads_to_a_runs_corrected_kernels():
    from specbench.fit.table_plan import TablePlanner, model_config

    name, config = model_config("llama3-8b")
    bare = TablePlanner(config, name, "h100_sxm", "vllm")
    corrected = TablePlanner(config, name, "h100_sxm", "vllm", corrections={"decode": lambda b: 1.0})
    assert bare.overheads == Overheads() and corrected.overheads is NO_OVERHEADS


def test_the_static_planner_prices_its_steps_through_the_contract():
    """plan --target's steps go through StaticTablesStep: a decode, a speculative step and a batch's
    prefill each as its shape's seconds, and a shape a static batch never runs is refused."""
    pytest.importorskip("aiconfigurator_core")
    from specbench.fit.table_plan import TablePlanner, model_config, parse_drafters
    from specbench.step_model import StaticTablesStep

    name, config = model_config("llama3-8b")
    planner = TablePlanner(config, name, "h100_sxm", "vllm")
    drafter = parse_drafters(["1b"], name, config, "llama3")[0]
    plain, speculative = StaticTablesStep(planner, 1), StaticTablesStep(planner, 1, drafter, 1)
    assert isinstance(speculative, StepModel)
    assert plain.seconds(plain.decoding(16, 1088)) * 1000 == plain.decode_ms(16, 1088)
    assert speculative.seconds(speculative.decoding(16, 1088, k=3)) * 1000 == speculative.step_ms(3, 16, 1088)
    assert speculative.seconds(speculative.prefilling(16, 1024)) * 1000 == speculative.prefill_ms(16, 1024)
    # a decode is the target's on the tables with the served overheads, whatever the drafter
    kernels = planner.forward(planner.target, 1).decode_ms(16, 1088)
    assert plain.decode_ms(16, 1088) == speculative.decode_ms(16, 1088) >= kernels
    with pytest.raises(ValueError, match="decodes or prefills"):
        plain.seconds(StepShape(prefill_tokens=512, decode_rows=4, prefill_chunks=((512, 0),), decode_context=4096.0))
    with pytest.raises(ValueError, match="one fresh prompt length"):
        plain.seconds(StepShape(prefill_tokens=300, prefill_chunks=((100, 0), (200, 0))))


def test_a_native_runs_fit_prices_its_steps_through_the_contract():
    """NativeFitStep on a run's StepTimes: a decode is the target's forward over one position a row,
    a speculative step the drafter's K proposals and the verify of K + 1, a prefill the batch's
    forwards (the target's, then a draft model's); a search drafter proposes in its fitted time."""
    import numpy as np

    from specbench.fit.prefill_times import prefill_forwards
    from specbench.fit.roofline import ForwardTimeModel
    from specbench.fit.step_times import SearchTime, StepTimes, search_features
    from specbench.shapes import Architecture
    from specbench.step_model import NativeFitStep
    from specbench.synthetic import shipped_config

    def forward(config: str, overhead_s: float) -> ForwardTimeModel:
        return ForwardTimeModel(Architecture.from_config(shipped_config(config)[1], "bfloat16"), overhead_s, 20e-6,
                                0.0, 0.0, 1 / 2.5e12, 240.0, 1 / 2.0e12, 0.0)

    target, draft = forward("llama3-8b", 3e-3), forward("llama3.2-1b", 1e-3)
    search = SearchTime(("fixed", "rows", "row_context", "drafted"), (1e-4, 1e-6, 1e-9, 2e-6))
    times = StepTimes(target, {"1b": draft, "ngram": search}, target, {"1b": draft})
    assert isinstance(NativeFitStep(times), StepModel)
    decode = NativeFitStep.decoding(8, 600)
    assert NativeFitStep(times).seconds(decode) == pytest.approx(float(target.seconds(8, 1, 600)), rel=1e-12)
    step = NativeFitStep(times, "1b")
    assert step.seconds(NativeFitStep.decoding(8, 600, 3)) == pytest.approx(
        3 * float(draft.seconds(8, 1, 600)) + float(target.seconds(8, 4, 600)), rel=1e-12)
    ngram = NativeFitStep(times, "ngram").proposing_s(NativeFitStep.decoding(8, 600, 3))
    assert ngram == pytest.approx(float(search.seconds(search_features(8, 600, 3))), rel=1e-12)
    lengths = [300, 500, 500, 700]
    batch = sum(float(m.seconds(r, p, 0)) for m in (target, draft) for r, p in prefill_forwards(lengths))
    assert step.seconds(NativeFitStep.prefilling(lengths)) == pytest.approx(batch, rel=1e-12)
    assert np.isnan(NativeFitStep(times, "8b").seconds(NativeFitStep.decoding(1, 100, 2)))  # a draft the run lacks


def test_the_fitted_forwards_share_one_interface_without_type_checks():
    """A run's fitted forwards (roofline, corrected tables, a search's time) are asked the same
    questions: nothing in the native fit tests a model's type or attributes to decide how."""
    fit = PACKAGE / "fit"
    found = [f"{path.name}: {line.strip()}" for path in (fit / "step_times.py", fit / "cost.py")
             for line in path.read_text().splitlines()
             if re.search(r"isinstance\(model|hasattr\(model", line)]
    assert found == []
