"""The fleet's vocabularies, a run's state, a job's, and where a job stands: one row per word, carrying what it
means and how it shows.

Optuna's ``TrialState`` is the model: a member is the word, and knows whether a run in it is over (``final``), its
colour in a terminal (``colour``, Rich markup), its mark on the dashboard (``mark``, a Streamlit colour) and its
words. Code outside this module reads the members, never the strings. A member's value is the string the database
holds (the tables' check constraints and migration ``0007_fleet`` name the same, never changed); ``unreadable`` is
only ever read (``fleet/readback.py``: a row that does not hold what autodeploy writes) and ``lost`` only shown,
never stored. :class:`JobStatus` is derived from a job's state and its runs, never stored.

Standard library only: the CLI and the dashboard read it without the schema.
"""

from __future__ import annotations

from enum import Enum

#: Words only ever read or shown, never stored: a row that does not hold what autodeploy writes, a device silent past
#: its job's limit (its run stays ``queued`` or ``running`` in the store: if its agent comes back, it goes on).
_SHOWN_ONLY = ("unreadable", "lost")


class _Word(str, Enum):
    """A word stored as text: equal to its string, shown as it (``f"{state}"`` is ``queued`` on every Python)."""

    __str__ = str.__str__
    __format__ = str.__format__
    #: The dashboard's colour for it (Streamlit markup); ``None``: plain.
    mark: str | None

    @classmethod
    def stored(cls) -> tuple[str, ...]:
        """The strings a row may hold (the table's check constraint), in order."""
        return tuple(m.value for m in cls if m.is_stored)

    @property
    def is_stored(self) -> bool:
        return self.value not in _SHOWN_ONLY

    def marked(self, text: str | None = None) -> str:
        """``text`` (this word by default) in the dashboard's colour markup, ``:red[failed]``; plain without a mark."""
        text = self.value if text is None else text
        return f":{self.mark}[{text}]" if self.mark else text


class RunState(_Word):
    """A run's state: one job on one device."""

    def __new__(cls, value: str, final: bool, colour: str, mark: str, words: str) -> RunState:
        member = str.__new__(cls, value)
        member._value_ = value
        member.final, member.colour, member.mark, member.words = final, colour, mark, words
        return member

    #: A run in it is over: no agent takes it again (Optuna's ``TrialState.is_finished``).
    final: bool
    #: How a terminal table shows it (Rich markup).
    colour: str
    words: str

    QUEUED = "queued", False, "dim", "grey", "no agent holds it yet"
    RUNNING = "running", False, "cyan", "blue", "an agent is tuning it; a lost agent's stays so in the store"
    DONE = "done", True, "green", "green", "tuned: its winner, or none and why"
    FAILED = "failed", True, "red", "red", "the agent could not tune it, and says why"
    CANCELLED = "cancelled", True, "yellow", "orange", "its job was cancelled"
    SKIPPED = "skipped", True, "yellow", "orange", "the device runs none of the job's engines, or refuses it"
    LOST = "lost", False, "red", "red", ("its device has been silent past the job's --lost-after, queued or running "
                                         "(never stored: if its agent comes back, the run goes on)")
    UNREADABLE = "unreadable", False, "red", "red", "its row is not what autodeploy writes (never stored)"

    @classmethod
    def finals(cls) -> tuple[str, ...]:
        """The stored states of a run that is over: no agent takes it again."""
        return tuple(m.value for m in cls if m.final)


class JobState(_Word):
    """A job's state: a model submitted once, for every device it selects."""

    def __new__(cls, value: str, mark: str | None, words: str) -> JobState:
        member = str.__new__(cls, value)
        member._value_ = value
        member.mark, member.words = mark, words
        return member

    words: str

    OPEN = "open", None, "devices take its runs (one registering later too, inside its --accept-late window)"
    CANCELLED = "cancelled", None, "its queued runs are cancelled, and a running one at its agent's next step"
    UNREADABLE = "unreadable", "red", "its row is not what autodeploy writes (never stored)"


class JobKind(_Word):
    """What a job does on each device (derived from its row: a profile job names its one config), never stored."""

    def __new__(cls, value: str, words: str) -> JobKind:
        member = str.__new__(cls, value)
        member._value_ = value
        member.mark, member.words = None, words
        return member

    words: str

    TUNE = "tune", "each device runs its own study and ships its winner"
    PROFILE = "profile", "one given config measured on every device (fleet submit --profile), beside each device's own winner"


class JobStatus(_Word):
    """Where a job stands, derived from its stored state and its runs as shown (never stored): what ``fleet status``
    prints and ``fleet status --wait`` waits for."""

    def __new__(cls, value: str, over: bool, ok: bool, colour: str, mark: str | None, words: str) -> JobStatus:
        member = str.__new__(cls, value)
        member._value_ = value
        member.over, member.ok, member.colour, member.mark, member.words = over, ok, colour, mark, words
        return member

    #: Every run is over (done, failed, skipped, cancelled) or lost: ``--wait`` returns.
    over: bool
    #: Over with nothing failed or lost: ``--wait`` exits 0.
    ok: bool
    colour: str
    words: str

    QUEUED = "queued", False, False, "dim", "grey", "no device has started it yet"
    RUNNING = "running", False, False, "cyan", "blue", "a device is tuning it, or one has yet to start"
    DONE = "done", True, True, "green", "green", "every device is over, none failed"
    DONE_WITH_FAILURES = "done with failures", True, False, "red", "red", "every device is over; one failed or was lost"
    CANCELLED = "cancelled", True, False, "yellow", "orange", "it was cancelled"
    NO_DEVICES = "no devices", True, False, "yellow", "orange", "no registered device was selected, nor took it late"

    @classmethod
    def of(cls, job: JobState, runs: list[RunState]) -> JobStatus:
        """A job's status from its stored state and its runs' states as shown (a silent device's read ``lost``)."""
        if job == JobState.CANCELLED:
            return cls.CANCELLED
        if not runs:
            return cls.NO_DEVICES
        if all(r.final or r == RunState.LOST for r in runs):
            return cls.DONE if all(r in (RunState.DONE, RunState.SKIPPED) for r in runs) else cls.DONE_WITH_FAILURES
        return cls.QUEUED if all(r == RunState.QUEUED for r in runs) else cls.RUNNING


class RunPhase(_Word):
    """Where a running run's study stands, as its agent writes it (``ad_fleet_runs.phase``, with ``i/N`` where the
    phase counts: :meth:`text`); ``fleet status`` and the Fleet page show it beside ``running``."""

    def __new__(cls, value: str, counted: bool, words: str) -> RunPhase:
        member = str.__new__(cls, value)
        member._value_ = value
        member.mark, member.counted, member.words = None, counted, words
        return member

    #: Shown with ``i/N``: the trials screened of the budget, the finalist round of the rounds.
    counted: bool
    words: str

    PREPARING = "preparing", False, "the model, its data, the reference outputs and the baseline"
    SCREENING = "screening", True, "one short measurement per config the search asks for: trials done of the budget"
    FINALIST_ROUND = "finalist round", True, "the finalists re-measured, interleaved: the round of the rounds"
    WAITING = "waiting for the spread", False, "the next finalist round is not due yet (rounds are spread over time)"
    EXPORTING = "exporting", False, "the winner's bundle is exported, verified and stored"
    PROFILING = "profiling", False, "a profile job's one config is measured"

    def text(self, i: int | None = None, n: int | None = None) -> str:
        """As stored and shown: ``screening 3/12``, ``exporting``."""
        return f"{self.value} {i}/{n}" if self.counted and i is not None and n is not None else self.value


def check_constraint(states: type[_Word]) -> str:
    """The SQL check of a ``state`` column: ``state IN ('open', 'cancelled')``."""
    return "state IN (" + ", ".join(f"'{s}'" for s in states.stored()) + ")"
