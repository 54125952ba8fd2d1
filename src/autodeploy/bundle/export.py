"""Export the winner of a study (or one stored trial) as a bundle (DESIGN.md, "Bundle").

The pipeline reads top to bottom: find the trial in the store (:func:`study_winner`,
:func:`stored_trial`), describe it (:func:`build_manifest`), and write it atomically
(:func:`write_bundle`; :mod:`autodeploy.bundle.triton` for a Triton repository). Writing
happens in a hidden staging folder next to the destination; every file and folder is
fsynced, then one ``rename`` publishes it, so a killed export leaves either nothing at the
destination or a complete bundle. Leftover staging folders of dead exports are removed by
the next export to the same place.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy import __version__
from autodeploy.adapters.base import ARTIFACT_FILE, Artifact, TrialConfig
from autodeploy.bundle import loader
from autodeploy.bundle.archive import write_tar
from autodeploy.bundle.loader import KIND, MANIFEST, MANIFEST_DIGEST, MODEL_DIR, SCHEMA, BundleError
from autodeploy.errors import StoreError, UsageError

if TYPE_CHECKING:
    from autodeploy.results_db.store import Store, StudyRow, TrialRow

REQUIREMENTS = "requirements.txt"
README = "README.md"
#: Extra runtime packages an engine's runner imports besides the engine itself.
RUNNER_EXTRAS = {"tensorrt": ("cuda-python",)}


@dataclass(frozen=True)
class Source:
    """What is shipped: one stored trial, its study (``None`` for a bench trial), model and device."""

    trial: TrialRow
    study: StudyRow | None
    model: dict[str, Any]  # name, sha256, inputs, outputs (as stored)
    device: dict[str, Any]  # DeviceInfo.to_dict() as stored

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
    trial = store.trial(study.winner_uid, samples=False)  # may be a measurement reused from an earlier run
    if trial is None:
        raise StoreError(f"study {name!r} names winner trial {study.winner_uid}, which is not in the store",
                         fix="run the study again (autodeploy tune --resume)")  # fmt: skip
    return _source(store, trial, study)


def stored_trial(store: Store, trial_id: int) -> Source:
    """One stored trial (e.g. from ``autodeploy bench``), with its study when it belongs to one."""
    trial = store.get_trial(trial_id)
    if trial is None:
        raise UsageError(f"no trial {trial_id} in results database {store.url}",
                         fix="list trials with `autodeploy results list`")  # fmt: skip
    return _source(store, trial, store.get_study(trial.study) if trial.study else None)


def _source(store: Store, trial: TrialRow, study: StudyRow | None) -> Source:
    fix = "export a trial that passed (autodeploy results list --status ok)"
    if not trial.measured or trial.accuracy is None:
        why = (
            f"it failed ({trial.failure_kind}: {trial.failure_message})"
            if trial.status != "ok"
            else "it has no measurement"
        )
        raise BundleError(f"trial {trial.id} ({trial.engine}) cannot be shipped: {why}", fix=fix)
    model, device = _records(store, trial.model_sha256, trial.device_fingerprint)
    source = Source(trial, study, model, device)
    if trial.status != "ok":
        # A study may set a looser accuracy budget than the harness default; its verdict decides.
        study_verdicts = {k: v for k, v in constraint_verdicts(source).items() if k != "accuracy"}
        if not (
            trial.failure_kind == "inaccurate"
            and study_verdicts
            and all(v["passed"] for v in study_verdicts.values())
        ):
            raise BundleError(f"trial {trial.id} ({trial.engine}) cannot be shipped: it failed "
                              f"({trial.failure_kind}: {trial.failure_message})", fix=fix)  # fmt: skip
    return source


def _records(store: Store, model_sha256: str, fingerprint: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The stored model interface and device info (the trial rows do not carry them)."""
    model, device = store.model_interface(model_sha256), store.device_info(fingerprint)
    if model is None or device is None:
        raise StoreError(f"{store.url} lacks the model or device of a trial: the database is inconsistent",
                         fix="re-run the trial into a fresh database")  # fmt: skip
    return model, device


def artifact_of(source: Source) -> Artifact:
    """The benchmarked artifact folder, checked to be complete and to match the trial."""
    trial = source.trial
    path = Path(trial.artifact_path or "")
    fix = f"re-run the trial ({trial.command or 'autodeploy bench ...'}) to rebuild it, then export the new trial"
    if not trial.artifact_path or not (path / ARTIFACT_FILE).is_file():
        raise BundleError(
            f"the artifact of trial {trial.id} is gone from {path} (the cache was cleared?)", fix=fix
        )
    artifact = Artifact.read(path)
    if artifact.engine != trial.engine or artifact.engine_version != trial.engine_version:
        raise BundleError(f"the artifact at {path} is {artifact.engine} {artifact.engine_version}, "
                          f"trial {trial.id} ran {trial.engine} {trial.engine_version}", fix=fix)  # fmt: skip
    missing = [f for f in artifact.files if not (path / f).is_file()]
    if missing:
        raise BundleError(f"the artifact at {path} lacks {', '.join(missing)}", fix=fix)
    return artifact


# -- 2. describe it ------------------------------------------------------------------------


def runtime_settings(config: TrialConfig, artifact: Artifact) -> dict[str, Any]:
    """The settings the loader applies, in the engine's own words, exactly as the adapter sets them."""
    knobs = config.knobs
    if config.engine == "onnxruntime":  # mirrors adapters/ort.py OnnxRuntimeEngine._load
        return {"model_file": "model.onnx", "intra_op_num_threads": config.threads or 0,
                "inter_op_num_threads": int(knobs.get("inter_op_num_threads", 0)),
                "execution_mode": knobs.get("execution_mode", "ORT_SEQUENTIAL"),
                "graph_optimization_level": knobs.get("graph_optimization_level", "ORT_ENABLE_ALL")}  # fmt: skip
    if config.engine == "openvino":
        from autodeploy.adapters.openvino import IR_FILE, compile_properties

        return {"model_file": IR_FILE, "properties": compile_properties(config)}
    if config.engine == "tflite":
        from autodeploy.adapters.tflite import LAYOUT_FILE, MODEL_FILE

        return {"model_file": MODEL_FILE, "layout_file": LAYOUT_FILE, "num_threads": config.threads,
                "xnnpack": bool(knobs.get("xnnpack", True))}  # fmt: skip
    if config.engine == "tensorrt":
        from autodeploy.adapters.tensorrt import PLAN_FILE

        return {"model_file": PLAN_FILE}  # precision and profile are baked into the plan
    raise BundleError(f"cannot bundle engine {config.engine!r}: the bundle loader has no runner for it",
                      fix="export a winner on onnxruntime, openvino, tflite or tensorrt")  # fmt: skip


def device_requirements(config: TrialConfig, artifact: Artifact, device: dict[str, Any]) -> dict[str, Any]:
    """What the target must have for the artifact to run at all (not merely fast)."""
    if config.engine == "openvino" and config.precision == "bf16":
        from autodeploy.adapters.openvino import BF16_ISA

        return {
            "isa_any_of": list(BF16_ISA),
            "why": "OpenVINO runs bf16 natively only with AVX512-BF16 or AMX",
        }
    if (
        config.engine == "openvino"
        and config.precision == "fp16"
        and device.get("arch") in ("x86_64", "AMD64")
    ):
        return {
            "isa_any_of": ["avx512_fp16", "amx_fp16"],
            "why": "OpenVINO fp16 on x86 needs AVX512-FP16 or AMX-FP16",
        }
    if config.engine == "tensorrt":
        cc = artifact.meta.get("compute_capability")
        if cc is None:
            raise BundleError("the TensorRT artifact does not record the compute capability it was built for",
                              fix="rebuild it with this autodeploy (autodeploy bench --engine tensorrt)")  # fmt: skip
        return {
            "gpu_compute_capability": str(cc),
            "why": "a TensorRT plan runs only on the GPU architecture that built it",
        }
    return {}  # int8 VNNI/AMX only changes speed: a warning at most, never a refusal


def constraint_verdicts(source: Source) -> dict[str, Any]:
    """Each constraint that chose the trial: its limit, the measured value and whether it held."""
    acc = source.trial.accuracy
    assert acc is not None
    verdicts: dict[str, Any] = {"accuracy": {"constraint": acc.constraint, "passed": acc.passed}}
    if source.study is None:
        return verdicts
    from autodeploy.search.config import Constraints
    from autodeploy.search.objective import Metrics, violations

    limits = Constraints(**(source.study.settings.get("constraints") or {}))
    found = violations(Metrics.of_row(source.trial), limits, source.study.objective)
    limit_of = {
        "accuracy_drop": limits.max_accuracy_drop,
        "memory_mb": limits.max_memory_mb,
        "latency_ms": limits.sla_ms,
    }
    for key, violation in found.items():
        limit = limit_of.get(key)
        verdicts[key] = {"limit": limit, "measured": None if limit is None else limit + violation,
                         "passed": violation <= 0}  # fmt: skip
    return verdicts


def build_manifest(source: Source, artifact: Artifact, *, command: str | None = None) -> dict[str, Any]:
    """Everything about the shipped trial except the file list (the writer adds it)."""
    trial, study, config = source.trial, source.study, source.config
    selection = None
    if study is not None and study.summary:
        summary = study.summary
        selection = {"objective": study.objective, "winner": summary.get("winner"), "tie_with": summary.get("tie_with"),
                     "speedup_vs_baseline": summary.get("speedup_vs_baseline"), "note": summary.get("note"),
                     "trials": summary.get("trials"),
                     "baseline": next((f for f in summary.get("finalists", []) if f.get("baseline")), None)}  # fmt: skip
    d = source.device
    assert trial.measurement is not None  # _source ships measured trials only
    measurements = trial.measurement.to_dict(samples=False)
    accuracy = measurements.pop("accuracy")  # a section of its own
    return {
        "schema": SCHEMA,
        "kind": KIND,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "created_by": f"autodeploy {__version__}",
        "export_command": command,
        "source": {
            "study": study.name if study else None,
            "trial_id": trial.id,
            "trial_uid": trial.uid,
            "phase": trial.phase,
            "reproduce": study.command if study and study.command else trial.command,
            "trial_command": trial.command,
        },  # fmt: skip
        "model": {**source.model, "shapes": (study.settings.get("shapes") or {}) if study else {}},
        "engine": {
            "name": trial.engine,
            "version": trial.engine_version,
            "package": loader.PACKAGES.get(trial.engine, (trial.engine,))[0],
        },  # fmt: skip
        "settings": config.to_dict(),
        "runtime": runtime_settings(config, artifact),
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
        "selection": selection,
        "accuracy": accuracy,
        "constraints": constraint_verdicts(source),
        "files": {},
    }


def requirements_txt(manifest: dict[str, Any]) -> str:
    engine = manifest["engine"]
    lines = ["# The runtime this bundle was benchmarked with: pip install -r requirements.txt",
             "numpy>=1.24", f"{engine['package']}=={engine['version']}"]  # fmt: skip
    for extra in RUNNER_EXTRAS.get(engine["name"], ()):
        lines.append(_pinned(extra))
    return "\n".join(lines) + "\n"


def _pinned(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{dist}=={version(dist)}"
    except PackageNotFoundError:
        return dist


def readme_md(manifest: dict[str, Any]) -> str:
    s, m, e = manifest["settings"], manifest["measurements"], manifest["engine"]
    label = TrialConfig.from_dict(s).label()
    p90 = "-" if m["p90_ms"] is None else f"{m['p90_ms']:.3f} ms"
    origin = f"study {manifest['source']['study']!r}" if manifest["source"]["study"] else "a single trial"
    inputs = ", ".join(f"{i['name']} {i['dtype']}" for i in manifest["model"]["inputs"])
    return f"""# {manifest["model"]["name"]}: {label}

Exported by {manifest["created_by"]} from {origin}.
Measured on `{manifest["device"]["cpu"]}` (fingerprint `{manifest["device"]["fingerprint"]}`):
median {m["median_ms"]:.3f} ms, p90 {p90}, {m["throughput"]:.1f} items/s at batch {m["batch"]}.

```bash
pip install -r requirements.txt          # numpy and {e["package"]}=={e["version"]}, nothing else
python loader.py                         # verify every file and check this machine can run it
```

```python
import sys; sys.path.insert(0, "path/to/this/folder")
import loader
predictor = loader.load("path/to/this/folder")   # verifies checksums, engine version, CPU/GPU features
outputs = predictor.run({{name: array, ...}})      # inputs: {inputs}
```

`manifest.json` holds the tuned settings, the measurements and accuracy that chose this
config, the constraint verdicts, every file's SHA-256, and the command that reproduces it:
`{manifest["source"]["reproduce"]}`. With autodeploy installed: `autodeploy bundle info|verify|run .`
"""


# -- 3. write it atomically ------------------------------------------------------------------


def write_bundle(source: Source, dest: str | Path, *, tar: bool = False, command: str | None = None) -> Path:
    """Write the bundle folder (or, with ``tar``, a ``.tar.gz`` of it) at ``dest``; return ``dest``."""
    dest = Path(dest)
    artifact = artifact_of(source)
    manifest = build_manifest(source, artifact, command=command)
    with staged(dest, tar=tar) as stage:
        (stage / MODEL_DIR).mkdir()
        for name in (ARTIFACT_FILE, *artifact.files):  # exactly the benchmarked files, nothing else
            (stage / MODEL_DIR / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(artifact.path / name, stage / MODEL_DIR / name)
        shutil.copyfile(Path(loader.__file__), stage / loader.LOADER)
        (stage / REQUIREMENTS).write_text(requirements_txt(manifest))
        (stage / README).write_text(readme_md(manifest))
        seal(stage, manifest)
    return dest


def seal(folder: Path, manifest: dict[str, Any]) -> None:
    """List every file of ``folder`` with its SHA-256 and size, then write the manifest and its digest."""
    manifest["files"] = {
        p.relative_to(folder).as_posix(): {"sha256": loader.sha256_file(p), "size": p.stat().st_size}
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
    data = (json.dumps(manifest, indent=2) + "\n").encode()
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
    tmp.mkdir()
    try:
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
