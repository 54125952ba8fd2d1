"""Four processes write trials into one store while the dashboard's queries read it.

Every row arrives exactly once, readers see counts only grow, and nobody sees an error, in
particular no "database is locked" on SQLite. The same on PostgreSQL.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback

import pytest

from autodeploy.results_db import Store, TrialFilter
from tests.results_db.factories import DEVICE, MODEL, failed_result, ok_result

pytest.importorskip(
    "pandas", reason="the dashboard's queries need pandas: pip install 'autodeploy[dashboard]'"
)

from autodeploy.dashboard import queries  # noqa: E402

WRITERS = 4
PER_WRITER = 25
STUDY = "concurrent"


def _write(url: str, writer: int, errors: multiprocessing.Queue) -> None:
    try:
        with Store.open(url) as store:
            for i in range(PER_WRITER):
                uid = f"w{writer}-{i}"
                result = ok_result(uid) if i % 5 else failed_result(uid)
                store.add_trial(result, model=MODEL, device=DEVICE, study=STUDY, phase="screening")
    except BaseException:
        errors.put(traceback.format_exc())
        raise


def _read_while(url: str, writers: list[multiprocessing.Process]) -> tuple[list[int], list[str]]:
    """Run the dashboard's queries in a loop until the writers are done; return the counts seen and any errors."""
    seen, errors = [], []
    with Store.open(url, readonly=True) as store:
        while True:
            done = not any(w.is_alive() for w in writers)
            try:
                trials = queries.trials(store, queries.Filters(study=STUDY))
                queries.options(store)
                queries.studies(store)
                queries.devices(store)
                queries.samples(store, tuple(int(i) for i in trials["trial_id"][:3]))
                store.trials(TrialFilter(newest_first=True, limit=20))
                seen.append(store.count_trials())
                assert len(trials) <= seen[-1]
            except Exception:
                errors.append(traceback.format_exc())
            if done:
                return seen, errors
            time.sleep(0.01)


def _hammer(url: str) -> None:
    Store.open(url).close()  # schema first: the dashboard never creates it
    ctx = multiprocessing.get_context("spawn")
    writer_errors = ctx.Queue()
    writers = [ctx.Process(target=_write, args=(url, w, writer_errors)) for w in range(WRITERS)]
    for w in writers:
        w.start()
    try:
        seen, read_errors = _read_while(url, writers)
    finally:
        for w in writers:
            w.join(timeout=120)
    failures = [writer_errors.get() for _ in range(writer_errors.qsize())] + read_errors
    assert not any("database is locked" in f for f in failures), failures
    assert failures == []
    assert all(w.exitcode == 0 for w in writers)
    assert seen == sorted(seen) and len(seen) > 1  # reads interleaved with the writes, counts only grow
    with Store.open(url, readonly=True) as store:
        rows = store.trials(TrialFilter(study=STUDY))
        assert store.count_trials() == len(rows) == WRITERS * PER_WRITER
        assert len({r.uid for r in rows}) == WRITERS * PER_WRITER
        assert sum(r.measured for r in rows) == WRITERS * (PER_WRITER - PER_WRITER // 5)
        df = queries.trials(store)
        assert len(df) == WRITERS * PER_WRITER and df["uid"].is_unique


@pytest.mark.slow
def test_four_writers_and_the_dashboard_on_sqlite(tmp_path):
    _hammer(f"sqlite:///{tmp_path / 'results.db'}")


@pytest.mark.slow
@pytest.mark.postgres
def test_four_writers_and_the_dashboard_on_postgres(postgres_url):
    _hammer(postgres_url)
