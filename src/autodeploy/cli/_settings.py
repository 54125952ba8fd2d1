"""A study's settings as command-line flags: one option per row of :data:`autodeploy.search.settings.SETTINGS`,
built into a command's signature for Typer (``autodeploy tune`` takes them all, ``fleet submit`` the study's own),
and read back as the API's keywords. A new setting is a row of the table, never a flag written out here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any

import typer

from autodeploy.cli._common import (
    ACCURACY_DROP_HELP,
    LayoutOption,
    MeanOption,
    MetricDropOption,
    MetricOption,
    ReverseOption,
    ScaleOption,
    at_least,
    preprocess_of,
)
from autodeploy.search.settings import SETTINGS, Setting

#: Flags that bench has too, declared once for both in ``cli/_common.py``.
_SHARED: dict[str, Any] = {
    "max_accuracy_drop": Annotated[float | None, typer.Option(callback=at_least(0.0), help=ACCURACY_DROP_HELP)],
    "metric": MetricOption,
    "max_metric_drop": MetricDropOption,
}
#: The API's one ``preprocess`` is four flags, as for bench (in :func:`preprocess_of`'s order), with their defaults.
_PREPROCESS: dict[str, tuple[Any, Any]] = {"layout": (LayoutOption, None), "reverse_input_channels": (ReverseOption, False),
                                           "mean_values": (MeanOption, None), "scale_values": (ScaleOption, None)}  # fmt: skip


def add_flags(command: Callable[..., Any], names: Iterable[str], *, after: str,
              helps: Mapping[str, str] | None = None) -> None:  # fmt: skip
    """Give ``command`` (which takes ``**flags``) the flags of the settings called ``names``, in the table's order,
    after its parameter ``after``; ``helps`` words a flag for this command where the table's words do not fit."""
    wanted, helps = set(names), helps or {}
    flags: list[inspect.Parameter] = []
    for setting in SETTINGS:
        if setting.name not in wanted:
            continue
        if setting.name == "preprocess":
            flags += [_parameter(name, *annotated) for name, annotated in _PREPROCESS.items()]
        elif setting.flag is not None:
            flags.append(_option(setting, helps.get(setting.name)))
    *own, _ = inspect.signature(command, eval_str=True).parameters.values()  # less **flags
    own = [p.replace(kind=p.KEYWORD_ONLY) for p in own]
    cut = [p.name for p in own].index(after) + 1
    command.__signature__ = inspect.Signature([*own[:cut], *flags, *own[cut:]], return_annotation=None)  # type: ignore[attr-defined]


def settings_of(flags: dict[str, Any]) -> dict[str, Any]:
    """The API's keywords of the settings' flags given (``--batch`` is ``batches``; the image flags one
    ``preprocess``), popped from ``flags``; a flag not given is ``None``."""
    given = {s.name: flags.pop(s.option) for s in SETTINGS if s.option in flags}
    if all(name in flags for name in _PREPROCESS):
        given["preprocess"] = preprocess_of(*(flags.pop(name) for name in _PREPROCESS))
    return given


def _parameter(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _option(setting: Setting, help: str | None = None) -> inspect.Parameter:
    """A setting's flag: repeatable for a list, on alone for a bool (``--fresh``, never ``--no-fresh``), refused
    below its minimum in one line."""
    if setting.option in _SHARED:
        return _parameter(setting.option, _SHARED[setting.option], None)
    switch = setting.type is bool
    names = (f"--{setting.option.replace('_', '-')}",) if switch else ()
    callback = None if setting.minimum is None else at_least(setting.minimum)
    option = typer.Option(*names, metavar=setting.metavar, callback=callback, help=help or setting.help)
    kind = setting.type if switch else setting.type | None
    return _parameter(setting.option, Annotated[kind, option], False if switch else None)
