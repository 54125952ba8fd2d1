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
    WHEELS.mkdir(parents=True, exist_ok=True)
    (WHEELS / "corpus-results.json").write_text(json.dumps(ROWS, indent=1))
