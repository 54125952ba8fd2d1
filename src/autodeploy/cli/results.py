"""``autodeploy results list|show``: read what the store holds."""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated

import typer
from rich.table import Table

from autodeploy.cli._common import Format, FormatOption, emit, fmt_ms, fmt_ms_ci, out, shown
from autodeploy.errors import UsageError
from autodeploy.report import study_record, trial_record
from autodeploy.search.summary import speedup_text

app = typer.Typer(help="Read stored trials.", no_args_is_help=True)
DbOption = Annotated[
    str | None, typer.Option(help="Results database URL (default: $AUTODEPLOY_DB or the user SQLite file).")
]


@app.command("list")
def list_(
    model: Annotated[str | None, typer.Option(help="Only this model (name or SHA-256 prefix).")] = None,
    engine: Annotated[str | None, typer.Option(help="Only this engine.")] = None,
    status: Annotated[str | None, typer.Option(help="ok or failed.")] = None,
    study: Annotated[str | None, typer.Option(help="Only this study's trials (oldest first).")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many trials.")] = 50,
    db: DbOption = None,
    format: FormatOption = Format.table,
) -> None:
    """List stored trials, newest first."""
    from autodeploy.results_db import Store, TrialFilter

    where = TrialFilter(model=model, engines=(engine,) if engine else (), status=status, study=study,
                        newest_first=study is None, limit=limit)  # a study's trials in the order they ran
    with Store.open(db, readonly=True) as store:
        rows = store.trials(where)
    if format is not Format.table:
        emit(format, [trial_record(r) for r in rows])
        return
    table = Table(title=f"{len(rows)} trial(s)")
    for column in (
        "id",
        "when (UTC)",
        "model",
        "config",
        "shape",
        "status",
        "median [95% CI]",
        "p90",
        "items/s",
    ):
        table.add_column(column)
    for r in rows:
        threads = "default" if r.threads is None else r.threads
        config = f"{r.engine}/{r.precision}/b{r.batch}/t{threads}"
        state = "[green]ok[/]" if r.status == "ok" else f"[red]{shown(r.failure_kind)}[/]"
        lat = None if r.measurement is None else r.measurement.latency
        median = "-" if lat is None else fmt_ms_ci(lat.median, lat.median_ci)
        throughput = "-" if r.throughput is None else f"{r.throughput:.1f}"
        table.add_row(
            str(r.id),
            f"{r.created_at:%Y-%m-%d %H:%M}",
            shown(r.model_name),
            shown(config),
            shown(r.shape_text),
            state,
            median,
            fmt_ms(r.p90_ms),
            throughput,
        )
    out.print(table)


@app.command("show")
def show(
    trial_id: Annotated[int, typer.Argument(help="Trial id from `autodeploy results list`.")],
    db: DbOption = None,
    format: FormatOption = Format.table,
) -> None:
    """Show every stored field of one trial."""
    from autodeploy.results_db import Store, TrialFilter

    with Store.open(db, readonly=True) as store:
        row = store.trial(TrialFilter(id=trial_id))
    if row is None:
        raise UsageError(f"no trial with id {trial_id}", fix="see `autodeploy results list`")
    if format is not Format.table:
        emit(format, trial_record(row))
        return
    table = Table(title=f"trial {trial_id}", show_header=False)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    stored = {f.name: getattr(row, f.name) for f in fields(row) if f.name not in ("config", "measurement")}
    measured = {} if row.measurement is None else row.measurement.to_dict()
    for key, value in {**stored, **row.config.to_dict(), **measured}.items():
        if key == "samples_ms" and value:
            value = f"{len(value)} samples"
        if key == "failure_message" and value:  # the engine's whole reason, line by line
            table.add_row(key, "\n".join(shown(line) for line in str(value).splitlines()))
            continue
        table.add_row(key, shown(str(value)))
    out.print(table)


@app.command("studies")
def studies(
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many studies.")] = 50,
    db: DbOption = None,
    format: FormatOption = Format.table,
) -> None:
    """List stored studies with their objective and winner."""
    from autodeploy.adapters.registry import BASELINE_NAME
    from autodeploy.results_db.store import Store

    with Store.open(db, readonly=True) as store:
        rows = store.list_studies(limit=limit)
    if format is not Format.table:
        emit(format, [study_record(r) for r in rows])
        return
    table = Table(title=f"{len(rows)} study(ies)")
    for column in ("name", "model", "objective", "updated (UTC)", "winner", "speedup vs baseline", "runner-up"):
        table.add_column(column, overflow="fold")
    for r in rows:
        record = study_record(r)  # the same record --format json prints and the dashboard's winners page reads
        winner = (record["winner"] or {}).get("label")
        speedup = speedup_text(record)
        if speedup != "-" and record["baseline"] != BASELINE_NAME:  # a .tflite's: LiteRT fp32, the file as given
            speedup += f" vs {record['baseline']}"
        table.add_row(shown(r.name), shown(r.model_name), r.objective, f"{r.updated_at:%Y-%m-%d %H:%M}",
                      shown(winner) if winner else f"[yellow]{shown(record['note'] or 'not finished')}[/]",
                      speedup,
                      shown((record["runner_up"] or {}).get("label") or "-"))  # fmt: skip
    out.print(table)

