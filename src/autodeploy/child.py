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
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable

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
