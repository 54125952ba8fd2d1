"""Red-team cases: ``nan`` and ``inf`` are refused wherever a number is asked for.

``bench --scenario server --sla-ms nan`` was stored as an ok server trial with a rate of 0:
Typer's min/max (and ``x <= 0``) let nan through. Every float flag of every command, the study
config's numbers (YAML ``.nan``/``.inf``) and the preprocessing values refuse it, one line, exit 2
(64 for ``gate``, whose 2 means inconclusive), before anything runs or is stored.
"""

from __future__ import annotations

import pytest

from autodeploy.errors import UsageError
from autodeploy.results_db import Store
from tests.cli_runner import run_cli
from tests.models import mlp


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODEPLOY_DB", f"sqlite:///{tmp_path / 'r.db'}")
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    return str(mlp(tmp_path / "m.onnx"))


def _one_line(err: str) -> str:
    """The one line an error is, beside tune's ``config: PATH`` (which file it read)."""
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("config: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["bench", "{m}", "--scenario", "server", "--sla-ms", "nan"],
    ["bench", "{m}", "--scenario", "server", "--sla-ms", "inf"],
    ["bench", "{m}", "--timeout", "inf"],
    ["bench", "{m}", "--min-duration", "nan"],
    ["bench", "{m}", "--max-metric-drop", "-inf"],
    ["tune", "{m}", "--objective", "server", "--sla-ms", "inf"],
    ["tune", "{m}", "--max-accuracy-drop", "nan"],
    ["tune", "{m}", "--max-memory-mb", "inf"],
    ["inhouse", "quantize", "{m}", "-o", "{t}/q.onnx", "--budget", "nan"],
    ["bundle", "run", "{m}", "--max-duration", "inf"],
    ["bench", "{m}", "--mean-values", "[nan]"],
])  # fmt: skip
def test_non_finite_numbers_are_refused_with_one_line(model, capsys, tmp_path, argv):
    code, out, err = run_cli(capsys, *(a.format(m=model, t=tmp_path) for a in argv))
    assert code == 2, (code, out, err)
    assert "finite" in _one_line(err)
    with Store.open(f"sqlite:///{tmp_path / 'r.db'}") as store:
        assert store.count_trials() == 0  # refused before anything ran


def test_gate_refuses_them_as_bad_input(model, capsys):
    code, _, err = run_cli(capsys, "gate", "--baseline", model, "--candidate", model, "--timeout", "nan")
    assert code == 64 and "--timeout nan is not a finite number" in _one_line(err)


@pytest.mark.parametrize("yaml_text", [
    "objective: server\nconstraints: {sla_ms: .nan}\n",
    "constraints: {max_accuracy_drop: .nan}\n",
    "screening: {timeout_s: .inf}\n",
    "preprocess: {mean_values: [1, .nan, 2]}\n",
])  # fmt: skip
def test_a_study_config_with_nan_or_inf_is_refused(model, capsys, tmp_path, yaml_text):
    config = tmp_path / "study.yaml"
    config.write_text(yaml_text)
    code, _, err = run_cli(capsys, "tune", model, "--config", str(config), "--trials", "1")
    assert code == 2 and "finite number" in _one_line(err), err


def test_the_library_refuses_a_nan_sla_too(model):
    import autodeploy

    with pytest.raises(UsageError, match="finite"):
        autodeploy.bench(model, scenario="server", sla_ms=float("nan"))
