"""Security round 4 (issue 37), part B: a config file is data and never runs code.

A metric is the user's own ``.py`` file named on the command line: never a module path
(``subprocess:call`` names any installed callable), never a key of a YAML config, never read back from
a stored study; a resume judged by another metric is refused (accuracy is reused per artifact). The
config file read is named, YAML aliases (billion laughs) are refused before any study exists, and
``--accuracy`` thresholds that are not finite are refused.
"""

from __future__ import annotations

import time

import optuna
import pytest

from autodeploy.errors import UsageError
from autodeploy.search import config as study_config
from tests.cli_runner import run_cli
from tests.models import mlp

FAST = ["--engine", "onnxruntime", "--precision", "fp32", "--threads", "1", "--batch", "1", "--min-samples", "16",
        "--min-duration", "0.1", "--finalists", "0"]  # fmt: skip


@pytest.fixture
def here(here):
    """The CLI's working folder (``conftest.here``) with a model and a metric file that leaves a mark."""
    tmp_path = here
    mlp(tmp_path / "m.onnx")
    (tmp_path / "marker.py").write_text(
        "import pathlib\n\ndef hit(outputs, labels):\n    pathlib.Path('HIT').write_text('ran')\n    return 1.0\n"
    )
    return tmp_path


def _studies(tmp_path) -> list[str]:
    if not (tmp_path / "r.db").exists():
        return []
    return optuna.study.get_all_study_names(storage=f"sqlite:///{tmp_path / 'r.db'}")


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("config: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_module_path_metric_is_refused(here, capsys):
    # `subprocess:call` with outputs named sh, -c, CMD ran CMD in the worker.
    code, _, err = run_cli(capsys, "tune", "m.onnx", "--name", "s", "--metric", "subprocess:call", "--trials", "1", *FAST)
    assert code == 2
    assert "not a .py file" in _one_line(err) and "--metric FILE.py:FUNCTION" in err
    assert _studies(here) == []
    with pytest.raises(UsageError, match="not a .py file"):
        from autodeploy.harness.metric import load_metric

        load_metric("os:system")


def test_a_config_that_names_a_metric_is_refused(here, capsys):
    (here / "study.yaml").write_text("model: m.onnx\nmetric: marker.py:hit\n")
    code, _, err = run_cli(capsys, "tune", "--config", "study.yaml", "--name", "s", "--trials", "1", *FAST)
    assert code == 2
    line = _one_line(err)
    assert "may not name a metric" in line and "--metric FILE.py:FUNC" in line
    assert not (here / "HIT").exists() and _studies(here) == []


def test_a_stored_metric_never_comes_back():
    # A stored study's settings are the base of a resume: its metric is not taken from there.
    cfg = study_config.validate({}, {"model": "m.onnx"}, base={"model": "m.onnx", "metric": "subprocess:call"})
    assert cfg.metric is None
    cfg = study_config.validate({}, {"model": "m.onnx", "metric": "marker.py:hit"}, base={"metric": "subprocess:call"})
    assert cfg.metric == "marker.py:hit"


def test_the_config_file_read_is_named(here, capsys):
    # `--config latency-mobilenetv2.yaml` from a README silently read a planted file of that name here.
    name = "latency-mobilenetv2.yaml"
    assert (study_config.EXAMPLES / name).is_file()
    (here / name).write_text("model: planted.onnx\n")
    code, _, err = run_cli(capsys, "tune", "--config", name, "--name", "s", "--trials", "1", *FAST)
    assert code != 0  # the planted config names a model that is not there
    assert f"config: {here / name}" in err
    (here / name).unlink()
    assert study_config.resolve(name) == study_config.EXAMPLES / name


BILLION_LAUGHS = """model: m.onnx
knobs:
  onnxruntime:
    a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
    g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
    h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
    i: [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def test_yaml_aliases_are_refused_before_any_study(here, capsys):
    (here / "laughs.yaml").write_text(BILLION_LAUGHS)
    started = time.monotonic()
    with pytest.raises(UsageError, match="anchors and aliases"):
        study_config.read(here / "laughs.yaml")
    assert time.monotonic() - started < 2
    # A harmless alias too (a real tune would go on past the study's creation): refused, no study made.
    (here / "alias.yaml").write_text("model: m.onnx\nthreads: &t [1]\nbatches: *t\n")
    code, _, err = run_cli(capsys, "tune", "--config", "alias.yaml", "--name", "s", "--trials", "1", *FAST)
    assert code == 2 and "anchors and aliases" in _one_line(err)
    assert _studies(here) == []


def test_knob_choices_are_scalars():
    with pytest.raises(UsageError, match="knobs"):
        study_config.validate({"model": "m.onnx", "knobs": {"onnxruntime": {"x": [[1, 2], [3]]}}}, {})
    cfg = study_config.validate({"model": "m.onnx", "knobs": {"onnxruntime": {"x": [1, "a", 0.5, True, None]}}}, {})
    assert cfg.knobs == {"onnxruntime": {"x": [1, "a", 0.5, True, None]}}


@pytest.mark.parametrize("rule", ["logits=cosine:nan", "logits=cosine:inf", "logits=decision:-inf",
                                  "logits=decision:1.5", "logits=cosine:1.01"])  # fmt: skip
def test_accuracy_thresholds_must_be_finite_and_in_range(here, capsys, rule):
    code, _, err = run_cli(capsys, "bench", "m.onnx", "--accuracy", rule, "--engine", "onnxruntime",
                           "--precision", "fp32", "--threads", "1", "--min-samples", "16", "--min-duration", "0.1")  # fmt: skip
    assert code == 2 and rule in _one_line(err)


def test_a_resume_with_another_judge_is_refused(here, capsys):
    # The reused accuracy predates a metric added on --resume: `g` always raised and a winner was crowned.
    (here / "g.py").write_text("def g(outputs, labels):\n    raise RuntimeError('never passes')\n")
    code, _, err = run_cli(capsys, "tune", "m.onnx", "--name", "s", "--trials", "1", *FAST)
    assert code == 0, err
    code, _, err = run_cli(capsys, "tune", "m.onnx", "--name", "s", "--resume", "--trials", "1",
                           "--metric", "g.py:g", "--max-metric-drop", "0", *FAST)  # fmt: skip
    assert code == 2, err
    line = _one_line(err)
    assert "judged by no --metric, this run by --metric …:g" in line and "another --name" in line
    # Its own judge (none) resumes; a study made with a metric refuses a resume without it, or with the file changed.
    code, _, err = run_cli(capsys, "tune", "m.onnx", "--name", "s", "--resume", "--trials", "1", *FAST)
    assert code == 0, err
    code, _, err = run_cli(capsys, "tune", "m.onnx", "--name", "t", "--trials", "1", "--metric", "marker.py:hit", *FAST)
    assert code == 0, err
    (here / "marker.py").write_text((here / "marker.py").read_text() + "\n# changed\n")
    for extra in ([], ["--metric", "marker.py:hit"]):
        code, _, err = run_cli(capsys, "tune", "m.onnx", "--name", "t", "--resume", "--trials", "1", *extra, *FAST)
        assert code == 2 and "was judged by --metric …:hit" in _one_line(err)


def test_a_new_study_with_a_metric_never_takes_a_measurement_judged_without_it(here, capsys):
    """A config measured before (a study without a metric) is taken from the store by a new study: its accuracy
    was judged without this study's --metric, which then never ran (``search/screening.py``)."""
    code, _, err = run_cli(capsys, "tune", "m.onnx", "--name", "plain", "--trials", "1", *FAST)
    assert code == 0, err
    code, _, err = run_cli(capsys, "tune", "m.onnx", "--name", "judged", "--trials", "1", "--metric", "marker.py:hit", *FAST)
    assert code == 0, err
    assert (here / "HIT").read_text() == "ran"  # measured afresh: the metric ran on its outputs
