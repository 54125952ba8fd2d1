"""What a fleet study trusts: only what this agent measured (issue 47, "Broke 5").

Anyone with the database URL can write the shared database: Optuna's tables and the stored trials included.
A trial planted there (0.1 µs) would be ranked, answered as a repeat, reused as a measurement, or shipped with
whatever artifact path its row names. The rule a fleet study follows instead:

* Its search state lives in this machine's cache, never in the shared database: the study's Optuna storage is a
  SQLite file of the agent's own (:func:`study_file`). Every trial, value and artifact path the winner is picked
  from, and all that a resume keeps, is there, where no database writer reaches.
* It reuses a stored measurement only if this agent stored it, as it stored it (:class:`OwnTrials`): before a
  trial is written to the shared database, the agent notes its uid and the digest of the numbers the search
  reads back (latency, throughput, memory, accuracy drop, config, engine version) in a journal beside the
  study file. A row the journal does not name, or whose numbers read otherwise, is not there for the study:
  the config is measured again. Noting it first leaves no gap: an agent killed between the two writes left a
  note and no row, and the config is measured again.
* It ships an artifact only from this machine's artifact store, built from the trial's model
  (:func:`artifact_store`, ``bundle.export.Source.artifacts``), never from the path a row names.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy.results_db.records import TrialFilter
from autodeploy.results_db.store import ALL_TRIALS, Store

if TYPE_CHECKING:
    from autodeploy.fleet.ledger import Job
    from autodeploy.harness.result import TrialResult
    from autodeploy.results_db.records import TrialRow

#: The folder under the agent's own (``<cache>/fleet``) that holds its studies and its journal of trials.
STUDIES = "studies"


def study_file(folder: Path, store: Store, job: Job, device: str) -> Path:
    """The SQLite file, in this machine's ``folder/studies``, that holds ``device``'s Optuna study of ``job``.

    Its name holds a digest of the database and the job (id, creation time), so a job of another database, or
    one made again under the same id, never resumes this one's study.
    """
    url = store.engine.url
    where = f"{url.host}:{url.port}/{url.database}|{job.id}|{job.created_at.isoformat()}|{device}"
    path = folder / STUDIES / f"{device}.{job.id}.{hashlib.sha256(where.encode()).hexdigest()[:16]}.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def artifact_store() -> Path:
    """This machine's artifact store: where the studies an agent runs build (``tune``'s default cache folder,
    its ``work/artifacts``, as :func:`autodeploy.api.tune` and :mod:`autodeploy.harness.run` name it)."""
    from autodeploy import api

    return api.cache_dir() / "work" / "artifacts"


class OwnTrials(Store):
    """The shared store as a fleet study sees it: the trials it reads back are the ones this agent stored, as
    it stored them (the module's rule); every other read and write goes to the store unchanged."""

    def __init__(self, store: Store, journal: Path) -> None:
        super().__init__(store.engine, store.url, readonly=store.readonly)
        self.journal = journal

    def add_trial(self, result: TrialResult, **where: Any) -> int:
        """Note the trial in the journal, then store it (:meth:`Store.add_trial`)."""
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"uid": result.uid, "digest": _digest(_numbers_of_result(result))}) + "\n"
        fd = os.open(self.journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return super().add_trial(result, **where)

    def trials(self, where: TrialFilter = ALL_TRIALS, *, samples: bool = False) -> list[TrialRow]:
        """:meth:`Store.trials`, less every row this agent did not store or that reads otherwise than stored."""
        noted = self._noted()
        rows = super().trials(where, samples=samples)
        return [r for r in rows if noted.get(r.uid) == _digest(_numbers_of_row(r))]

    def _noted(self) -> dict[str, str]:
        if not self.journal.is_file():
            return {}
        noted = {}
        for line in self.journal.read_text().splitlines():
            try:
                entry = json.loads(line)
                noted[str(entry["uid"])] = str(entry["digest"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short (a kill): its trial is measured again
        return noted


def _digest(numbers: tuple[Any, ...]) -> str:
    return hashlib.sha256(repr(numbers).encode()).hexdigest()


def _numbers_of_result(r: TrialResult) -> tuple[Any, ...]:
    """What the search reads back from a trial it stored: its config, engine version, and for a measured one the
    metrics it is ranked by (:class:`autodeploy.search.objective.Metrics`, as a reused row gives them)."""
    from autodeploy.search.objective import Metrics

    measured = r.latency is not None and r.accuracy is not None
    metrics = replace(Metrics.of_result(r), uid="") if measured else None
    return r.config.key(), r.engine_version, r.status, metrics


def _numbers_of_row(r: TrialRow) -> tuple[Any, ...]:
    from autodeploy.search.objective import Metrics

    measured = r.median_ms is not None and r.accuracy is not None
    metrics = replace(Metrics.of_row(r), uid="") if measured else None
    return r.config_key, r.engine_version, r.status, metrics
