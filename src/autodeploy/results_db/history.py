"""A config's history on one device: what the store says it read before, one value per earlier study or run.

A study reads its baseline's history here, and the gate its baseline arm's, to say when today's reading lies
outside it (:func:`autodeploy.verdict.against_history`; docs/architecture.md, "Unsteady machine"): a shared VM's
host can move the ORT fp32 default 2x for minutes, and the studies before today say how far it has moved it.
"""

from __future__ import annotations

from dataclasses import replace
from statistics import median
from typing import TYPE_CHECKING

from autodeploy.adapters.base import TrialConfig
from autodeploy.objectives import statistic_of
from autodeploy.results_db.records import TrialFilter, TrialRow

if TYPE_CHECKING:
    from autodeploy.results_db.store import Store

#: The newest stored trials one history reads: a study stores about ten of its baseline (a screening trial, its
#: finalist rounds, pair rounds), so this covers about the last hundred studies.
HISTORY_TRIALS = 1000


def trial_history(store: Store, where: TrialFilter, statistic: str, *,
                  exclude_study: str | None = None) -> tuple[list[float], str]:  # fmt: skip
    """One value per earlier study among the measured trials ``where`` selects, newest first, and what they come
    from: ``"studies"``, or ``"runs"`` where some trial was stored outside a study (``bench``: a run of its own).

    A study's value is the median of its finalist trials' ``statistic`` (p90, median, items/s: a name in
    :data:`autodeploy.objectives.STATISTICS`), as a study's own baseline value is the median of its rounds; the
    median of its screening trials where it ran no finalists. The trials of ``exclude_study`` (the study asking)
    are left out.
    """
    reduced = statistic_of(statistic)
    rows = store.trials(replace(where, measured_only=True, newest_first=True, limit=HISTORY_TRIALS))
    groups: dict[tuple[str, str], list[TrialRow]] = {}
    for row in rows:
        if exclude_study is not None and row.study == exclude_study:
            continue
        key = ("study", row.study) if row.study is not None else ("run", row.uid)
        groups.setdefault(key, []).append(row)
    values = []
    for group in groups.values():
        chosen = [r for r in group if r.phase == "finalist"] or group
        known = [v for r in chosen if (v := reduced.value(r)) is not None]
        if known:
            values.append(float(median(known)))
    kind = "studies" if all(kind == "study" for kind, _ in groups) else "runs"
    return values, kind


def gate_history(store: Store, *, device: str, baseline_sha256: str, config_key: str, limit: int = 50) -> list[float]:
    """One value per earlier interleaved gate run on ``device`` whose baseline was this model (SHA-256) and config:
    the median over its baseline rounds of each round's median latency (ms), newest first. Runs against stored
    history (``--against-db``) measured no baseline and are left out."""
    values = []
    for run in store.list_gate_runs(limit=limit, device=device):
        if run.mode != "interleaved" or run.baseline_sha256 != baseline_sha256:
            continue
        if TrialConfig.from_dict(run.baseline_config).key() != config_key:
            continue
        rounds = (run.settings.get("rounds_measured") or {}).get("baseline") or ()
        known = [r["median_ms"] for r in rounds if r.get("median_ms") is not None and not r.get("failure")]
        if known:
            values.append(float(median(known)))
    return values


