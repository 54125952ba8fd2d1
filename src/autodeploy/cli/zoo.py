"""``autodeploy zoo list|build``: the models built in code for demos and tests."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from autodeploy.cli._common import err, out, shown

app = typer.Typer(
    help="Built-in models, made in code (no downloads); use them as zoo:NAME.", no_args_is_help=True
)


@app.command("list")
def list_() -> None:
    """List the built-in models."""
    from autodeploy import zoo

    table = Table(title="zoo models (use as zoo:NAME)")
    table.add_column("name")
    table.add_column("description")
    for name in zoo.names():
        table.add_row(name, shown(zoo.ZOO[name].description))
    out.print(table)


@app.command("build")
def build(
    names: Annotated[list[str] | None, typer.Argument(help="Models to build (default: all).")] = None,
) -> None:
    """Build (or find in the cache) built-in models and print where they are."""
    from autodeploy import zoo

    for name in names or zoo.names():
        with err.status(f"building zoo:{name}"):
            path = zoo.get(name)
        out.print(f"zoo:{name}\t{path}\t{path.stat().st_size / 2**20:.1f} MB")
