"""Round 4 (issue 37), the store's partials: a URL option of the wrong type and a full disk each say what failed in
one line, and so does the zoo's cache on a full disk (it printed a traceback before the store was reached)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys

from autodeploy.errors import StoreError
from autodeploy.results_db import Store

LIMIT = 40_000  # bytes a child may write per file: room for the zoo's mlp, not for a results database


def _limited() -> None:  # in the child: a write past the limit fails with EFBIG (as a full disk fails with ENOSPC)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _bench(tmp_path, cache, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AUTODEPLOY_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "autodeploy", "bench", "zoo:mlp", "--engine", "onnxruntime",
                           "--threads", "1", "--min-duration", "0.1", *extra], preexec_fn=_limited,
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip


def test_a_url_option_of_the_wrong_type_is_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}?timeout=abc"
    try:
        Store.open(url)
    except StoreError as err:
        text = str(err)
    else:
        raise AssertionError("a timeout of 'abc' was accepted")
    assert "an option in its URL is not valid" in text and "'abc'" in text and "\n" not in text


def test_a_store_on_a_full_disk_says_the_disk_refused_the_write(tmp_path):
    cache = tmp_path / "cache"
    subprocess.run([sys.executable, "-c", "from autodeploy import zoo; zoo.get('mlp')"], check=True,
                   env={**os.environ, "AUTODEPLOY_CACHE": str(cache)})  # the model cached before the disk fills  # fmt: skip
    done = _bench(tmp_path, cache, "--db", f"sqlite:///{tmp_path / 'r.db'}")
    line = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "the disk refused the write" in line and "free disk space" in line and "check the database URL" not in line


def test_the_zoo_cache_on_a_full_disk_is_one_line(tmp_path):
    done = _bench(tmp_path, tmp_path / "cache", "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: cannot write mlp-") and "nothing was left behind" in line
    assert not [p for p in (tmp_path / "cache" / "zoo").iterdir() if p.name.endswith(".tmp")]


def test_a_bundle_manifest_is_strict_json(tmp_path):
    """An output bit-exact to its reference has SQNR inf: the manifest said ``Infinity``, which strict parsers refuse."""
    import json

    import autodeploy.api
    from autodeploy.bundle import export
    from tests.bundle.conftest import FAST
    from tests.models import detector

    db = f"sqlite:///{tmp_path / 'r.db'}"
    stored = autodeploy.api.bench(detector(tmp_path / "d.onnx"), engine="onnxruntime", threads=1, timing=FAST, db=db,
                                  cache=tmp_path / "cache")  # fmt: skip
    assert any(o.sqnr_db == float("inf") for o in stored.result.accuracy.outputs)  # ORT fp32 against itself
    with Store.open(db, readonly=True) as store:
        folder = export.write_bundle(export.stored_trial(store, stored.id), tmp_path / "bundle")
    text = (folder / "manifest.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))  # strict: no constants
