"""Export the winner of a study (or one stored trial) as a bundle (docs/architecture.md, "Layers").

The pipeline reads top to bottom: find the trial in the store (:func:`study_winner`,
:func:`stored_trial`), describe it (:func:`build_manifest`), and write it atomically
(:func:`write_bundle`; :mod:`autodeploy.bundle.triton` for a Triton repository). Writing
happens in a hidden staging folder next to the destination; every file and folder is
fsynced, then one ``rename`` publishes it, so a killed export leaves either nothing at the
destination or a complete bundle. Leftover staging folders of dead exports are removed by
the next export to the same place.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy import report, runtime
from autodeploy.adapters import registry
from autodeploy.adapters.base import ARTIFACT_FILE, Artifact, Engine, TrialConfig
from autodeploy.bundle import loader
from autodeploy.bundle.archive import write_tar
from autodeploy.bundle.loader import KIND, MANIFEST, MANIFEST_DIGEST, MODEL_DIR, SCHEMA, BundleError
from autodeploy.errors import BuildError, StoreError, UnknownEngineError, UsageError, WriteError
from autodeploy.harness.cold_start import COMPILED_DIR
from autodeploy.harness.result import headline
from autodeploy.model import ModelInfo, TensorSpec
from autodeploy.objectives import DEFAULT_SCENARIO, MEDIAN, P90, SCENARIOS, stored
from autodeploy.redact import mask_secrets
from autodeploy.runtime import cache, machine
from autodeploy.search import summary as study_words
from autodeploy.shapes import ShapeSet, parse_key

if TYPE_CHECKING:
    from autodeploy.results_db.records import StudyRow, TrialRow
    from autodeploy.results_db.store import Store

REQUIREMENTS = "requirements.txt"
README = "README.md"
#: The runtime modules every bundle ships besides its engine's (the shared base, machine probe and compiled cache).
RUNTIME_COMMON = ("__init__", "base", "machine", "cache")


@dataclass(frozen=True)
class Source:
    """What is shipped: one stored trial, its study (``None`` for a bench trial), model and device."""

    trial: TrialRow
    study: StudyRow | None
    model: dict[str, Any]  # name, sha256, inputs, outputs (as stored)
    device: dict[str, Any]  # DeviceInfo.to_dict() as stored
    #: A study over several shapes: the shipped config's trial at each of its shapes, in the study's order,
    #: each from the round the shipped trial ran in (:func:`at_each_shape`); empty otherwise.
    by_shape: tuple[TrialRow, ...] = ()
    #: This machine's artifact store (``<cache>/work/artifacts``): set, the artifact is taken only from a folder of
    #: it built from the trial's model, never from wherever the trial row says (a fleet agent's export: anyone
    #: with the database URL can write that row). ``None``: the row's path, as a local export takes it.
    artifacts: Path | None = None

    @property
    def config(self) -> TrialConfig:
        return self.trial.config

    @property
    def what(self) -> str:
        where = f"study {self.study.name!r} winner" if self.study else "trial"
        return f"{where} {self.config.label()} (trial {self.trial.id})"


# -- 1. find what to ship ------------------------------------------------------------------


def study_winner(store: Store, name: str) -> Source:
    """The winning trial of study ``name``; an error naming the study's note when it has none."""
    study = store.get_study(name)
    if study is None:
        known = ", ".join(s.name for s in store.list_studies(limit=20)) or "none yet"
        raise UsageError(f"no study named {name!r} in results database {store.url}",
                         fix=f"choose one of: {known} (autodeploy tune creates studies)")  # fmt: skip
    if not study.winner_uid:
        note = (study.summary or {}).get("note") or "the study has not finished"
        raise BundleError(f"study {name!r} has no winner: {note}",
                          fix="relax the constraints or add trials (autodeploy tune --resume), "
                          "or export one measured trial with --trial ID")  # fmt: skip
    # Imported here: `bundle verify` imports this module and needs no SQL.
    from autodeploy.results_db.records import TrialFilter

    # The winner may be a measurement reused from an earlier run.
    trial = store.trial(TrialFilter(uid=study.winner_uid), samples=False)
    if trial is None:
        raise StoreError(f"study {name!r} names winner trial {study.winner_uid}, which is not in the store",
                         fix="run the study again (autodeploy tune --resume)")  # fmt: skip
    return _source(store, trial, study)


def stored_trial(store: Store, trial_id: int) -> Source:
    """One stored trial (e.g. from ``autodeploy bench``), with its study when it belongs to one."""
    from autodeploy.results_db.records import TrialFilter

    trial = store.trial(TrialFilter(id=trial_id))
    if trial is None:
        raise UsageError(f"no trial {trial_id} in results database {store.url}",
                         fix="list trials with `autodeploy results list`")  # fmt: skip
    return _source(store, trial, store.get_study(trial.study) if trial.study else None)


def _source(store: Store, trial: TrialRow, study: StudyRow | None) -> Source:
    fix = "export a trial that passed (autodeploy results list --status ok)"
    if not trial.measured or trial.accuracy is None:
        why = (
            f"it failed ({trial.failure_kind}: {headline(trial.failure_message)})"
            if trial.status != "ok"
            else "it has no measurement"
        )
        raise BundleError(f"trial {trial.id} ({trial.engine}) cannot be shipped: {why}", fix=fix)
    model, device = _records(store, trial.model_sha256, trial.device_fingerprint)
    source = Source(trial, study, model, device, at_each_shape(store, trial, study))
    if trial.status != "ok":
        # A study may set a looser accuracy budget than the harness default; its verdict decides.
        study_verdicts = {k: v for k, v in constraint_verdicts(source).items() if k != "accuracy"}
        if not (
            trial.failure_kind == "inaccurate"
            and study_verdicts
            and all(v["passed"] for v in study_verdicts.values())
        ):
            raise BundleError(f"trial {trial.id} ({trial.engine}) cannot be shipped: it failed "
                              f"({trial.failure_kind}: {headline(trial.failure_message)})", fix=fix)  # fmt: skip
    return source


def at_each_shape(store: Store, trial: TrialRow, study: StudyRow | None) -> tuple[TrialRow, ...]:
    """The trial of ``trial``'s config at each shape of its study, when the study covers several: the shipped
    one, and at every other shape the newest measured trial stored before it (a round measures a config at
    each shape in turn, the shipped trial last). A shape without one is left out."""
    cases = ShapeSet.of(study.settings.get("shapes") or {}).cases if study is not None else ()
    if len(cases) < 2:
        return ()
    from autodeploy.results_db.records import TrialFilter

    found = []
    for case in cases:
        if case.key() == trial.shape_key:
            found.append(trial)
            continue
        where = TrialFilter(study=study.name, config_key=trial.config_key, shape_key=case.key(),  # type: ignore[union-attr]
                            measured_only=True, newest_first=True)  # fmt: skip
        before = next((t for t in store.trials(where) if t.id < trial.id), None)
        if before is not None:
            found.append(before)
    return tuple(found)


def _records(store: Store, model_sha256: str, fingerprint: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The stored model interface and device info (the trial rows do not carry them)."""
    model, device = store.model_interface(model_sha256), store.device_info(fingerprint)
    if model is None or device is None:
        raise StoreError(f"{store.url} lacks the model or device of a trial: the database is inconsistent",
                         fix="re-run the trial into a fresh database")  # fmt: skip
    return model, device


def artifact_of(source: Source) -> Artifact:
    """The benchmarked artifact folder, checked to be complete and to match the trial (and, with
    ``source.artifacts``, to be a folder of this machine's artifact store built from the trial's model)."""
    trial = source.trial
    path = Path(trial.artifact_path or "")
    fix = f"re-run the trial ({trial.command or 'autodeploy bench ...'}) to rebuild it, then export the new trial"
    if source.artifacts is not None:
        _check_in_store(trial, path, source.artifacts)
    if not trial.artifact_path or not (path / ARTIFACT_FILE).is_file():
        raise BundleError(
            f"the artifact of trial {trial.id} is gone from {path} (the cache was cleared?)", fix=fix
        )
    artifact = Artifact.read(path)
    built_from = (artifact.model_sha256, _converted_from(artifact))
    if source.artifacts is not None and trial.model_sha256 not in built_from:
        raise BundleError(f"the artifact at {path} was built from model sha256 {artifact.model_sha256[:12] or '?'}, "
                          f"trial {trial.id} measured {trial.model_sha256[:12]}: not shipped", fix=fix)  # fmt: skip
    if artifact.engine != trial.engine or artifact.engine_version != trial.engine_version:
        raise BundleError(f"the artifact at {path} is {artifact.engine} {artifact.engine_version}, "
                          f"trial {trial.id} ran {trial.engine} {trial.engine_version}", fix=fix)  # fmt: skip
    missing = [f for f in artifact.files if not (path / f).is_file()]
    if missing:
        raise BundleError(f"the artifact at {path} lacks {', '.join(missing)}", fix=fix)
    return artifact


def _check_in_store(trial: TrialRow, path: Path, store: Path) -> None:
    """Refuse an artifact path that is not a folder directly in ``store`` (symbolic links resolved): a trial row
    naming ``/root/private-model`` would otherwise ship that folder."""
    inside = bool(trial.artifact_path) and path.is_absolute() and not path.is_symlink()
    if not (inside and path.resolve().parent == store.resolve()):
        raise BundleError(f"trial {trial.id} names artifact {trial.artifact_path!r}, which is not in this machine's "
                          f"artifact store {store}: refused, nothing shipped (a stored row names a path, it never "
                          "chooses what ships)", fix="re-run the study on this device, so its own build is shipped")  # fmt: skip


def _converted_from(artifact: Artifact) -> str:
    """The SHA-256 of the model a converted artifact came from (a ``.tflite`` through tf2onnx), or ``""``."""
    source = artifact.meta.get("source")
    return str(source.get("sha256") or "") if isinstance(source, Mapping) else ""


# -- 2. describe it ------------------------------------------------------------------------


def shipped_engine(config: TrialConfig) -> Engine:
    """The adapter of a config whose artifact a bundle can run: its runtime ships in :mod:`autodeploy.runtime`."""
    try:
        engine = registry.get(config.engine)
    except UnknownEngineError:
        engine = None
    if engine is None or not engine.runtime_module(config).startswith(f"{runtime.__name__}."):
        raise BundleError(f"cannot bundle engine {config.engine!r}: the bundle loader has no runner for it",
                          fix="export a winner whose engine runs on a runtime in autodeploy.runtime "
                          "(onnxruntime, openvino, tflite, tensorrt, inhouse)")  # fmt: skip
    return engine


def serving_engine(manifest: dict[str, Any]) -> Engine:
    """The adapter whose runtime runs the bundle described by ``manifest`` (:meth:`Engine.serving_engine`)."""
    config = TrialConfig.from_dict(manifest["settings"])
    return shipped_engine(config).serving_engine(config)


def engine_record(config: TrialConfig, engine_version: str) -> dict[str, Any]:
    """The manifest's ``engine``: what measured it, and the runtime (module, packages, version) that runs it."""
    engine = shipped_engine(config)
    packages = engine.runtime_packages(config)
    try:
        runtime_version = engine.runtime_version(engine_version, config)
    except BuildError as exc:
        raise BundleError(exc.message, fix=exc.fix) from None
    return {"name": config.engine, "version": engine_version, "package": packages[0], "packages": list(packages),
            "runtime": engine.runtime_module(config).rpartition(".")[2], "runtime_version": runtime_version}  # fmt: skip


def runtime_settings(config: TrialConfig, artifact: Artifact, model: ModelInfo) -> dict[str, Any]:
    """The settings the bundle's runtime applies: the adapter's own, exactly as the harness applied them."""
    return shipped_engine(config).runtime_settings(artifact, config, model)


def device_requirements(config: TrialConfig, artifact: Artifact, device: dict[str, Any]) -> dict[str, Any]:
    """What the target must have for the artifact to run at all (not merely fast)."""
    try:
        return shipped_engine(config).requirements(artifact, config, device)
    except BuildError as exc:
        raise BundleError(exc.message, fix=exc.fix) from None


def model_info(source: Source) -> ModelInfo:
    """The shipped model's interface as the trial ran it: the trial's fixed shapes, and the
    ranges of every shape its study covered (what a TensorRT profile spans)."""
    m, shape_set = source.model, measured_shapes(source)
    specs = [tuple(TensorSpec(t["name"], t["dtype"], tuple(t["shape"])) for t in m[k]) for k in ("inputs", "outputs")]
    return ModelInfo(path=Path(m.get("path") or m["name"]), name=m["name"], sha256=m["sha256"], inputs=specs[0],
                     outputs=specs[1], opset=0, shapes=trial_shapes(source),
                     shape_ranges=shape_set.ranges() if shape_set.several else {})  # fmt: skip


def trial_shapes(source: Source) -> dict[str, tuple[int, ...]]:
    """The shapes fixed for the shipped trial: its own (recorded since schema 0003), else its study's single set."""
    if source.trial.shape_key is not None:
        return parse_key(source.trial.shape_key)
    shape_set = ShapeSet.of(source.study.settings.get("shapes") or {}) if source.study else ShapeSet()
    return dict(shape_set.cases[0].shapes) if not shape_set.several else {}


def measured_shapes(source: Source) -> ShapeSet:
    """Every shape the choice was measured on: the study's shape set, or the bench trial's one shape."""
    if source.study is not None:
        return ShapeSet.of(source.study.settings.get("shapes") or {})
    return ShapeSet.single(trial_shapes(source))


def shapes_record(source: Source) -> dict[str, Any]:
    """The manifest's ``shapes``: the shapes measured (with their weights), every input's shape as
    the shipped trial fed it, each input's batch axis, so the loader can tell a new shape, and the shape the
    manifest's ``measurements`` are at (``shipped``: ``x=1x3x320x320``; :func:`shipped_numbers`)."""
    info = model_info(source)
    cases = measured_shapes(source).cases
    return {"measured": [{"shape": {k: list(v) for k, v in c.shapes.items()}, "weight": c.weight} for c in cases],
            "fed": source.trial.shapes, "batch_axes": {s.name: info.batch_axis(s.name) for s in info.inputs},
            "shipped": shape_text(source.trial)}  # fmt: skip


def shipped_numbers(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A manifest's ``measurements`` with the shape they are at, the shapes fed and the trial, as a
    ``by_shape`` entry has them (``measurements`` itself keeps the format of a measurement)."""
    shapes = manifest.get("shapes") or {}
    return {**manifest["measurements"], "shape": shapes.get("shipped") or "", "fed": shapes.get("fed"),
            "trial_id": (manifest.get("source") or {}).get("trial_id")}  # fmt: skip


def shape_text(trial: TrialRow) -> str:
    """The shape a trial's numbers are at: its fixed shapes (``x=1x3x320x320``), else every input as fed, else ``""``."""
    return "" if trial.shape_text == "-" else trial.shape_text


def numbers_of(trial: TrialRow, weight: float | None = None) -> dict[str, Any]:
    """One trial's numbers as a manifest keeps them, each set named by the shape it is at: ``shape``, ``fed``
    (every input's shape as fed), the trial, its scenario and batch, median/p90/p99, samples, items/s, the load."""
    m = trial.measurement
    assert m is not None  # shipped trials and their siblings are measured
    numbers = {k: v for k, v in m.to_dict(samples=False).items() if k in _NUMBERS}
    return {"shape": shape_text(trial), "fed": trial.shapes, "trial_id": trial.id, **numbers,
            **({"weight": weight} if weight is not None else {})}  # fmt: skip


#: The measurement fields a manifest's ``by_shape`` repeats per shape.
_NUMBERS = ("scenario", "batch", "median_ms", "p90_ms", "p99_ms", "n_samples", "throughput", "load")


def numbers_text(numbers: Mapping[str, Any]) -> str:
    """A manifest's numbers in one line, naming what they are: ``p90 44.67 ms at x=1x3x320x320, one call at a
    time, solo``: the statistic (p90, else the median where too few calls were timed for a p90), the shape, the
    scenario's calls, and the machine: ``solo`` (other processes kept under a quarter of a core busy) or
    ``under load (1.38 of 2 cores busy with other processes)``; nothing where the load was not read (a bundle
    exported before it was)."""
    from autodeploy.harness.load import Load
    from autodeploy.units import fmt_ms

    shown = P90 if numbers.get(P90.field) is not None else MEDIAN
    text = f"{shown.name} {fmt_ms(numbers.get(shown.field))}"
    if numbers.get("shape"):
        text += f" at {numbers['shape']}"
    scenario = numbers.get("scenario")  # how its calls came: a name the table lacks as is, none: the default's
    known = SCENARIOS.get(scenario or "")
    text += f", {known.words if known else scenario or DEFAULT_SCENARIO.name}"
    load = Load.from_dict(numbers["load"]) if numbers.get("load") else None
    if load is not None:
        text += (f", under load ({load.other_cores:.2f} of {load.cpus} cores busy with other processes)"
                 if load.under_load else ", solo")  # fmt: skip
    return text


def basis_text(selection: Mapping[str, Any]) -> str:
    """What a study's winner line rests on, from a manifest's ``selection``: ``the median over 3 rounds of each
    round's p90, their mean over 2 shapes``; "" for a bundle exported before the selection said."""
    statistic, rounds = selection.get("statistic"), selection.get("rounds") or 0
    if not statistic:
        return ""
    text = (f"the median over {rounds} rounds of each round's {statistic}" if rounds
            else f"one screening run's {statistic}")  # fmt: skip
    shapes = selection.get("shapes") or ()
    return text + (f", their mean over {len(shapes)} shapes" if len(shapes) > 1 else "")


def inputs_of(source: Source) -> dict[str, Any] | None:
    """What the shipped trial was fed (data source, image preprocessing): recorded with it (schema
    0005), else its study's ``data`` and ``preprocess`` keys; ``None`` when unknown (an older bench trial)."""
    if source.trial.inputs is not None:
        return dict(source.trial.inputs)
    if source.study is None:
        return None
    from autodeploy import zoo
    from autodeploy.images import Preprocess
    from autodeploy.intake import inputs_record

    settings = source.study.settings
    preprocess = settings.get("preprocess")
    return inputs_record(settings.get("data"), Preprocess.from_dict(preprocess) if preprocess else None,
                         zoo.own_inputs(source.model["name"]))  # fmt: skip


def inputs_text(inputs: dict[str, Any] | None) -> str:
    """``photos/ (NCHW, RGB, mean [...], scale [...])``: a manifest's ``inputs`` in one line."""
    if not inputs:
        return "not recorded"
    p = inputs.get("preprocess")
    if not p:
        return str(inputs["data"])
    steps = [p.get("layout") or "layout from the model", "BGR" if p.get("reverse_input_channels") else "RGB"]
    steps += [f"{k.split('_')[0]} {p[k]}" for k in ("mean_values", "scale_values") if p.get(k)]
    return f"{inputs['data']} ({', '.join(steps)})"


def constraint_verdicts(source: Source) -> dict[str, Any]:
    """Each constraint that chose the trial: its limit, the measured value and whether it held
    (:func:`autodeploy.verdict.constraint_verdicts`, the study's own rule)."""
    acc = source.trial.accuracy
    assert acc is not None
    verdicts: dict[str, Any] = {"accuracy": {"constraint": acc.constraint, "passed": acc.passed}}
    if source.study is None:
        return verdicts
    from autodeploy import verdict
    from autodeploy.search.config import Constraints
    from autodeploy.search.objective import Metrics

    limits = verdict.Limits.of(Constraints(**(source.study.settings.get("constraints") or {})))
    # The store keeps no server rate: a server study's rate constraint is the study's to judge.
    measured = Metrics.of_row(source.trial).measured(server_rate=None)
    return {**verdicts, **verdict.constraint_verdicts(measured, limits, stored(source.study.objective))}


def _version() -> str:
    """This autodeploy's version as installed (pyproject.toml's), read from the package metadata as
    ``autodeploy.__version__`` is, without importing the package top from below it (``0+unknown``: a source tree on
    PYTHONPATH, never installed)."""
    return machine.version("autodeploy") or "0+unknown"


def build_manifest(source: Source, artifact: Artifact, *, command: str | None = None) -> dict[str, Any]:
    """Everything about the shipped trial except the file list (the writer adds it)."""
    trial, study, config = source.trial, source.study, source.config
    selection = None
    if study is not None and study.summary:
        summary = study.summary
        selection = {"objective": study.objective, "winner": summary.get("winner"), "tie_with": summary.get("tie_with"),
                     "speedup_vs_baseline": summary.get("speedup_vs_baseline"), "note": summary.get("note"),
                     "headline": study_words.headline(summary), "screening_only": bool(summary.get("screening_only")),
                     "trials": summary.get("trials"), "baseline_name": study_words.baseline_name(summary),
                     # what the headline's number is: this statistic of each round, at these shapes, over rounds
                     "statistic": summary.get("statistic"), "rounds": summary.get("rounds"),
                     "shapes": [{"shape": c.key(), "weight": c.weight} for c in measured_shapes(source).cases],
                     "baseline": next((f for f in summary.get("finalists", []) if f.get("baseline")), None)}  # fmt: skip
    d = source.device
    assert trial.measurement is not None  # _source ships measured trials only
    measurements = trial.measurement.to_dict(samples=False)
    accuracy = measurements.pop("accuracy")  # a section of its own
    # Every number says the shape it is at: the shipped trial's (shapes.shipped), and per shape of a study over several.
    weights = {c.key(): c.weight for c in measured_shapes(source).cases}
    return {
        "schema": SCHEMA,
        "kind": KIND,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "created_by": f"autodeploy {_version()}",
        "export_command": mask_secrets(command),  # a bundle ships: never a database password
        "source": {
            "study": study.name if study else None,
            "trial_id": trial.id,
            "trial_uid": trial.uid,
            "phase": trial.phase,
            "reproduce": mask_secrets(study.command if study and study.command else trial.command),
            "trial_command": mask_secrets(trial.command),
        },  # fmt: skip
        "model": {**source.model, "shapes": {k: list(v) for k, v in trial_shapes(source).items()}},
        "shapes": shapes_record(source),
        "inputs": inputs_of(source),  # what it was measured on: `bundle run --data` preprocesses images the same way
        "engine": engine_record(config, trial.engine_version or "unknown"),
        "settings": config.to_dict(),
        "runtime": runtime_settings(config, artifact, model_info(source)),
        "artifact": {k: v for k, v in artifact.to_dict().items() if k != "schema"},
        "device": {
            "fingerprint": trial.device_fingerprint,
            "cpu": trial.device_cpu,
            **{
                k: d.get(k)
                for k in ("arch", "isa", "gpus", "physical_cores", "logical_cores", "memory_gb", "os")
            },
        },  # fmt: skip
        "requires": device_requirements(config, artifact, d),
        "measurements": measurements,
        "by_shape": [numbers_of(t, weights.get(t.shape_key or "")) for t in source.by_shape],
        "selection": selection,
        "accuracy": accuracy,
        "constraints": constraint_verdicts(source),
        "files": {},
    }


def requirements_txt(manifest: dict[str, Any]) -> str:
    """``name==version`` lines only (the loader refuses anything else): numpy and the engine runtime, pinned."""
    engine = manifest["engine"]
    lines = ["# The runtime this bundle was benchmarked with. Verify the bundle first (autodeploy bundle verify .),",
             "# then run the pip line it prints (these pins on the command line, wheels only), not pip install -r",
             _pinned("numpy"), f"{engine['package']}=={engine['runtime_version']}"]  # fmt: skip
    for extra in serving_engine(manifest).runner_extras:
        lines.append(_pinned(extra))
    return "\n".join(lines) + "\n"


def _pinned(dist: str) -> str:
    """``dist==VERSION`` as installed here; a comment when it is not (an unpinned name is no pin)."""
    found = machine.version(dist)
    if found is not None:
        return f"{dist}=={found}"
    return f"# {dist}: not installed where this bundle was exported; install the version that fits the engine"


def readme_md(manifest: dict[str, Any]) -> str:
    s, m = manifest["settings"], manifest["measurements"]
    label = TrialConfig.from_dict(s).label()
    p90 = "-" if m["p90_ms"] is None else f"{m['p90_ms']:.3f} ms"
    origin = f"study {manifest['source']['study']!r}" if manifest["source"]["study"] else "a single trial"
    inputs = ", ".join(f"{i['name']} {i['dtype']}" for i in manifest["model"]["inputs"])
    pins = " ".join(line for line in requirements_txt(manifest).splitlines() if line and not line.startswith("#"))
    shipped = shipped_numbers(manifest)
    at = f", input {shipped['shape']}" if shipped["shape"] else ""
    for other in manifest.get("by_shape") or ():  # a study over several shapes: each one's numbers
        if other.get("trial_id") != shipped["trial_id"]:
            at += f"; at {other['shape']}: median {other['median_ms']:.3f} ms (trial {other['trial_id']})"
    return f"""# {manifest["model"]["name"]}: {label}

Exported by {manifest["created_by"]} from {origin}.
Measured on `{manifest["device"]["cpu"]}` (fingerprint `{manifest["device"]["fingerprint"]}`):
median {m["median_ms"]:.3f} ms, p90 {p90}, {m["throughput"]:.1f} items/s at batch {m["batch"]}{at}.
Measured on inputs: {inputs_text(manifest.get("inputs"))}; feed images preprocessed the same way.

```bash
autodeploy bundle verify .               # first, with code that is not in this bundle (add --trust KEY.pub)
{loader.PIP_INSTALL} {pins}   # the line verify prints: pip reads no file from this bundle
python -I loader.py                      # verify every file and check this machine can run it
```

Install the pins on the command line as above; never hand `requirements.txt` to pip (`-r`): pip
decodes that file by an encoding line of its own choosing, so a comment can become a path that runs
code at install. The loader and `autodeploy bundle verify` refuse a `requirements.txt` that is not
plain ASCII `name==version` lines.

```python
import runpy
loader = runpy.run_path("path/to/this/folder/loader.py")   # from source; the folder is not put on sys.path
predictor = loader["load"]("path/to/this/folder")   # verifies checksums, engine version, CPU/GPU features
outputs = predictor.run({{name: array, ...}})          # inputs: {inputs}
```

`manifest.json` holds the tuned settings, the measurements and accuracy that chose this
config, the constraint verdicts, every file's SHA-256, and the command that reproduces it:
`{manifest["source"]["reproduce"]}`. With autodeploy installed: `autodeploy bundle info|verify|run .`
"""


# -- 3. write it atomically ------------------------------------------------------------------


def write_bundle(source: Source, dest: str | Path, *, tar: bool = False, command: str | None = None,
                 sign_key: str | Path | None = None) -> Path:  # fmt: skip
    """Write the bundle folder (or, with ``tar``, a ``.tar.gz`` of it) at ``dest``; return ``dest``.

    With ``sign_key`` (a PEM elliptic-curve private key) the bundle is also signed (:func:`sign`).
    """
    dest = Path(dest)
    if sign_key is not None:
        loader.check_key(sign_key, private=True)  # before anything is written
    artifact = artifact_of(source)
    manifest = build_manifest(source, artifact, command=command)
    with staged(dest, tar=tar) as stage:
        (stage / MODEL_DIR).mkdir()
        for name in (ARTIFACT_FILE, *artifact.files):  # exactly the benchmarked files, nothing else
            (stage / MODEL_DIR / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(artifact.path / name, stage / MODEL_DIR / name)
        shutil.copyfile(Path(loader.__file__), stage / loader.LOADER)
        (stage / loader.RUNTIME_DIR).mkdir()
        for name in (*RUNTIME_COMMON, manifest["engine"]["runtime"]):  # the same files the harness ran
            source_file = Path(runtime.__file__).with_name(f"{name}.py")
            shutil.copyfile(source_file, stage / loader.RUNTIME_DIR / source_file.name)
        made = compiled_cache(artifact, manifest)
        if made is not None:  # made here when the cold start was measured: shipped, verified like every file
            shutil.copytree(made[0], stage / loader.COMPILED_DIR)
            manifest["compiled_cache"] = made[1]
        (stage / REQUIREMENTS).write_text(requirements_txt(manifest))
        (stage / README).write_text(readme_md(manifest))
        seal(stage, manifest)
        check_as_measured(source, {name: entry["sha256"] for name, entry in _model_files(manifest)})
        if sign_key is not None:
            sign(stage, sign_key)
    return dest


def compiled_cache(artifact: Artifact, manifest: Mapping[str, Any]) -> tuple[Path, dict[str, Any]] | None:
    """The engine's compiled cache the harness made for the shipped artifact and settings on this machine
    (``harness/cold_start.py``, kept beside the artifacts), and the manifest's record of it (the engine, its
    version and the key: this device, the artifact, the settings); ``None`` where there is none, or it is not
    whole or not made under this engine version here (``runtime/cache.py`` ``why_not``)."""
    settings = manifest["runtime"]
    folder = artifact.path.parent.parent / COMPILED_DIR / f"{artifact.path.name}-{cache.settings_key(settings)}"
    engine, version = manifest["engine"]["runtime"], manifest["engine"]["runtime_version"]
    key = cache.cache_key(artifact.key, settings)
    if not folder.is_dir() or cache.why_not(folder, engine, version, key) is not None:
        return None
    return folder, {"dir": loader.COMPILED_DIR, "engine": engine, "version": version, "key": key}


def _model_files(manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    prefix = f"{MODEL_DIR}/"
    return [(name[len(prefix):], entry) for name, entry in manifest["files"].items() if name.startswith(prefix)]


def check_as_measured(source: Source, shipped: dict[str, str]) -> None:
    """Refuse to ship artifact bytes other than the ones the trial measured (their SHA-256 is stored).

    ``shipped`` maps each shipped artifact file (relative to the artifact folder) to its SHA-256,
    taken from the copies that will ship, so a file replaced in the cache after the measurement is caught.
    Trials stored before the store kept these hashes are shipped unchecked.
    """
    measured = source.trial.artifact_files
    if not measured:
        return
    for name, digest in shipped.items():
        if measured.get(name) != digest:
            raise BundleError(f"the artifact file {name} of trial {source.trial.id} is not the one that was measured "
                              f"(its SHA-256 differs from the one stored at measurement)",
                              fix=f"re-run the trial ({source.trial.command or 'autodeploy bench ...'}) and export the "
                              "new one; never edit a cached artifact")  # fmt: skip


def manifest_digest(path: str | Path) -> str:
    """SHA-256 of the manifest of the bundle (folder or .tar.gz) or Triton repository at ``path``."""
    import hashlib

    from autodeploy.bundle.archive import open_archive

    path = Path(path)
    if path.is_dir():
        found = [path / MANIFEST] if (path / MANIFEST).is_file() else sorted(path.glob(f"*/{MANIFEST}"))
        return hashlib.sha256(found[0].read_bytes()).hexdigest()
    with open_archive(path) as tar:
        for member in tar:
            parts = member.name.split("/")
            if parts[-1] == MANIFEST and len(parts) <= 3 and member.isfile():
                return hashlib.sha256(tar.extractfile(member).read()).hexdigest()  # type: ignore[union-attr]
    raise BundleError(f"{path} holds no {MANIFEST}", fix="pass a bundle made by `autodeploy export`")


def sign(folder: Path, private_key: str | Path) -> None:
    """Sign every file of a sealed bundle with OpenSSF model-signing into ``bundle.sig``.

    model-signing is the ML ecosystem's signing format (a Sigstore bundle holding a DSSE-signed
    in-toto statement of every file's SHA-256), so a bundle can be checked with its own
    ``model_signing verify key`` command as well as with ``autodeploy bundle verify --trust``.
    """
    try:
        from model_signing import hashing, signing
    except ImportError as exc:
        raise UsageError(f"--sign needs model-signing, which cannot be imported ({exc})",
                         fix=loader.SIGN_INSTALL) from None  # fmt: skip
    config = signing.Config().use_elliptic_key_signer(private_key=Path(private_key))
    config.set_hashing_config(hashing.Config().set_ignored_paths(paths=[loader.SIGNATURE], ignore_git_paths=False))
    try:
        config.sign(folder, folder / loader.SIGNATURE)
    except (OSError, ValueError, TypeError) as exc:  # unreadable or wrong kind of key
        raise UsageError(f"cannot sign with {private_key}: {type(exc).__name__}: {exc}",
                         fix="pass a PEM elliptic-curve private key (openssl ecparam -genkey -name prime256v1)") from None  # fmt: skip


def seal(folder: Path, manifest: dict[str, Any]) -> None:
    """List every file of ``folder`` with its SHA-256 and size, then write the manifest and its digest."""
    manifest["files"] = {
        p.relative_to(folder).as_posix(): {"sha256": loader.sha256_file(p), "size": p.stat().st_size}
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
    data = (report.strict_json(manifest, indent=2) + "\n").encode()  # strict: an exact output's SQNR inf is null
    (folder / MANIFEST).write_bytes(data)
    (folder / MANIFEST_DIGEST).write_text(loader.digest_line(data))


@contextmanager
def staged(dest: Path, *, tar: bool) -> Iterator[Path]:
    """Yield an empty staging folder; when the block succeeds it becomes ``dest`` in one rename.

    With ``tar`` the folder is archived first and the archive is renamed to ``dest``. On any
    exception the staging folder is removed and ``dest`` is never created.
    """
    if dest.exists() or dest.is_symlink():
        raise UsageError(f"{dest} already exists", fix="choose another -o, or remove it first")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(dest)
    tmp = dest.parent / f".{dest.name}.partial-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        stage = tmp / "content"
        stage.mkdir()
        yield stage
        _fsync_tree(stage)
        if tar:
            archive = tmp / "content.tar.gz"
            write_tar(stage, archive, arcroot=_stem(dest))
            _fsync(archive)
            os.rename(archive, dest)
        else:
            os.rename(stage, dest)
        _fsync(dest.parent)
    except OSError as exc:  # a full disk is the user's to fix in one line, not a traceback
        error = WriteError.of(exc, dest, dest.parent, instead="choose another --output")
        if error is None:
            raise
        raise error from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".tar.gz", ".tgz", ".tar"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _remove_stale(dest: Path) -> None:
    """Staging folders left by exports to ``dest`` that were killed (their process is gone)."""
    prefix = f".{dest.name}.partial-{socket.gethostname()}-"
    for leftover in dest.parent.glob(f".{dest.name}.partial-*"):
        pid = leftover.name[len(prefix) :].split("-")[0] if leftover.name.startswith(prefix) else ""
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*"), reverse=True):  # files before the folders holding them
        _fsync(path)
    _fsync(folder)
