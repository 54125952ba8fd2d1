"""A study's settings, declared once: one row per setting, with the keyword of :func:`autodeploy.tune`, the flag of
``autodeploy tune``, its key in the study config (:class:`~autodeploy.search.config.StudyConfig`), its type, its help
and its default (the config's own, read from the pydantic model). The API checks its keywords against the rows
(:func:`given`), the CLI builds its options from them (``cli/tune.py``) and :func:`overrides` turns the values given
into config keys. Polygraphy's argument groups are the model: a new setting is a row here and a field of the config.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autodeploy.objectives import NAMES
from autodeploy.search.config import DEFAULT_TRIALS, SPREAD_MAX_S, StudyConfig
from autodeploy.shapes import ShapeSet


@dataclass(frozen=True)
class Setting:
    """One setting of a study: a keyword of :func:`autodeploy.tune`, a flag of ``autodeploy tune``, a config key."""

    #: The API's keyword (``tune(spread_s=...)``).
    name: str
    #: Its key in the study config, dotted into a section (``finalists.spread_s``); ``None``: how this run goes
    #: (``resume``), not what the study is.
    path: str | None
    #: The flag's type (``list[int]``: repeatable; ``bool``: an on/off flag); the API takes it or wider (a
    #: sequence for a list, a path for text).
    type: Any
    #: The flag's help; ``{default}`` is the config's default (:attr:`default`), so it is spelled once.
    text: str | None
    #: The CLI's parameter (``spread``: ``--spread``); ``""``: the name; ``None``: no flag (the API's only, or
    #: flags of their own in ``cli/tune.py``).
    flag: str | None = ""
    metavar: str | None = None
    #: The least value a flag takes (a value below is refused in one line).
    minimum: float | None = None
    #: The API's words where the flag's do not fit a keyword.
    doc: str = ""
    #: A value given to the API as the study (and its recorded call) takes it: ``"10m"`` as 600.0 seconds.
    parse: Callable[[Any], Any] | None = None
    #: A value as the config holds it (lists, text, the canonical shapes).
    to_config: Callable[[Any], Any] | None = None

    @property
    def default(self) -> Any:
        """The study config's default (``None`` for a setting that is no config key)."""
        if self.path is None:
            return None
        model: Any = StudyConfig
        *sections, key = self.path.split(".")
        for section in sections:
            model = model.model_fields[section].annotation
        return model.model_fields[key].default

    @property
    def help(self) -> str | None:
        """The flag's help, its default filled in."""
        return None if self.text is None else self.text.format(default=self.default)

    @property
    def option(self) -> str:
        """The CLI's parameter name (``--build-timeout`` is ``build_timeout``)."""
        return self.flag or self.name


def _list(value: Any) -> list[Any]:
    return list(value)


def _text(value: Any) -> str:
    return str(value)  # paths are stored as text


def _seconds(value: Any) -> float:
    from autodeploy.search.budget import parse_duration  # a duration is parsed at the edge, in one line

    return parse_duration(value)


def _shapes(shapes: Any) -> dict[str, Any] | None:
    """Shapes as the config holds them; none given (``{}``, a set of no shape) keeps the config's."""
    if isinstance(shapes, ShapeSet):
        return shapes.to_config() if shapes.cases[0].shapes else None
    return {k: v if isinstance(v, str) else list(v) for k, v in shapes.items()} if shapes else None


def _preprocess(value: Any) -> dict[str, Any]:
    return value.to_dict()  # an images.Preprocess, as the config (and the recorded call) hold it


def _true_or_unset(value: Any) -> Any:
    return value or None  # False: not given, the config's own stays


S = Setting
#: Every setting, in the order of ``autodeploy tune --help`` and of a recorded call.
SETTINGS: tuple[Setting, ...] = (
    S("model", "model", str, None, flag=None, to_config=_text),  # the first argument (or ``model`` in the config)
    S("name", "name", str, "Study name (default: MODEL-OBJECTIVE-DEVICE)."),
    S("objective", "objective", str, " | ".join(NAMES) + ".", doc="``" + "``, ``".join(NAMES) + "`` (server needs ``sla_ms``)"),
    S("engines", "engines", list[str], "Engines to search (default: all available); repeatable.", flag="engine", to_config=_list),
    S("precisions", "precisions", list[str], "Precisions to search (default: each engine's); repeatable.", flag="precision", to_config=_list),
    S("batches", "batches", list[int], "Batch sizes to search; repeatable.", flag="batch", to_config=_list),
    S("threads", "threads", list[int], "Thread counts to search; repeatable.", to_config=_list),
    S("knobs", "knobs", dict, None, flag=None, doc="per engine, the choices of its knobs searched (``{{engine: {{knob: [choices]}}}}``; default: the engine's own)"),
    S("trials", "trials", int, f"Trials this run adds (default {DEFAULT_TRIALS}; the whole grid for --sampler grid).",
      doc=f"trials this run adds (default {DEFAULT_TRIALS}; the whole grid for ``sampler='grid'``; with ``time_budget`` alone, as many as the space has configs)"),
    S("timeout_s", "screening.timeout_s", float, "Seconds before a worker running the model (reference, measurement) is killed, as for bench (default {default:g}).", flag="timeout", minimum=0.001),
    S("build_timeout_s", "screening.build_timeout_s", float, "Seconds before a worker building an artifact is killed (default {default:g}).", flag="build_timeout", minimum=0.001),
    S("screening_time_s", "screening_time_s", float, "Start no new screening trial after this many seconds (the finalists still run; --time-budget bounds the whole run).",
      flag="screening_time", metavar="SECONDS", minimum=0.001),
    S("time_budget", "time_budget_s", str, "Wall time of this run, finalists included (600, 90s, 10m, 1h30m): the best found in it, with the confidence reached; --resume goes on.",
      metavar="DURATION", parse=_seconds, doc="wall time of this run, finalists included: seconds, or ``'90s'``, ``'10m'``, ``'1h30m'``; the summary is the best found in it, with the confidence reached (every trial is kept for ``resume``)"),
    S("sampler", "sampler", str, "tpe (default, seeded) | grid | random | nsga2."),
    S("seed", "seed", int, None, doc="the sampler's seed (default {default})"),
    S("fresh", "fresh", bool, "Re-measure configs already in the store.", to_config=_true_or_unset),
    S("resume", None, bool, "Add trials to an existing study (or join it from another worker).",
      doc="add trials to the existing study of this name, within its stored search space"),
    S("max_accuracy_drop", "constraints.max_accuracy_drop", float, None, minimum=0.0,
      doc="accuracy budget per output, as a fraction (default {default:.0%}), as for :func:`bench`"),
    S("max_memory_mb", "constraints.max_memory_mb", float, "Peak worker memory allowed, MB."),
    S("sla_ms", "constraints.sla_ms", float, "p99 latency bound (needed by --objective server)."),
    S("finalists", "finalists.count", int, "Finalists re-measured interleaved (default {default}; 0: none)."),
    S("rounds", "finalists.rounds", int, "Interleaved rounds for the finalists, spread over time (default {default})."),
    S("spread_s", "finalists.spread_s", float, f"Least seconds the finalist rounds span, waiting between them at random times (default: as long as screening took, at most {SPREAD_MAX_S:g}; 0: back to back).",
      flag="spread", metavar="SECONDS", minimum=0.0),
    S("min_samples", "screening.min_samples", int, "Timed calls per screening trial, at least (default {default})."),
    S("min_duration_s", "screening.min_duration_s", float, "Timed seconds per screening trial, at least (default {default:g}).", flag="min_duration"),
    S("shapes", "shapes", list[str], "Fix an input shape, NAME=1x3x224x224[@WEIGHT]; repeat an input for several shapes.", flag="shape", to_config=_shapes,
      doc="per input one shape, several (``{{'x': [(1, 3, 48, 320), (1, 3, 48, 640)]}}``), a weighted mix (``{{'x': [{{'shape': '1x3x48x320', 'weight': 3}}, ...]}}``) "
          "or a :class:`~autodeploy.shapes.ShapeSet`: every config is measured at each shape and judged by the mix"),
    S("per_shape", "per_shape", bool, "With several shapes: one study and winner per shape (default: one config for the weighted mix).",
      doc="one study per shape: :func:`tune` refuses it with several shapes and names :func:`tune_per_shape`, which honours it"),
    S("data", "data", str, "Input data: .npz, a .npy (one input), a folder of NAME.npy (optional 'labels'), a folder of images (subfolders: classes), or sample:images (crops of real photos).",
      to_config=_text),
    S("preprocess", "preprocess", object, None, flag=None, parse=_preprocess,
      doc="an :class:`~autodeploy.images.Preprocess` of the images, as for :func:`bench` (the CLI's four image flags)"),
    S("metric", "metric", str, None, doc="the task metric ``FILE.py:FUNCTION``, as for :func:`bench`: an argument only (a config naming one is refused, and a resume must give the stored study's own)"),
    S("max_metric_drop", "constraints.max_metric_drop", float, None, doc="the largest drop of ``metric`` allowed (default: only reported)"),
)  # fmt: skip
del S
#: The settings by their API name.
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def given(function: str, keywords: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a call of ``function`` by name, in the table's order, each parsed (:attr:`Setting.parse`).

    Raises:
        TypeError: a keyword that is no setting, as Python says it, naming the closest one.
    """
    for key in keywords:
        if key not in BY_NAME:
            close = difflib.get_close_matches(key, BY_NAME, 1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{function}() got an unexpected keyword argument {key!r}{hint}")
    values = {s.name: keywords[s.name] for s in SETTINGS if s.name in keywords}
    return {k: v if v is None or BY_NAME[k].parse is None else BY_NAME[k].parse(v) for k, v in values.items()}


def overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """The study config keys of the settings given (by name; ``None``: not given), dotted into sections
    (``"constraints.sla_ms"``), as :func:`autodeploy.search.config.validate` layers them over a config."""
    found = {}
    for name, value in values.items():
        setting = BY_NAME[name]
        if setting.path is not None and value is not None:
            found[setting.path] = value if setting.to_config is None else setting.to_config(value)
    return found


def doc() -> str:
    """The settings as a docstring section, for :func:`autodeploy.tune`'s ``help()``."""
    head = "Settings (keywords; each overrides the config's key of its name, or the one named):"
    lines = ["", "", f"    {head}"]
    for s in SETTINGS:
        if s.name == "model":
            continue  # the first argument
        words = s.doc.format(default=s.default) if s.doc else (s.help or "")
        key = f" (``{s.path}``)" if s.path not in (None, s.name) else ""
        lines.append(f"        {s.name}{key}: {words.rstrip('.')}.")
    return "\n".join(lines) + "\n"
