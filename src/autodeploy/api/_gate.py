""":func:`gate`: a baseline and a candidate in interleaved A/B worker runs, and a statistical verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.api._common import Progress, Shapes, cache_dir, open_store, python_call, silent
from autodeploy.data import Dataset
from autodeploy.device import probe_device
from autodeploy.errors import UsageError
from autodeploy.gate.stats import ALPHA, MIN_ROUNDS
from autodeploy.harness.run import HarnessSettings
from autodeploy.harness.timing import TimingPolicy
from autodeploy.images import Preprocess
from autodeploy.intake import choose_inputs, load_source, resolve_model

if TYPE_CHECKING:
    from autodeploy.gate.core import GateResult
    from autodeploy.gate.measure import Arm
    from autodeploy.results_db.store import Store


@dataclass(frozen=True)
class GateRun:
    """What :func:`gate` returns: the verdict (``result.exit_code`` is the CI's exit status), and
    where it was stored (``id`` and ``db``: ``None`` when not stored)."""

    result: GateResult
    id: int | None = None
    db: str | None = None

    @property
    def exit_code(self) -> int:
        return self.result.exit_code


def gate(
    baseline: str | Path,
    candidate: str | Path,
    *,
    max_regression: float = 0.05,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    rounds: int = 16,
    min_samples: int = MIN_ROUNDS,
    alpha: float = ALPHA,
    metrics: Sequence[str] = (),
    against_db: bool = False,
    engine: str = registry.BASELINE_ENGINE,
    precision: str = "fp32",
    batch: int = 1,
    threads: int = 1,
    shapes: Shapes | None = None,
    data: str | Path | Dataset | None = None,
    preprocess: Preprocess | None = None,
    reference_model: str | Path | None = None,
    calls: int = 100,
    duration_s: float = 0.1,
    timeout_s: float = 300.0,
    store: bool = True,
    db: str | Store | None = None,
    seed: int = 0,
    cache: Path | None = None,
    progress: Progress | None = None,
    command: str | None = None,
) -> GateRun:
    """Gate ``candidate`` against ``baseline``: interleaved A/B worker runs on this machine, a statistical verdict.

    Args:
        baseline, candidate: an ``.onnx`` path, ``zoo:NAME``, or a bundle folder or ``.tar.gz``.
        max_regression: the largest tolerated latency increase, relative (0.05: 5%).
        max_accuracy_drop: the largest tolerated accuracy drop, absolute on a 0..1 score.
        rounds: worker runs per side, interleaved A B, B A, ...
        min_samples: fewer runs per side than this is inconclusive (at least 2: a rank test needs two).
        alpha: the significance level for the whole family of metrics.
        metrics: latency metrics per run (``autodeploy.gate.core.LATENCY_METRICS``; default p10 and median).
        against_db: compare the candidate with the stored trials of the baseline's model and config on
            this device; the baseline is not run (weaker: drift between then and now is not cancelled).
        engine, precision, batch, threads: the config of model arms (bundles use their own).
        shapes, data, preprocess: as for :func:`bench`, for model arms.
        reference_model: the source ONNX model of a bundle arm, for its accuracy reference.
        calls, duration_s: timed calls and seconds per run, at least.
        timeout_s: seconds before a worker is killed.
        store: store the gate run (for the dashboard); ``db`` is opened also for ``against_db``.
        seed: the seed of synthetic inputs and of the bootstrap.
        progress: told each phase (``"baseline round 3/16"``).
        command: what to record as the command that reproduces it (default: this call).

    Raises:
        UsageError, ModelError, DataError, UnsupportedConfigError, BundleError: the input is wrong
            (the CLI's exit 64).
        AutodeployError: anything else that stopped the gate: an engine, the reference, the store (exit 70).
    """
    from autodeploy.gate.core import DEFAULT_METRICS, LATENCY_METRICS, GateSettings, run_gate
    from autodeploy.gate.stats import Criteria
    from autodeploy.results_db.store import DeviceRecord

    report = progress or silent
    metrics = tuple(metrics) or DEFAULT_METRICS
    unknown = [m for m in metrics if m not in LATENCY_METRICS]
    if unknown:
        raise UsageError(f"unknown --metric {', '.join(unknown)}", fix=f"choose from {', '.join(LATENCY_METRICS)}")  # fmt: skip
    if min_samples < 2:
        raise UsageError("--min-samples must be >= 2: a rank test needs two runs per side", fix="--min-samples 2")  # fmt: skip
    command = command or python_call("gate", str(baseline), str(candidate), engine=engine, precision=precision,
                                     batch=batch, threads=threads, against_db=against_db)  # fmt: skip
    # 1. what is judged and how: the criteria, the rounds, the timing of each worker run
    criteria = Criteria(max_regression=max_regression, max_accuracy_drop=max_accuracy_drop, alpha=alpha,
                        min_rounds=min_samples, seed=seed)  # fmt: skip
    settings = GateSettings(rounds=rounds, metrics=metrics, criteria=criteria, against_db=against_db)
    policy = TimingPolicy(warmup_min_calls=10, warmup_max_s=2.0, min_samples=calls, min_duration_s=duration_s,
                          max_duration_s=max(30.0, 4 * duration_s))  # fmt: skip
    cache = Path(cache) if cache else cache_dir()
    harness = HarnessSettings(workdir=cache / "work", policy=policy, timeout_s=timeout_s, seed=seed)
    config = TrialConfig(engine=engine, precision=precision, batch=batch, threads=threads)
    device = probe_device()
    with ExitStack() as stack:
        # 2. the store first: a bad database fails in a second, not after the rounds
        opened = stack.enter_context(open_store(db)) if store or against_db else None
        # 3. both arms, each checked to run here before any worker starts
        arms = _gate_arms((str(baseline), str(candidate)), config, harness, shapes=shapes, data=data,
                          preprocess=preprocess, reference_model=reference_model, cache=cache, progress=report,
                          stack=stack)  # fmt: skip
        for arm in arms:
            if arm.kind == "model":
                registry.get(arm.config.engine).check(device, arm.model, arm.config)
                arm.model.input_shape(arm.model.inputs[0].name, arm.config.batch)
        # 4. measure and judge
        report("starting")
        result = run_gate(*arms, settings, harness, device=device, store=opened, progress=report)
        # 5. store it for the dashboard
        if opened is None or not store:
            return GateRun(result)
        gate_id = opened.add_gate_run(result.to_record(), device=DeviceRecord.of(device), command=command)
        return GateRun(result, gate_id, opened.url)


def _gate_arms(refs: tuple[str, str], config: TrialConfig, harness: HarnessSettings, *, shapes: Shapes | None,
               data: str | Path | Dataset | None, preprocess: Preprocess | None,
               reference_model: str | Path | None, cache: Path, progress: Progress, stack: ExitStack,
               ) -> list[Arm]:  # fmt: skip
    """The baseline and candidate arms. Model arms first: a bundle arm's accuracy reference is the
    other arm's model when that is the bundle's source model (``--baseline model.onnx --candidate BUNDLE``)."""
    from autodeploy import bundle
    from autodeploy.gate.measure import bundle_arm, model_arm
    from autodeploy.model import load_model

    fixed = {k: tuple(v) for k, v in (shapes or {}).items()}
    roles = dict(zip(("baseline", "candidate"), refs, strict=True))
    models = {}
    for role, ref in roles.items():
        if not (Path(ref).is_dir() or ref.endswith((".tar.gz", ".tgz"))):  # a bundle folder or archive
            resolved = resolve_model(ref, fixed, cache_dir=cache, progress=progress)
            inputs = choose_inputs(resolved.info, load_source(data, resolved.info, preprocess), resolved,
                                   items=harness.calibration_items + harness.evaluation_items, seed=harness.seed)  # fmt: skip
            models[role] = model_arm(role, ref, resolved.info, config, data=inputs.data,
                                     calibration=inputs.calibration)  # fmt: skip
    arms = []
    for role, ref in roles.items():
        if role in models:
            arms.append(models[role])
            continue
        root = stack.enter_context(bundle.opened(Path(ref)))
        reference = load_model(reference_model, fixed) if reference_model else None
        others = [arm.model for arm in models.values()]
        arms.append(bundle_arm(role, ref, root, reference_model=reference, others=others))
    return arms
