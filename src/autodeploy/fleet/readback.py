"""What a fleet run or job row may hold, checked as it is read back from the store (issue 47, case 11).

Anyone with the database URL can write a run row, so the values an agent wrote there (its winner, the
engines it skipped, the reason) are checked for type and length on every read, before ``fleet status`` or
the Fleet page sees them. A row that does not fit is *unreadable*, alone: its device shows that state and one
line naming the run and the field, and every other run reads as usual. Checking is not escaping: the
terminal and the page still escape every string they show (``cli._common.shown``, ``dashboard.cache.md``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from autodeploy.results_db.states import RunState

#: The longest name, label or statistic a row may hold; longer is not what an agent writes.
SHORT = 200
#: The longest reason or headline (an error's one line, with its paths).
LONG = 10_000
#: The most engines a run may have skipped (one entry per engine the job names).
MAX_SKIPPED = 64
#: The most study config keys a job's options may hold (the config has a few dozen).
MAX_OPTIONS = 256
__all__ = ["job_problem", "run_values"]

Short = Annotated[str, StringConstraints(max_length=SHORT)]
Long = Annotated[str, StringConstraints(max_length=LONG)]


class _Row(BaseModel):
    # strict: a string is never read as a number, a list never as an object; no NaN or infinity
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class Winner(_Row):
    """A winner as :func:`autodeploy.fleet.agent.winner_record` writes it."""

    config: Short
    uid: Short | None = None
    statistic: Short
    value: float | None
    value_text: Short | None = None
    speedup: float | None = None
    baseline: Short | None = None
    screening_only: bool = False
    #: Why it is weaker than a finalist-proven winner (``search.summary.caveats``): a few short phrases.
    caveats: list[Short] = Field(default_factory=list, max_length=8)
    headline: Long | None = None
    #: The statistic's interval (re-measured: over its rounds; a profile: over its calls), in ``value``'s unit.
    ci: Annotated[list[float], Field(min_length=2, max_length=2)] | None = None
    memory_mb: float | None = None  # peak RSS of its worker over the worker's baseline
    accuracy: Short | None = None  # the verdict it passed (or failed, a profile's), in one phrase
    #: A profile's every round statistic by name (``median``, ``p90``, ``items/s``): set beside any device's winner.
    values: Annotated[dict[Short, float], Field(max_length=8)] | None = None

    @model_validator(mode="after")
    def _stored_before_caveats(self) -> Winner:
        """A winner stored before caveats: its screening-only flag, in the words every reader shows."""
        if not self.caveats and self.screening_only:
            from autodeploy.search.summary import caveats

            self.caveats = caveats({"screening_only": True})
        return self


class Skipped(_Row):
    engine: Short
    reason: Long


class _RunValues(_Row):
    device: Short
    study: Short
    state: Literal[RunState.stored()]  # type: ignore[valid-type]
    reason: Long | None
    winner: Winner | None
    skipped: Annotated[list[Skipped], Field(max_length=MAX_SKIPPED)] | None
    phase: Short | None = None


class RunValues(NamedTuple):
    device: str
    study: str
    state: RunState
    reason: str | None
    winner: dict[str, Any] | None
    skipped: list[dict[str, str]]
    phase: str | None = None


def run_values(run_id: int, job_id: int, **stored: Any) -> RunValues:
    """The run row's ``device``, ``study``, ``state``, ``reason``, ``winner`` and ``skipped`` as read, checked;
    a row where one does not fit reads as :attr:`RunState.UNREADABLE`, its reason the line that names the run and field."""
    try:
        v = _RunValues.model_validate(stored)
    except ValidationError as error:
        field, why = _first(error)
        reason = (f"run {run_id} of fleet job {job_id} is unreadable: its {field} is not what an agent writes "
                  f"({why}); it was changed outside autodeploy: cancel the job and submit it again")  # fmt: skip
        device, study = _name(stored.get("device")), _name(stored.get("study"))
        return RunValues(device, study, RunState.UNREADABLE, reason, None, [])
    winner = None
    if v.winner is not None:  # its known keys as written (an int stays an int: a signature covers them)
        written = stored["winner"]
        winner = {**v.winner.model_dump(), **{k: written[k] for k in Winner.model_fields if k in written}}
    return RunValues(v.device, v.study, RunState(v.state), v.reason, winner, [s.model_dump() for s in v.skipped or ()],
                     v.phase)  # fmt: skip


def _name(value: object) -> str:
    """A name of an unreadable row, as far as it can be shown: text, cut to :data:`SHORT`."""
    return value[:SHORT] if isinstance(value, str) else "?"


class _Profile(_Row):
    """A profile job's config as ``fleet submit --profile`` writes it (``TrialConfig.to_dict``)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    engine: Short
    precision: Short
    batch: Annotated[int, Field(ge=1)]
    threads: Annotated[int, Field(ge=1)] | None
    knobs: Annotated[dict[Short, str | int | float | bool | None], Field(max_length=MAX_OPTIONS)]


class _JobValues(_Row):
    options: Annotated[dict[str, Any], Field(max_length=MAX_OPTIONS)]
    data: dict[str, Any] | None
    profile: _Profile | None = None


def job_problem(job_id: int, **stored: Any) -> str | None:
    """Why the job row's ``options`` and ``data`` (JSON: what a database writer could plant beyond the columns'
    own types) are not what ``fleet submit`` writes, in one line naming the job and field; ``None`` when they are."""
    try:
        _JobValues.model_validate(stored)
    except ValidationError as error:
        field, why = _first(error)
        return (f"fleet job {job_id} is unreadable: its {field} is not what fleet submit writes ({why}); it "
                "was changed outside autodeploy: cancel the job and submit it again")  # fmt: skip
    return None


def _first(error: ValidationError) -> tuple[str, str]:
    """The first field that does not fit (``winner.value``, ``skipped.0.engine``) and what pydantic says of it."""
    first = error.errors()[0]
    return ".".join(str(part) for part in first["loc"]), first["msg"]
