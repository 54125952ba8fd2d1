"""A user's task metric (``--metric module:function``), as Olive and Neural Compressor take one.

The function receives the model's outputs on the evaluation inputs and their labels and returns one
number, higher is better (accuracy, mAP, F1, a negated error)::

    def top5(outputs: dict[str, numpy.ndarray], labels: numpy.ndarray | None) -> float:
        logits = outputs["logits"]               # [n_items, ...], every evaluation item
        return float((numpy.argsort(-logits, 1)[:, :5] == labels[:, None]).any(1).mean())

It is called on the engine's outputs and on the ONNX Runtime FP32 reference's, so its drop is
reported beside the built-in accuracy, and ``--max-metric-drop`` bounds it. ``module`` is an import
path (``mypkg.metrics``; a module in the current folder is found too) or a ``.py`` file
(``metrics.py:top5``); it is imported with :mod:`importlib`, as any import, never exec'd from text.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from autodeploy.errors import UsageError

Metric = Callable[[Mapping[str, np.ndarray], "np.ndarray | None"], float]
_FIX = "give --metric MODULE:FUNCTION (an import path or a .py file), e.g. --metric mymetrics:top5"


def load_metric(spec: str) -> Metric:
    """The function ``spec`` names.

    Raises:
        UsageError: a malformed spec, a module that cannot be imported, or no such function.
    """
    module_name, sep, function = spec.rpartition(":")
    if not sep or not module_name or not function.isidentifier():
        raise UsageError(f"cannot parse --metric {spec!r}", fix=_FIX)
    module = _import(module_name, spec)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise UsageError(f"--metric {spec!r}: module {module_name!r} has no function {function!r}", fix=_FIX)
    return fn  # type: ignore[no-any-return]


def _import(name: str, spec: str) -> object:
    try:
        if name.endswith(".py"):
            path = Path(name).resolve()
            if not path.is_file():
                raise UsageError(f"--metric {spec!r}: file {name} not found", fix=_FIX)
            where = importlib.util.spec_from_file_location(f"autodeploy_metric_{path.stem}", path)
            if where is None or where.loader is None:
                raise UsageError(f"--metric {spec!r}: cannot import {name}", fix=_FIX)
            module = importlib.util.module_from_spec(where)
            where.loader.exec_module(module)
            return module
        if os.getcwd() not in sys.path:  # `python -m` finds modules in the current folder; the script too
            sys.path.append(os.getcwd())
        return importlib.import_module(name)
    except UsageError:
        raise
    except ModuleNotFoundError as exc:
        raise UsageError(f"--metric {spec!r}: no module named {exc.name!r}", fix=_FIX) from None
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
