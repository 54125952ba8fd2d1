"""The bundle fixtures (a real measured trial in a real store, and bundles exported from it), and a working
folder for CLI runs."""

import pytest

from autodeploy.cli import _common
from tests.bundle.conftest import bundle, stored  # noqa: F401 - re-exported fixtures


@pytest.fixture
def here(tmp_path, monkeypatch):
    """``tmp_path`` as the working folder of a CLI run: its own cache and store, wide output."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTODEPLOY_DB", f"sqlite:///{tmp_path / 'r.db'}")
    monkeypatch.setattr(_common.out, "width", 200)
    monkeypatch.setattr(_common.err, "width", 400)
    return tmp_path
