"""How autodeploy starts a Python child (worker, dashboard server, converter, model probe).

``python -m MODULE`` and ``python -c CODE`` put the working folder first on ``sys.path``, so a
``platform.py`` (or an ``autodeploy/`` folder) in the folder the user runs from would be imported
by the child before the real one. Every child is started from :func:`module_argv` or
:func:`code_argv`, which leave the working folder off the path: ``-P`` on Python >= 3.11, and on
3.10 a ``-c`` bootstrap that drops ``sys.path[0]`` before anything else is imported. ``-I`` and
``-E`` are not used: they would also drop ``PYTHONPATH`` and the user's environment.

A child reads files it was handed (a model, a ``.pt2``, a ``.tflite``), so its environment is this one less
every secret (:func:`child_env`): a fleet agent's ``AUTODEPLOY_DB`` holds the fleet's credentials, and a child
that a hostile file managed to steer must not find them. No child writes to the results database.

A child that reads or converts a file (a format's interface, a ``.tflite`` or ``.pt2`` to ONNX, a model ONNX Runtime
loads) speaks one protocol, written here once: the parent runs it with :func:`run_module` (or :func:`run_code`) and
gets the last line it printed, or a :class:`ChildFailed` carrying its one-line reason; the child's ``main`` is
:func:`child_main`, which prints its result as one JSON line, or its own reason as one line and exits
:data:`REPORTED`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any

#: Python 3.10 has no ``-P``: drop the working folder (``''``, first for ``-c``), then run the module as ``-m`` would.
_BOOTSTRAP = (
    "import sys\n"
    "if sys.path and sys.path[0] == '': del sys.path[0]\n"
    "import runpy\n"
    "sys.argv[:] = sys.argv[1:]\n"
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
)
_DROP_CWD = "import sys\nif sys.path and sys.path[0] == '': del sys.path[0]\n"
_HAS_SAFE_PATH = sys.version_info >= (3, 11)


def module_argv(module: str, *args: str, safe_path_flag: bool = _HAS_SAFE_PATH) -> list[str]:
    """``python -m module args...``, without the working folder on the child's ``sys.path``."""
    if safe_path_flag:
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _BOOTSTRAP, module, *args]


def code_argv(code: str, *args: str, safe_path_flag: bool = _HAS_SAFE_PATH) -> list[str]:
    """``python -c code args...``, without the working folder on the child's ``sys.path``."""
    if safe_path_flag:
        return [sys.executable, "-P", "-c", code, *args]
    return [sys.executable, "-c", _DROP_CWD + code, *args]


#: Variables a child never gets: the results database's URL (with its password) and libpq's secrets.
SECRETS = ("AUTODEPLOY_DB", "DATABASE_URL", "PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE", "PGSSLKEY")
#: Any other variable named like a credential.
SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|PRIVATE_KEY|API_KEY", re.IGNORECASE)


def is_secret(name: str) -> bool:
    """Whether the environment variable ``name`` is kept from children (:data:`SECRETS`, :data:`SECRET_NAME`)."""
    return name.upper() in SECRETS or bool(SECRET_NAME.search(name))


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child, less every secret (:func:`is_secret`), with ``PYTHONPATH`` set
    to the absolute folders on our ``sys.path``: the child sees the modules we see (plug-in and test engines
    included), never the working folder. ``extra`` variables are set on top."""
    env = {name: value for name, value in os.environ.items() if not is_secret(name)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isabs(p) and os.path.exists(p))
    return {**env, **extra}


def default_memory_cap_mb() -> int:
    """A child's memory cap when none is given (the workers' too): 75% of this machine's RAM."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.75)


def capped(memory_cap_mb: int) -> Callable[[], None]:
    """A ``preexec_fn`` that caps the child's address space at ``memory_cap_mb`` (``RLIMIT_AS``), for a child
    that no supervisor watches (the ``.pt2`` export): past it, an allocation fails in the child (a
    ``MemoryError``) instead of the machine running out of memory."""

    def limit() -> None:
        import resource

        cap = memory_cap_mb * 2**20
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(
            resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard)
        )

    return limit


# -- one protocol: run a child, read its one-line reason ------------------------------------------

#: A child's exit code when the last line it printed is its own reason, one line (:func:`child_main`).
REPORTED = 3
#: How many of a failed child's last lines ``ChildFailed.said`` keeps.
_TAIL = 10


class ChildFailed(Exception):
    """A child that did not exit 0, and why in one line (``reason``): its own words when it reported them (exit
    :data:`REPORTED`, ``reported``), ``it crashed (SIGSEGV)`` when a signal killed it (``signal``), ``it did not
    finish within N s`` when it was stopped (``timed_out``), else the last line it wrote (stderr, or stdout when it
    wrote none) or its exit code. ``said`` holds its last lines, for a caller that looks for more (a
    ``MemoryError``). Callers turn it into their own error: it never reaches the user."""

    def __init__(self, reason: str, *, reported: bool = False, timed_out: bool = False, signal: str | None = None,
                 said: tuple[str, ...] = ()) -> None:  # fmt: skip
        super().__init__(reason)
        self.reason, self.reported, self.timed_out = reason, reported, timed_out
        self.signal, self.said = signal, said


def run_module(module: str, *args: str, timeout_s: float, env_extra: Mapping[str, str] | None = None,
               memory_cap_mb: int | None = None) -> str:  # fmt: skip
    """Run ``python -m module args...`` (:func:`module_argv`) to the end: no stdin, :func:`child_env` with
    ``env_extra`` on top, stopped after ``timeout_s`` and, given ``memory_cap_mb``, :func:`capped`.

    Returns:
        The last line it printed (``""`` when none).

    Raises:
        ChildFailed: it exited other than 0, was killed or timed out; its one-line reason.
    """
    return _run(module_argv(module, *args), timeout_s, env_extra, memory_cap_mb)


def run_code(code: str, *args: str, timeout_s: float, env_extra: Mapping[str, str] | None = None,
             memory_cap_mb: int | None = None) -> str:  # fmt: skip
    """:func:`run_module` for ``python -c code args...`` (:func:`code_argv`)."""
    return _run(code_argv(code, *args), timeout_s, env_extra, memory_cap_mb)


def _run(argv: list[str], timeout_s: float, env_extra: Mapping[str, str] | None, cap_mb: int | None) -> str:
    import subprocess

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                              env=child_env(**(env_extra or {})), check=False,
                              preexec_fn=None if cap_mb is None else capped(cap_mb))  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"it did not finish within {timeout_s:g} s", timed_out=True) from None
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0:
        return lines[-1] if lines else ""
    said = tuple(line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip())[-_TAIL:]
    if done.returncode == REPORTED and lines:  # the child's own words
        raise ChildFailed(lines[-1], reported=True, said=said)
    if done.returncode < 0:
        name = _signal_name(-done.returncode)
        raise ChildFailed(f"it crashed ({name})", signal=name, said=said)
    raise ChildFailed(said[-1] if said else f"exit code {done.returncode}", said=said)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name of its own
        return f"signal {number}"


def child_main(work: Callable[[], Any], *, reported: type[BaseException] | tuple[type[BaseException], ...] = Exception,
               reason: Callable[[BaseException], str] = str) -> int:  # fmt: skip
    """A child's ``main``: run ``work``; print what it returns as one JSON line (nothing for ``None``) and return 0,
    or, when it raises ``reported``, print ``reason(exc)`` as one line (line breaks made spaces) and return
    :data:`REPORTED`, for the parent's :func:`run_module` to raise as the child's own words. Anything else
    escapes, and the parent reads the last line of its traceback."""
    try:
        result = work()
    except reported as exc:
        print(" ".join(reason(exc).split()))
        return REPORTED
    if result is not None:
        print(json.dumps(result))
    return 0


def last_line(exc: BaseException, *, noise: re.Pattern[str] | None = None) -> str:
    """The line of ``exc``'s message that says what is wrong, as a child reports it: its last non-empty line, less
    those matching ``noise`` (an engine's lines naming its own source files) when another is left, else the name
    of its type."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if noise is None or not noise.match(line)]
    return (said or lines or [type(exc).__name__])[-1]


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (ONNX's checker and ONNX Runtime say what is wrong first), else the
    name of its type."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
