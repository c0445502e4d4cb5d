"""The floors (plan -> measure -> judge): the judge's commands load no engine. `specbench --help`,
`check` and `plan` on a committed run, each in a fresh process, import neither torch nor
matplotlib nor any engine or executor module (benchmarks/floors/startup.py measures what that saves); a sweep's engine checks run
only for the engine chosen."""

import subprocess
import sys

import pytest

from specbench.grid import ENGINES, EngineOptions, GateOptions, GridOptions, SweepConfig

RUN = "tests/fixtures/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-graphs"
PROBE = ("import sys, runpy; sys.argv = ['specbench', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('specbench.cli', run_name='__main__')\n"
         "except SystemExit:\n    pass\n"
         "print('LOADED', sorted(m for m in sys.modules if m in ('torch', 'matplotlib', 'transformers')\n"
         "      or m.startswith(('specbench.native', 'specbench.served', 'specbench.executors'))))")


@pytest.mark.parametrize("args", [["--help"], ["check", RUN], ["plan", RUN], ["plan", "--target", "llama3-70b",
                                                                              "--alpha", "0.7", "--tp", "4"]])
def test_the_judges_commands_load_no_engine(args):
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    loaded = [line for line in done.stdout.splitlines() if line.startswith("LOADED")]
    assert loaded == ["LOADED []"], (loaded, done.stderr[-2000:])


def test_the_grid_checks_its_values_and_the_sweep_checks_the_engine():
    """SweepConfig.validate knows no engine; sweep.check_config adds the chosen engine's checks."""
    from specbench.measuring import ENGINES as IMPLEMENTATIONS
    from specbench.sweep import check_config

    config = SweepConfig(engine=EngineOptions(cuda_graphs=True))  # the native engine refuses CUDA graphs without CUDA
    config.validate()
    with pytest.raises(ValueError, match="--cuda-graphs needs"):
        check_config(config)
    assert set(IMPLEMENTATIONS) == set(ENGINES)
    with pytest.raises(ValueError, match="top_p must be in"):
        SweepConfig(grid=GridOptions(top_p=0)).validate()
    with pytest.raises(ValueError, match="SLO|slo"):
        check_config(SweepConfig(gate=GateOptions(slo="nonsense")))


def test_the_walls_hold():
    """The import-linter contracts of pyproject.toml: the judge imports nothing of measuring, and
    the plan neither measuring nor judging (imports inside functions count)."""
    import shutil
    from pathlib import Path

    linter = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    done = subprocess.run([linter], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout[-3000:] + done.stderr[-1000:]


def test_the_walls_see_imports_inside_functions():
    """The graph the contracts are checked on (grimp's, as import-linter builds it) holds imports
    made inside functions: grid reaches traces only from inside `build_replay` and `validate`."""
    import inspect

    import grimp

    import specbench.grid as grid

    top_level = [line for line in inspect.getsource(grid).splitlines() if line.startswith(("from ", "import "))]
    assert not any("specbench.traces" in line for line in top_level)
    graph = grimp.build_graph("specbench")
    assert "specbench.traces" in graph.find_modules_directly_imported_by("specbench.grid")


def test_the_clis_exit_codes_are_the_gates():
    """main() knows two of the gate's exit codes without importing the gate (which loads pandas)."""
    from specbench import gate
    from specbench.cli import common

    assert (common.UNANSWERABLE, common.INTERNAL_ERROR) == (gate.UNANSWERABLE, gate.INTERNAL_ERROR)
