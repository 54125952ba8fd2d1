"""Export the winner as a Triton Inference Server model repository.

Layout: ``<repo>/<model>/config.pbtxt`` plus ``<repo>/<model>/1/model.<ext>`` (the artifact's
files, unchanged) and ``<repo>/<model>/manifest.json`` (the bundle manifest, which Triton
ignores). ``config.pbtxt`` carries the winner's settings in each backend's own words.

Which backend serves an engine's artifacts is the engine's declaration (``Engine.triton``, a
:class:`~autodeploy.adapters.base.TritonBackend`), and that backend writes its parameters
(:meth:`~autodeploy.adapters.base.TritonBackend.parameters`: ONNX Runtime's in ``adapters/ort.py``, OpenVINO's
in ``adapters/openvino.py``; a TensorRT plan carries its own settings).
An in-house winner is served by the backend of the runtime it was measured on (``runtime`` knob).

``instance_group`` is the number of requests that were in flight when it was measured (one per
Triton instance: an OpenVINO infer request, an ORT session, a TensorRT context); one for a
single-stream winner. ``dynamic_batching`` is written only for a winner measured through the
harness's batcher (the ``server`` scenario), with its max queue delay; others were measured on
whole batches and get none. The batch axis becomes ``max_batch_size`` (the winner's batch; a
TensorRT plan's profile maximum); a model with a static batch dim gets ``max_batch_size: 0``
and its full shapes. What Triton cannot carry (the Triton OpenVINO backend has no f32 precision
setting; one ORT session shared by several threads) is listed by :func:`config_pbtxt`, written
to the repository's ``README.md`` and printed by the CLI.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from autodeploy.adapters import registry
from autodeploy.adapters.base import Engine, TritonBackend
from autodeploy.bundle.export import (
    Source,
    artifact_of,
    build_manifest,
    check_as_measured,
    serving_engine,
    shipped_engine,
    staged,
)
from autodeploy.bundle.loader import BundleError, sha256_file

TRITON_DTYPES = {"float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64", "bool": "TYPE_BOOL",
                 "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
                 "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32", "uint64": "TYPE_UINT64",
                 "bfloat16": "TYPE_BF16", "object": "TYPE_STRING", "str": "TYPE_STRING"}  # fmt: skip
README = "README.md"


def model_name_of(name: str) -> str:
    """A Triton model folder name from a model name (``zoo:mlp`` -> ``zoo-mlp``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "model"


def write_repository(source: Source, dest: str | Path, *, tar: bool = False, model_name: str | None = None,
                     command: str | None = None) -> Path:  # fmt: skip
    """Write a Triton model repository for the winner at ``dest`` (atomically, like a bundle)."""
    dest = Path(dest)
    backend_of(shipped_engine(source.config).serving_engine(source.config))
    artifact = artifact_of(source)
    manifest = build_manifest(source, artifact, command=command)
    name = model_name_of(model_name or manifest["model"]["name"])
    with staged(dest, tar=tar) as stage:
        version = stage / name / "1"
        version.mkdir(parents=True)
        for file in artifact.files:  # model.onnx (+ external data), model.xml/.bin, or model.plan
            (version / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(artifact.path / file, version / file)
        text, notes = config_pbtxt(manifest, name)
        (stage / name / "config.pbtxt").write_text(text)
        (stage / name / README).write_text(readme(name, manifest, notes))
        manifest["triton"] = {"not_carried": notes}
        check_as_measured(source, {name: sha256_file(version / name) for name in artifact.files})
        manifest["format"] = "triton"
        manifest["files"] = {p.relative_to(stage / name).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size}
                             for p in sorted((stage / name).rglob("*")) if p.is_file()}  # fmt: skip
        (stage / name / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return dest


def config_pbtxt(manifest: dict[str, Any], name: str) -> tuple[str, list[str]]:
    """The model configuration (protobuf text format) for the winner described by ``manifest``,
    and what of the measured config it cannot carry (one sentence each)."""
    settings, model = manifest["settings"], manifest["model"]
    triton = backend_of(serving_engine(manifest))
    serving = manifest["measurements"].get("serving") or {}
    batchable = _batch_first(model)
    max_batch = max(settings["batch"], triton.max_batch_floor) if batchable else 0
    notes: list[str] = []
    lines = [f"# autodeploy winner {settings['engine']}/{settings['precision']}/b{settings['batch']}"
             f"/t{settings['threads'] or 'default'}: {manifest['measurements']['median_ms']:.3f} ms median "
             f"on {manifest['device']['cpu']} (fingerprint {manifest['device']['fingerprint']})",
             f'name: "{name}"']  # fmt: skip
    if triton.platform:
        lines.append(f'platform: "{triton.platform}"')
    lines += [f'backend: "{triton.backend}"', f"max_batch_size: {max_batch}"]
    shapes = model.get("shapes") or {}
    lines += _tensors("input", model["inputs"], shapes, batchable)
    lines += _tensors("output", model["outputs"], {}, batchable)
    concurrency = serving.get("concurrency") or {}
    count = int(concurrency.get("requests", 1))
    lines.append(f"instance_group [\n  {{\n    count: {count}\n    kind: {triton.kind}\n  }}\n]")
    split = (serving.get("server") or {}).get("split") or {}
    if max_batch > 0 and "max_queue_delay_us" in split:
        lines.append(f"dynamic_batching {{\n  max_queue_delay_microseconds: {int(split['max_queue_delay_us'])}\n}}")
    elif max_batch > 1:
        notes.append(f"dynamic batching was not measured (a {manifest['measurements']['scenario']} winner, "
                     f"timed on whole batches of {settings['batch']}); none is configured, so send whole batches")  # fmt: skip
    written = triton.parameters(settings, serving, max_batch, manifest.get("device") or {})
    notes += written.notes
    if written.graph_level is not None:
        lines.append(f"optimization {{\n  graph {{\n    level: {written.graph_level}\n  }}\n}}")
    for key, value in written.values.items():
        lines.append(f'parameters {{\n  key: "{key}"\n  value: {{\n    string_value: "{value}"\n  }}\n}}')
    return "\n".join(lines) + "\n", notes


def backend_of(engine: Engine) -> TritonBackend:
    """The Triton backend ``engine`` declares; an error naming the engines that declare one when it has none."""
    if engine.triton is not None:
        return engine.triton
    served = [e.name for e in registry.all_engines() if e.triton is not None]
    raise BundleError(f"Triton has no backend for {engine.name} winners (only {', '.join(served)})",
                      fix="ship the bundle instead (autodeploy export without --format), "
                      f"or tune with --engine {'/'.join(served)}")  # fmt: skip


def readme(name: str, manifest: dict[str, Any], notes: list[str]) -> str:
    """The repository's README: what it serves, and what of the measured config Triton cannot carry."""
    s = manifest["settings"]
    lines = [f"# {name}: a Triton model repository written by autodeploy", "",
             f"Serves the winner {s['engine']}/{s['precision']}/b{s['batch']} as measured on {manifest['device']['cpu']} "
             f"({manifest['measurements']['scenario']} scenario). `config.pbtxt` carries its settings; `manifest.json` "
             "has the measurements.", "", "## Not carried over", ""]  # fmt: skip
    lines += [f"- {note}" for note in notes] or ["Nothing: every measured setting is in config.pbtxt."]
    return "\n".join(lines) + "\n"


def notes_of(path: Path) -> list[str]:
    """What a written repository (folder) could not carry, from its manifest."""
    for manifest in sorted(Path(path).glob("*/manifest.json")):
        return list((json.loads(manifest.read_text()).get("triton") or {}).get("not_carried") or [])
    return []


def _batch_first(model: dict[str, Any]) -> bool:
    """Triton batches on axis 0 of every input and output: true only when the model's batch
    axis (:func:`autodeploy.model.batch_axes`) is the dynamic first dim of all of them."""
    from autodeploy.model import TensorSpec, batch_axes

    def specs(items: list[dict[str, Any]]) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(i["name"], i["dtype"], tuple(i["shape"])) for i in items)

    inputs, outputs = specs(model["inputs"]), specs(model["outputs"])
    axes = batch_axes(inputs, outputs, {})
    return all(axes.get(s.name) == 0 and not isinstance(s.shape[0], int) for s in inputs) and all(
        axes.get(s.name) == 0 for s in outputs
    )


def _tensors(
    kind: str, specs: list[dict[str, Any]], shapes: dict[str, list[int]], batchable: bool
) -> list[str]:
    blocks = []
    for spec in specs:
        shape = list(shapes.get(spec["name"], spec["shape"]))
        dims = shape[1:] if batchable else shape
        dims_text = ", ".join(str(d) if isinstance(d, int) else "-1" for d in dims)
        dtype = TRITON_DTYPES.get(spec["dtype"])
        if dtype is None:
            raise BundleError(f"Triton has no data type for {kind} {spec['name']!r} of dtype {spec['dtype']}")
        blocks.append(
            f'  {{\n    name: "{spec["name"]}"\n    data_type: {dtype}\n    dims: [ {dims_text} ]\n  }}'
        )
    return [f"{kind} [\n" + ",\n".join(blocks) + "\n]"]
