"""A study name never becomes a path (issue 28, case 3): refused at creation, slugged by the dashboard."""

import gzip
import shutil
import tempfile

import pytest

import autodeploy
from autodeploy.api import default_study_name
from autodeploy.device import probe_device
from autodeploy.errors import UsageError
from autodeploy.results_db import TrialFilter
from autodeploy.results_db.store import DeviceRecord, ModelRecord, Store
from autodeploy.search.config import check_study_name

BAD = ["../../../../x", "a/b", "a\\b", "..", "x..y", "new\nline", "bell\x07", "", "   ", "s" * 201]


@pytest.mark.parametrize("name", BAD)
def test_a_study_name_with_path_syntax_or_control_characters_is_refused(name):
    with pytest.raises(UsageError) as info:
        check_study_name(name)
    assert "\n" not in str(info.value) and "fix:" in str(info.value)


@pytest.mark.parametrize("name", ["s", "mlp-latency-1a2b3c4d", "[red]study[bold] x'); DROP TABLE studies;--", "é.v1"])
def test_ordinary_and_merely_odd_names_are_kept(name):
    assert check_study_name(name) == name


def test_tune_refuses_to_create_a_study_named_like_a_path(tmp_path):
    from tests.models import mlp

    db = tmp_path / "r.db"
    with pytest.raises(UsageError, match=r"study name '\.\./\.\./x' holds '/'"):
        autodeploy.tune(str(mlp(tmp_path / "m.onnx")), name="../../x", db=f"sqlite:///{db}", trials=1)
    if db.exists():
        with Store.open(f"sqlite:///{db}", readonly=True) as store:
            assert store.list_studies() == []


def test_default_study_names_pass_the_check():
    assert check_study_name(default_study_name("../../a..b/c", "latency", "0123456789")) == (
        "a.b-c-latency-01234567"
    )


def test_the_dashboard_builds_a_bundle_of_a_path_named_study_inside_its_temp_folder(stored, tmp_path, monkeypatch):
    """An old store (or another writer) holds a study named ``../../../../x``: the bundle stays in the temp folder."""
    pytest.importorskip("streamlit")
    from autodeploy.bundle import export
    from autodeploy.dashboard import DB_ENV, cache

    db = tmp_path / "r.db"
    shutil.copyfile(stored.db.removeprefix("sqlite:///"), db)
    name = "../../../../x"
    with Store.open(f"sqlite:///{db}") as store:
        trial = store.trial(TrialFilter(id=stored.trial_id))
        store.save_study(name, model=ModelRecord.of(stored.model), device=DeviceRecord.of(probe_device()),
                         objective="latency", settings={}, command=None)  # fmt: skip
        store.finish_study(name, winner_uid=trial.uid, summary={})
    deep = tmp_path / "t1" / "t2" / "t3"
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    monkeypatch.setenv(DB_ENV, f"sqlite:///{db}")
    data, file_name = cache.build_bundle(export, name)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*bundle*")) == []  # nothing escaped
    assert file_name == "x-bundle.tar.gz" and gzip.decompress(data)  # a real archive
    assert "/" not in cache.export_command(name).split(" -o ")[1].split()[0]
