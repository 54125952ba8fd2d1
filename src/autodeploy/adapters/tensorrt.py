"""NVIDIA TensorRT 10: ONNX → serialized engine plan, run through an execution context.

The build is TensorRT's documented Python flow: ``Builder`` → network (TensorRT 10 networks are
always explicit-batch) → ``OnnxParser`` → ``BuilderConfig`` with ``BuilderFlag`` FP16/BF16/INT8
and one optimization profile → ``build_serialized_network``. INT8 is *explicit* quantization
only: the ONNX model must carry QuantizeLinear/DequantizeLinear nodes (e.g. from
``autodeploy.inhouse`` or ``onnxruntime.quantization`` in QDQ format); TensorRT 10 deprecated
implicit calibration.

A plan only runs under the TensorRT version and GPU architecture that built it, so the artifact
records both (``meta.tensorrt``, ``meta.compute_capability``); they become the runtime settings,
and :mod:`autodeploy.runtime.tensorrt` refuses a mismatch before deserializing. A GPU engine's
speed does not depend on a CPU thread count, so threads are not searched for it. The plan is TensorRT's
compiled form (every start deserializes it); its *timing cache* (the kernel timings the builder measured) is
kept beside the artifacts, one file per TensorRT version and GPU architecture (:func:`timing_cache_path`), and
every build starts from it and adds to it, so a second build of another config spends less time timing tactics.

The pure parts (profile shapes, compatibility check, GPU parsing) import nothing from
TensorRT, so they are tested on machines without a GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autodeploy.adapters.base import (
    ONNX_ML,
    Artifact,
    Availability,
    Engine,
    EngineSpace,
    TrialConfig,
    TritonBackend,
    foreign_ops,
)
from autodeploy.errors import BuildError
from autodeploy.runtime import tensorrt as rt
from autodeploy.runtime.tensorrt import check_plan_compatible, shape_in_profile

__all__ = ["PLAN_FILE", "TensorRTEngine", "check_plan_compatible", "compute_capability", "profile_shapes", "shape_in_profile"]

if TYPE_CHECKING:
    from autodeploy.model import ModelInfo
    from autodeploy.runtime.device import DeviceInfo

PLAN_FILE = rt.MODEL_FILE
#: The largest batch a plan accepts is at least this, so one plan serves small batches too.
MIN_MAX_BATCH = 8
NO_GPU_REASON = "TensorRT needs an NVIDIA GPU; none found"
NO_GPU_FIX = "run on a machine with an NVIDIA GPU and its driver (nvidia-smi must list it)"
#: BF16 kernels exist from Ampere (compute capability 8.0) on.
BF16_MIN_CAPABILITY = (8, 0)

Shape = tuple[int, ...]


class TensorRTEngine(Engine):
    name = "tensorrt"
    extra = "tensorrt"
    modules = ("tensorrt", "cuda")
    runner_extras = ("cuda-python",)  # the runtime drives CUDA through it
    int8_quantizes = False  # its int8 runs a QDQ model's quantization: the one way TensorRT 10 takes int8
    triton = TritonBackend("tensorrt", platform="tensorrt_plan", kind="KIND_GPU", max_batch_floor=MIN_MAX_BATCH)
    runtime = rt.__name__
    packages = rt.PACKAGES
    build_packages = ("cuda-python",)
    gpu = True

    def _probe(self, target: DeviceInfo) -> Availability:
        if not target.gpus:
            where = "nvidia-smi absent" if shutil.which("nvidia-smi") is None else "nvidia-smi lists none"
            return Availability(False, reason=f"{NO_GPU_REASON} ({where})", fix=NO_GPU_FIX)
        import tensorrt as trt

        rt.cudart()  # the runtime needs cuda-python; a missing one is an ImportError with the install hint
        return Availability(True, version=trt.__version__)

    def _space(self, target: DeviceInfo, model: ModelInfo) -> EngineSpace:
        lacked = foreign_ops(model).get(ONNX_ML)
        if lacked:  # TensorRT's ONNX parser has no importer for the classical-ML domain
            why = (f"TensorRT's ONNX parser has no importer for {ONNX_ML} op{'s' * (len(lacked) > 1)} "
                   f"{', '.join(lacked)}; fix: run it on onnxruntime (--engine onnxruntime)")  # fmt: skip
            everything = dict.fromkeys(("fp32", "fp16", "bf16", "int8"), why)
            return EngineSpace(precisions=(), unsupported=everything, threads=False)
        precisions = ["fp32", "fp16"]
        unsupported: dict[str, str] = {}
        capability = compute_capability(target.gpus)
        if capability is not None and capability >= BF16_MIN_CAPABILITY:
            precisions.append("bf16")
        else:
            unsupported["bf16"] = (
                f"TensorRT bf16 needs compute capability >= 8.0, this GPU has {_cc(capability)}"
            )
        if model.format != "onnx":  # a .tflite reaches TensorRT through tf2onnx's fp32 ONNX, built later
            unsupported["int8"] = ("TensorRT 10 runs int8 only from explicitly quantized ONNX models; this model is "
                                   "not ONNX (it is converted at build time), so no QDQ can be checked for")  # fmt: skip
        elif _has_qdq(model.path):
            precisions.append("int8")
        else:
            unsupported["int8"] = (
                "TensorRT 10 runs int8 only from explicitly quantized models and this ONNX has no "
                "QuantizeLinear nodes; quantize it to QDQ first (implicit calibration is deprecated)"
            )
        # The GPU does the work: a CPU thread count is not a TensorRT setting, so it is not searched.
        return EngineSpace(precisions=tuple(precisions), unsupported=unsupported, threads=False)

    def oversubscription(self, config: TrialConfig, logical_cores: int) -> str | None:
        return None  # requests run on the GPU, one execution context and stream each

    def build_key(self, model: ModelInfo, config: TrialConfig, version: str, calibration_hash: str) -> str:
        # The plan's optimization profile is tuned for the trial batch and spans the shapes covered,
        # so both join the key.
        base = super().build_key(model, config, version, calibration_hash)
        ranges = json.dumps({k: [list(lo), list(hi)] for k, (lo, hi) in sorted(model.shape_ranges.items())})
        return hashlib.sha256(f"{base}/b{config.batch}{'/' + ranges if model.shape_ranges else ''}".encode()).hexdigest()[:24]

    def _build(
        self,
        model: ModelInfo,
        config: TrialConfig,
        calibration: Mapping[str, np.ndarray] | None,
        outdir: Path,
        target: DeviceInfo,
    ) -> dict[str, Any]:
        import tensorrt as trt

        logger = trt.Logger(trt.Logger.ERROR)
        builder = trt.Builder(logger)
        network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(model.path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise BuildError(f"TensorRT's ONNX parser rejected {model.name}: {errors}")
        builder_config = builder.create_builder_config()
        for flag in PRECISION_FLAGS[config.precision]:
            builder_config.set_flag(getattr(trt.BuilderFlag, flag))
        profile = profile_shapes(model, config.batch)
        trt_profile = builder.create_optimization_profile()
        for name, (low, opt, high) in profile.items():
            trt_profile.set_shape(name, low, opt, high)
        builder_config.add_optimization_profile(trt_profile)
        timings = timing_cache_path(outdir.parent, trt.__version__, rt.device_capability())
        _use_timing_cache(builder_config, timings)
        plan = builder.build_serialized_network(network, builder_config)
        if plan is None:
            raise BuildError(f"TensorRT could not build a {config.precision} engine for {model.name}")
        (outdir / PLAN_FILE).write_bytes(bytes(plan))
        _save_timing_cache(builder_config, timings)
        profile_record = {name: {"min": list(lo), "opt": list(opt), "max": list(hi)} for name, (lo, opt, hi) in profile.items()}
        return {"tensorrt": trt.__version__, "compute_capability": rt.device_capability(), "profile": profile_record}

    def _runtime_settings(self, artifact: Artifact, config: TrialConfig, model: ModelInfo) -> dict[str, Any]:
        # Precision and the optimization profile are baked into the plan; what it needs is recorded.
        meta = artifact.meta
        return {"model_file": PLAN_FILE, "tensorrt": meta.get("tensorrt"),
                "compute_capability": meta.get("compute_capability"), "profile": meta.get("profile")}  # fmt: skip

    def requirements(self, artifact: Artifact, config: TrialConfig, device: Mapping[str, Any]) -> dict[str, Any]:
        cc = artifact.meta.get("compute_capability")
        if cc is None:
            raise BuildError("the TensorRT artifact does not record the compute capability it was built for",
                             fix="rebuild it with this autodeploy (autodeploy bench --engine tensorrt)")  # fmt: skip
        return {"gpu_compute_capability": str(cc), "why": "a TensorRT plan runs only on the GPU architecture that built it"}


#: Builder flags per precision; fp32 needs none. INT8 only takes effect with QDQ nodes.
PRECISION_FLAGS: dict[str, tuple[str, ...]] = {
    "fp32": (),
    "fp16": ("FP16",),
    "bf16": ("BF16",),
    "int8": ("INT8",),
}


# -- pure parts (no TensorRT needed) -------------------------------------------------------


def timing_cache_path(folder: Path, version: str, capability: str) -> Path:
    """Where the timing cache of TensorRT ``version`` on GPUs of compute ``capability`` is kept in ``folder``:
    timings measured under another version or on another architecture are never read back."""
    return Path(folder) / f"tensorrt-timing-{version}-cc{capability}.cache"


def _use_timing_cache(builder_config: Any, path: Path) -> None:
    """Start the build from the timing cache at ``path`` (an empty one where there is none, or where TensorRT
    refuses it: ``ignore_mismatch=False`` rejects timings of another device)."""
    blob = path.read_bytes() if path.is_file() else b""
    timings = builder_config.create_timing_cache(blob)
    if timings is None or not builder_config.set_timing_cache(timings, ignore_mismatch=False):
        builder_config.set_timing_cache(builder_config.create_timing_cache(b""), ignore_mismatch=False)


def _save_timing_cache(builder_config: Any, path: Path) -> None:
    """Write the build's timing cache (what it read, plus what it timed) to ``path``, atomically."""
    timings = builder_config.get_timing_cache()
    if timings is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(bytes(timings.serialize()))
    os.replace(tmp, path)


def profile_shapes(model: ModelInfo, batch: int) -> dict[str, tuple[Shape, Shape, Shape]]:
    """Min/opt/max shape of every input for the optimization profile.

    The batch axis (the model's, wherever it is) runs from 1 through ``batch`` (opt) to
    ``max(batch, 8)``; a static batch dim stays what the model says, and an input without a
    batch axis keeps one shape. Other dims come from the model, ``--shape`` or the data; when
    the bench or study covers several shapes (:attr:`ModelInfo.shape_ranges`), they span the
    smallest to the largest of them, tuned (opt) for this trial's own.
    """
    shapes = {}
    for spec in model.inputs:
        axis = model.batch_axis(spec.name)
        if axis is None or not model.batchable():
            # No batch axis, or the model fixes the batch: the batch dim is the model's (or the user's).
            fixed = model.input_shape(spec.name, model.fixed_batch() or 1)
            low, opt, high = fixed, fixed, fixed
            axis = None
        else:
            low = model.input_shape(spec.name, 1)
            opt = model.input_shape(spec.name, batch)
            high = model.input_shape(spec.name, max(batch, MIN_MAX_BATCH))
        if spec.name in model.shape_ranges:
            smallest, largest = model.shape_ranges[spec.name]
            low = _span(low, smallest, min, axis)
            high = _span(high, largest, max, axis)
        shapes[spec.name] = (low, opt, high)
    return shapes


def _span(shape: Shape, bound: Sequence[int], pick: Any, batch_axis: int | None) -> Shape:
    """``shape`` widened dim by dim to ``bound`` (``pick`` is min or max), its batch axis left as it is."""
    return tuple(d if i == batch_axis else pick(d, b) for i, (d, b) in enumerate(zip(shape, bound, strict=True)))


def compute_capability(gpus: Sequence[str]) -> tuple[int, int] | None:
    """``(major, minor)`` of the first GPU in :attr:`DeviceInfo.gpus` (``"NAME (compute X.Y)"``)."""
    for gpu in gpus:
        found = re.search(r"\(compute (\d+)\.(\d+)\)", gpu)
        if found:
            return int(found.group(1)), int(found.group(2))
    return None


def _cc(capability: tuple[int, int] | None) -> str:
    return "an unknown one" if capability is None else f"{capability[0]}.{capability[1]}"


def _has_qdq(path: Path) -> bool:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return any(node.op_type == "QuantizeLinear" for node in graph.node)
