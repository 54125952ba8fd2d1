"""How a study tells its progress: the :class:`Reporter` hooks, silent here. Stdlib only, so the CLI can draw its
progress bar on them without loading the store (and SQLAlchemy) before a study runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autodeploy.search.space import SearchSpace


class Reporter:
    """Progress hooks; the CLI draws a progress bar, tests pass this silent one."""

    def study(self, name: str, objective: str) -> None: ...  # the study being run, before start
    def start(self, total: int, space: SearchSpace) -> None: ...
    def finalists(self, runs: int) -> None: ...  # the interleaved re-measurement begins: runs to come
    def phase(self, text: str) -> None: ...
    def note(self, text: str) -> None: ...  # something the user should read, e.g. a slow conversion skipped
    def rerun(self, runs: int) -> None: ...  # a finalist round runs again (it ran under load): runs added
    def trial_done(self, done: int, best: str | None) -> None: ...
