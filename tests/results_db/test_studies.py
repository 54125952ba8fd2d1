"""Studies in the store: saved, resumed, finished, with their trials by phase (every backend)."""

from autodeploy.results_db import Store, TrialFilter
from tests.results_db.factories import DEVICE, MODEL, failed_result, ok_result


def test_study_round_trip_and_resume(store: Store) -> None:
    first = store.save_study("s1", model=MODEL, device=DEVICE, objective="latency",
                             settings={"trials": 3}, command="autodeploy tune m")  # fmt: skip
    again = store.save_study("s1", model=MODEL, device=DEVICE, objective="latency",
                             settings={"trials": 5}, command="autodeploy tune m --resume")  # fmt: skip
    assert again == first
    row = store.get_study("s1")
    # The resume refreshes the settings but keeps the command that created the study: a `--resume
    # --trials 0` names no --data or --engine, and the reproduce line lost them.
    assert row.settings == {"trials": 5} and row.command == "autodeploy tune m" and row.winner_uid is None
    assert row.model_sha256 == MODEL.sha256 and row.device_fingerprint == DEVICE.fingerprint
    assert store.get_study("nope") is None


def test_study_trials_by_phase_and_winner(store: Store) -> None:
    store.save_study("s2", model=MODEL, device=DEVICE, objective="latency", settings={}, command=None)
    store.add_trial(ok_result("a", artifact_path="/tmp/art"), model=MODEL, device=DEVICE, study="s2",
                    phase="screening")  # fmt: skip
    store.add_trial(failed_result("b"), model=MODEL, device=DEVICE, study="s2", phase="screening")
    store.add_trial(ok_result("c"), model=MODEL, device=DEVICE, study="s2", phase="finalist")
    store.add_trial(ok_result("d"), model=MODEL, device=DEVICE, study="other", phase="screening")
    assert [t.uid for t in store.trials(TrialFilter(study="s2"))] == ["a", "b", "c"]
    screening = store.trials(TrialFilter(study="s2", phase="screening"))
    assert [t.uid for t in screening] == ["a", "b"] and screening[0].artifact_path == "/tmp/art"
    store.finish_study("s2", winner_uid="c", summary={"tie": False, "finalists": [{"uid": "c"}]})
    row = store.get_study("s2")
    assert row.winner_uid == "c" and row.summary["finalists"][0]["uid"] == "c"
    assert [s.name for s in store.list_studies()][0] == "s2"


def test_a_studys_trials_keep_the_other_filters(store: Store) -> None:
    # `results list --study S --status failed` listed every trial of S: --study ignored --status.
    store.save_study("s3", model=MODEL, device=DEVICE, objective="latency", settings={}, command=None)
    for result in (ok_result("a"), failed_result("b"), failed_result("c")):
        store.add_trial(result, model=MODEL, device=DEVICE, study="s3")
    store.add_trial(failed_result("d"), model=MODEL, device=DEVICE, study="other")
    assert [t.uid for t in store.trials(TrialFilter(study="s3", status="failed"))] == ["b", "c"]  # oldest first
    assert [t.uid for t in store.trials(TrialFilter(study="s3", status="ok"))] == ["a"]
    assert [t.uid for t in store.trials(TrialFilter(study="s3", limit=2))] == ["a", "b"]
