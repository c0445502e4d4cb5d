"""benchmarks/engine-speed/RESULTS.md: one section per benchmark run, newest first, under a fixed header."""

from __future__ import annotations

from pathlib import Path

HEADER = (
    "# specbench engine benchmarks: against transformers, vLLM and the memory-bandwidth bound\n\n"
    "Newest first. Each section is one run of one benchmark on one machine, with its command: "
    "`benchmarks/engine-speed/compare_transformers.py` (specbench vs transformers, and the speed-up bound) or "
    "`benchmarks/engine-speed/native_vs_vllm.py` (the native engine vs vLLM on the same grid).\n\n"
)


def prepend_section(path: Path, section: str) -> None:
    """Put `section` (starting with '## ') first under the header, keeping every earlier section."""
    previous = path.read_text() if path.exists() else ""
    previous = previous[previous.find("\n## ") + 1:] if "\n## " in previous else ""
    path.write_text(HEADER + section.rstrip("\n") + "\n\n" + previous)
