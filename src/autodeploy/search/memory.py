"""What a study learned that no other config can change, rebuilt from its Optuna trials.

Read afresh before each trial (workers sharing a study learn from each other) and after a resume.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autodeploy.accuracy.records import Accuracy
from autodeploy.adapters.base import TrialConfig
from autodeploy.harness.run import KnownAccuracy
from autodeploy.verdict import feasible

if TYPE_CHECKING:
    import optuna


def _complete() -> Any:
    from optuna.trial import TrialState

    return TrialState.COMPLETE


@dataclass
class Memory:
    """What the study has learned that no other config can change, rebuilt from its trials on resume.

    * ``dead``: artifact key -> why every config that builds that artifact is pruned: it failed
      to build, or it broke the accuracy budget (accuracy depends on the artifact, not on
      threads, streams or hints).
    * ``seen``: config key -> the trial that measured it; a repeat is answered from it for free.
    * ``artifacts``: artifact key -> the folder built for it: configs that differ only in runtime
      settings (threads, streams, hints) are measured on it without a build worker.
    * ``accuracy``: artifact key and batch -> the accuracy measured on it, reused by every other
      config of that artifact and batch (the worker does not compare again).
    * ``slower``: ``engine/precision`` -> why that branch gets no more trials (an int8 artifact
      measured slower than fp32 on the same runtime, same batch and threads).
    * ``build_s``: engine -> the longest build timed here (what a slow conversion will cost).
    * ``timing_s``: the measure workers' timing seconds (what a finalist run will cost).
    * ``looked``: the configs measured, failed or pruned: when it holds the whole space, asking
      more only brings repeats.
    * ``behind``: ``engine/precision`` -> why it is not refined once every branch has had its look
      (:func:`outsiders`: far behind the best branch at the same batch and threads).
    * ``broken``: ``(engine, build knobs of its fp32 trial, why)``: that fp32 conversion broke the model
      (:func:`autodeploy.accuracy.rules.conversion_fault`), and every precision of the engine with those build
      knobs is built from it (:meth:`broken_by`).
    """

    dead: dict[str, str] = field(default_factory=dict)
    seen: dict[str, optuna.trial.FrozenTrial] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    accuracy: dict[str, KnownAccuracy] = field(default_factory=dict)
    slower: dict[str, str] = field(default_factory=dict)
    build_s: dict[str, float] = field(default_factory=dict)
    timing_s: list[float] = field(default_factory=list)
    looked: set[str] = field(default_factory=set)
    behind: dict[str, str] = field(default_factory=dict)
    broken: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    minimize: bool = True

    @classmethod
    def of(cls, study: optuna.Study) -> Memory:
        memory = cls()
        trials = study.get_trials(deepcopy=False)
        for t in trials:
            attrs = t.user_attrs
            if attrs.get("dead_artifact"):
                memory.dead[attrs["artifact_key"]] = attrs["dead_artifact"]
            if attrs.get("broken_conversion") and "config" in attrs:
                memory.break_conversion(TrialConfig.from_dict(attrs["config"]), attrs["broken_conversion"])
            if t.state == _complete() and "repeat_of" not in attrs:
                memory.seen.setdefault(TrialConfig.from_dict(attrs["config"]).key(), t)
            if t.state.is_finished() and "config" in attrs and not attrs.get("budget_timeout") \
                    and not attrs.get("budget_skip"):  # fmt: skip
                memory.looked.add(TrialConfig.from_dict(attrs["config"]).key())
            memory.learn(attrs)
        if len(study.directions) == 1:
            memory.minimize = study.directions[0].name == "MINIMIZE"
            memory.slower = slower_int8(trials, minimize=memory.minimize)
            memory.behind = outsiders(trials, minimize=memory.minimize)
        return memory

    def break_conversion(self, fp32: TrialConfig, reason: str) -> None:
        """Remember that ``fp32``'s conversion broke the model: :meth:`broken_by` prunes its siblings."""
        self.broken.append((fp32.engine, _build_knobs(fp32), reason))

    def broken_by(self, config: TrialConfig) -> str | None:
        """Why ``config`` is built from a conversion whose fp32 broke the model: the same engine, and the
        build knobs that fp32 trial had (a precision's own knobs, e.g. ``quant_method``, do not change it)."""
        return next((reason for engine, knobs, reason in self.broken
                     if engine == config.engine and all(config.knobs.get(k) == v for k, v in knobs.items())),
                    None)  # fmt: skip

    def learn(self, attrs: Mapping[str, Any]) -> None:
        """Take in what one measurement (a trial's user attributes) taught about its artifact."""
        config = attrs.get("config")
        if config is None:
            return
        artifact = attrs.get("artifact_key", "")
        if attrs.get("artifact_path") and artifact:
            self.artifacts.setdefault(artifact, attrs["artifact_path"])
        if attrs.get("accuracy") and artifact:
            known = KnownAccuracy(attrs.get("accuracy_uid") or attrs.get("uid", ""), Accuracy.from_dict(attrs["accuracy"]))
            self.accuracy.setdefault(accuracy_key(artifact, config["batch"]), known)
        wall = attrs.get("wall_s") or {}
        if wall.get("build") and not attrs.get("artifact_reused"):
            engine = config["engine"]
            self.build_s[engine] = max(self.build_s.get(engine, 0.0), float(wall["build"]))
        if wall.get("timing"):
            self.timing_s.append(float(wall["timing"]))


def _build_knobs(config: TrialConfig) -> dict[str, Any]:
    from autodeploy.adapters import registry

    known = registry.get(config.engine).build_knobs if config.engine in registry.targets() else frozenset()
    return {k: v for k, v in config.knobs.items() if k in known}


def accuracy_key(artifact: str, batch: int) -> str:
    return f"{artifact}/b{batch}"


#: Once every engine × precision has had its look, a branch whose best screening value is this many
#: times worse than the best branch's is not refined: other threads or knobs rarely buy that back,
#: and the finalists' interleaved runs judge only contenders.
CONTENDER_RATIO = 1.5


def outsiders(trials: list[optuna.trial.FrozenTrial], *, minimize: bool, ratio: float = CONTENDER_RATIO) -> dict[str, str]:
    """``engine/precision`` -> why it is not refined: at every batch and thread count it was measured at
    (the portfolio measures each branch at the same one), another branch did more than ``ratio`` times better.

    Branches are compared at the same settings only: a branch measured at all cores is not judged
    against another's best thread count.
    """
    best = _best_per_setting(trials, minimize)
    settings: dict[tuple[int, Any], dict[str, float]] = {}
    for (engine, precision, batch, threads), value in best.items():
        settings.setdefault((batch, threads), {})[f"{engine}/{precision}"] = value
    verdicts: dict[str, list[str]] = {}  # branch -> one reason per setting ("" where it is a contender)
    for (batch, threads), values in settings.items():
        if len(values) < 2:
            continue
        lead = min(values, key=values.__getitem__) if minimize else max(values, key=values.__getitem__)
        top = values[lead]
        for branch, value in values.items():
            factor = (value / top if minimize else top / value) if value > 0 and top > 0 else 1.0
            where = f"b{batch}/t{'default' if threads is None else threads}"
            verdicts.setdefault(branch, []).append(
                f"screened {factor:.2f}x worse than {lead} at {where} ({value:.4g} against {top:.4g}); only "
                f"branches within {ratio:g}x of the best are refined" if factor > ratio else "")  # fmt: skip
    return {branch: reasons[0] for branch, reasons in verdicts.items() if all(reasons)}


def _best_per_setting(trials: list[optuna.trial.FrozenTrial], minimize: bool) -> dict[tuple[str, str, int, Any], float]:
    """(engine, precision, batch, threads) -> the best feasible value measured there."""
    best: dict[tuple[str, str, int, Any], float] = {}
    better = min if minimize else max
    for t in trials:
        if t.state != _complete() or not t.constraints or not feasible(t.constraints):
            continue
        c = t.user_attrs["config"]
        key = (c["engine"], c["precision"], c["batch"], c["threads"])
        best[key] = better(best.get(key, t.values[0]), t.values[0])
    return best


def slower_int8(trials: list[optuna.trial.FrozenTrial], *, minimize: bool) -> dict[str, str]:
    """``engine/int8…`` -> reason, for each int8 branch whose best feasible value is worse than fp32's
    on the same engine at every batch and thread count both were measured at (at least one)."""
    best = _best_per_setting(trials, minimize)
    out: dict[str, str] = {}
    for (engine, precision, batch, threads), value in best.items():
        if not precision.startswith("int8"):
            continue
        branch = f"{engine}/{precision}"
        fp32 = best.get((engine, "fp32", batch, threads))
        if fp32 is None:
            continue
        faster = value < fp32 if minimize else value > fp32
        if faster:
            out[branch] = ""  # one setting where int8 wins keeps the branch open
        elif branch not in out or out[branch]:
            where = f"b{batch}/t{'default' if threads is None else threads}"
            out[branch] = (f"{precision} measured slower than fp32 on {engine} ({where}: {value:.4g} against "
                           f"{fp32:.4g}); no more trials on this branch")  # fmt: skip
    return {k: v for k, v in out.items() if v}
