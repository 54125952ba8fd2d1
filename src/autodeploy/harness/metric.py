"""A user's task metric (``--metric FILE.py:FUNCTION``), as Olive and Neural Compressor take one.

The function receives the model's outputs on the evaluation inputs and their labels and returns one
number, higher is better (accuracy, mAP, F1, a negated error)::

    def top5(outputs: dict[str, numpy.ndarray], labels: numpy.ndarray | None) -> float:
        logits = outputs["logits"]               # [n_items, ...], every evaluation item
        return float((numpy.argsort(-logits, 1)[:, :5] == labels[:, None]).any(1).mean())

It is called on the engine's outputs and on the ONNX Runtime FP32 reference's, so its drop is
reported beside the built-in accuracy, and ``--max-metric-drop`` bounds it. The metric is code, so it
is only ever the user's own ``.py`` file named on the command line (``metrics.py:top5``): never an
import path (``subprocess:call`` would run any installed callable), never a key of a study config and
never read back from the store (a config file or a database holds data, and data must not run code).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from autodeploy.errors import UsageError

Metric = Callable[[Mapping[str, np.ndarray], "np.ndarray | None"], float]
_FIX = "give --metric FILE.py:FUNCTION, your own Python file, e.g. --metric mymetrics.py:top5"


def _parse(spec: str) -> tuple[Path, str]:
    """The file and function of ``FILE.py:FUNCTION``.

    Raises:
        UsageError: not of that form (an import path is refused: it names code the user did not write),
            or no such file.
    """
    name, sep, function = spec.rpartition(":")
    if not sep or not name or not function.isidentifier():
        raise UsageError(f"cannot parse --metric {spec!r}", fix=_FIX)
    if not name.endswith(".py"):
        raise UsageError(f"--metric {spec!r} is not a .py file: a metric is your own file, never a module path", fix=_FIX)
    path = Path(name).resolve()
    if not path.is_file():
        raise UsageError(f"--metric {spec!r}: file {name} not found", fix=_FIX)
    return path, function


def identity(spec: str) -> dict[str, str]:
    """What a study records of its metric to tell a resume with another one: the function and the file's SHA-256.

    Raises:
        UsageError: as :func:`load_metric`'s spec check.
    """
    path, function = _parse(spec)
    return {"function": function, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def load_metric(spec: str) -> Metric:
    """The function ``spec`` (``FILE.py:FUNCTION``) names.

    Raises:
        UsageError: a malformed spec, a module path, a file that cannot be imported, or no such function.
    """
    path, function = _parse(spec)
    module = _import(path, spec)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise UsageError(f"--metric {spec!r}: file {path.name} has no function {function!r}", fix=_FIX)
    return fn  # type: ignore[no-any-return]


def _import(path: Path, spec: str) -> object:
    name = path.name
    try:
        where = importlib.util.spec_from_file_location(f"autodeploy_metric_{path.stem}", path)
        if where is None or where.loader is None:
            raise UsageError(f"--metric {spec!r}: cannot import {name}", fix=_FIX)
        module = importlib.util.module_from_spec(where)
        where.loader.exec_module(module)
        return module
    except UsageError:
        raise
    except Exception as exc:  # the user's module failed while importing: say how, in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"--metric {spec!r}: importing {name} failed: {type(exc).__name__}: {first}",
                         fix="fix the module so that it imports") from None  # fmt: skip


def score(fn: Metric, spec: str, outputs: Mapping[str, np.ndarray], labels: np.ndarray | None) -> float:
    """``fn(outputs, labels)`` as a finite float.

    Raises:
        ValueError: the function raised, or returned something that is not a finite number.
    """
    try:
        value = fn(outputs, labels)
    except Exception as exc:  # the user's code: its failure is the trial's, said in one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"metric {spec} raised {type(exc).__name__}: {first}") from None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"metric {spec} returned {type(value).__name__}, not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"metric {spec} returned {number}, not a finite number")
    return number
