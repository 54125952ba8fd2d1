"""How autodeploy starts a Python child (worker, dashboard server, converter, model probe).

``python -m MODULE`` and ``python -c CODE`` put the working folder first on ``sys.path``, so a
``platform.py`` (or an ``autodeploy/`` folder) in the folder the user runs from would be imported
by the child before the real one. Every child is started from :func:`module_argv` or
:func:`code_argv`, which leave the working folder off the path: ``-P`` on Python >= 3.11, and on
3.10 a ``-c`` bootstrap that drops ``sys.path[0]`` before anything else is imported. ``-I`` and
``-E`` are not used: they would also drop ``PYTHONPATH`` and the user's environment.
"""

from __future__ import annotations

import os
import sys

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


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child, with ``PYTHONPATH`` set to the absolute folders on our
    ``sys.path``: the child sees the modules we see (plug-in and test engines included), never the
    working folder. ``extra`` variables are set on top."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isabs(p) and os.path.exists(p))
    return {**env, **extra}
