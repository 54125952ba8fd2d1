"""How a study tells its progress: the :class:`Reporter` hooks, silent here; :class:`LineReporter`, one line a step
on stderr, which the Python API uses where a terminal is attached and no reporter was given (:func:`default`).
Stdlib only, so the CLI can draw its progress bar on them without loading the store (and SQLAlchemy) before a study
runs."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from autodeploy.search.space import SearchSpace


class Reporter:
    """Progress hooks; the CLI draws a progress bar, tests pass this silent one."""

    def study(self, name: str, objective: str) -> None: ...  # the study being run, before start
    def start(self, total: int, space: SearchSpace) -> None: ...
    def finalists(self, runs: int) -> None: ...  # the interleaved re-measurement begins: runs to come
    def round(self, r: int, rounds: int) -> None: ...  # finalist round r (from 1) of at most ``rounds`` starts
    def phase(self, text: str) -> None: ...
    def note(self, text: str) -> None: ...  # something the user should read, e.g. a slow conversion skipped
    def rerun(self, runs: int) -> None: ...  # a finalist round runs again (it ran under load): runs added
    def trial_done(self, done: int, best: str | None) -> None: ...

    def wait(self, seconds: float) -> None:
        """The study has nothing to do for ``seconds`` (the finalist rounds' spread over time): it sleeps. A reporter
        that must wake on a stop or a cancel (the fleet agent's) waits on those instead, and raises to end the study."""
        time.sleep(seconds)


class LineReporter(Reporter):
    """One line per step on ``stream`` (stderr), each starting ``autodeploy:``: what the Python API shows by default
    where a terminal is attached, so a study of minutes is never silent."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream, self.total = stream, 0

    def say(self, text: str) -> None:
        print(f"autodeploy: {text}", file=self.stream or sys.stderr, flush=True)

    def study(self, name: str, objective: str) -> None:
        self.say(f"study {name!r}, objective {objective}")

    def start(self, total: int, space: SearchSpace) -> None:
        self.total = total
        self.say(f"screening: {total} trials")

    def finalists(self, runs: int) -> None:
        self.say(f"finalists: {runs} runs, interleaved")

    def phase(self, text: str) -> None:
        self.say(text)

    def note(self, text: str) -> None:
        self.say(f"note: {text}")

    def rerun(self, runs: int) -> None:
        self.say(f"a finalist round ran under load: {runs} runs added")

    def trial_done(self, done: int, best: str | None) -> None:
        self.say(f"trial {done}/{self.total} done" + (f"; best so far {best}" if best else ""))


def default(stream: TextIO | None = None) -> Reporter:
    """The Python API's reporter when none is given: :class:`LineReporter` where ``stream`` (stderr) is a terminal,
    else silent (a log file, CI, a notebook's captured output)."""
    stream = stream or sys.stderr
    return LineReporter(stream) if stream.isatty() else Reporter()
