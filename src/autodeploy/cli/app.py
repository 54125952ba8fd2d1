"""The ``autodeploy`` command: a Typer app that turns library errors into one line and an exit code."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from autodeploy.adapters import registry
from autodeploy.cli import (
    agent,
    bench,
    bundle,
    dashboard,
    engines,
    export,
    fleet,
    gate,
    inhouse,
    results,
    schema,
    tune,
    zoo,
)
from autodeploy.cli._common import err, quiet_engines, shown
from autodeploy.errors import AutodeployError, UsageError

if TYPE_CHECKING:  # Typer >= 0.20 vendors its own click; older Typer uses the click package
    from typer.core import TyperCommand as Command
    from typer.core import TyperOption as Option
    from typer.core import _TyperParameter as Parameter

app = typer.Typer(
    name="autodeploy",
    help="Benchmark a model on this device across engines, precisions, batch sizes and threads; store every result.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # library errors become one line below; bugs keep their traceback
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from autodeploy import __version__

        typer.echo(f"autodeploy {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the engines' own log lines.")] = False,
) -> None:  # fmt: skip
    """Benchmark a model on this device across engines, precisions, batch sizes and threads; store every result."""
    quiet_engines(not verbose)


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
app.add_typer(fleet.app, name="fleet")
app.command("agent")(agent.agent)


#: Metavars by option name; others follow from the type (N, SECONDS, NUMBER, PATH, the name in capitals).
METAVARS = {"shape": "NAME=DIMS", "knob": "NAME=VALUE", "input": "NAME=VALUE", "db": "URL", "storage": "URL",
            "metric": "METRIC", "trust": "PUBKEY", "sign_key": "KEY", "output": "PATH"}  # fmt: skip


def _metavars(command: Command) -> Command:
    """Meaningful metavars in every help page (``--batch N``, ``--shape NAME=DIMS``), never ``<list[str]>``.

    Duck-typed on click's attributes, never ``isinstance``: Typer >= 0.20 vendors its own click (no
    ``param.type``), older Typer uses the click package, and autodeploy depends on neither directly."""
    for param in command.params:
        descriptor = getattr(param, "type_descriptor", None)
        choice = descriptor.is_choice if descriptor is not None else type(getattr(param, "type", None)).__name__ == "Choice"
        if param.metavar is not None or choice:
            continue
        if getattr(param, "is_flag", False):
            param.metavar = ""
        else:
            param.metavar = METAVARS.get(param.name or "") or _by_type(param)
        if param.param_type_name == "argument":
            param.display_type_rich = lambda ctx: None  # the name column already says MODEL; no "<str>"
    make_help = command.get_help_option

    def help_option(ctx: object) -> Option | None:
        option = make_help(ctx)
        if option is not None:
            option.metavar = ""  # not "<bool>"
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        _metavars(sub)
    return command


def _by_type(param: Parameter) -> str:
    kind = param.bare_type() if hasattr(param, "bare_type") else param.type.name
    kind, name = kind.removeprefix("list[").removesuffix("]").lower(), param.name or "value"
    if kind in ("int", "integer"):
        return "N"
    if kind == "float":
        return "SECONDS" if any(w in name for w in ("timeout", "duration")) else "NUMBER"
    if kind == "path":
        return "PATH"
    return name.upper()


def _finite_floats(command: Command) -> Command:
    """Every number option of every command refuses ``nan`` and ``inf`` (Typer's min/max let them through:
    ``--sla-ms nan`` was stored as an ok server trial at rate 0): one line, exit 2."""
    for param in command.params:
        descriptor = getattr(param, "type_descriptor", None)  # Typer >= 0.20; older: click's own param.type
        is_float = (descriptor.annotation is float if descriptor is not None
                    else type(getattr(param, "type", None)).__name__ in ("FloatParamType", "FloatRange"))  # fmt: skip
        if is_float:
            param.callback = _finite(param.callback)
    for sub in getattr(command, "commands", {}).values():
        _finite_floats(sub)
    return command


def _finite(callback: Callable[..., Any] | None) -> Callable[..., Any]:
    def check(ctx: object, param: Parameter, value: Any) -> Any:
        for number in value if isinstance(value, (list, tuple)) else [value]:
            if number is not None and not math.isfinite(number):
                flag = param.opts[0] if param.opts else param.name
                raise UsageError(f"{flag} {number} is not a finite number", fix=f"give a finite number, e.g. {flag} 10")
        return value if callback is None else callback(ctx, param, value)

    return check


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script. Exit codes (errors.py, README): 0 ok, 1 failure, 2 bad input
    or setup, 130 interrupted; ``gate`` has its own."""
    try:
        _finite_floats(_metavars(typer.main.get_command(app))).main(args=argv, prog_name="autodeploy")
    except AutodeployError as error:
        _die(error)
    except ModuleNotFoundError as error:  # an optional extra is missing: one line with the pip command
        missing = registry.missing_extra(error)
        if missing is None:
            raise  # not an extra: a bug, keep the traceback
        _die(missing)


def _die(error: AutodeployError) -> None:
    err.print(f"[red]error:[/red] {shown(str(error))}", soft_wrap=True)
    sys.exit(error.exit_code)
