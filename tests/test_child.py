"""The one child protocol (``child.py``): real children, each failing one way, each read back as one line."""

from __future__ import annotations

import json
import re
import time

import pytest

from autodeploy.child import REPORTED, ChildFailed, child_main, first_line, last_line, run_code, run_module


def _failure(code: str, **kwargs) -> ChildFailed:
    with pytest.raises(ChildFailed) as failed:
        run_code(code, **{"timeout_s": 60, **kwargs})
    return failed.value


def test_a_child_that_reports_gives_its_own_line():
    code = ("import sys\nfrom autodeploy.child import child_main, last_line\n"
            "def work():\n    raise ValueError('the reader says:\\n  op FOO  is unknown\\n')\n"
            "sys.exit(child_main(work, reason=last_line))\n")  # fmt: skip
    failed = _failure(code)
    assert (failed.reason, failed.reported, failed.timed_out) == ("op FOO is unknown", True, False)


def test_only_the_last_line_printed_is_the_reason():
    failed = _failure("import sys\nprint('progress 50%')\nprint('the file is truncated')\nsys.exit(3)")
    assert failed.reported and failed.reason == "the file is truncated"


def test_a_child_killed_by_a_signal_is_named():
    failed = _failure("import os\nprint('half way', flush=True)\nos.kill(os.getpid(), 9)")
    assert (failed.reason, failed.signal, failed.reported) == ("it crashed (SIGKILL)", "SIGKILL", False)


def test_a_child_that_runs_too_long_is_stopped():
    start = time.monotonic()
    failed = _failure("import time\ntime.sleep(60)", timeout_s=0.5)
    assert time.monotonic() - start < 30
    assert failed.timed_out and failed.reason == "it did not finish within 0.5 s"


def test_a_traceback_gives_its_last_line():
    failed = _failure("def deep():\n    raise RuntimeError('the weights are missing')\ndeep()")
    assert failed.reason == "RuntimeError: the weights are missing" and not failed.reported
    # the tail of what it wrote, for a caller that looks further (a MemoryError)
    assert failed.said[0] == "Traceback (most recent call last):"


def test_exit_3_with_nothing_printed_is_not_a_report():
    failed = _failure("import sys\nsys.stderr.write('something broke\\n')\nsys.exit(3)")
    assert (failed.reason, failed.reported) == ("something broke", False)


def test_a_silent_failure_gives_its_exit_code():
    assert _failure("import sys\nsys.exit(7)").reason == "exit code 7"


def test_past_its_memory_cap_a_child_fails_with_a_memory_error():
    failed = _failure("b = bytearray(2 * 1024**3)", memory_cap_mb=400)
    assert any("MemoryError" in line for line in failed.said[-5:]), failed.said


def test_success_returns_the_last_line_and_the_child_sees_no_secret(monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    code = "import os, json\nprint('warming up')\nprint(json.dumps(dict(os.environ)))"
    seen = json.loads(run_code(code, timeout_s=60, env_extra={"TF_CPP_MIN_LOG_LEVEL": "3"}))
    assert seen["TF_CPP_MIN_LOG_LEVEL"] == "3" and "PGPASSWORD" not in seen
    assert run_code("pass", timeout_s=60) == ""


def test_run_module_runs_a_module_as_main(tmp_path):
    (tmp_path / "in.json").write_text('{"a": [1, 2]}')
    assert run_module("json.tool", "--compact", str(tmp_path / "in.json"), timeout_s=60) == '{"a":[1,2]}'
    with pytest.raises(ChildFailed, match="can't open") as failed:
        run_module("json.tool", str(tmp_path / "missing.json"), timeout_s=60)
    assert not failed.value.reported


def test_child_main_prints_json_or_one_line(capsys):
    assert child_main(lambda: {"inputs": []}) == 0 and capsys.readouterr().out == '{"inputs": []}\n'
    assert child_main(lambda: None) == 0 and capsys.readouterr().out == ""

    def fail() -> None:
        raise KeyError("a\nb\r\nc")

    assert child_main(fail, reported=KeyError) == REPORTED and capsys.readouterr().out.count("\n") == 1
    # not the reported kind: it escapes, and the parent reads its traceback
    with pytest.raises(ZeroDivisionError):
        child_main(lambda: 1 / 0, reported=KeyError)


def test_the_line_of_an_exception():
    noise = re.compile(r"^Exception from \S+:\d+:$")
    source = "Exception from src/x.cpp:9:"
    exc = RuntimeError(f"{source}\nCheck failed: the IR has no outputs\n\n{source}\n")
    assert last_line(exc, noise=noise) == "Check failed: the IR has no outputs"
    assert last_line(RuntimeError(source), noise=noise) == source  # nothing else: the noise, not nothing
    assert last_line(ValueError()) == "ValueError" == first_line(ValueError("  "))
    said = first_line(ValueError("\n  Load model failed: NoSuchOp\n  at node 3"))
    assert said == "Load model failed: NoSuchOp"
