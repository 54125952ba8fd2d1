"""TensorFlow Lite (LiteRT): ONNX → TFLite through onnx2tf, run by ``ai-edge-litert``'s Interpreter.

Precisions are TFLite's post-training quantization modes
(https://ai.google.dev/edge/litert/models/post_training_quantization):

* ``fp32``: the plain conversion.
* ``fp16``: float16 weights (half the size); CPU kernels compute in fp32.
* ``int8-dynamic``: *dynamic range* quantization: int8 weights, activations quantized on the
  fly per call; needs no calibration data.
* ``int8``: full integer quantization of weights and activations, calibrated on the
  ``calibration`` inputs given to :meth:`~autodeploy.adapters.base.Engine.build`; inputs and
  outputs stay float32.

Knobs: ``num_threads`` is :attr:`TrialConfig.threads`; ``xnnpack`` (True/False) picks the
interpreter's op resolver: ``AUTO`` applies the default XNNPACK delegate,
``BUILTIN_WITHOUT_DEFAULT_DELEGATES`` runs TFLite's own kernels.

One onnx2tf conversion per model (and shapes and converter versions) serves every precision: it
climbs the :data:`LADDER` (onnxslim first, then onnx2tf's own remedies) and is kept beside the
artifacts with its outcome, a failure too; the quantized files are converted from its SavedModel.
``artifact.json`` names the rung that made the file (``meta["conversion"]``).

onnx2tf turns channels-first tensors (rank 3-5) into channels-last ones. The build records
the mapping in ``layout.json`` (per input and output: the TFLite tensor name and the axis
permutation), and the runner applies it, so callers feed and get the ONNX layout.

A ``.tflite`` file given as the model is run as given (:mod:`autodeploy.formats`): its artifact is the
file, copied unchanged, with a ``layout.json`` that maps each tensor to itself. Its one precision is
``fp32`` (the file as it is, no conversion: whatever it holds inside); the others need the ONNX model.
Running it needs only the runtime (``ai-edge-litert``), so the engine is available without the converter
(onnx2tf and TensorFlow, large and absent on many boards): then every precision of an ONNX model is
unsupported with the converter's install hint (:func:`converter_missing`), and the probe names it too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autodeploy.adapters.base import Artifact, Availability, Engine, EngineSpace, TrialConfig, foreign_ops
from autodeploy.child import child_env, module_argv
from autodeploy.errors import BuildError, ConversionError, UnsupportedConfigError
from autodeploy.model import copy_unchanged
from autodeploy.runtime import machine
from autodeploy.runtime import tflite as rt
from autodeploy.runtime.tflite import permute as _permute

if TYPE_CHECKING:
    from autodeploy.model import ModelInfo
    from autodeploy.runtime.device import DeviceInfo

MODEL_FILE = rt.MODEL_FILE
LAYOUT_FILE = rt.LAYOUT_FILE
#: Which of onnx2tf's output files holds each precision.
ONNX2TF_SUFFIX = {
    "fp32": "_float32.tflite",
    "fp16": "_float16.tflite",
    "int8-dynamic": "_dynamic_range_quant.tflite",
    "int8": "_integer_quant.tflite",  # int8 inside, float32 inputs and outputs
}
#: The precisions onnx2tf's conversion writes itself (``_float32`` and ``_float16`` files); the
#: quantized ones are converted from the SavedModel it writes beside them.
FLOAT_PRECISIONS = ("fp32", "fp16")
#: Their versions key the kept conversion (a new onnx2tf may convert what an old one could not).
CONVERTER_PACKAGES = ("onnx2tf", "tensorflow", "onnxslim")
#: In the conversion folder: which rung converted the model (or every rung's reason).
CONVERSION_FILE = "conversion.json"
#: In a rung's options: the model's input names.
INPUTS = "<inputs>"
#: Each failed rung's reason is cut to this many characters in the build's one-line reason.
MAX_RUNG_REASON = 300
#: A failed conversion's reason names the folder of its kept onnx2tf logs after these words (:func:`kept_logs`).
LOGS_KEPT = "outcome and each rung's onnx2tf log kept in "
#: Each rung's whole onnx2tf output, in the conversion folder (``{}``: the rung's place in the ladder).
RUNG_LOG = "onnx2tf-rung-{}.log"


@dataclass(frozen=True)
class Rung:
    """One way to run onnx2tf: on the onnxslim-simplified graph or on the graph as given, with
    these ``onnx2tf.convert`` options (onnx2tf's own names)."""

    name: str
    slim: bool
    options: Mapping[str, Any]


#: The conversion ladder, tried in order on the fixed-shape graph until a rung converts.
LADDER = (
    # Ultralytics' TFLite export: onnxslim first, onnx2tf's own onnxsim off. Converts PP-OCRv5 rec
    # (a MatMul of SVTR's attention fails unsimplified) and ddddocr's CRNN (its LSTM fails unsimplified).
    Rung("onnxslim", True, {"not_use_onnxsim": True}),
    # onnx2tf's own advice on a failed op (-kat): an input whose layout is not NCHW keeps its shape as given.
    Rung("onnxslim + keep input shapes", True, {"not_use_onnxsim": True, "keep_shape_absolutely_input_names": INPUTS}),
    # The graph as given with onnx2tf's defaults (the conversion before the ladder): for a graph onnxslim breaks.
    Rung("onnx2tf defaults", False, {}),
)
#: onnx2tf fetches this sample file over the network unless it lies in its working folder; it
#: only feeds onnx2tf's own dummy inference, so random images do.
ONNX2TF_SAMPLE = "calibration_image_sample_data_20x128x128x3_float32.npy"
#: In ``layout.json``: why the XNNPACK delegate could not run the file (its configs with ``xnnpack``
#: are then unsupported; TFLite's own kernels run it).
XNNPACK_FAILED = "xnnpack_failed"
_QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONWARNINGS": "ignore"}
#: How to install the ONNX → TFLite converter (onnx2tf and TensorFlow) beside the runtime.
CONVERTER_FIX = "pip install 'autodeploy[tflite]'"


def converter_missing() -> str:
    """Why no ONNX model can be converted here (the converter's missing packages), or ``""``.

    Looked up without importing TensorFlow (seconds to import): a board with only ``ai-edge-litert``
    runs ``.tflite`` files all the same, so this is a per-model limit, never the engine's availability.
    """
    import importlib.util

    missing = [m for m in ("onnx2tf", "tensorflow") if importlib.util.find_spec(m) is None]
    return f"the ONNX → TFLite converter is missing ({', '.join(missing)} not installed)" if missing else ""


class TfliteEngine(Engine):
    name = "tflite"
    extra = "tflite"
    modules = ("tensorflow", "onnx2tf", "ai_edge_litert", "tf_keras")
    runtime = rt.__name__
    packages = rt.PACKAGES
    build_packages = ("onnx2tf", "tensorflow")
    slow_build = True  # onnx2tf converts through TensorFlow: minutes for a real model
    formats = ("onnx", "tflite")

    def _probe(self, target: DeviceInfo) -> Availability:
        from ai_edge_litert import interpreter  # noqa: F401 - the runtime must import

        # Available with the runtime alone: a .tflite runs as given. The converter only builds from
        # ONNX, so its absence is a limit the listing shows and the space turns into a per-model reason.
        version = self._version() or "unknown"
        missing = converter_missing()
        return Availability(True, version=version, reason=missing, fix=CONVERTER_FIX if missing else "")

    def _space(self, target: DeviceInfo, model: ModelInfo) -> EngineSpace:
        unsupported = {
            "bf16": "TFLite has no bf16 kernels on CPU; use openvino on a CPU with AMX",
        }
        if model.format == "tflite":  # the file as given: no conversion, so no other precision
            why = "needs a conversion from ONNX (onnx2tf); the model is a TFLite flatbuffer, run as given"
            unsupported.update({p: why for p in ONNX2TF_SUFFIX if p != "fp32"})
            return EngineSpace(precisions=("fp32",), unsupported=unsupported, knobs={"xnnpack": (True, False)})
        missing = converter_missing()
        if missing:  # every precision of an ONNX model is built by onnx2tf
            unsupported.update({p: f"{missing}; fix: {CONVERTER_FIX}" for p in ONNX2TF_SUFFIX})
            return EngineSpace(precisions=(), unsupported=unsupported, knobs={"xnnpack": (True, False)})
        lacked = converterless_ops(model)
        if lacked:  # from the graph, before minutes of onnx2tf: every precision needs its conversion
            why = (f"onnx2tf has no converter for ONNX op{'s' * (len(lacked) > 1)} {', '.join(lacked)}; "
                   "fix: run it on onnxruntime (--engine onnxruntime)")  # fmt: skip
            unsupported.update(dict.fromkeys(ONNX2TF_SUFFIX, why))
            return EngineSpace(precisions=(), unsupported=unsupported, knobs={"xnnpack": (True, False)})
        precisions = list(ONNX2TF_SUFFIX)
        non_float = [s.name for s in model.inputs if s.dtype != "float32"]
        if non_float:
            # onnx2tf feeds calibration data as float32 to every input.
            precisions.remove("int8")
            unsupported["int8"] = (
                f"full int8 calibration through onnx2tf needs float32 inputs; {', '.join(non_float)} "
                "are not (int8-dynamic needs no calibration)"
            )
        return EngineSpace(
            precisions=tuple(precisions),
            unsupported=unsupported,
            # No thread-affinity knob (issue 26): LiteRT's interpreter and its XNNPACK delegate take a thread
            # count only, and pin nothing.
            knobs={"xnnpack": (True, False)},
        )

    def _build(
        self,
        model: ModelInfo,
        config: TrialConfig,
        calibration: Mapping[str, np.ndarray] | None,
        outdir: Path,
        target: DeviceInfo,
    ) -> dict[str, Any]:
        if model.format == "tflite":
            return _as_given(model, outdir)
        if config.precision == "int8" and not calibration:
            raise BuildError(
                "full int8 TFLite quantization needs calibration data",
                fix="give --data or use synthetic data",
            )
        conversion, record = _conversion(model, outdir.parent)
        with tempfile.TemporaryDirectory(prefix="autodeploy-tflite-") as scratch:
            if config.precision in FLOAT_PRECISIONS:
                chosen = _variant(conversion, model, config.precision)
            else:
                chosen = _quantize(conversion, model, config.precision, calibration, Path(scratch))
            layout = _resolve_layout(model, chosen, kept_inputs="keep_shape_absolutely_input_names" in record["options"])
            shutil.copyfile(chosen, outdir / MODEL_FILE)
        (outdir / LAYOUT_FILE).write_text(json.dumps(layout, indent=2))
        return {
            "converter": {d: v for d in CONVERTER_PACKAGES if (v := machine.version(d))},
            # Which rung of the ladder made the file, with which options, after which rungs failed and why.
            "conversion": {k: record[k] for k in ("rung", "onnxslim", "options", "failed_rungs")},
        }

    def _runtime_settings(self, artifact: Artifact, config: TrialConfig, model: ModelInfo) -> dict[str, Any]:
        xnnpack = bool(config.knobs.get("xnnpack", True))
        layout = artifact.path / LAYOUT_FILE if artifact.path is not None else None
        failed = json.loads(layout.read_text()).get(XNNPACK_FAILED) if layout is not None and layout.is_file() else None
        if xnnpack and failed:
            raise UnsupportedConfigError(
                f"the XNNPACK delegate cannot run this TFLite {config.precision} model ({failed})",
                fix="use --knob xnnpack=false (TFLite's own kernels run it)",
            )
        return {
            "model_file": MODEL_FILE,
            "layout_file": LAYOUT_FILE,
            "num_threads": config.threads,  # None: TFLite's default
            "xnnpack": xnnpack,
        }


def _as_given(model: ModelInfo, outdir: Path) -> dict[str, Any]:
    """A ``.tflite`` model's artifact: the file copied unchanged (hash-checked against intake) and a
    layout that maps every input and output to the tensor of the same name, axes unchanged."""
    copy_unchanged(model, outdir, MODEL_FILE)
    layout = {kind: [{"name": s.name, "tflite": s.name, "perm": None} for s in specs]
              for kind, specs in (("inputs", model.inputs), ("outputs", model.outputs))}  # fmt: skip
    (outdir / LAYOUT_FILE).write_text(json.dumps(layout, indent=2))
    return {"as_given": model.path.name}


def _channels_last(rank: int) -> list[int] | None:
    """The permutation onnx2tf applies to a rank-3..5 tensor: N C D... → N D... C."""
    return [0, *range(2, rank), 1] if 3 <= rank <= 5 else None


def _inverse(perm: Sequence[int] | None) -> list[int] | None:
    return None if perm is None else [int(i) for i in np.argsort(perm)]


# -- conversion --------------------------------------------------------------------------


def _conversion(model: ModelInfo, workdir: Path) -> tuple[Path, dict[str, Any]]:
    """The folder onnx2tf wrote for ``model`` (SavedModel, float32 and float16 files) and its
    :data:`CONVERSION_FILE` record, converting through the :data:`LADDER` on first use.

    Every precision starts from this one conversion, so its outcome is kept per model, shapes
    and converter versions, not per precision: a failure is recorded too, and every later build
    fails at once with the same reason instead of paying for onnx2tf again.
    """
    folder = _conversion_dir(model, workdir)
    if not (folder / CONVERSION_FILE).is_file():
        _climb(model, folder)
    record = json.loads((folder / CONVERSION_FILE).read_text())
    if "failed" in record:
        rungs = record.get("failed_rungs") or [{"reason": ""}]
        first = re.sub(r"^exit -?\d+: ", "", rungs[0]["reason"])
        raise ConversionError(  # the first rung's reason (the op) first: the headline a table shows
            f"onnx2tf could not convert {model.name} to TFLite: {first[:MAX_RUNG_REASON]}; every TFLite precision "
            f"needs this conversion ({LOGS_KEPT}{folder}): {record['failed']}",
            fix="check the model's ops against onnx2tf's supported list, or try another engine "
            "(delete that folder to convert again)",
        )
    return folder, record


def kept_logs(reason: str | None) -> list[Path]:
    """The onnx2tf logs of a failed conversion, in ladder order, from a build's reason (a trial's stored
    failure message) that names their folder; empty for any other reason or once the folder is gone.

    The reason is all a failed trial keeps of its build, so the folder is read back from the words
    this module wrote it after (:data:`LOGS_KEPT`)."""
    found = re.search(re.escape(LOGS_KEPT) + r"(.+?[\\/]tflite-onnx2tf[\\/][0-9a-f]{24})\)", reason or "")
    if found is None:
        return []
    folder = Path(found.group(1))
    return [folder / RUNG_LOG.format(i) for i in range(len(LADDER)) if (folder / RUNG_LOG.format(i)).is_file()]


def log_lines(log: Path, last: int) -> list[str]:
    """A converter log's last ``last`` non-blank lines, without terminal colour codes (onnx2tf prints them)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    return [line for line in text.splitlines() if line.strip()][-last:]


def converterless_ops(model: ModelInfo) -> list[str]:
    """The ops outside ONNX's default domain (ai.onnx.ml's, com.microsoft's) that onnx2tf has no converter
    for: it converts a node by its module ``onnx2tf.ops.<op type>``, whatever the domain. Read from its
    package folder, without importing it (TensorFlow takes seconds). Default-domain ops are left to the
    conversion: onnxslim may fold them away first."""
    import importlib.util

    spec = importlib.util.find_spec("onnx2tf")
    folder = Path(spec.origin).parent / "ops" if spec and spec.origin else None
    if folder is None or not folder.is_dir():
        return []
    return [op for ops in foreign_ops(model).values() for op in ops if not (folder / f"{op}.py").is_file()]


def _conversion_dir(model: ModelInfo, workdir: Path) -> Path:
    import hashlib

    versions = [machine.version(d) for d in CONVERTER_PACKAGES]
    ladder = [(r.name, r.slim, dict(r.options)) for r in LADDER]
    key = json.dumps([model.sha256, model.shape_overrides_key(), versions, ladder], sort_keys=True)
    return workdir / "tflite-onnx2tf" / hashlib.sha256(key.encode()).hexdigest()[:24]


def _climb(model: ModelInfo, folder: Path) -> None:
    """Try each rung of the ladder in turn; keep the first conversion, or every rung's reason."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        # onnx2tf and onnxslim rewrite the ONNX file they are given: they get copies (checked against
        # the intake hash), never the user's model.
        source = scratch / "onnx"
        source.mkdir()
        copy_unchanged(model, source, model.path.name)
        fixed = _fixed_graph(replace(model, path=source / model.path.name), scratch)
        failed: list[dict[str, str]] = []
        for i, rung in enumerate(LADDER):
            out = scratch / f"rung-{i}"
            options = _options(rung, model)
            reason = _convert(model, rung.slim, options, fixed, out)
            if reason is None:
                record = {"rung": rung.name, "onnxslim": rung.slim, "options": options, "failed_rungs": failed}
                break
            failed.append({"rung": rung.name, "reason": reason})
        else:
            out = scratch / "failed"
            out.mkdir()
            said = [f["reason"] for f in failed]
            reasons = "; ".join(f"[{f['rung']}] " + ("the same" if i and said[i] == said[i - 1] else said[i][:MAX_RUNG_REASON])
                                for i, f in enumerate(failed))  # fmt: skip
            record = {"failed": f"no rung of the conversion ladder converted it: {reasons}", "failed_rungs": failed}
        for i in range(len(LADDER)):  # each rung's whole onnx2tf output, kept with the outcome
            if (scratch / f"rung-{i}.log").is_file():
                shutil.move(scratch / f"rung-{i}.log", out / RUNG_LOG.format(i))
        (out / CONVERSION_FILE).write_text(json.dumps(record, indent=2))
        try:
            os.rename(out, folder)
        except OSError:  # recorded by another build first
            pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _options(rung: Rung, model: ModelInfo) -> dict[str, Any]:
    return {k: list(model.input_names) if v == INPUTS else v for k, v in rung.options.items()}


def _convert(model: ModelInfo, slim: bool, options: Mapping[str, Any], fixed: Path, out: Path) -> str | None:
    """One rung in a child process (:mod:`autodeploy.adapters.tflite_convert`) on a copy of the
    fixed-shape graph; ``None`` when onnx2tf wrote the float files into ``out``, else why not."""
    work = out.with_name(f"{out.name}-work")
    shutil.copytree(fixed.parent, work / "onnx")  # the file and any external data beside it
    job = {
        "onnxslim": slim,
        "onnx2tf": {
            "input_onnx_file_path": str(work / "onnx" / fixed.name),
            "output_folder_path": str(out),
            "non_verbose": True,
            "output_signaturedefs": True,  # the SavedModel the quantized variants are converted from
            **options,
        },
    }
    reason = _child(job, work, "onnx2tf.log")
    if reason is None and not _variant(out, model, "fp32").is_file():
        reason = "onnx2tf exited without writing the float32 .tflite file"
    if (work / "onnx2tf.log").is_file():  # kept with the outcome: the reason is its last error lines only
        shutil.move(work / "onnx2tf.log", out.with_name(f"{out.name}.log"))
    shutil.rmtree(work, ignore_errors=True)
    return reason


def _quantize(
    conversion: Path, model: ModelInfo, precision: str, calibration: Mapping[str, np.ndarray] | None, scratch: Path
) -> Path:
    """Convert the conversion's SavedModel to a quantized TFLite file (no onnx2tf run)."""
    output = scratch / f"{model.path.stem}{ONNX2TF_SUFFIX[precision]}"
    job: dict[str, Any] = {"quantize": {"saved_model": str(conversion), "output": str(output), "precision": precision}}
    if precision == "int8":
        assert calibration is not None
        job["quantize"]["calibration"] = _write_calibration(model, calibration, scratch)
    reason = _child(job, scratch, "quantize.log")
    if reason is not None or not output.is_file():
        raise BuildError(
            f"TensorFlow could not quantize {model.name}'s SavedModel to TFLite {precision}: {reason or 'no file written'}",
            fix="use fp32 or fp16, or another engine",
        )
    return output


def _child(job: Mapping[str, Any], cwd: Path, log_name: str) -> str | None:
    """Run a converter job in its own process in ``cwd``; ``None`` on success, else why it failed."""
    cwd.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    np.save(cwd / ONNX2TF_SAMPLE, rng.random((20, 128, 128, 3), dtype=np.float32))
    (cwd / "job.json").write_text(json.dumps(job))
    log = cwd / log_name
    with open(log, "wb") as sink:
        done = subprocess.run(
            module_argv("autodeploy.adapters.tflite_convert", "job.json"),
            cwd=cwd,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=child_env(**_QUIET_ENV),  # the worker's is stripped already; said again, as every child's
            check=False,
        )
    return None if done.returncode == 0 else f"exit {done.returncode}: {_log_tail(log)}"


def _variant(folder: Path, model: ModelInfo, precision: str) -> Path:
    """onnx2tf names its files after the ONNX file: ``<stem>_float32.tflite`` and so on."""
    return folder / f"{model.path.stem}{ONNX2TF_SUFFIX[precision]}"


def _dynamic_inputs(model: ModelInfo) -> list[str]:
    """Inputs with a dynamic dim off their batch axis (fixed by ``--shape`` or the data)."""
    return [
        s.name for s in model.inputs
        if any(not isinstance(d, int) and i != model.batch_axis(s.name) for i, d in enumerate(s.shape))
    ]  # fmt: skip


def _fixed_graph(model: ModelInfo, scratch: Path) -> Path:
    """The ONNX file onnx2tf converts: the model itself, or, when some input has dynamic
    non-batch dims, a copy with every input's concrete shape at batch 1 written in (from
    ``--shape`` or the data) and the shapes re-inferred. The runtime resizes the batch.

    onnx2tf's ``overwrite_input_shape`` alone leaves the graph's stale symbolic shapes (on a
    detector with symbolic height/width it then sees ``[1,2,?]`` against ``[?,4,?]``); a batch
    left symbolic beside fixed dims breaks PP-OCR's ConvTranspose in onnx2tf.
    """
    if not _dynamic_inputs(model):
        return model.path
    import onnx

    proto = onnx.load(str(model.path))
    batch = model.fixed_batch() or 1
    for value in proto.graph.input:
        if value.name in model.input_names:
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, model.input_shape(value.name, batch), strict=True):
                dim.Clear()
                dim.dim_value = size
    del proto.graph.value_info[:]  # stale symbolic shapes of intermediates: re-inferred below
    for value in proto.graph.output:
        value.type.tensor_type.ClearField("shape")
    proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    folder = scratch / "fixed"
    folder.mkdir(exist_ok=True)
    path = folder / model.path.name  # onnx2tf names its files after this stem
    onnx.save(proto, str(path), save_as_external_data=proto.ByteSize() > 2**31 - 2**20)
    return path


def _write_calibration(
    model: ModelInfo, calibration: Mapping[str, np.ndarray], scratch: Path
) -> dict[str, str]:
    """One .npy per input in TF's channels-last layout; returns input name → path."""
    paths = {}
    for i, spec in enumerate(model.inputs):
        data = np.asarray(calibration[spec.name], dtype=np.float32)
        path = scratch / f"calibration_{i}.npy"
        np.save(path, np.ascontiguousarray(_permute(data, _channels_last(data.ndim))))
        paths[spec.name] = str(path)
    return paths


def _log_tail(log: Path, lines: int = 8) -> str:
    """What went wrong, from the converter's log: its error lines when it printed any (a Python
    exception's last line, onnx2tf's ``ERROR:`` lines), else its last lines; never a stack."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    kept = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(("I0000", "W0000"))]
    raised = [re.sub(r"^ModuleNotFoundError: No module named 'onnx2tf\.ops\.(\w+)'", r"onnx2tf has no converter for ONNX op \1", line)
              for line in kept if re.match(r"^[\w.]*(Error|Exception)\b", line)]  # fmt: skip
    said = [line for line in kept if line.startswith("ERROR:")]
    frames = re.compile(r'^(File "|Traceback|\^+$|~+$)')
    node = [f"at ONNX node {line.split(':', 2)[2].strip()}" for line in said if line.startswith("ERROR: onnx_op_name:")]
    detail = _keras_detail(kept) if raised and KERAS_WRAPPER in raised[-1] else []
    found = raised[-1:] + detail + node[-1:] if raised else said[-2:]
    return " | ".join(found or [line for line in kept if not frames.match(line)][-lines:]) or "no output"


#: Keras' first line of an exception in a layer; what was wrong is on the line under it.
KERAS_WRAPPER = "Exception encountered when calling layer"


def _keras_detail(kept: list[str]) -> list[str]:
    """The line under Keras' ``Exception encountered when calling layer ...``, which says what was wrong
    (``Dimensions must be equal, but are 324 and 309 ... with input shapes: [?,172,2,324], [1,1,1,309].``),
    without TensorFlow's node definition; ``[]`` when the last exception is not that wrapper."""
    wrapper = max((i for i, line in enumerate(kept) if KERAS_WRAPPER in line), default=None)
    said = kept[wrapper + 1] if wrapper is not None and wrapper + 1 < len(kept) else "ERROR:"
    if said.startswith(("ERROR:", "Call arguments", "File ")):
        return []
    return [re.sub(r" for '\{\{node .*?\}\}.*?' with", " with", said)[:160]]


# -- layout ------------------------------------------------------------------------------


def _resolve_layout(model: ModelInfo, tflite_file: Path, *, kept_inputs: bool = False) -> dict[str, Any]:
    """Map each ONNX input/output to a TFLite tensor and an axis permutation.

    Inputs are matched by name and shape. Outputs are renamed by TensorFlow (``Identity_N``,
    ``PartitionedCall:N``), so each is matched numerically: the TFLite model and ONNX Runtime
    run one probe input, and each ONNX output takes the TFLite output (and permutation)
    closest to it. ``kept_inputs``: onnx2tf kept the inputs' ONNX shapes (``-kat``), so a shape
    that fits both layouts is taken as it is.
    """
    from autodeploy.data import feeds as batch_feeds
    from autodeploy.data import synthetic
    from autodeploy.runtime.onnxruntime import session as ort_session

    # A graph whose shapes were fixed before conversion (:func:`_fixed_graph`) is probed at batch 1.
    batch = 2 if model.batchable() and not _dynamic_inputs(model) else (model.fixed_batch() or 1)
    axes = {name: model.batch_axis(name) for name in model.input_names}
    feeds = batch_feeds(synthetic(model, batch, seed=7).inputs, 0, batch, axes)
    layout: dict[str, Any] = {}
    try:
        inputs, got = _probe(model, tflite_file, feeds, xnnpack=True, kept_inputs=kept_inputs)
    except (RuntimeError, ValueError) as exc:
        # XNNPACK may fail to prepare a model TFLite's own kernels run (e.g. "XNNPack delegate failed
        # to reshape runtime"): the file is fine, only configs with the delegate are not (see XNNPACK_FAILED).
        inputs, got = _probe(model, tflite_file, feeds, xnnpack=False, kept_inputs=kept_inputs)
        layout[XNNPACK_FAILED] = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    want = dict(zip(model.output_names, ort_session(model.path).run(None, feeds), strict=True))
    return {"inputs": inputs, "outputs": _match_outputs(want, got), **layout}


def _probe(model: ModelInfo, tflite_file: Path, feeds: Mapping[str, np.ndarray], *,
           xnnpack: bool, kept_inputs: bool = False) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:  # fmt: skip
    """Run the TFLite file once on ``feeds``: its inputs matched to the ONNX ones, and its outputs."""
    interpreter = rt.interpreter(tflite_file.parent, {"model_file": tflite_file.name, "xnnpack": xnnpack})
    inputs = _match_inputs(model, interpreter.get_input_details(), feeds, kept=kept_inputs)
    for entry in inputs:
        detail = next(d for d in interpreter.get_input_details() if d["name"] == entry["tflite"])
        array = _permute(feeds[entry["name"]], entry["perm"])
        interpreter.resize_tensor_input(detail["index"], list(array.shape))
    interpreter.allocate_tensors()
    for entry in inputs:
        detail = next(d for d in interpreter.get_input_details() if d["name"] == entry["tflite"])
        array = _permute(feeds[entry["name"]], entry["perm"])
        interpreter.set_tensor(detail["index"], np.ascontiguousarray(array, dtype=detail["dtype"]))
    interpreter.invoke()
    return inputs, {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}


def _match_inputs(
    model: ModelInfo, details: Sequence[Mapping[str, Any]], feeds: Mapping[str, np.ndarray], *, kept: bool = False
) -> list[dict[str, Any]]:
    def key(name: str) -> str:
        # Quantized files name inputs after the SavedModel signature: serving_default_<name>:0.
        name = re.sub(r"^serving_default_|:\d+$", "", name)
        return re.sub(r"\W", "_", name).lower()

    entries = []
    for spec in model.inputs:
        named = [d for d in details if key(d["name"]) == key(spec.name)]
        if not named and len(details) == len(model.inputs) == 1:
            named = list(details)
        if not named:
            raise BuildError(
                f"onnx2tf's TFLite model has no input for {spec.name!r}; it has {[d['name'] for d in details]}"
            )
        detail = named[0]
        perm = _layout_of(feeds[spec.name].shape, tuple(int(d) for d in detail["shape_signature"]), kept=kept)
        if perm is False:
            raise BuildError(
                f"TFLite input {detail['name']!r} has shape {detail['shape_signature'].tolist()}, "
                f"which is not ONNX input {spec.name!r} {list(feeds[spec.name].shape)} in any layout onnx2tf uses"
            )
        entries.append({"name": spec.name, "tflite": detail["name"], "perm": perm})
    return entries


def _layout_of(onnx_shape: Sequence[int], signature: Sequence[int], *, kept: bool = False) -> list[int] | None | bool:
    """The permutation taking an ONNX-layout array to ``signature`` (-1: any size); False if none fits.
    ``kept``: onnx2tf was told to keep the ONNX shape (``-kat``), which then wins a tie."""

    def fits(shape: Sequence[int]) -> bool:
        return len(shape) == len(signature) and all(
            s in (-1, d) for s, d in zip(signature, shape, strict=True)
        )

    if kept and fits(onnx_shape):
        return None
    last = _channels_last(len(onnx_shape))
    if last is not None and fits([onnx_shape[i] for i in last]):
        return last  # onnx2tf's default; wins when both fit (e.g. all dims equal)
    if fits(onnx_shape):
        return None
    return False


def _match_outputs(want: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    entries, free = [], dict(got)
    for name, reference in want.items():
        best: tuple[float, str, list[int] | None] | None = None
        for tname, value in free.items():
            perm = _inverse(_channels_last(value.ndim))
            for candidate in (None, perm) if perm is not None else (None,):
                arranged = _permute(value, candidate)
                if arranged.shape != reference.shape:
                    continue
                err = float(np.abs(arranged.astype(np.float64) - reference).max()) if reference.size else 0.0
                if best is None or err < best[0]:
                    best = (err, tname, candidate)
        if best is None:
            raise BuildError(
                f"no TFLite output has the shape of ONNX output {name!r} {list(reference.shape)}; "
                f"TFLite outputs: {_shapes(free)}"
            )
        entries.append({"name": name, "tflite": best[1], "perm": best[2], "probe_max_abs_error": best[0]})
        del free[best[1]]
    return entries


def _shapes(arrays: Mapping[str, np.ndarray]) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in arrays.items()}
