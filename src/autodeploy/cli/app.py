"""The ``autodeploy`` command: a Typer app that turns library errors into one line and an exit code."""

from __future__ import annotations

import sys

import typer

from autodeploy.cli import (
    bench,
    bundle,
    dashboard,
    engines,
    export,
    gate,
    inhouse,
    results,
    schema,
    tune,
    zoo,
)
from autodeploy.cli._common import err, shown
from autodeploy.errors import AutodeployError

app = typer.Typer(
    name="autodeploy",
    help="Benchmark a model on this device across engines, precisions, batch sizes and threads; store every result.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # library errors become one line below; bugs keep their traceback
    add_completion=False,
)
app.command("engines")(engines.engines)
app.command("bench")(bench.bench)
app.command("tune")(tune.tune)
app.command("dashboard")(dashboard.dashboard)
app.command("export")(export.export)
app.command("gate", cls=gate.GateCommand)(gate.gate)
app.command("schema")(schema.schema)
app.add_typer(results.app, name="results")
app.add_typer(zoo.app, name="zoo")
app.add_typer(inhouse.app, name="inhouse")
app.add_typer(bundle.app, name="bundle")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script. Exit codes: 0 ok, 1 failure, 2 bad input."""
    try:
        app(args=argv, prog_name="autodeploy")
    except AutodeployError as error:
        err.print(f"[red]error:[/red] {shown(str(error))}", soft_wrap=True)
        sys.exit(error.exit_code)
