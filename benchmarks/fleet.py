"""Fleet jobs: what running a study through an agent costs beside running ``tune`` directly, how soon a
submitted job starts, and what idle agents cost PostgreSQL; in one run, on one machine.

1. **Submit to first trial**: an agent waits idle (LISTEN/NOTIFY); ``autodeploy fleet submit`` is timed from
   its start to the first trial the agent's study stores, with the pick-up (the run's ``started_at`` less
   the job's ``created_at``, both the database's clock) beside it.
2. **Agent overhead**: the same study run directly (``autodeploy tune`` then ``autodeploy export``, two
   processes) and through an agent (``fleet submit`` to the run's winner bundle stored, verified), interleaved
   direct, agent, direct, ... after one discarded warm-up of each; every run on a fresh database, so no run
   takes another's measurements from the store. Medians, and the ratio agent / direct (goal: at most 1.05).
3. **Idle agents**: N agent processes (``autodeploy agent``, default lease) on an empty database; over a
   window, PostgreSQL's statements/s (``pg_stat_statements`` where the cluster is ours, else transactions/s
   from ``pg_stat_database``), its connections, and the agents' memory, per agent.
4. **On paper**: 1,000 devices, from the per-agent numbers of the largest N.

Usage::

    python benchmarks/fleet.py                  # zoo:tiny-cnn, 3 repeats, N = 1, 10, 50 (about 20 min quiet)
    python benchmarks/fleet.py --quick          # 1 repeat of a tiny study, N = 1, 2, short windows (~3 min)
    python benchmarks/fleet.py --server URL     # an existing PostgreSQL whose user may CREATE DATABASE

Without ``--server`` it starts a throwaway PostgreSQL 15 cluster on 127.0.0.1 (as the tests do; as the
``postgres`` user when run as root), with ``pg_stat_statements`` loaded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import psutil
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from autodeploy.device import probe_device

PG_BIN = Path(os.environ.get("AUTODEPLOY_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
console = Console()
#: The study of the overhead runs: ONNX Runtime on zoo:tiny-cnn with tune's own timing and finalists.
STUDY = ["--engine", "onnxruntime", "--trials", "8", "--finalists", "2", "--rounds", "3"]
#: --quick: the tests' tiny study (3 short trials, one short finalist round).
QUICK = ["--engine", "onnxruntime", "--precision", "fp32", "--threads", "1", "--threads", "2", "--trials", "3",
         "--finalists", "1", "--rounds", "1", "--min-samples", "10", "--min-duration", "0.05"]  # fmt: skip


def autodeploy(*argv: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "autodeploy", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)  # fmt: skip


def run(*argv: str) -> float:
    """Seconds ``autodeploy ARGV`` took; fails on a non-zero exit."""
    started = time.monotonic()
    proc = autodeploy(*argv)
    _, err = proc.communicate(timeout=3600)
    if proc.returncode != 0:
        sys.exit(f"autodeploy {' '.join(argv[:3])} failed ({proc.returncode}): {err[-2000:]}")
    return time.monotonic() - started


# -- PostgreSQL -------------------------------------------------------------------------------------------


@contextmanager
def throwaway_cluster() -> Iterator[str]:
    """A PostgreSQL cluster of its own on a free port, with pg_stat_statements; its maintenance URL."""
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    root = Path(tempfile.mkdtemp(prefix="autodeploy-fleet-bench-"))
    if prefix:
        shutil.chown(root, user="postgres", group="postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c max_connections=1000 "
               "-c shared_preload_libraries=pg_stat_statements")  # fmt: skip
    subprocess.run([*prefix, str(PG_BIN / "initdb"), "-D", str(root / "data"), "-U", "postgres", "-A", "trust",
                    "-E", "UTF8", "--locale=C"], check=True, capture_output=True)  # fmt: skip
    subprocess.run([*prefix, str(PG_BIN / "pg_ctl"), "-D", str(root / "data"), "-l", str(root / "log"), "-o", options,
                    "-w", "start"], check=True, capture_output=True)  # fmt: skip
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, str(PG_BIN / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "stop"],
                       capture_output=True)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


class Server:
    def __init__(self, url: str) -> None:
        self.url = sa.make_url(url)
        self.engine = sa.create_engine(self.url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)

    def scalar(self, sql: str, **params) -> object:
        with self.engine.connect() as conn:
            return conn.execute(sa.text(sql), params).scalar()

    def execute(self, sql: str) -> None:
        with self.engine.connect() as conn:
            conn.execute(sa.text(sql))

    @contextmanager
    def database(self) -> Iterator[str]:
        name = f"fleet_bench_{uuid.uuid4().hex[:10]}"
        with self.engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')  # a name made here, never input
        try:
            yield self.url.set(database=name).render_as_string(hide_password=False)
        finally:
            with self.engine.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def statements(self, db: str) -> tuple[float, str]:
        """Statements run in ``db`` so far (pg_stat_statements), else its transactions; and which it is."""
        name = sa.make_url(db).database
        try:
            calls = self.scalar("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d "
                                "ON d.oid = s.dbid WHERE d.datname = :n", n=name)  # fmt: skip
            return float(calls), "statements/s"
        except sa.exc.DBAPIError:
            done = self.scalar("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = :n", n=name)
            return float(done), "transactions/s"

    def connections(self, db: str) -> int:
        return int(self.scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = :n", n=sa.make_url(db).database))


def query(db: str, sql: str, **params) -> object:
    engine = sa.create_engine(db, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(sql), params).first()
    finally:
        engine.dispose()


def wait_for(check, timeout: float = 600.0, step: float = 0.05) -> float:
    """Poll ``check`` until true; the monotonic time it first was."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(step)
    sys.exit("timed out waiting")


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def tables_ready(db: str) -> bool:
    try:
        return query(db, "SELECT count(*) FROM ad_fleet_agents") is not None
    except sa.exc.DBAPIError:
        return False


# -- 1 and 2: one study through an agent, and directly --------------------------------------------------------


def through_agent(server: Server, model: str, study: list[str]) -> tuple[float, float, float]:
    """(submit → winner stored, submit → first trial, pick-up) seconds, with an agent already waiting."""
    with server.database() as db:
        agent = autodeploy("agent", "--db", db, "--name", "bench")
        try:
            wait_for(lambda: tables_ready(db) and query(db, "SELECT count(*) FROM ad_fleet_agents")[0] == 1)
            time.sleep(2.0)  # let it reach its wait for work
            started = time.monotonic()
            submitted = autodeploy("fleet", "submit", model, *study, "--db", db)
            first = wait_for(lambda: query(db, "SELECT count(*) FROM ad_trials")[0] > 0)
            done = wait_for(lambda: query(db, "SELECT state FROM ad_fleet_runs")[0] in ("done", "failed"))
            submitted.wait(timeout=60)
            state, pickup = query(db, "SELECT r.state, extract(epoch FROM r.started_at - j.created_at) FROM "
                                      "ad_fleet_runs r JOIN ad_fleet_jobs j ON j.id = r.job_id")  # fmt: skip
            if state != "done":
                sys.exit(f"the agent's run ended {state}: {query(db, 'SELECT reason FROM ad_fleet_runs')[0]}")
        finally:
            stop([agent])
    return done - started, first - started, float(pickup)


def direct(server: Server, model: str, study: list[str], out: Path) -> tuple[float, float]:
    """(tune, tune + export) seconds, each its own process, on a fresh database."""
    with server.database() as db:
        name = f"direct-{uuid.uuid4().hex[:6]}"
        tune = run("tune", model, *study, "--name", name, "--db", db)
        export = run("export", name, "-o", str(out / name), "--tar", "--db", db)
    return tune, tune + export


# -- 3: idle agents -----------------------------------------------------------------------------------------


def idle_agents(server: Server, n: int, settle_s: float, window_s: float) -> dict[str, float]:
    with server.database() as db:
        procs = [autodeploy("agent", "--db", db, "--name", "idle-0")]  # first alone: it creates the tables
        wait_for(lambda: tables_ready(db))
        for i in range(1, n):
            procs.append(autodeploy("agent", "--db", db, "--name", f"idle-{i}"))
            time.sleep(0.2)
        try:
            wait_for(lambda: query(db, "SELECT count(*) FROM ad_fleet_agents")[0] == n, timeout=1800, step=1.0)
            time.sleep(settle_s)
            before, unit = server.statements(db)
            time.sleep(window_s)
            after, _ = server.statements(db)
            rss = sum(psutil.Process(p.pid).memory_info().rss for p in procs if p.poll() is None)
            return {"n": n, "rate": (after - before) / window_s, "unit": unit, "connections": server.connections(db),
                    "rss_mb": rss / 2**20}  # fmt: skip
        finally:
            stop(procs)


# -- the report ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="maintenance URL of a PostgreSQL server (default: a throwaway cluster)")
    parser.add_argument("--model", default="zoo:tiny-cnn")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--agents", default="1,10,50", help="idle agent counts")
    parser.add_argument("--window", type=float, default=60.0, help="seconds the idle agents are watched")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    study = QUICK if args.quick else STUDY
    if args.quick:
        args.repeats, args.agents, args.window = 1, "1,2", 15.0
    console.print(probe_device().cpu_line())
    console.print(f"model {args.model}; study: {' '.join(study)}; {args.repeats} repeat(s); load average "
                  f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    with nullcontext(args.server) if args.server else throwaway_cluster() as url:
        server = Server(url)
        if not args.server:
            server.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")  # in the maintenance database
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch)
            direct(server, args.model, study, out)  # warm-up: zoo build, references, artifacts cached
            through_agent(server, args.model, study)
            agent_runs, direct_runs = [], []
            for _ in range(args.repeats):
                direct_runs.append(direct(server, args.model, study, out))
                agent_runs.append(through_agent(server, args.model, study))
        idle = [idle_agents(server, int(n), 5.0 if args.quick else 20.0, args.window) for n in args.agents.split(",")]
        report(agent_runs, direct_runs, idle)


def report(agent_runs: list[tuple[float, float, float]], direct_runs: list[tuple[float, float]],
           idle: list[dict[str, float]]) -> None:  # fmt: skip
    med = statistics.median
    agent_total, first, pickup = (med(r[i] for r in agent_runs) for i in range(3))
    tune, tune_export = (med(r[i] for r in direct_runs) for i in range(2))
    table = Table(title="One study through an agent vs directly (medians; every run on a fresh database)")
    for column in ("measure", "seconds", "agent / direct"):
        table.add_column(column)
    table.add_row("direct: autodeploy tune", f"{tune:.2f}", "")
    table.add_row("direct: tune, then export --tar", f"{tune_export:.2f}", "")
    table.add_row("agent: fleet submit -> winner bundle stored (verified)", f"{agent_total:.2f}",
                  f"{agent_total / tune_export:.3f}x vs tune+export, {agent_total / tune:.3f}x vs tune (goal <= 1.05)")
    table.add_row("agent: fleet submit -> first stored trial", f"{first:.2f}", "")
    table.add_row("agent: job stored -> run taken (pick-up, database clock)", f"{pickup:.2f}", "")
    console.print(table)
    table = Table(title="Idle agents on PostgreSQL (each a process with the default 60 s lease)")
    for column in ("agents", "rate", "per agent", "connections", "per agent", "agents' memory"):
        table.add_column(column)
    for row in idle:
        table.add_row(str(row["n"]), f"{row['rate']:.1f} {row['unit']}", f"{row['rate'] / row['n']:.2f}",
                      str(row["connections"]), f"{row['connections'] / row['n']:.1f}", f"{row['rss_mb']:.0f} MB")  # fmt: skip
    console.print(table)
    big = idle[-1]
    rate, conns, rss = big["rate"] / big["n"], big["connections"] / big["n"], big["rss_mb"] / big["n"]
    console.print(f"on paper, 1,000 devices (from N={big['n']}): {rate * 1000:.0f} {big['unit']} while idle, "
                  f"{conns * 1000:.0f} connections (PostgreSQL's default max_connections is 100: a pooler in session "
                  f"mode, since each agent LISTENs, or max_connections raised), {rss:.0f} MB on each device for "
                  f"its waiting agent; the model's bytes are stored once, one winner bundle per device.")  # fmt: skip


if __name__ == "__main__":
    main()
