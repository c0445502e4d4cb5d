"""The report on disk: charts (PNG), one self-contained HTML page and a Markdown summary, written
whole or not at all. The page opens with the analysis' answer in one sentence."""

from __future__ import annotations

import base64
import errno
import html
import math
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from specbench.fit import load_label
from specbench.report.analysis import TABLE_NOTES, Analysis, analyse, answer, summary_tables
from specbench.report.charts import CHART_NOTES, CHARTS, NothingToDraw, drawers
from specbench.results import Run, recorded_config
from specbench.synthetic import random_model_lines

TRUST_SECTION = "how far the performance model's predictions can be trusted"
NOT_DRAWN_SECTION = "charts not drawn"


def _format(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_format(v).replace("|", "\\|") for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def html_table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_format(v))}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_report(run: Run, out_dir: Path | None = None, gpu_price: float | None = None, gpus: int = 1,
                 extra_sections: dict[str, str] | None = None, slo: str | None = None,
                 gate_result=None, reference: Run | None = None) -> tuple[Path, Analysis]:
    """Charts (PNG), report.html (self-contained) and summary.md under RUN/report/. The page
    opens with its answer in one sentence (`answer`), then how fast the baseline was."""
    out_dir = Path(out_dir or run.path / "report")
    for place in (out_dir, *out_dir.parents):  # a file where a directory must be: one line (OSError), exit 2
        if place.exists():
            if not place.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(place))
            break
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Written beside its place and moved there whole: an error or Ctrl-C half way leaves the
    # report that was there (or none), never a partial one.
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes 0700; the report is as readable as a directory mkdir makes
    try:
        a = _write_report(run, staging, gpu_price, gpus, extra_sections, slo, gate_result, reference)
        if out_dir.is_dir() and not _only_a_report(out_dir):  # the user's own directory: our files into it
            for path in staging.iterdir():
                path.replace(out_dir / path.name)
        else:
            if out_dir.is_dir():
                shutil.rmtree(out_dir)
            staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir, a


SUMMARY_MAX_ROWS = 20  # summary.md writes tables up to this long; longer ones only in report.html


def _only_a_report(directory: Path) -> bool:
    """Whether a directory holds nothing but what write_report writes (so it may be replaced whole)."""
    return all(path.is_file() and path.suffix in (".png", ".html", ".md") for path in directory.iterdir())


def _write_report(run: Run, out_dir: Path, gpu_price: float | None, gpus: int, extra_sections: dict[str, str] | None,
                  slo: str | None, gate_result, reference: Run | None) -> Analysis:
    a = analyse(run, gpu_price, gpus, slo, reference)
    if a.cells.empty:
        raise ValueError(f"{run.path} has no finished cells to report")
    a.answer = answer(a, gate_result)
    images, not_drawn = {}, []
    for name, draw in drawers(a).items():
        path = out_dir / f"{name}.png"
        try:
            draw(a, path)
            images[name] = path
        except NothingToDraw as why:
            path.unlink(missing_ok=True)
            not_drawn.append(f"{CHARTS[name]}: {why}")
    tables = summary_tables(a)
    if a.goodput is not None and not a.goodput.empty:
        tables[f"goodput per cell (SLO: {a.slo.describe()})"] = a.goodput.drop(columns=["cell_id", "mode"])
    if a.capacity is not None and not a.capacity.empty:
        tables[f"capacity: the highest {load_label(a.load)} meeting the SLO, and the cost there ({a.cost_unit})"] = \
            a.capacity
    meta = run.meta
    config = recorded_config(meta)
    hardware = meta.get("hardware", {})
    gpu = ", ".join(g["name"] for g in hardware.get("gpus", []))
    flags = ", ".join(hardware.get("cpu_flags") or [])  # runs before cpu_flags was recorded lack it
    where = gpu if gpu else f"{hardware.get('cpu', '?')} ({flags + '; ' if flags else ''}CPU only)"
    if (meta.get("engine") or {}).get("name") == "endpoint":
        where = f"the endpoint {(meta.get('engine') or {}).get('endpoint', '?')}"
    title = f"specbench: {config['grid'].get('target', '?')} on {where}"
    if meta.get("synthetic"):
        title += " — TIMING-ONLY (random weights, synthetic acceptance" + (", layer-subset ESTIMATE)" if meta.get("estimated") else ")")
    engine = meta.get("engine") or {"name": "native"}
    trace = meta.get("trace") or {}
    if trace:  # replayed arrivals: neither Poisson nor a fixed number in flight
        loop = f"trace replay: each request at its time in {trace.get('describe', '?')}, {trace.get('requests')} requests"
    elif a.load == "request_rate":
        loop = ("open loop: requests arrive at Poisson/gamma times, rates "
                + ", ".join(map(str, config["load"].get("request_rates") or [])) + f" req/s, burstiness "
                f"{config['load'].get('burstiness', 1)}")
    else:
        loop = "batch size = requests in flight (closed loop)"
    if engine.get("name") == "vllm":
        how = f"engine vLLM {engine.get('version', '?')}: one server per speculative configuration, {loop}"
    elif engine.get("name") == "endpoint":
        how = (f"endpoint {engine.get('endpoint')} (model {engine.get('served_model')}), baseline "
               f"{engine.get('baseline_endpoint') or 'none'}; {loop}")
    else:
        how = f"native engine, decode steps {'replayed from CUDA graphs' if config['engine'].get('cuda_graphs') else 'eager'}"
    provenance = (f"run {run.path.name} · started {meta.get('started')} · status {meta.get('status')} · "
                  f"specbench {meta.get('versions', {}).get('specbench_git', '?')} · torch "
                  f"{meta.get('versions', {}).get('torch', '?')} · transformers {meta.get('versions', {}).get('transformers', '?')}"
                  f" · {how}")
    from specbench.fit.nodes import node_spread, spread_text

    nodes = spread_text(node_spread(run.cells, run.baseline_copies))
    sections = ({"measurement warnings": "\n".join(a.warnings)} if a.warnings else {}) | \
        ({"nodes (a cluster run)": nodes + "; each speed-up is paired with the baseline measured on its own node"}
         if nodes else {}) | \
        ({TRUST_SECTION: "\n".join(a.trust)} if a.trust else {}) | \
        ({NOT_DRAWN_SECTION: "\n".join(not_drawn)} if not_drawn else {}) | \
        ({"models built with random weights": "\n".join(built)} if (built := random_model_lines(meta)) else {}) | \
        dict(extra_sections or {})

    body, contents = [], []

    def heading(text: str) -> str:  # an <h2> with an anchor, listed in the table of contents
        anchor = f"s{len(contents) + 1}"
        contents.append(f"<li><a href='#{anchor}'>{html.escape(text)}</a></li>")
        return f"<h2 id={anchor}>{html.escape(text)}</h2>"

    for name, text in sections.items():
        css = " class=warn" if name == "measurement warnings" else ""
        body.append(f"{heading(name)}<pre{css}>{html.escape(text)}</pre>")
    for name, path in images.items():
        data = base64.b64encode(path.read_bytes()).decode()
        note = f"<p class=note>{html.escape(CHART_NOTES[name])}</p>" if name in CHART_NOTES else ""
        body.append(f"{heading(CHARTS[name])}{note}<img alt='{name}' src='data:image/png;base64,{data}'>")
    for name, frame in tables.items():
        note = f"<p class=note>{html.escape(TABLE_NOTES[name])}</p>" if name in TABLE_NOTES else ""
        body.append(f"{heading(name)}{note}<div class=wide>{html_table(frame)}</div>")
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if a.answer:  # the answer first, then what it rests on
        parts.append(f"<p class=answer>{html.escape(a.answer)}</p>")
    if a.baseline_note:
        parts.append(f"<p>{html.escape(a.baseline_note)}</p>")
    parts.append(f"<p class=meta>{html.escape(provenance)}</p><nav><b>Contents</b><ol>{''.join(contents)}</ol></nav>")
    parts += body
    # Long verdict lines wrap and wide tables scroll inside their own box: the page never scrolls sideways.
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}img{max-width:100%;border:1px solid #ddd}"
             ".wide{overflow-x:auto;max-width:100%}"
             "table{border-collapse:collapse;font-size:12px;margin-bottom:1em}td,th{border:1px solid #ccc;padding:2px 6px;"
             "text-align:right}th{background:#f3f3f3}.meta{color:#666;font-size:12px;overflow-wrap:anywhere}"
             "pre{background:#f7f7f7;padding:1em;white-space:pre-wrap;overflow-wrap:anywhere}"
             ".warn{background:#fff4e5;border-left:4px solid #e69500}"
             ".answer{font-size:17px;font-weight:600;max-width:1000px}.note{color:#444;max-width:1000px}"
             "nav{background:#f7f7f7;padding:.5em 1em;display:inline-block}nav ol{margin:.3em 0;columns:2}")
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head><body>{''.join(parts)}</body></html>"
    (out_dir / "report.html").write_text(page)

    md = [f"# {title}", ""] + ([a.answer, ""] if a.answer else []) + \
        ([a.baseline_note, ""] if a.baseline_note else []) + [provenance, ""]
    for name, text in sections.items():
        md += [f"## {name}", "", "```", text, "```", ""]
    for name, path in images.items():
        md += [f"![{CHARTS[name]}]({path.name})", ""] + ([CHART_NOTES[name], ""] if name in CHART_NOTES else [])
    for name, frame in tables.items():
        md += [f"## {name}", ""] + ([TABLE_NOTES[name], ""] if name in TABLE_NOTES else [])
        # a table of one row per cell is read on the page, where it scrolls; the summary stays short
        md += [markdown_table(frame) if len(frame) <= SUMMARY_MAX_ROWS else
               f"{len(frame)} rows: in report.html beside this file", ""]
    (out_dir / "summary.md").write_text("\n".join(md))
    return a
