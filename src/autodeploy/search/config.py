"""Study configuration: validated once (pydantic, ``extra="forbid"``), then frozen.

Precedence: CLI flags > YAML file > defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP
from autodeploy.errors import ShapeError, UsageError
from autodeploy.harness.timing import MAX_TIMED_S, TimingPolicy
from autodeploy.objectives import DEFAULT_OBJECTIVE, NAMES, Objective, of
from autodeploy.shapes import ShapeSet

#: The example study configs installed with the package; ``--config NAME.yaml`` finds them by name.
EXAMPLES = Path(__file__).resolve().parents[1] / "configs"

#: The objectives' names (:data:`autodeploy.objectives.NAMES`).
ObjectiveName = Literal[NAMES]  # type: ignore[valid-type]


def _name_of(value: Any) -> Any:
    """A row given where a name is read (a config built from another's fields) as its name."""
    return value.name if isinstance(value, Objective) else value


#: The study's objective: read as its name (an unknown one refused by the names' ``Literal``, in pydantic's
#: words), held as its row (:func:`autodeploy.objectives.of`: parsed once, here), written back as its name, so the
#: stored settings, the recorded call and a YAML round trip say what they said.
ObjectiveRow = Annotated[ObjectiveName, BeforeValidator(_name_of), AfterValidator(of),
                         PlainSerializer(lambda row: row.name, return_type=str)]  # fmt: skip
Sampler = Literal["tpe", "grid", "random", "nsga2"]


#: Trials a run adds when it names none and has no time budget (``--trials``' default).
DEFAULT_TRIALS = 30
#: The finalist rounds span at most this many seconds when ``finalists.spread_s`` is not given (``search/rounds.py``
#: ``_spread``): waiting longer buys little more of the host's states and costs the user.
SPREAD_MAX_S = 300.0


class _Strict(BaseModel):
    #: ``.nan`` and ``.inf`` in YAML are floats to pydantic; no number of a study may be either.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Constraints(_Strict):
    """A trial that breaks one of these is never a winner."""

    max_accuracy_drop: float = Field(DEFAULT_MAX_ACCURACY_DROP, ge=0, le=1, description="top-1 agreement drop (else 1 - cosine)")
    max_memory_mb: float | None = Field(None, gt=0, description="peak RSS of the worker over its baseline")
    sla_ms: float | None = Field(None, gt=0, description="p99 latency bound of the server objective")
    max_metric_drop: float | None = Field(None, ge=0, description="drop of the user's --metric allowed (None: reported only)")


class Screening(_Strict):
    """Timing of each search trial: short, the top few are re-measured anyway."""

    min_samples: int = Field(64, ge=2, le=TimingPolicy.max_samples)
    min_duration_s: float = Field(1.0, ge=0, le=MAX_TIMED_S)
    max_duration_s: float = Field(30.0, gt=0, le=MAX_TIMED_S)
    timeout_s: float = Field(600.0, gt=0, description="seconds before a worker running the model is killed")
    build_timeout_s: float = Field(1800.0, gt=0, description="seconds before a worker building an artifact is killed")


class Finalists(_Strict):
    """Re-measurement of the best screening trials, interleaved A B A B … in longer runs."""

    count: int = Field(3, ge=0, description="0 skips re-measurement (e.g. distributed workers)")
    #: 5: a winner claim needs 3; with 5 the interval over rounds is min..max (93.75% for independent rounds),
    #: room for rounds that share the host's state (``harness/stats.py`` ``CLAIMED_COVERAGE``, issue 42).
    rounds: int = Field(5, ge=1)
    min_samples: int = Field(200, ge=2, le=TimingPolicy.max_samples)
    min_duration_s: float = Field(2.0, ge=0, le=MAX_TIMED_S)
    #: The least seconds from the first finalist round to the last, waiting between rounds at random (seeded by the
    #: study's seed) so the rounds sample the host over time, not one moment of it (``search/rounds.py``
    #: ``_spread``); ``None``: as long as the study ran before the finalists, at most ``SPREAD_MAX_S``; 0: back to back.
    #: A time budget pays for the rounds first: a wait the time left cannot pay for is cut.
    spread_s: float | None = Field(None, ge=0, le=MAX_TIMED_S, description="seconds the finalist rounds span at least (None: automatic; at most a day)")  # fmt: skip


class ImagePreprocess(_Strict):
    """How images (a folder or ``sample:images``) become the input, in benchmark_app's words."""

    layout: Literal["NCHW", "NHWC"] | None = None
    reverse_input_channels: bool = False
    mean_values: list[float] | None = None
    scale_values: list[float] | None = None


#: A study name is shown, stored and put in file names (bundles, CSVs): no path syntax, no control characters.
MAX_STUDY_NAME = 200


def check_study_name(name: str) -> str:
    """``name`` when it can name a study.

    Raises:
        UsageError: empty, longer than :data:`MAX_STUDY_NAME`, or holding a path separator, ``..`` or a
            control character.
    """
    fix = "choose a --name of letters, digits and '_.-' (no '/', '\\', '..' or control characters)"
    if not name.strip() or len(name) > MAX_STUDY_NAME:
        raise UsageError(f"study name of {len(name)} characters: it must have 1 to {MAX_STUDY_NAME}", fix=fix)
    bad = next((c for c in name if c in "/\\" or not c.isprintable()), None)
    if bad is not None or ".." in name:
        what = repr(bad) if bad is not None else "'..'"
        raise UsageError(f"study name {name!r} holds {what}, which could be read as a path", fix=fix)
    return name


class StudyConfig(_Strict):
    """Everything that defines a study. Field names are the YAML keys."""

    model: str
    name: str | None = None
    #: The default is a name, parsed like any other, so the settings' help and the schema say ``latency``.
    objective: ObjectiveRow = Field(DEFAULT_OBJECTIVE.name, validate_default=True)
    engines: list[str] | None = None  # None: every engine available on this device
    precisions: list[str] | None = None  # None: every precision each engine offers here
    batches: list[int] | None = None  # None: the objective's (objectives.py: 1 for latency, 1..32 for throughput)
    threads: list[int] | None = None  # None: powers of two up to the logical cores, and the core count
    #: {engine: {knob: [choices]}}; None: the engine's own. A choice is one scalar, never a nested structure.
    knobs: dict[str, dict[str, list[str | int | float | bool | None]]] | None = None
    trials: int | None = Field(None, ge=0, description="None: 30, or the whole grid with sampler grid")
    #: Was ``timeout_s``: "timeout" means the seconds before a worker is killed everywhere (``screening.timeout_s``,
    #: ``bench --timeout``), so the study-wide stop is named for what it does.
    screening_time_s: float | None = Field(None, gt=0, description="start no new screening trial after this many seconds")
    time_budget_s: float | None = Field(None, gt=0, description="wall time of the whole run, finalists included "
                                        "(600, 90s, 10m, 1h30m): the best found in it, with the confidence reached")
    sampler: Sampler = "tpe"
    seed: int = 0
    fresh: bool = False
    constraints: Constraints = Constraints()
    screening: Screening = Screening()
    finalists: Finalists = Finalists()
    #: Per input: one shape, a list of shapes or a weighted mix ``[{shape: 1x3x48x320, weight: 3}, ...]``
    #: (:mod:`autodeploy.shapes`); stored in the canonical form of :meth:`ShapeSet.to_config`.
    shapes: dict[str, Any] = {}
    #: Several shapes: one study per shape (True), or one config for all, the objective weighted by the mix.
    per_shape: bool = False
    data: str | None = None  # .npz, a folder of NAME.npy or of images, or sample:images
    preprocess: ImagePreprocess | None = None
    #: The user's task metric, ``FILE.py:FUNCTION``: from the command line (an override) only; a config file
    #: or a stored study that names one is refused (:func:`validate`), as data must never name code to run.
    metric: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, value: Any) -> Any:
        """A config or stored study of earlier versions says ``timeout_s`` for ``screening_time_s`` (same meaning)."""
        if isinstance(value, Mapping) and "timeout_s" in value:
            value = dict(value)
            old = value.pop("timeout_s")
            value.setdefault("screening_time_s", old)
        return value

    @field_validator("shapes", mode="before")
    @classmethod
    def _canonical_shapes(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value  # pydantic says it is not a mapping
        try:
            return ShapeSet.of(value).to_config()
        except ShapeError as exc:
            raise ValueError(exc.message if exc.fix is None else f"{exc.message} ({exc.fix})") from None

    def shape_set(self) -> ShapeSet:
        return ShapeSet.of(self.shapes)

    @field_validator("time_budget_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if isinstance(value, str):
            from autodeploy.search.budget import parse_duration

            try:
                return parse_duration(value)
            except UsageError as exc:
                raise ValueError(exc.message) from None
        return value

    @model_validator(mode="after")
    def _check(self) -> StudyConfig:
        if not self.objective.sla_bounds_latency and self.constraints.sla_ms is None:
            raise ValueError(f"the {self.objective.name} objective needs constraints.sla_ms (--sla-ms)")
        for name, values in (("batches", self.batches), ("threads", self.threads)):
            if values is not None and (not values or min(values) < 1):
                raise ValueError(f"{name} must be a non-empty list of positive integers")
        return self

    def default_batches(self) -> list[int]:
        if self.batches is not None:
            return sorted(set(self.batches))
        return list(self.objective.batches)


def load(
    path: str | Path | None, overrides: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> StudyConfig:
    """Read a YAML study config (if any), apply CLI overrides (``None`` values are ignored), validate.

    ``base`` (the stored settings of a study being resumed) sits under the YAML and the flags,
    so a resumed study keeps its search space unless told otherwise.

    Raises:
        UsageError: unreadable YAML or a config that does not validate, with the field named.
    """
    return validate(read(path), overrides, base)


def resolve(path: str | Path) -> Path:
    """The file ``--config path`` reads: ``path`` itself, or else the shipped example of that name."""
    if not Path(path).exists() and (EXAMPLES / Path(path).name).is_file():
        return EXAMPLES / Path(path).name  # an example shipped with the package, given by name
    return Path(path).resolve()


def read(path: str | Path | None) -> dict[str, Any]:
    """The keys of the YAML study config at ``path`` (none for ``None``; see :func:`resolve`), not validated yet.

    Raises:
        UsageError: the file cannot be read, is not YAML, holds an alias (``&a``/``*a``: a config's
            values are plain data, and aliases nest into a billion laughs), or is not a mapping.
    """
    if path is None:
        return {}
    path = resolve(path)
    try:
        loaded = _load_yaml(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read study config {path}: {exc}".splitlines()[0],
                         fix=f"give a YAML file, or an example's name from {EXAMPLES}") from None  # fmt: skip
    if not isinstance(loaded, dict):
        raise UsageError(f"study config {path} must be a mapping of keys to values")
    return loaded


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, refusing anchors and aliases (:class:`_NoAliases`)."""
    loader = _NoAliases(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class _NoAliases(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses anchors and aliases as it meets them, before any is expanded."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent) or getattr(self.peek_event(), "anchor", None) is not None:
            event = self.peek_event()
            raise yaml.YAMLError(f"line {event.start_mark.line + 1}: YAML anchors and aliases (&name, *name) are not "
                                 "allowed in a study config; write each value out")  # fmt: skip
        return super().compose_node(parent, index)


def validate(
    keys: Mapping[str, Any], overrides: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> StudyConfig:
    """Layer ``base`` < ``keys`` (a study config's top-level keys) < ``overrides``, then validate.

    ``overrides`` are flags or arguments: ``None`` values are ignored, and a dotted key
    (``"constraints.sla_ms"``) sets one field of a nested section.

    Raises:
        UsageError: the config does not validate, with the field named.
    """
    if "metric" in keys:
        raise UsageError(f"a study config may not name a metric (metric: {str(keys['metric'])[:80]!r}): a metric is code "
                         "and is given on the command line only", fix="pass --metric FILE.py:FUNC instead")  # fmt: skip
    # A stored study's metric never comes back (the resume names its own, checked against the stored one).
    data: dict[str, Any] = {**{k: v for k, v in (base or {}).items() if k not in ("metric", "judge")}, **keys}
    for key, value in overrides.items():
        if value is None:
            continue
        if "." in key:  # nested: "constraints.sla_ms"
            outer, inner = key.split(".", 1)
            data[outer] = {**data.get(outer, {}), inner: value}
        else:
            data[key] = value
    try:
        return StudyConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise UsageError(f"invalid study config: {where}: {first['msg']}",
                         fix=f"see the examples in {EXAMPLES}") from None  # fmt: skip
