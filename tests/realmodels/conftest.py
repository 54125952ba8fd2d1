"""Fixtures of the real-model corpus: the photos, one shared workdir per session (so each model
is converted once per engine and precision), and the table of what each run ended in."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.realmodels.corpus import WHEELS

ROWS: list[dict] = []


@pytest.fixture(scope="session")
def photos() -> list[np.ndarray]:
    sklearn = pytest.importorskip("sklearn.datasets", reason="scikit-learn (the dev extras) gives the photos")
    return list(sklearn.load_sample_images().images)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("realmodels")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not ROWS:
        return
    terminalreporter.section("real-model corpus")
    for row in ROWS:
        terminalreporter.write_line(
            f"{row['model']:18} {row['engine']:11} {row['precision']:12} {row['outcome']}"
        )
    save(ROWS, WHEELS / "corpus-results.json")


def save(rows: list[dict], path: Path) -> None:
    """Merge this run's rows into ``path``: a row replaces the one of the same model, engine and
    precision; rows this run did not reach (a ``-k`` selection, an interrupted run) are kept."""
    from autodeploy.device import probe_device

    cpu = probe_device().cpu_line()
    key = lambda r: (r["model"], r["engine"], r["precision"])  # noqa: E731
    kept = json.loads(path.read_text()) if path.is_file() else []
    merged = {key(r): r for r in kept} | {key(r): {**r, "cpu": cpu} for r in rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(merged.values()), indent=1))
