"""`specbench models`: the model aliases and where each is available here."""

from __future__ import annotations

from rich.table import Table

from specbench.cli.common import console, quiet_libraries

def billions(count: float) -> str:
    """A parameter count in billions as read: 0.596B, 3.35B, 37.6B, 671B, 1.03T."""
    if count >= 1000:
        return f"{count / 1000:.2f}T"
    return f"{count:.0f}B" if count >= 100 else f"{count:.1f}B" if count >= 10 else f"{count:.3g}B"


def models() -> None:
    """Model aliases, their parameters (all, and those a token uses), and where each is available here."""
    quiet_libraries()
    from specbench.models import REGISTRY, local_availability
    from specbench.synthetic import config_parameters, shipped_config

    table = Table(title="model aliases", title_justify="left", header_style="bold")
    for column in ("alias", "family", "size", "params", "active", "hub id", "available here"):
        table.add_column(column, overflow="fold")
    for spec in REGISTRY.values():
        config = shipped_config(spec.alias)[1]
        total, active = (config_parameters(config, active=used) / 1e9 for used in (False, True))
        where = local_availability(spec)
        table.add_row(spec.alias, spec.family, spec.size, billions(total), billions(active) if active < total else "all",
                      spec.hub_id, f"[green]{where}[/]" if where else "[dim]no[/]")
    console.print(table)
    console.print("params: every weight, each expert of a mixture of experts; active: those a token uses (the shared "
                  "layers, embeddings included, and the top-k routed experts). Drafts: an alias, a bare size in the "
                  "target's family (llama3-70b + 1b -> llama3.2-1b, qwen3-32b + 0.6b -> qwen3-0.6b), ALIAS@DTYPE, "
                  "ngram[:N], self:N. Missing models: `hf download HUB_ID` on an online machine.")
