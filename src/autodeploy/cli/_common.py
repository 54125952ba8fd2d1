"""Helpers shared by commands: consoles, model references, the store, the cache folder."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from autodeploy.data import Dataset
from autodeploy.model import ModelInfo, load_model

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def cache_dir() -> Path:
    """Where zoo models, data and artifacts are cached: ``$AUTODEPLOY_CACHE`` or the user cache folder."""
    from platformdirs import user_cache_dir

    return Path(os.environ.get("AUTODEPLOY_CACHE") or user_cache_dir("autodeploy"))


@dataclass(frozen=True)
class ResolvedModel:
    info: ModelInfo
    data: Dataset | None = None  # a zoo model's own labelled evaluation data
    calibration: Dataset | None = None


def resolve_model(ref: str, shapes: dict[str, tuple[int, ...]]) -> ResolvedModel:
    """Load ``PATH.onnx`` or ``zoo:NAME`` (built on first use), with the zoo's dataset if it has one."""
    from autodeploy import zoo

    name = zoo.parse_ref(ref)
    if name is None:
        return ResolvedModel(load_model(ref, shapes))
    with err.status(f"building zoo:{name} (first use only)"):
        path = zoo.get(name)
        dataset = zoo.dataset(name)
    info = load_model(path, shapes, name=f"zoo:{name}")
    if dataset is None:
        return ResolvedModel(info)
    return ResolvedModel(
        info,
        Dataset(dataset["inputs"], dataset.get("labels")),
        Dataset(dataset["calibration"]) if dataset.get("calibration") is not None else None,
    )


def command_line() -> str:
    """The command as typed, for the store (so a result can be reproduced)."""
    return shlex.join(["autodeploy", *sys.argv[1:]])


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
