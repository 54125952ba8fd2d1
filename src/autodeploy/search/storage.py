"""Optuna's side of a study: its RDB storage, the sampler, stale trials, a running trial's heartbeat, and the
completed trials ranked by the objective."""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from autodeploy.adapters.base import TrialConfig
from autodeploy.errors import StoreError, UsageError
from autodeploy.objectives import Objective
from autodeploy.redact import mask_secrets
from autodeploy.search.config import StudyConfig
from autodeploy.search.context import StudyContext
from autodeploy.verdict import feasible, pareto_front

if TYPE_CHECKING:
    import optuna


# A running trial beats every HEARTBEAT_S; one silent for GRACE_S (its process was killed) is
# failed by the next run or worker of the study (Optuna's fail_stale_trials).
HEARTBEAT_S = 5
GRACE_S = 20


# -- screening ----------------------------------------------------------------------------


def open_study(ctx: StudyContext) -> tuple[optuna.Study, optuna.storages.RDBStorage]:
    """The study ``ctx.name`` (created, or loaded with ``--resume``) and the storage it lives in."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = _rdb_storage(ctx.storage)
        existing = optuna.study.get_all_study_names(storage=storage)
    except Exception as exc:  # Optuna wraps SQLAlchemy errors in several types
        raise StoreError(f"cannot open the study storage {mask_secrets(ctx.storage)}: "
                         f"{mask_secrets(str(exc).splitlines()[0])}",
                         fix="pass --storage or --db with a reachable database") from None  # fmt: skip
    if ctx.name in existing and not ctx.resume:
        raise UsageError(f"study {ctx.name!r} already exists",
                         fix="add --resume to add trials to it, or choose another --name")  # fmt: skip
    # A resumed or joined study must not replay the same seeded suggestions as the first run.
    seed = ctx.config.seed if ctx.name not in existing else ctx.config.seed + os.getpid()
    study = optuna.create_study(study_name=ctx.name, storage=storage, load_if_exists=True,
                                directions=list(ctx.config.objective.directions), sampler=_sampler(ctx.config, seed))  # fmt: skip
    want = [d.upper() for d in ctx.config.objective.directions]
    if [d.name for d in study.directions] != want:
        raise UsageError(f"study {ctx.name!r} was created for another objective",
                         fix="resume it with its own --objective, or choose another --name")  # fmt: skip
    return study, storage


def _rdb_storage(url: str, attempts: int = 5) -> optuna.storages.RDBStorage:
    """Optuna's storage with heartbeats. Workers starting together race to create Optuna's tables
    (PostgreSQL then raises a unique violation on pg_type): the loser retries and finds them made."""
    import optuna

    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat_interval
                return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)
        except Exception as exc:
            text = str(exc)
            if attempt == attempts - 1 or not ("already exists" in text or "unique constraint" in text):
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def fail_stale_trials(study: optuna.Study) -> None:
    """Fail the trials left RUNNING by a killed run or worker, so the study can go on without them."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def claim(trial: optuna.Trial) -> None:
    """Record which process runs ``trial`` (host, pid and the process's start time, so a reused pid is not it)."""
    trial.set_user_attr("owner", _me())


def release_orphans(storage: optuna.storages.RDBStorage, study: optuna.Study) -> list[int]:
    """End the RUNNING trials whose owner (:func:`claim`) was a process of this host that is gone (kill -9):
    without waiting for their heartbeat to go stale, and also those killed before their first beat, which
    Optuna's heartbeat never fails. They are marked ``interrupted`` (not a failure of their config), so a grid
    asks their point again. Returns their numbers."""
    import psutil

    me = _me()
    ended = []
    for t in study.get_trials(deepcopy=False, states=(trial_state().RUNNING,)):
        owner = t.user_attrs.get("owner")
        if not isinstance(owner, dict) or owner.get("host") != me["host"] or owner.get("pid") == me["pid"]:
            continue  # another host's (its heartbeat tells), or this process's own
        try:
            alive = abs(psutil.Process(int(owner["pid"])).create_time() - float(owner["started"])) < 1.0
        except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError, ValueError):
            alive = False
        if alive:
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), t.number)
        storage.set_trial_user_attr(trial_id, "interrupted", f"its run (pid {owner.get('pid')}) ended without "
                                    "finishing it")  # fmt: skip
        study.tell(t.number, state=trial_state().FAIL)
        ended.append(t.number)
    return ended


def _me() -> dict[str, Any]:
    import socket

    import psutil

    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


@contextmanager
def heartbeat(storage: optuna.storages.RDBStorage, study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Record the trial's heartbeat from a thread while it runs (what ``Study.optimize`` does for its trials).

    ``storage`` is the one the study was opened on; the trial's storage id comes from its public
    study name and number.
    """
    study_id = storage.get_study_id_from_name(study.study_name)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
    stop = threading.Event()

    def beat() -> None:
        while True:
            storage.record_heartbeat(trial_id)
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beat, name="optuna-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _sampler(cfg: StudyConfig, seed: int) -> optuna.samplers.BaseSampler:
    """Samplers take the constraints from each trial (``Trial.set_constraint``), so none needs a constraints_func."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if cfg.sampler == "tpe":
            # multivariate + group model the conditional (per-engine) parameters jointly.
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
        if cfg.sampler == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed)
        return optuna.samplers.RandomSampler(seed=seed)  # "random", and "grid" (grid points are enqueued)


def trial_state() -> Any:
    from optuna.trial import TrialState

    return TrialState


def feasible_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    done = study.get_trials(deepcopy=False, states=(trial_state().COMPLETE,))
    return [t for t in done if t.constraints and feasible(t.constraints)]


def ranked(study: optuna.Study, objective: Objective) -> list[optuna.trial.FrozenTrial]:
    """Feasible trials best first by their first value, one per config; of several values (``pareto``), the
    Pareto front alone."""
    trials = feasible_trials(study)
    if not objective.single:
        trials = [trials[i] for i in pareto_front([t.values for t in trials])]
    trials.sort(key=lambda t: t.values[0], reverse=objective.higher_is_better)
    unique, seen = [], set()
    for t in trials:
        key = TrialConfig.from_dict(t.user_attrs["config"]).key()
        if key not in seen:
            seen.add(key)
            unique.append(t)
    return unique


def best_label(study: optuna.Study, objective: Objective) -> str | None:
    top = ranked(study, objective)
    if not top:
        return None
    t = top[0]
    return (
        f"{TrialConfig.from_dict(t.user_attrs['config']).label()} = {', '.join(f'{v:.4g}' for v in t.values)}"
    )
