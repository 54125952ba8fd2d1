"""The ``inhouse`` engine: our graph passes (fp32) plus our INT8 quantizer (int8), run by ONNX Runtime.

Build knobs:

* ``calibration``: ``minmax``, ``percentile`` or ``entropy`` (int8 only);
* ``activation_symmetric``: symmetric int8 activations instead of asymmetric (int8 only);
* ``fallback``: keep layers in float until the accuracy budget holds (int8), found from the verdict's
  evidence (:mod:`autodeploy.inhouse.quantize.mixed`): the head of the channels int8 breaks, then the
  layers ranked by their effect on them;
* ``float_layers``: what the fallback may keep float: ``search`` (the head, then ranked layers, the default)
  or ``head`` (the config "int8, head float": the head alone, passing or not); a knob the search tries;
* ``smoothquant``: SmoothQuant scaling (alpha 0.5) of LayerNorm -> MatMul before quantizing (int8);
* ``bias_correction``: subtract each Conv/Gemm's mean int8 output shift from its bias (int8; on by
  default, as NNCF's FastBiasCorrection is: in ``benchmarks/inhouse_int8.py``, 16 + 16 real crops,
  on OpenVINO the fallback kept 6 of ppocrv5-det's 75 nodes float instead of 12 (0.99x and 0.83x
  NNCF's speed in two runs, against 0.84x and 0.70x), and ppocrv5-rec met the budget held out,
  cosine 0.9967 against 0.9855);
* ``reduce_range``: 7-bit weights; ``auto`` turns it on for x86 CPUs without VNNI, where the
  int8 kernels of both ONNX Runtime and OpenVINO saturate with full-range weights (int8);
* ``runtime``: ``onnxruntime`` (default; fp32 passes may use ORT's fused contrib ops) or
  ``openvino`` (standard ops only; the QDQ model is read by OpenVINO's ONNX frontend). The
  int8 QDQ placement, the float remainder and the fp32 passes follow its row of
  :data:`autodeploy.inhouse.placement.PLACEMENTS` (:func:`autodeploy.inhouse.quantize.qdq.plan`).

Build knob ``float_precision`` (int8 on OpenVINO): what the layers the quantizer leaves float
(the fallback's, and the ops with no int8 kernel) run in: ``f32`` (default) or ``bf16`` (OpenVINO's
``INFERENCE_PRECISION_HINT``; int8 layers stay int8). With ``bf16`` the fallback judges each
candidate on OpenVINO in bf16, so the layers it keeps are chosen under the error the artifact will
have. ``auto`` tries ``bf16`` where the CPU runs it natively (AVX512-BF16 or AMX) and OpenVINO
reports it, and keeps ``f32`` when bf16 misses the budget on the calibration data. The choice is
recorded in the artifact (``meta["float_precision"]``) and applied when it is opened. ``f32`` stays
the default because bf16 can pass on the calibration items and fail held out: ppocrv5-rec's bf16
remainder met the budget on 8 calibration crops and gave cosine 0.988 on the 8 evaluation ones
(f32: 0.997); on ppocrv5-det, whose fallback keeps 6 of 75 nodes float, the bf16 remainder did
the same with 16 + 16 crops (cosine 0.9895 held out) and was not faster (``benchmarks/inhouse_int8.py``).

Run-time knobs are ONNX Runtime's (``adapters/ort.py``); the artifact runs on the ``runtime``
knob's engine runtime (:mod:`autodeploy.runtime`), with the settings that engine's adapter derives.
The artifact is ``model.onnx`` plus ``inhouse.json``: what each pass did, the quantization
report and the memory plan.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP
from autodeploy.adapters import ort
from autodeploy.adapters.base import (
    NATIVE_ISA,
    ONNX_ML,
    Artifact,
    Availability,
    Engine,
    EngineSpace,
    TrialConfig,
    foreign_ops,
    int8_saturates,
    require_quantized,
)
from autodeploy.adapters.ort import EXECUTION_MODES, MODEL_FILE, OPT_LEVELS
from autodeploy.errors import BuildError, UnsupportedConfigError
from autodeploy.inhouse.placement import PLACEMENTS
from autodeploy.model import INT8_OPS
from autodeploy.runtime import machine

if TYPE_CHECKING:
    from autodeploy.model import ModelInfo
    from autodeploy.runtime.device import DeviceInfo

REPORT_FILE = "inhouse.json"
#: ``float_precision`` values: what the float remainder of an int8 artifact runs in on OpenVINO.
FLOAT_PRECISIONS = ("f32", "bf16", "auto")
#: The runtimes an in-house artifact can run on (the ``runtime`` knob); their versions join ours.
RUNTIME_DISTS = ("onnxruntime", "openvino")
#: The ``runtime`` knob's default.
DEFAULT_RUNTIME = "onnxruntime"
CALIBRATION_METHODS = ("minmax", "percentile", "entropy")
#: ``float_layers`` values (:data:`autodeploy.inhouse.quantize.mixed.FLOAT_LAYERS` less ``none``, which is ``fallback=False``).
FLOAT_LAYERS_SEARCHED = ("search", "head")
DEFAULT_CALIBRATION = "percentile"
#: SmoothQuant's alpha: the paper's default, half of the activation range moved into the weights.
SMOOTHQUANT_ALPHA = 0.5


class InhouseEngine(Engine):
    name = "inhouse"
    extra = None  # onnxscript is a core dependency, and ONNX Runtime runs the result
    build_knobs = frozenset({"calibration", "activation_symmetric", "fallback", "reduce_range", "runtime",
                             "bias_correction", "smoothquant", "float_precision", "float_layers"})  # fmt: skip
    # int8 with only the failing channels' head float is a config like any other (issue 41)
    search_knobs = frozenset({"float_layers"})
    precision_knobs = {"float_layers": frozenset({"int8"})}
    runtime = ort.rt.__name__  # or OpenVINO's, with the ``runtime`` knob (see runtime_module)
    build_packages = ("onnxscript",)

    def _version(self) -> str | None:
        """Our code, onnxscript and every runtime that can run the result: all change the numbers."""
        ours, onnxscript = machine.version("autodeploy"), machine.version("onnxscript")
        if ours is None or onnxscript is None:
            return None
        runtimes = [f"{dist}-{found}" for dist in RUNTIME_DISTS if (found := machine.version(dist)) is not None]
        return "+".join([f"autodeploy-{ours}", f"onnxscript-{onnxscript}", *runtimes])

    def runtime_version(self, engine_version: str, config: TrialConfig) -> str:
        dist = self.runtime_packages(config)[0]
        found = re.search(rf"(?:^|\+){re.escape(dist)}-([^+]+)", engine_version)
        if found is None:
            raise BuildError(f"in-house version {engine_version!r} does not record the {dist} version it ran on",
                             fix="measure the trial again with this autodeploy")  # fmt: skip
        return found.group(1)

    def _probe(self, target: DeviceInfo) -> Availability:
        import onnxruntime as ort
        import onnxscript

        if "CPUExecutionProvider" not in ort.get_available_providers():
            return Availability(False, reason="this onnxruntime build has no CPUExecutionProvider")
        return Availability(True, version=self._version() or f"onnxscript-{onnxscript.__version__}")

    def _space(self, target: DeviceInfo, model: ModelInfo) -> EngineSpace:
        runtimes = (DEFAULT_RUNTIME, "openvino") if importlib.util.find_spec("openvino") else (DEFAULT_RUNTIME,)
        return EngineSpace(
            precisions=("fp32", "int8"),
            unsupported={
                "fp16": "the in-house path quantizes to int8 only; use openvino or tensorrt for fp16",
                "bf16": "the in-house path quantizes to int8 only; use openvino on a CPU with AMX",
            },
            knobs={
                "calibration": CALIBRATION_METHODS,
                "activation_symmetric": (False, True),
                "fallback": (True, False),
                "float_layers": FLOAT_LAYERS_SEARCHED,
                "reduce_range": ("auto", True, False),
                "runtime": runtimes,
                "bias_correction": (True, False),
                "smoothquant": (False, True),
                "float_precision": FLOAT_PRECISIONS if _native_bf16(target) else ("f32", "auto"),
                "inter_op_num_threads": (1, 2, 4),
                "execution_mode": EXECUTION_MODES,
                "graph_optimization_level": OPT_LEVELS,
            },
        )

    def _build(
        self,
        model: ModelInfo,
        config: TrialConfig,
        calibration: Mapping[str, np.ndarray] | None,
        outdir: Path,
        target: DeviceInfo,
    ) -> dict[str, Any]:
        import onnx

        from autodeploy.inhouse.memory import plan_memory
        from autodeploy.inhouse.passes import optimize
        from autodeploy.inhouse.search_time import STOPPED_KEY

        runtime = runtime_of(config)
        # int8 keeps standard ops: the quantizer and every QDQ consumer understand them.
        ops = PLACEMENTS[runtime].fp32_passes if config.precision == "fp32" else "onnx"
        proto = onnx.load(str(model.path))
        optimized, pass_report = optimize(proto, target=ops)
        report: dict[str, Any] = {"passes": pass_report.to_dict()}
        meta: dict[str, Any] = {
            "target": ops,
            "passes": {p.name: p.rewrites for p in pass_report.passes if p.changed},
        }
        if config.precision == "int8":
            source = [n.op_type for n in optimized.graph.node]
            optimized, quant = _quantize(optimized, config, calibration, model, target)
            built = [n.op_type for n in optimized.graph.node]
            if quant["kept_float"] and not any(op in INT8_OPS for op in built):
                raise UnsupportedConfigError(
                    f"inhouse int8 is identical to fp32: its accuracy-aware fallback kept all {len(quant['kept_float'])} "
                    "quantizable nodes float to hold the accuracy budget", fix="use fp32: it is the same graph")  # fmt: skip
            require_quantized(self.name, built, source)
            report["quantization"] = quant
            meta.update(
                float_precision=quant["float_precision"],
                calibration=quant["calibration"],
                reduce_range=quant["reduce_range"],
                kept_float=len(quant["kept_float"]),
                budget_met=quant["budget_met"],
                # which channels all-int8 broke: inhouse.json's kept_float_why says why each float layer stayed
                **({"float_evidence": quant["evidence"]} if quant.get("evidence") else {}),
                # the float-layer search stopped at its time limit: what it spent, said with the trial's result
                **({STOPPED_KEY: quant["search_stopped_s"], "float_builds": quant["evaluations"]}
                   if quant.get("search_stopped_s") is not None else {}),
            )
        onnx.save(optimized, str(outdir / MODEL_FILE))
        report["memory"] = plan_memory(optimized, dims=_batch_dims(model)).to_dict(tensors=False)
        (outdir / REPORT_FILE).write_text(json.dumps(report, indent=2))
        return meta

    def _check(self, target: DeviceInfo, model: ModelInfo, config: TrialConfig) -> None:
        mixed = config.knobs.get("float_layers", "search")
        if mixed != "search" and (config.precision != "int8" or not config.knobs.get("fallback", True)):
            raise UnsupportedConfigError(f"inhouse float_layers={mixed} chooses what the int8 fallback keeps float; this "
                                         f"config has {'fallback=False' if config.precision == 'int8' else config.precision}",
                                         fix="leave float_layers out")  # fmt: skip
        if runtime_of(config) != "openvino":
            return
        from autodeploy.adapters.openvino import ONNX_ML_OPS

        lacked = foreign_ops(model, {ONNX_ML: ONNX_ML_OPS}).get(ONNX_ML)
        if lacked:
            raise UnsupportedConfigError(f"inhouse runtime=openvino: openvino has no conversion rule for {ONNX_ML} "
                                         f"op{'s' * (len(lacked) > 1)} {', '.join(lacked)}",
                                         fix="use runtime=onnxruntime")  # fmt: skip

    def runtime_module(self, config: TrialConfig) -> str:
        if runtime_of(config) == "openvino":
            from autodeploy.runtime import openvino

            return openvino.__name__
        return self.runtime

    def serving_engine(self, config: TrialConfig) -> Engine:
        from autodeploy.adapters import registry

        return registry.get(runtime_of(config))

    def _runtime_settings(self, artifact: Artifact, config: TrialConfig, model: ModelInfo) -> dict[str, Any]:
        if runtime_of(config) == "openvino":
            from autodeploy.adapters.openvino import runtime_settings

            # OpenVINO's ONNX frontend reads the QDQ model directly; its settings are OpenVINO's own.
            settings = {**runtime_settings(config, model), "model_file": MODEL_FILE}
            if config.precision == "int8":  # what the quantizer judged the float remainder in
                remainder = str(artifact.meta.get("float_precision", "f32"))
                settings["properties"] = {**settings["properties"], "INFERENCE_PRECISION_HINT": remainder}
            return settings
        return ort.session_settings(config)

    def requirements(
        self, artifact: Artifact, config: TrialConfig, device: Mapping[str, Any]
    ) -> dict[str, Any]:
        if config.precision == "int8" and runtime_of(config) == "openvino":
            if artifact.meta.get("float_precision") == "bf16":
                return {"isa_any_of": list(NATIVE_ISA["bf16"]),
                        "why": "the float layers of this int8 artifact run in bf16 on OpenVINO"}  # fmt: skip
        return {}


def runtime_of(config: TrialConfig) -> str:
    """The engine whose runtime runs ``config``'s artifact (the ``runtime`` knob)."""
    return str(config.knobs.get("runtime", DEFAULT_RUNTIME))


def float_precision(config: TrialConfig, isa: Any) -> str:
    """``f32`` or ``bf16``: the float remainder to try first for an int8 artifact, on a CPU with ``isa``."""
    if "bf16" not in PLACEMENTS[runtime_of(config)].float_precisions:
        return "f32"  # ONNX Runtime's CPU kernels have no bf16
    chosen = str(config.knobs.get("float_precision", "f32"))
    if chosen != "auto":
        return chosen
    from autodeploy.runtime.openvino import capabilities

    native = any(flag in tuple(isa) for flag in NATIVE_ISA["bf16"])
    return "bf16" if native and "BF16" in capabilities() else "f32"


def _native_bf16(target: DeviceInfo) -> bool:
    return importlib.util.find_spec("openvino") is not None and any(target.has(f) for f in NATIVE_ISA["bf16"])


def _quantize(
    model: Any, config: TrialConfig, calibration: Mapping[str, np.ndarray] | None, info: ModelInfo,
    target: DeviceInfo,
) -> tuple[Any, dict[str, Any]]:
    from autodeploy.inhouse.quantize import QuantConfig, quantize

    if not calibration:
        raise BuildError("in-house int8 needs calibration data", fix="give --data or use synthetic data")
    reduce_range = config.knobs.get("reduce_range", "auto")
    if reduce_range == "auto":
        reduce_range = int8_saturates(target)
    remainder = float_precision(config, target.isa)
    auto = config.knobs.get("float_precision", "f32") == "auto"
    if auto and not config.knobs.get("fallback", True):
        remainder = "f32"  # nothing judges the accuracy: bf16 only where the user asks for it
    settings = QuantConfig(
        float_precision=remainder,
        calibration=config.knobs.get("calibration", DEFAULT_CALIBRATION),
        activation_symmetric=bool(config.knobs.get("activation_symmetric", False)),
        reduce_range=bool(reduce_range),
        # the fallback holds the default budget (docs/architecture.md, 1%)
        max_accuracy_drop=DEFAULT_MAX_ACCURACY_DROP if config.knobs.get("fallback", True) else None,
        # QDQ where the runtime that runs the artifact fuses it into integer kernels
        placement=runtime_of(config),
        bias_correction=bool(config.knobs.get("bias_correction", True)),
        float_layers=str(config.knobs.get("float_layers", "search")),
        smoothquant=SMOOTHQUANT_ALPHA if config.knobs.get("smoothquant", False) else None,
        # Calibrated and judged at the trial's batch: a dynamic-batch detector whose decode head holds
        # batch-1 constants crashed OpenVINO's compiler when the judge compiled it at batch 8.
        batch=config.batch,
    )
    axes = {name: info.batch_axis(name) for name in info.input_names}
    quantized, report = quantize(model, calibration, settings, axes)
    if auto and remainder == "bf16" and settings.max_accuracy_drop is not None and not report.budget_met:
        # bf16 cannot hold the budget here: the f32 remainder may (the user asked for no precision)
        quantized, report = quantize(model, calibration, replace(settings, float_precision="f32"), axes)
    return quantized, report.to_dict()


def _batch_dims(model: ModelInfo) -> dict[str, int]:
    """Symbolic dims fixed for the memory plan: the batch dim at 1, others as the user fixed them."""
    dims: dict[str, int] = {}
    for spec in model.inputs:
        fixed = model.shapes.get(spec.name)
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, str):
                dims.setdefault(dim, fixed[axis] if fixed else 1)
    return dims
