"""``autodeploy agent``: run on a device; take the fleet jobs meant for it, tune each, store the winner."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from autodeploy.cli._common import at_least, err, out, shown


def agent(
    db: Annotated[str | None, typer.Option(help="The PostgreSQL results database of the fleet (default: $AUTODEPLOY_DB).")] = None,
    name: Annotated[str | None, typer.Option(help="This device's name (default: the host name); bound to this machine's fingerprint.")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="A tag jobs can select (--devices tag:TAG); repeatable.")] = None,
    once: Annotated[bool, typer.Option("--once", help="Exit when nothing is left for this device (else wait for jobs).")] = False,
    lease: Annotated[float, typer.Option(callback=at_least(1.0), metavar="SECONDS", help="A run this agent holds goes back to the queue after this long without its heartbeat (the agent died).")] = 60.0,
    allow_pytorch: Annotated[bool, typer.Option("--allow-pytorch", help="Run PyTorch .pt2 jobs (else they end skipped): loading a .pt2 comes close to running its code.")] = False,
) -> None:  # fmt: skip
    """Register this device and run the fleet jobs meant for it, one at a time."""
    from autodeploy.fleet.agent import AgentSettings, default_name, serve

    def log(text: str) -> None:
        err.print(f"{datetime.now():%H:%M:%S} {shown(text)}", soft_wrap=True)

    settings = AgentSettings(name=name or default_name(), tags=tuple(tag or ()), once=once, lease_s=lease,
                             allow_pytorch=allow_pytorch)  # fmt: skip
    runs = serve(db, settings, log)
    left = "; stopped" if settings.stop.is_set() else "; nothing left for this device" if once else ""
    out.print(f"{shown(settings.name)}: {runs} run(s) taken{left}")
