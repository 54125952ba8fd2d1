"""The fleet's two vocabularies, a run's state and a job's: one row per word, carrying what it means and how it shows.

Optuna's ``TrialState`` is the model: a member is the word, and knows whether a run in it is over (``final``), its
colour in a terminal (``colour``, Rich markup), its mark on the dashboard (``mark``, a Streamlit colour) and its
words. Code outside this module reads the members, never the strings. A member's value is the string the database
holds (the tables' check constraints and migration ``0007_fleet`` name the same, never changed); ``unreadable`` is
only ever read (``fleet/readback.py``: a row that does not hold what autodeploy writes), never stored.

Standard library only: the CLI and the dashboard read it without the schema.
"""

from __future__ import annotations

from enum import Enum


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
        return self.value != "unreadable"

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

    OPEN = "open", None, "devices take its runs (and a device that registers later, one of its own)"
    CANCELLED = "cancelled", None, "its queued runs are cancelled, and a running one at its agent's next step"
    UNREADABLE = "unreadable", "red", "its row is not what autodeploy writes (never stored)"


def check_constraint(states: type[_Word]) -> str:
    """The SQL check of a ``state`` column: ``state IN ('open', 'cancelled')``."""
    return "state IN (" + ", ".join(f"'{s}'" for s in states.stored()) + ")"
