"""`specbench models`: the model aliases and where each is available here."""

from __future__ import annotations

from rich.table import Table

from specbench.cli.common import console, quiet_libraries

def models() -> None:
    """Model aliases, their sizes, and where each is available on this machine."""
    quiet_libraries()
    from specbench.models import REGISTRY, local_availability

    table = Table(title="model aliases", title_justify="left", header_style="bold")
    for column in ("alias", "family", "size", "params", "hub id", "available here"):
        table.add_column(column, overflow="fold")
    for spec in REGISTRY.values():
        where = local_availability(spec)
        table.add_row(spec.alias, spec.family, spec.size, f"{spec.params_b:g}B", spec.hub_id,
                      f"[green]{where}[/]" if where else "[dim]no[/]")
    console.print(table)
    console.print("Drafts: an alias, a bare size in the target's family (llama3-70b + 1b -> llama3.2-1b), "
                  "ALIAS@DTYPE, ngram[:N], self:N. Missing models: `hf download HUB_ID` on an online machine.")

