"""Input shapes as a dimension of a study: a :class:`ShapeSet` of weighted :class:`ShapeCase` s.

A model with dynamic dims (an OCR recogniser's width, a detector's height and width) is not
measured at one pinned shape: ``--shape x=1x3x48x320 --shape x=1x3x48x640`` measures each,
and a study config can weigh them as traffic does::

    shapes:
      x:
        - {shape: 1x3x48x320, weight: 3}
        - {shape: 1x3x48x640, weight: 1}

Inputs given several shapes are *zipped* (the i-th shape of every such input makes case i),
since inputs that vary together (token ids and their mask) share a length; an input given one
shape has it in every case. Each case is measured as its own trial, compiled for its shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autodeploy.errors import ShapeError

Shape = tuple[int, ...]
_FIX = "write it as NAME=DIMxDIMx... (optionally @WEIGHT), e.g. x=1x3x48x320 or x=1x3x48x320@3"


@dataclass(frozen=True)
class ShapeCase:
    """One combination of fixed input shapes, and its share of the traffic (``weight``)."""

    shapes: Mapping[str, Shape]
    weight: float = 1.0

    def key(self) -> str:
        """``x=1x3x48x320`` (inputs by name, ``;``-separated): how the store and the tables name this case."""
        return ";".join(f"{name}={dims_text(self.shapes[name])}" for name in sorted(self.shapes))


@dataclass(frozen=True)
class ShapeSet:
    """The shapes a bench or a study covers: one case (possibly with no fixed shape) or several."""

    cases: tuple[ShapeCase, ...] = (ShapeCase({}),)

    def __post_init__(self) -> None:
        if not self.cases:
            raise ShapeError("a shape set needs at least one case", fix="give --shape NAME=DIMS")
        if any(c.weight <= 0 for c in self.cases):
            raise ShapeError("every shape weight must be positive", fix="give weights > 0, e.g. x=1x3x48x320@3")
        keys = [c.key() for c in self.cases]
        doubled = sorted({k for k in keys if keys.count(k) > 1})
        if doubled:
            raise ShapeError(f"shape {doubled[0]} is given twice", fix="give each shape once, with a weight")

    @property
    def several(self) -> bool:
        return len(self.cases) > 1

    @property
    def total_weight(self) -> float:
        return sum(c.weight for c in self.cases)

    def share(self, case: ShapeCase) -> float:
        """The case's weight as a fraction of all weights."""
        return case.weight / self.total_weight

    def names(self) -> tuple[str, ...]:
        return tuple(sorted({name for c in self.cases for name in c.shapes}))

    def ranges(self) -> dict[str, tuple[Shape, Shape]]:
        """Per input, the element-wise smallest and largest shape over the cases (same rank assumed)."""
        out = {}
        for name in self.names():
            shapes = [c.shapes[name] for c in self.cases if name in c.shapes]
            out[name] = (tuple(map(min, zip(*shapes, strict=True))), tuple(map(max, zip(*shapes, strict=True))))
        return out

    def to_config(self) -> dict[str, Any]:
        """The study-config form: ``{name: [dims]}`` for one case (as before shape sets), else
        ``{name: [{shape: [dims], weight: w}, ...]}``, one entry per case, in order."""
        if not self.several:
            return {name: list(dims) for name, dims in self.cases[0].shapes.items()}
        return {name: [{"shape": list(c.shapes[name]), "weight": c.weight} for c in self.cases]
                for name in self.names()}  # fmt: skip

    @classmethod
    def single(cls, shapes: Mapping[str, Sequence[int]] | None) -> ShapeSet:
        return cls((ShapeCase({k: tuple(int(d) for d in v) for k, v in (shapes or {}).items()}),))

    @classmethod
    def of(cls, value: ShapeSet | Mapping[str, Any] | None) -> ShapeSet:
        """A shape set from itself, a study config's ``shapes`` mapping (any form it takes), or ``None``."""
        if isinstance(value, ShapeSet):
            return value
        return from_config(value or {})


def dims_text(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape))


def parse_dims(text: str, where: str) -> Shape:
    """``1x3x224x224`` -> ``(1, 3, 224, 224)``; every dim a positive integer."""
    try:
        shape = tuple(int(d) for d in str(text).lower().split("x"))
        if not shape or any(d < 1 for d in shape):
            raise ValueError
    except ValueError:
        raise ShapeError(f"cannot parse {where}", fix=_FIX) from None
    return shape


def parse_flags(flags: Iterable[str]) -> ShapeSet:
    """``--shape NAME=DIMS[@WEIGHT]`` flags, repeatable per input, as a shape set (inputs zipped)."""
    given: dict[str, list[tuple[Shape, float | None]]] = {}
    for flag in flags:
        name, sep, rest = flag.partition("=")
        dims, at, weight = rest.partition("@")
        if not sep or not name:
            raise ShapeError(f"cannot parse --shape {flag!r}", fix=_FIX)
        shape = parse_dims(dims, f"--shape {flag!r}")
        given.setdefault(name, []).append((shape, _weight(weight, f"--shape {flag!r}") if at else None))
    return _zip(given, "--shape")


def from_config(shapes: Mapping[str, Any]) -> ShapeSet:
    """A study config's ``shapes``: per input one shape (``[1, 3, 224, 224]`` or ``"1x3x224x224"``),
    a list of shapes, or a list of ``{shape: ..., weight: ...}`` (a weighted mix)."""
    given: dict[str, list[tuple[Shape, float | None]]] = {}
    for name, value in shapes.items():
        where = f"shapes.{name}"
        if isinstance(value, str) or (isinstance(value, Sequence) and value and all(isinstance(d, int) for d in value)):
            given[name] = [(_shape(value, where), None)]
            continue
        if not isinstance(value, Sequence) or isinstance(value, str) or not value:
            raise ShapeError(f"cannot read {where}: {value!r}",
                             fix="give a shape (1x3x224x224), a list of shapes, or a list of {shape, weight}")  # fmt: skip
        entries = []
        for item in value:
            if isinstance(item, Mapping):
                unknown = set(item) - {"shape", "weight"}
                if "shape" not in item or unknown:
                    raise ShapeError(f"cannot read {where}: {dict(item)!r}", fix="each entry is {shape: 1x3x48x320, weight: 3}")
                weight = item.get("weight")
                entries.append((_shape(item["shape"], where), None if weight is None else _weight(weight, where)))
            else:
                entries.append((_shape(item, where), None))
        given[name] = entries
    return _zip(given, "shapes")


def _shape(value: Any, where: str) -> Shape:
    if isinstance(value, str):
        return parse_dims(value, f"{where} = {value!r}")
    if isinstance(value, Sequence) and value and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in value):
        return tuple(value)
    raise ShapeError(f"cannot read {where}: {value!r} is not a shape", fix="write it as [1, 3, 224, 224] or 1x3x224x224")


def _weight(value: Any, where: str) -> float:
    try:
        weight = float(value)
    except (TypeError, ValueError):
        weight = -1.0
    if not weight > 0 or weight != weight or weight == float("inf"):
        raise ShapeError(f"cannot parse the weight of {where}: {value!r}", fix="a weight is a positive number, e.g. @3")
    return weight


def _zip(given: Mapping[str, list[tuple[Shape, float | None]]], flag: str) -> ShapeSet:
    if not given:
        return ShapeSet()
    counts = {len(v) for v in given.values() if len(v) > 1}
    if len(counts) > 1:
        shown = ", ".join(f"{k}: {len(v)}" for k, v in given.items())
        raise ShapeError(f"inputs given several shapes must be given as many each ({shown})",
                         fix=f"{flag} zips the i-th shape of every such input into one case; give each the same count")  # fmt: skip
    n = counts.pop() if counts else 1
    cases = []
    for i in range(n):
        shapes, weights = {}, set()
        for name, entries in given.items():
            shape, weight = entries[i if len(entries) > 1 else 0]
            shapes[name] = shape
            if weight is not None and len(entries) > 1:
                weights.add(weight)
        if len(weights) > 1:
            raise ShapeError(f"case {i + 1} of {flag} has different weights {sorted(weights)}", fix="give one weight per case")
        cases.append(ShapeCase(shapes, weights.pop() if weights else 1.0))
    return ShapeSet(tuple(cases))


_KEY_PART = re.compile(r"([^=;]+)=(\d+(?:x\d+)*)")


def parse_key(key: str) -> dict[str, Shape]:
    """The inverse of :meth:`ShapeCase.key` (a stored trial's shape back as a mapping)."""
    out = {}
    for part in filter(None, key.split(";")):
        match = _KEY_PART.fullmatch(part)
        if match is None:
            raise ShapeError(f"cannot read stored shape {key!r}")
        out[match.group(1)] = tuple(int(d) for d in match.group(2).split("x"))
    return out
