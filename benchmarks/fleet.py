"""Fleet jobs: what running a study through an agent costs beside running ``tune`` directly, how soon a
submitted job starts, and what idle agents cost PostgreSQL; in one run, on one machine.

1. **Pick-up**: an agent waits idle (LISTEN/NOTIFY); ``autodeploy fleet submit`` of the tiny study is timed from
   its start to the first trial the agent's study stores, with the pick-up (the run's ``started_at`` less the
   job's ``created_at``, both the database's clock) beside it. Once, apart from the overhead runs.
2. **Agent overhead, like with like: both sides cold, two process starts each.** Direct: ``autodeploy tune``
   then ``autodeploy export --tar``. Agent: ``autodeploy fleet submit --devices bench``, then a fresh
   ``autodeploy agent --once --name bench`` started for this repeat alone, which registers, takes the job (a job
   naming a device is taken when it registers), tunes, exports, verifies, stores the bundle and exits. Both run
   the same study config (one YAML file, ``--study-s`` long: at least 60 s here by default, finalist rounds
   back to back), each run on a fresh database so no run takes another's measurements from the store. One
   discarded warm-up of each (the zoo model, the artifact caches, the page cache), then ``--repeats`` pairs,
   interleaved (direct then agent, then agent then direct, ...). Reported: each side's wall seconds and CPU
   seconds (user + system of the process and every child it waited for: the kernel's ``RUSAGE_CHILDREN`` read
   around it, which, unlike polling the process with psutil, still counts its last seconds), and the ratio
   agent / direct as the **median of the paired per-repeat ratios** (goal: at most 1.05).
3. **Idle agents**: N agent processes (``autodeploy agent``, default lease) on an empty database; over a
   window, PostgreSQL's statements/s (``pg_stat_statements`` where the cluster is ours, else transactions/s
   from ``pg_stat_database``), its connections, and the agents' memory, per agent.
4. **On paper**: 1,000 devices, from the per-agent numbers of the largest N.
5. **Running agents** (``--running N``): N agents take one ``all`` job at once (the tiny study); the most
   connections the database held while they ran it, beside the README's budget of 3 per agent.

Usage::

    python benchmarks/fleet.py                  # zoo:tiny-cnn, 60 s studies, 3 repeats, N = 1, 10, 50 (~25 min quiet)
    python benchmarks/fleet.py --study-s 240    # longer studies: the fixed costs weigh less
    python benchmarks/fleet.py --quick          # 1 repeat of the tiny study, N = 1, 2, short windows (~3 min)
    python benchmarks/fleet.py --server URL     # an existing PostgreSQL whose user may CREATE DATABASE
    python benchmarks/fleet.py --repeats 0 --agents "" --running 30   # 30 agents running one job: peak connections

Without ``--server`` it starts a throwaway PostgreSQL 15 cluster on 127.0.0.1 (as the tests do; as the
``postgres`` user when run as root), with ``pg_stat_statements`` loaded. Run it on a quiet machine: it prints the
CPU, its ISA flags and the load average first.
"""

from __future__ import annotations

import argparse
import os
import resource
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
#: The study of the overhead runs (both sides, one YAML file): ONNX Runtime on the model, 8 screening trials, 2
#: finalists over 3 rounds back to back (no spread wait: the study is measuring, not sleeping). Every timed
#: slot (a screening trial; a finalist or the baseline in a round: 8 + 3 x 3 = 17) runs ``--study-s / 17``
#: seconds, so the study lasts a little over ``--study-s`` (builds, warm-ups and the search come on top).
STUDY = """engines: [onnxruntime]
threads: [1, 2]
trials: 8
screening: {{min_duration_s: {slot:.2f}}}
finalists: {{count: 2, rounds: 3, spread_s: 0, min_duration_s: {slot:.2f}}}
"""
TIMED_SLOTS = 8 + 3 * (2 + 1)
#: --quick, and the pick-up measurement: the tests' tiny study (3 short trials, one short finalist round).
QUICK = """engines: [onnxruntime]
precisions: [fp32]
threads: [1, 2]
trials: 3
screening: {min_samples: 10, min_duration_s: 0.05}
finalists: {count: 1, rounds: 1, spread_s: 0, min_samples: 10, min_duration_s: 0.05}
"""


def autodeploy(*argv: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "autodeploy", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)  # fmt: skip


def children_cpu() -> float:
    """CPU seconds (user + system) of every child this process has waited for so far, and of the children they
    waited for: the kernel adds a process's own and its reaped children's when it is reaped."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def finish(proc: subprocess.Popen, what: str) -> None:
    _, err = proc.communicate(timeout=3600)
    if proc.returncode != 0:
        sys.exit(f"autodeploy {what} failed ({proc.returncode}): {err[-2000:]}")


def run(*argv: str) -> tuple[float, float]:
    """(wall, CPU) seconds of ``autodeploy ARGV``, its children included; fails on a non-zero exit."""
    cpu, started = children_cpu(), time.monotonic()
    finish(autodeploy(*argv), " ".join(argv[:3]))
    return time.monotonic() - started, children_cpu() - cpu


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


def pickup(server: Server, model: str, config: Path) -> tuple[float, float]:
    """(submit → first stored trial, job stored → run taken) seconds, with an agent already waiting."""
    with server.database() as db:
        agent = autodeploy("agent", "--db", db, "--name", "bench")
        try:
            wait_for(lambda: tables_ready(db) and query(db, "SELECT count(*) FROM ad_fleet_agents")[0] == 1)
            time.sleep(2.0)  # let it reach its wait for work
            started = time.monotonic()
            submitted = autodeploy("fleet", "submit", model, "--config", str(config), "--db", db)
            first = wait_for(lambda: query(db, "SELECT count(*) FROM ad_trials")[0] > 0)
            wait_for(lambda: query(db, "SELECT state FROM ad_fleet_runs")[0] in ("done", "failed"))
            finish(submitted, "fleet submit")
            (pick,) = query(db, "SELECT extract(epoch FROM r.started_at - j.created_at) FROM ad_fleet_runs r "
                                "JOIN ad_fleet_jobs j ON j.id = r.job_id")  # fmt: skip
        finally:
            stop([agent])
    return first - started, float(pick)


def through_agent(server: Server, model: str, config: Path) -> dict[str, float]:
    """Wall and CPU seconds of ``fleet submit --devices bench``, then of a fresh ``agent --once`` that takes the
    job, tunes, exports, stores the bundle and exits."""
    with server.database() as db:
        submit, submit_cpu = run("fleet", "submit", model, "--config", str(config), "--devices", "bench", "--db", db)
        cpu, started = children_cpu(), time.monotonic()
        agent = autodeploy("agent", "--db", db, "--name", "bench", "--once")
        try:
            finish(agent, "agent --once")
        finally:
            stop([agent])
        took, agent_cpu = time.monotonic() - started, children_cpu() - cpu
        state, reason = query(db, "SELECT state, reason FROM ad_fleet_runs")
        if state != "done":
            sys.exit(f"the agent's run ended {state}: {reason}")
    return {"wall": submit + took, "cpu": submit_cpu + agent_cpu, "agent_wall": took, "agent_cpu": agent_cpu}


def direct(server: Server, model: str, config: Path, out: Path) -> dict[str, float]:
    """Wall and CPU seconds of ``tune``, then ``export --tar``, each its own process, on a fresh database."""
    with server.database() as db:
        name = f"direct-{uuid.uuid4().hex[:6]}"
        tune, tune_cpu = run("tune", model, "--config", str(config), "--name", name, "--db", db)
        export, export_cpu = run("export", name, "-o", str(out / name), "--tar", "--db", db)
    return {"wall": tune + export, "cpu": tune_cpu + export_cpu, "tune_wall": tune}


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


# -- 5: agents running one job at once ----------------------------------------------------------------------


def running_agents(server: Server, n: int, model: str, config: Path) -> dict[str, float]:
    """N agents (waiting for work) take one ``all`` job at once: the most connections the database held while they
    ran it (``pg_stat_activity``, sampled every 0.2 s), beside the README's budget of 3 per agent."""
    with server.database() as db:
        procs = [autodeploy("agent", "--db", db, "--name", "run-0")]  # first alone: it creates the tables
        wait_for(lambda: tables_ready(db))
        procs += [autodeploy("agent", "--db", db, "--name", f"run-{i}") for i in range(1, n)]
        try:
            wait_for(lambda: query(db, "SELECT count(*) FROM ad_fleet_agents")[0] == n, timeout=1800, step=1.0)
            started = time.monotonic()
            finish(autodeploy("fleet", "submit", model, "--config", str(config), "--devices", "all", "--db", db),
                   "fleet submit")  # fmt: skip
            peak, over = 0, "SELECT count(*) FROM ad_fleet_runs WHERE state NOT IN ('done', 'failed', 'skipped')"
            while query(db, over)[0]:
                peak = max(peak, server.connections(db))
                time.sleep(0.2)
            (done,) = query(db, "SELECT count(*) FROM ad_fleet_runs WHERE state = 'done'")
            return {"n": n, "peak": peak, "budget": 3 * n, "done": done, "wall": time.monotonic() - started}
        finally:
            stop(procs)


# -- the report ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="maintenance URL of a PostgreSQL server (default: a throwaway cluster)")
    parser.add_argument("--model", default="zoo:tiny-cnn")
    parser.add_argument("--study-s", type=float, default=60.0, help="timed seconds of each overhead study (>= 60)")
    parser.add_argument("--repeats", type=int, default=3, help="paired overhead runs, interleaved")
    parser.add_argument("--agents", default="1,10,50", help="idle agent counts")
    parser.add_argument("--window", type=float, default=60.0, help="seconds the idle agents are watched")
    parser.add_argument("--running", type=int, default=0, help="agents running one job at once: their peak "
                        "connections beside the budget (0: not measured; 30 in the issue)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.agents, args.window = 1, "1,2", 15.0
    console.print(probe_device().cpu_line())
    console.print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} (run it on a quiet machine)")
    cluster = nullcontext(args.server) if args.server else throwaway_cluster()
    with cluster as url, tempfile.TemporaryDirectory() as scratch:
        out, tiny = Path(scratch), Path(scratch) / "tiny.yaml"
        tiny.write_text(QUICK)
        config = tiny if args.quick else Path(scratch) / "study.yaml"
        if not args.quick:
            config.write_text(STUDY.format(slot=args.study_s / TIMED_SLOTS))
        study = config.read_text().strip().replace("\n", "; ")
        console.print(f"model {args.model}; study: {study}; {args.repeats} repeat(s)", markup=False)
        server = Server(url)
        if not args.server:
            server.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")  # in the maintenance database
        first = pickup(server, args.model, tiny)  # also the warm-up of the agent's caches
        if args.repeats:
            direct(server, args.model, config, out)  # warm-ups: zoo build, references, artifacts cached
            through_agent(server, args.model, config)
        pairs = []
        for i in range(args.repeats):  # interleaved, each side first every other repeat (a drift hits both)
            if i % 2 == 0:
                d = direct(server, args.model, config, out)
                a = through_agent(server, args.model, config)
            else:
                a = through_agent(server, args.model, config)
                d = direct(server, args.model, config, out)
            pairs.append((d, a))
        idle = [idle_agents(server, int(n), 5.0 if args.quick else 20.0, args.window) for n in args.agents.split(",") if n]
        running = running_agents(server, args.running, args.model, tiny) if args.running else None
    report(pairs, first, idle, quick=args.quick)
    if running is not None:
        console.print(f"{running['n']} agents running one job at once (tiny study; {running['done']} runs done in "
                      f"{running['wall']:.0f} s): at most {running['peak']} connections, budget 3 per agent = "
                      f"{running['budget']} (README, \"Connections\")")  # fmt: skip


def report(pairs: list[tuple[dict[str, float], dict[str, float]]], first: tuple[float, float],
           idle: list[dict[str, float]], quick: bool) -> None:  # fmt: skip
    if pairs:  # --repeats 0: not measured
        _report_pairs(pairs, quick)
    console.print(f"pick-up with an agent already waiting (tiny study): submit -> first stored trial {first[0]:.2f} s, "
                  f"job stored -> run taken {first[1]:.2f} s (database clock)")  # fmt: skip
    if idle:  # --agents "": not measured
        _report_idle(idle)


def _report_pairs(pairs: list[tuple[dict[str, float], dict[str, float]]], quick: bool) -> None:
    med = statistics.median
    table = Table(title="One study, both sides cold (two process starts each; every run on a fresh database)")
    for column in ("repeat", "direct s", "direct CPU s", "agent s", "agent CPU s", "agent / direct", "CPU ratio"):
        table.add_column(column)
    for i, (d, a) in enumerate(pairs, 1):
        table.add_row(str(i), f"{d['wall']:.2f}", f"{d['cpu']:.2f}", f"{a['wall']:.2f}", f"{a['cpu']:.2f}",
                      f"{a['wall'] / d['wall']:.3f}", f"{a['cpu'] / d['cpu']:.3f}")  # fmt: skip
    console.print(table)
    ratio, cpu = med(a["wall"] / d["wall"] for d, a in pairs), med(a["cpu"] / d["cpu"] for d, a in pairs)
    tune = med(d["tune_wall"] for d, _ in pairs)
    agent, agent_cpu = med(a["agent_wall"] for _, a in pairs), med(a["agent_cpu"] for _, a in pairs)
    console.print(f"direct = tune + export --tar (tune alone, the study with its process start: median {tune:.1f} s); "
                  f"agent = fleet submit + agent --once (the agent process alone: median {agent:.1f} s, "
                  f"{agent_cpu:.1f} CPU s)")  # fmt: skip
    console.print(f"agent / direct, median of the {len(pairs)} paired per-repeat ratios: wall {ratio:.3f}x "
                  f"(goal <= 1.05), CPU {cpu:.3f}x")  # fmt: skip
    if tune < 60 and not quick:  # the goal is stated for a study of at least 60 s
        console.print(f"[yellow]the study took {tune:.0f} s, under 60 s: run it again with a larger --study-s[/]")


def _report_idle(idle: list[dict[str, float]]) -> None:
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
