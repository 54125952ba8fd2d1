"""Red-team round 5 (issue 47): values read back from the store, and one clear line for each partial.

Case 11: a run row's ``winner.statistic`` reached ``fleet status`` raw (ESC sequences, Rich markup) and the
Fleet page as live Markdown (a link, an external image: a beacon); one malformed JSON value in one run row
crashed both for every job. The rows are planted as anyone with the database URL could: SQLAlchemy, bound
parameters, into a real PostgreSQL. Case 12 and the partials follow, each through the CLI or the api.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.cli_runner import run_cli
from tests.fleet.conftest import JOB_CONFIG
from tests.hardening.disk import small_disk
from tests.models import mlp

#: A statistic that clears the screen, styles text (Rich markup), links out and loads a beacon (Markdown).
HOSTILE = "\x1b[2J[bold red]x[/] [x](http://evil) ![b](http://evil/p.png)"
GOOD_WINNER = {"config": "onnxruntime/fp32/b1/t1", "uid": "u1", "statistic": "p90", "value": 1.5,
               "value_text": "1.500 ms", "speedup": 1.2, "baseline": "onnxruntime/fp32/b1/tdefault",
               "screening_only": False, "caveats": [], "headline": "p90 1.500 ms"}  # fmt: skip
#: One malformed JSON value in one run row, and the field its line must name.
MALFORMED = [({"winner": "a string"}, "winner"), ({"winner": [1, 2]}, "winner"),
             ({"winner": {**GOOD_WINNER, "value": "fast"}}, "winner.value"), ({"skipped": {"engine": "x"}}, "skipped"),
             ({"skipped": [{"engine": 3, "reason": "r"}]}, "skipped.0.engine"),
             ({"winner": {**GOOD_WINNER, "statistic": "p" * 100_000}}, "winner.statistic")]  # fmt: skip


# -- case 11: the fleet's rows ----------------------------------------------------------------------------


def _register(url: str, *names: str) -> None:
    from autodeploy import __version__
    from autodeploy.device import probe_device
    from autodeploy.fleet import ledger
    from autodeploy.results_db.store import Store

    with Store.open(url) as store:
        for name in names:
            ledger.register(store, name, probe_device(), {"onnxruntime": "available"}, (), __version__)


def _plant(url: str, **rows: dict) -> dict[str, int]:
    """Three devices; job A on all of them (its runs set to ``rows[device]``), job B on ``good`` alone, done.
    Returns the ids: ``job_a``, ``job_b`` and each device's run of job A."""
    from autodeploy.fleet import ledger
    from autodeploy.results_db.store import Store

    _register(url, "good", "bad", "evil")
    with Store.open(url) as store:
        sha = ledger.put_blob(store, b"not a model: no agent runs these jobs")
        made = {}
        for key, devices in (("job_a", "all"), ("job_b", "good")):
            job, runs = ledger.add_job(store, model_name=f"model-{key}", model_file="m.onnx", model_sha256=sha, data=None,
                                       options={}, devices=devices, lost_after_s=1800, command=None)  # fmt: skip
            made[key] = job.id
            if key == "job_a":
                made.update({r.device: r.id for r in runs})
            else:
                rows["good_b"] = {"winner": GOOD_WINNER}
                made["good_b"] = runs[0].id
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    update = sa.text(
        "UPDATE ad_fleet_runs SET state = 'done', winner = :winner, skipped = :skipped WHERE id = :id"
    )
    update = update.bindparams(sa.bindparam("winner", type_=sa.JSON), sa.bindparam("skipped", type_=sa.JSON))
    with engine.begin() as conn:
        for device, values in rows.items():
            conn.execute(
                update, {"winner": values.get("winner"), "skipped": values.get("skipped"), "id": made[device]}
            )
    engine.dispose()
    return made


@pytest.mark.postgres
@pytest.mark.parametrize(("malformed", "field"), MALFORMED,
                         ids=["winner-text", "winner-list", "value", "skipped-object", "skipped-engine", "long"])  # fmt: skip
def test_one_malformed_run_row_fails_alone_in_fleet_status(postgres_url, capsys, malformed, field):
    ids = _plant(postgres_url, good={"winner": GOOD_WINNER}, bad=malformed)
    code, out, err = run_cli(capsys, "fleet", "status", "--db", postgres_url)
    assert code == 0, err
    assert f"job {ids['job_a']}: model-job_a" in out and f"job {ids['job_b']}: model-job_b" in out
    assert out.count("onnxruntime/fp32/b1/t1") == 2  # both good winners printed
    lines = [line for line in err.splitlines() if "unreadable" in line]
    assert len(lines) == 1, err
    assert (
        f"run {ids['bad']} of fleet job {ids['job_a']} is unreadable: its {field} is not what an agent writes"
        in lines[0]
    )


@pytest.mark.postgres
@pytest.mark.parametrize("options", [[1, 2], "a string", {f"k{i}": i for i in range(300)}], ids=["list", "text", "huge"])
def test_one_malformed_job_row_fails_alone_in_fleet_status(postgres_url, capsys, options):
    """A job's options are JSON a database writer could plant: the job reads unreadable, with one line naming it,
    and the other job prints as usual."""
    ids = _plant(postgres_url, good={"winner": GOOD_WINNER})
    engine = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    update = sa.text("UPDATE ad_fleet_jobs SET options = :options WHERE id = :id").bindparams(
        sa.bindparam("options", type_=sa.JSON))
    with engine.begin() as conn:
        conn.execute(update, {"options": options, "id": ids["job_a"]})
    engine.dispose()
    code, out, err = run_cli(capsys, "fleet", "status", "--db", postgres_url)
    assert code == 0 and "Traceback" not in err, err
    assert f"job {ids['job_a']}: model-job_a on all (unreadable)" in " ".join(out.split())
    assert f"job {ids['job_b']}: model-job_b" in out and "onnxruntime/fp32/b1/t1" in out
    lines = [line for line in err.splitlines() if f"fleet job {ids['job_a']} is unreadable: its options" in line]
    assert len(lines) == 1, err


@pytest.mark.postgres
def test_a_planted_statistic_reaches_fleet_status_as_text(postgres_url, capsys):
    evil = {**GOOD_WINNER, "statistic": HOSTILE, "config": HOSTILE, "value_text": HOSTILE}
    _plant(
        postgres_url,
        good={"winner": GOOD_WINNER},
        evil={"winner": evil, "skipped": [{"engine": "x", "reason": HOSTILE}]},
    )
    code, out, err = run_cli(capsys, "fleet", "status", "--db", postgres_url)
    assert code == 0, err
    assert (
        "\x1b" not in out + err
    )  # the consoles write to a pipe: Rich adds no style, so any ESC is the row's
    assert out.count("[bold red]x[/]") >= 3  # shown as typed, never rendered (config, statistic, value text)
    assert "\\x1b[2J" in out


@pytest.mark.postgres
def test_the_fleet_json_record_holds_only_checked_values(postgres_url, capsys):
    import json

    ids = _plant(
        postgres_url, good={"winner": {**GOOD_WINNER, "beacon": "http://evil/p.png"}}, bad={"winner": [1]}
    )
    code, out, err = run_cli(capsys, "fleet", "status", "--db", postgres_url, "--format", "json")
    assert code == 0, err
    job_a = next(r for r in json.loads(out) if r["job"] == ids["job_a"])
    devices = {d["device"]: d for d in job_a["devices"]}
    assert devices["bad"]["state"] == "unreadable" and devices["bad"]["winner"] is None
    from autodeploy.fleet.readback import Winner

    shown = devices["good"]["winner"]  # a key no agent writes is not passed on; a known one unwritten reads its default
    assert "beacon" not in shown and set(GOOD_WINNER) <= set(shown) <= set(Winner.model_fields), shown


@pytest.mark.postgres
@pytest.mark.slow
def test_the_fleet_page_renders_good_jobs_and_no_live_link_from_a_planted_row(postgres_url, monkeypatch):
    pytest.importorskip("streamlit", reason="pip install 'autodeploy[dashboard]'")
    from streamlit.testing.v1 import AppTest

    from autodeploy.dashboard import APP, DB_ENV

    _plant(postgres_url, good={"winner": GOOD_WINNER}, bad={"winner": "a string"},
           evil={"winner": {**GOOD_WINNER, "statistic": HOSTILE}})  # fmt: skip
    monkeypatch.setenv(DB_ENV, postgres_url)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.switch_page("app_pages/fleet.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    grid = next(m.value for m in at.markdown if m.value.startswith("| Job |"))
    assert (
        grid.count(":green[done]") == 3 and ":red[unreadable]" in grid
    )  # both jobs' good runs, and the evil one
    assert "](http" not in grid and "![" not in grid  # no Markdown link or image is live
    assert "\\[x\\]\\(http" in grid  # the statistic shown, escaped
    table = at.dataframe[0].value
    assert set(table["State"]) == {"done", "unreadable"}


# -- partial: a full disk under a fleet agent -------------------------------------------------------------

def _agent(url: str, name: str, env: dict[str, str], preexec: object = None) -> tuple[int, str]:
    """One ``autodeploy agent --once`` run to its end: (exit code, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "autodeploy", "agent", "--db", url, "--name", name, "--once",
                             "--lease", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **env}, preexec_fn=preexec)  # type: ignore[arg-type]  # fmt: skip
    try:
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the session started above: the agent and its workers
            proc.wait(timeout=10)
    return proc.returncode, err


def _state(url: str, job: int) -> tuple[str, str | None]:
    from autodeploy.fleet import jobs
    from autodeploy.results_db.store import Store

    with Store.open(url, readonly=True) as store:
        (device,) = jobs.status(store, job)[0]["devices"]
    return device["state"], device["reason"]


def _submit(url: str, model: Path) -> int:
    from autodeploy.fleet import jobs

    return jobs.submit(str(model), db=url, devices="edge", config=JOB_CONFIG).job


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fsize", "tmpfs"])
def test_a_full_cache_disk_fails_the_run_in_one_line_not_as_an_internal_error(postgres_url, tmp_path, kind):
    model = mlp(tmp_path / "m.onnx", in_features=32_768)
    _register(postgres_url, "edge")
    job = _submit(postgres_url, model)
    cache = tmp_path / "cache"
    with small_disk(kind, cache) as preexec:
        code, err = _agent(postgres_url, "edge", {"AUTODEPLOY_CACHE": str(cache)}, preexec)
        left = sorted(p.name for p in cache.rglob("*") if p.is_file() and p.name.startswith("."))
    assert code == 0, err[-3000:]
    state, reason = _state(postgres_url, job)
    assert state == "failed" and "internal error" not in reason, reason
    assert "cannot write the model blob m.onnx" in reason and "free space on the disk of" in reason, reason
    assert left == []  # no half-written blob


@pytest.mark.postgres
@pytest.mark.slow
def test_a_full_temp_disk_fails_the_run_naming_the_disk_not_done(postgres_url, tmp_path):
    model = mlp(tmp_path / "m.onnx", in_features=32_768)
    _register(postgres_url, "edge")
    env = {"AUTODEPLOY_CACHE": str(tmp_path / "cache")}
    first = _submit(postgres_url, model)  # measured with room: its reference stays in the agent's cache
    code, err = _agent(postgres_url, "edge", env)
    assert code == 0 and _state(postgres_url, first)[0] == "done", err[-3000:]
    second = _submit(postgres_url, model)
    with small_disk("tmpfs", tmp_path / "tmp"):
        code, err = _agent(postgres_url, "edge", {**env, "TMPDIR": str(tmp_path / "tmp")})
    assert code == 0, err[-3000:]
    state, reason = _state(postgres_url, second)
    assert state == "failed", (state, reason)
    assert "free space on the disk of" in reason, (
        reason
    )  # screening failed, or each finalist: the disk is named
    assert "set TMPDIR to a folder on a disk with room" in reason, reason


# -- partial: odd model_file names --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "written"), [("..", "model"), ("...", "model"), ("m..onnx", "m.onnx"), ("m.", "m")]
)
def test_a_model_file_name_is_always_a_plain_file_name(name, written):
    from autodeploy.fleet import jobs

    assert jobs.safe_file_name(name) == written


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("name", ["..", ".", ""])
def test_an_odd_model_file_name_in_a_job_row_leaves_no_temp_file(postgres_url, tmp_path, name):
    _register(postgres_url, "edge")
    job = _submit(postgres_url, mlp(tmp_path / "m.onnx"))
    engine = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:  # as anyone with the database URL could
        conn.execute(
            sa.text("UPDATE ad_fleet_jobs SET model_file = :name WHERE id = :id"), {"name": name, "id": job}
        )
    engine.dispose()
    cache = tmp_path / "cache"
    code, err = _agent(postgres_url, "edge", {"AUTODEPLOY_CACHE": str(cache)})
    assert code == 0, err[-3000:]
    blobs = [p for p in (cache / "fleet").rglob("*") if p.is_file() and len(p.parent.name) == 64]
    assert [p.name for p in blobs] == ["model"]  # one plain file in the blob's folder, no temp file beside it
    state, reason = _state(postgres_url, job)
    assert state in ("done", "failed") and "internal error" not in (reason or ""), reason


# -- case 12 and the timing partials: one line with the fix ---------------------------------------------------


def test_a_shape_whose_batch_dim_is_not_the_batch_is_refused(here, capsys):
    model = mlp(here / "m.onnx")
    code, out, err = run_cli(capsys, "bench", str(model), "--shape", "x=100000000x8", "--batch", "1")
    assert code == 2, out + err
    assert err.strip() == ("error: --shape x=100000000x8 sets the batch dim (axis 0) to 100000000, but the batch is 1: it "
                           "would be stored under 100000000x8 and fed 1 item(s); fix: give --shape x=1x8 and the batch "
                           "with --batch 100000000")  # fmt: skip


def test_a_tune_shape_whose_batch_dim_is_not_a_searched_batch_is_refused(here, capsys):
    model = mlp(here / "m.onnx")
    code, out, err = run_cli(
        capsys, "tune", str(model), "--shape", "x=7x8", "--batch", "1", "--engine", "onnxruntime"
    )
    assert code == 2, out + err
    assert (
        "error: --shape x=7x8 sets the batch dim (axis 0) to 7, but the batch is 1" in err
        and "Traceback" not in err
    )


@pytest.mark.parametrize(("flags", "line"), [
    (["--min-samples", "200000"], "error: --min-samples 200000 is outside 2..100,000"),
    (["--max-duration", "-1"], "error: --max-duration -1 is outside 0..86400 seconds"),
    (["--min-duration", "1e308"], "error: --min-duration 1e+308 is outside 0..60 seconds (--max-duration)"),
    (["--min-duration", "5", "--max-duration", "1e308"], "error: --max-duration 1e+308 is outside 0..86400 seconds"),
])  # fmt: skip
def test_bundle_run_timing_flags_out_of_bounds_are_one_line(bundle, here, capsys, flags, line):
    code, out, err = run_cli(capsys, "bundle", "run", str(bundle), *flags)
    assert code == 2, out + err
    assert err.startswith(line) and "; fix: " in err and len(err.strip().splitlines()) == 1, err


def test_a_finalist_spread_past_a_day_is_refused_in_the_config(here, capsys):
    model = mlp(here / "m.onnx")
    config = here / "study.yaml"
    config.write_text(f"model: {model}\nengines: [onnxruntime]\nfinalists: {{spread_s: 1e12}}\n")
    code, out, err = run_cli(capsys, "tune", "--config", str(config))
    assert code == 2, out + err
    assert (
        "error: invalid study config: finalists.spread_s: Input should be less than or equal to 86400" in err
    )


def test_a_study_config_asking_more_samples_than_the_harness_times_is_refused(here, capsys):
    model = mlp(here / "m.onnx")
    config = here / "study.yaml"
    config.write_text(f"model: {model}\nengines: [onnxruntime]\nscreening: {{min_samples: 200000}}\n")
    code, out, err = run_cli(capsys, "tune", "--config", str(config))
    assert code == 2 and "Traceback" not in err, out + err
    assert "error: invalid study config: screening.min_samples: Input should be less than or equal to 100000" in err
