"""The drafter kinds: one class each in specbench/drafter_kinds.py, asked instead of compared."""

import re
from pathlib import Path

import pytest

from specbench.drafter_kinds import KINDS, BYTES_PER_VALUE, drafter_kind
from specbench.step_model import StaticTablesStep, StepShape


def at(model, prefill_tokens: int, decode_rows: int, k: int = 0) -> float:
    return model.seconds(StepShape(prefill_tokens, decode_rows, k))


PACKAGE = Path(__file__).resolve().parent.parent / "specbench"


def test_no_module_but_the_kinds_compares_a_drafter_kind_by_name():
    """A drafter's kind is asked (`drafter_kind(spec.kind).separate_model`), never compared with a
    kind's name outside drafter_kinds.py: a new kind is one class and one line in KINDS."""
    names = "|".join(re.escape(name) for name in KINDS)
    compared = re.compile(rf"""kind\s*(==|!=)\s*["']({names})["']|kind\s+(not\s+)?in\s+[(\[{{][^)\]}}]*["']({names})["']""")
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.name != "drafter_kinds.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if compared.search(line)]
    assert not found, "\n".join(found)


def test_every_kind_a_draft_spec_names_is_registered():
    from specbench.models import parse_draft_spec

    for text in ("ngram", "ngram:2", "self:4", "1b", "1b@bf16", "eagle:some/head", "eagle3:some/head", "mtp",
                 'json:{"method": "ngram"}'):
        assert drafter_kind(parse_draft_spec(text, allow_served=True).kind).name in KINDS
    with pytest.raises(ValueError, match="no drafter kind"):
        drafter_kind("medusa")


def test_vllm_configs_are_written_by_the_kinds():
    from specbench.grid import speculative_config
    from specbench.models import parse_draft_spec

    def config(text, k=3):
        return speculative_config(parse_draft_spec(text, allow_served=True), k)

    assert config("eagle3:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") == {
        "method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}
    assert config("ngram:2")["prompt_lookup_max"] == 2
    assert config("mtp") == {"method": "mtp", "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="does not run on vLLM"):
        config("self:2")


@pytest.fixture(scope="module")
def heads():
    from specbench.cli.plan_tables import target_and_drafters
    from specbench.fit.table_plan import TablePlanner

    _, name, config, drafters = target_and_drafters("llama3-70b", "eagle,eagle3")
    planner = TablePlanner(config, name, "h100_sxm", "vllm", host=None, launch=None, speculation_host=None,
                           executor=None)
    return planner, dict((d.kind, d) for d in drafters)


def test_an_eagle3_step_costs_an_eagle_step_and_the_gemm_fusing_three_layers(heads):
    """EAGLE-3 is priced as the EAGLE head (one target-width layer) plus its `fc`, a 3·hidden →
    hidden GEMM over every position of the first draft forward (K + 1 a row)."""
    planner, drafters = heads
    eagle, eagle3 = drafters["eagle"], drafters["eagle3"]
    hidden = planner.target["hidden_size"]
    for batch, k in ((1, 3), (64, 4)):
        fused = planner.draft_forward(eagle3, 4).gemm_ms(batch * (k + 1), hidden, 3 * hidden)
        assert fused > 0
        assert StaticTablesStep(planner, 4, eagle3, 4).step_ms(k, batch, 2048) \
            - StaticTablesStep(planner, 4, eagle, 4).step_ms(k, batch, 2048) == pytest.approx(fused, rel=1e-9)
    # its prefill is the target's alone, as an EAGLE head's
    assert StaticTablesStep(planner, 4, eagle3, 4).prefill_ms(8, 1024) == \
        StaticTablesStep(planner, 4, eagle, 4).prefill_ms(8, 1024)


def test_eagle3_memory_holds_the_fusing_weights_whole_on_each_gpu(heads):
    planner, drafters = heads
    hidden = planner.target["hidden_size"]
    for tp in (4, 8):
        eagle, eagle3 = (planner.memory(drafters[kind], tp, tp, 2048) for kind in ("eagle", "eagle3"))
        assert eagle3.weights - eagle.weights == pytest.approx(3 * hidden * hidden * BYTES_PER_VALUE, rel=1e-12)
        assert eagle3.kv_per_row == eagle.kv_per_row


def test_the_served_replica_prices_eagle3s_fusing_gemm_too(heads):
    from specbench.fleet.tables import replica_spec, step_cost

    planner, drafters = heads
    target = planner.forward(planner.target, 4)
    head = planner.draft_forward(drafters["eagle3"], 4)
    hidden, k, rows = planner.target["hidden_size"], 3, 32
    bare = {"async_scheduling": False, "host": None, "launch": None, "speculation_host": None, "executor": None}
    eagle = step_cost(target, 1024, 128, head, draft_kind="eagle", **bare)
    eagle3 = step_cost(target, 1024, 128, head, draft_kind="eagle3", **bare)
    assert (at(eagle3, 0, rows, k) - at(eagle, 0, rows, k)) * 1e3 == pytest.approx(
        head.gemm_ms(rows * (k + 1), hidden, 3 * hidden), rel=1e-9)
    with_eagle, with_eagle3 = (replica_spec(planner.target, "h100_sxm", 4, draft=drafters[kind].config, draft_kind=kind)
                               for kind in ("eagle", "eagle3"))
    assert with_eagle3.kv_capacity_tokens < with_eagle.kv_capacity_tokens  # the fusing weights leave less cache


def test_plan_prices_eagle3_beside_eagle():
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", "--target", "llama3-70b", "--drafts", "eagle,eagle3", "--tp", "4",
                                      "--alpha", "0.7", "--k", "3", "--batch-sizes", "1,64", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["predictions"]
    step = {(r["draft"], r["batch_size"]): r["step_ms"] for r in rows if r["draft"] in ("eagle", "eagle3")}
    assert set(step) == {("eagle", 1), ("eagle", 64), ("eagle3", 1), ("eagle3", 64)}
    assert all(step["eagle3", b] > step["eagle", b] for b in (1, 64))
