"""ONNX Runtime (CPU execution provider): fp32, and int8 through ``onnxruntime.quantization``.

Knobs keep ORT's own names (``SessionOptions`` attributes), so they can be checked against
https://onnxruntime.ai/docs/performance/tune-performance/threading.html.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autodeploy.adapters.base import (
    Artifact,
    Availability,
    Engine,
    EngineSpace,
    TrialConfig,
    TritonBackend,
    TritonParameters,
    int8_saturates,
    require_quantized,
)
from autodeploy.errors import BuildError, UnsupportedConfigError
from autodeploy.model import copy_unchanged
from autodeploy.runtime import onnxruntime as rt

if TYPE_CHECKING:
    from autodeploy.model import ModelInfo
    from autodeploy.runtime.device import DeviceInfo

MODEL_FILE = rt.MODEL_FILE
OPT_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
EXECUTION_MODES = ("ORT_SEQUENTIAL", "ORT_PARALLEL")
#: ``auto`` picks dynamic quantization for MatMul-heavy models (transformers), static QDQ otherwise.
QUANT_METHODS = ("auto", "static", "dynamic")
#: The ops ONNX Runtime's CPU provider runs in int8 (QLinearConv, QLinearMatMul, QGemm, ConvInteger, MatMulInteger,
#: QAttention, DynamicQuantizeLSTM): a graph without one has nothing int8 could speed up or change.
INT8_KERNELS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Attention", "LSTM", "EmbedLayerNormalization")
#: Static int8 of the head: the ops after the last Conv/MatMul/Gemm (activations, Concat, Transpose) stay
#: float by default. Quantized, a detector's Concat of pixel boxes (0-320) and class scores (0-1) gets one
#: scale, 320/255, and every score collapses to 0 or 1.26 (class channels at 2.3 dB SQNR, flattened
#: cosine 0.99999); float, 35 dB, at the cost of a few light ops in float.
QUANT_HEADS = ("float", "int8")
#: Static int8's mixed precision (``float_layers``): ``none`` (the default: every layer int8 but the ``quant_head``),
#: ``head`` (also the head of the channels int8 breaks float), ``search`` (then the layers ranked by their
#: effect on them, until the verdict passes on the calibration items): ``nodes_to_exclude`` built from the
#: evidence of the verdict (:mod:`autodeploy.inhouse.quantize.scope`), the in-house quantizer's rule.
FLOAT_LAYERS = ("none", "head", "search")
#: Ops that carry weights: the head is what lies after the last of them on every path to an output.
WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "ConvInteger", "MatMulInteger"})
CALIBRATION_BATCH = 8
#: ``graph_optimization_level`` as the Triton ORT backend's ``optimization.graph.level`` (unset means all).
TRITON_GRAPH_LEVEL = {"ORT_ENABLE_BASIC": -1, "ORT_ENABLE_EXTENDED": 1, "ORT_DISABLE_ALL": 2}


@dataclass(frozen=True)
class OrtTritonBackend(TritonBackend):
    """Triton's ONNX Runtime backend (platform ``onnxruntime_onnx``): ``intra_op_thread_count``,
    ``inter_op_thread_count``, ``execution_mode`` and ``optimization.graph.level`` (-1 basic, 1 extended,
    2 disabled; unset means all, as in the backend)."""

    backend: str = "onnxruntime"
    platform: str | None = "onnxruntime_onnx"

    def parameters(self, settings: Mapping[str, Any], serving: Mapping[str, Any], max_batch: int,
                   device: Mapping[str, Any]) -> TritonParameters:  # fmt: skip
        threads, knobs = settings["threads"], settings["knobs"]
        values: dict[str, str] = {}
        if threads:
            values["intra_op_thread_count"] = str(threads)
        if knobs.get("inter_op_num_threads"):
            values["inter_op_thread_count"] = str(knobs["inter_op_num_threads"])
        if knobs.get("execution_mode") == "ORT_PARALLEL":
            values["execution_mode"] = "1"
        concurrency = serving.get("concurrency") or {}
        count = int(concurrency.get("requests", 1))
        notes: tuple[str, ...] = ()
        if count > 1 and concurrency.get("sessions", count) != count:
            notes = (f"measured as {count} threads sharing one ONNX Runtime session; Triton gives each of "
                     f"its {count} instances a session of its own (more memory)",)  # fmt: skip
        level = TRITON_GRAPH_LEVEL.get(knobs.get("graph_optimization_level", "ORT_ENABLE_ALL"))
        return TritonParameters(values, level, notes)


class OnnxRuntimeEngine(Engine):
    name = "onnxruntime"
    extra = None  # a core dependency: it also computes the FP32 reference
    triton = OrtTritonBackend()
    runtime = rt.__name__
    packages = rt.PACKAGES
    build_knobs = frozenset({"quant_method", "quant_head", "float_layers"})
    # Parallel execution of independent branches is the one session option that often pays off; pinning
    # each pool thread to a CPU of its own (issue 26) keeps threads from migrating between cores; int8 with
    # the layers its verdict's evidence names kept float is a config like any other (issue 41).
    search_knobs = frozenset({"execution_mode", "intra_op_thread_affinities", "float_layers"})
    precision_knobs = {"float_layers": frozenset({"int8"})}
    throughput_knobs = frozenset({"inter_op_num_threads", "num_requests", "sessions"})
    peak_kernels = True

    def _probe(self, target: DeviceInfo) -> Availability:
        import onnxruntime as ort

        if "CPUExecutionProvider" not in ort.get_available_providers():
            return Availability(
                False,
                reason="this onnxruntime build has no CPUExecutionProvider",
                fix="pip install onnxruntime",
            )
        return Availability(True, version=ort.__version__)

    def _space(self, target: DeviceInfo, model: ModelInfo) -> EngineSpace:
        return EngineSpace(
            precisions=("fp32", "int8"),
            unsupported={
                "fp16": "ORT's CPU provider has few fp16 kernels and falls back through casts; "
                "use openvino or tensorrt for fp16",
                "bf16": "ORT's CPU provider has no bf16 kernels; use openvino on a CPU with AMX",
            },
            knobs={
                "inter_op_num_threads": (1, 2, 4),
                "execution_mode": EXECUTION_MODES,
                "graph_optimization_level": OPT_LEVELS,
                "quant_method": QUANT_METHODS,
                "quant_head": QUANT_HEADS,
                "float_layers": FLOAT_LAYERS,
                "sessions": rt.SESSIONS,  # several requests in flight: on one session, or one session each
                # "none" first: the portfolio's first look at an engine keeps its default (threads unpinned)
                "intra_op_thread_affinities": rt.AFFINITIES,
            },
        )

    def _check(self, target: DeviceInfo, model: ModelInfo, config: TrialConfig) -> None:
        mixed = config.knobs.get("float_layers", "none")
        if mixed != "none" and config.precision != "int8":
            raise UnsupportedConfigError(f"onnxruntime float_layers={mixed} applies to int8 only",
                                         fix="leave float_layers out, or set it to none")  # fmt: skip
        if mixed != "none" and config.knobs.get("quant_method") == "dynamic":
            raise UnsupportedConfigError(f"onnxruntime float_layers={mixed} needs static int8 (calibrated, judged on "
                                         "the calibration items)", fix="use quant_method=static")  # fmt: skip
        if config.knobs.get("intra_op_thread_affinities", "none") == "none":
            return
        threads = config.threads
        if threads is None or threads < 2:
            raise UnsupportedConfigError(
                f"onnxruntime intra_op_thread_affinities={config.knobs['intra_op_thread_affinities']} needs 2 or more "
                f"threads, got {'the default' if threads is None else threads}: ORT pins the threads of its pool, the "
                "calling thread never (so 1 thread has none), and at its default thread count it sets affinities itself",
                fix="pass --threads N with N >= 2, or leave the knob out",
            )  # fmt: skip
        if config.knobs.get("sessions") == "per_request":
            raise UnsupportedConfigError(
                "onnxruntime intra_op_thread_affinities with sessions=per_request: every session would pin its pool "
                "to the same CPUs", fix="use sessions=shared, or leave intra_op_thread_affinities out",
            )  # fmt: skip
        if threads > target.logical_cores:
            raise UnsupportedConfigError(
                f"onnxruntime intra_op_thread_affinities pins {threads} threads, one per logical CPU, on "
                f"{target.logical_cores} logical CPUs", fix=f"pass --threads {target.logical_cores} or fewer",
            )  # fmt: skip

    def _build(
        self,
        model: ModelInfo,
        config: TrialConfig,
        calibration: Mapping[str, np.ndarray] | None,
        outdir: Path,
        target: DeviceInfo,
    ) -> dict[str, Any]:
        out = outdir / MODEL_FILE
        if config.precision == "fp32":
            copy_unchanged(model, outdir, MODEL_FILE)  # no links followed; the intake hash re-checked
            return {}
        method = config.knobs.get("quant_method", "auto")
        if method == "auto":
            method = "dynamic" if _matmul_heavy(model.path) else "static"
        if method == "static" and not calibration:
            raise BuildError(
                "static int8 quantization needs calibration data", fix="give --data or use synthetic data"
            )
        source = _op_types(model.path)
        if not any(op in INT8_KERNELS for op in source):  # nothing to quantize: ORT's quantizer may even refuse
            require_quantized(self.name, (), source)
        reduce_range = int8_saturates(target) if method == "static" else False
        float_head = method == "static" and config.knobs.get("quant_head", "float") == "float"
        mixed = str(config.knobs.get("float_layers", "none"))
        if mixed != "none" and method != "static":
            raise UnsupportedConfigError(f"onnxruntime float_layers={mixed} needs static int8; quant_method=auto "
                                         "chose dynamic for this MatMul-heavy model", fix="use quant_method=static")  # fmt: skip
        kept, found = _quantize(model, method, calibration, out, reduce_range=reduce_range, float_head=float_head,
                                float_layers=mixed)  # fmt: skip
        require_quantized(self.name, _op_types(out), source)
        return {
            "quant_method": method,
            **({"activations": "u8", "reduce_range": reduce_range, "float_head_nodes": kept}
               if method == "static" else {}),
            **found,
        }

    def _runtime_settings(self, artifact: Artifact, config: TrialConfig, model: ModelInfo) -> dict[str, Any]:
        return session_settings(config)

    def peak_call(self, graph: bytes, precision: str, shapes: Mapping[str, tuple[int, ...]]) -> Callable[[Any], Any]:
        session = rt.session(graph, {"intra_op_num_threads": 0})  # 0: ORT's default threads
        return lambda feeds: session.run(None, feeds)


def session_settings(config: TrialConfig) -> dict[str, Any]:
    """ONNX Runtime ``SessionOptions`` for ``config``, in ORT's own words (also the in-house engine's)."""
    knobs = config.knobs
    return {
        "model_file": MODEL_FILE,
        "intra_op_num_threads": config.threads or 0,  # 0: ORT's default (one per physical core)
        "inter_op_num_threads": int(knobs.get("inter_op_num_threads", 0)),
        "execution_mode": knobs.get("execution_mode", "ORT_SEQUENTIAL"),
        "graph_optimization_level": knobs.get("graph_optimization_level", "ORT_ENABLE_ALL"),
        **({"sessions": knobs["sessions"]} if "sessions" in knobs else {}),
        # the policy, not ORT's processor list: the runtime resolves it on the machine it runs on
        **({"intra_op_thread_affinities": knobs["intra_op_thread_affinities"]}
           if knobs.get("intra_op_thread_affinities", "none") != "none" else {}),
    }


def _op_types(path: Path) -> list[str]:
    import onnx

    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def _matmul_heavy(path: Path) -> bool:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    return ops.count("MatMul") > ops.count("Conv")


def _quantize(model: ModelInfo, method: str, calibration: Mapping[str, np.ndarray] | None, out: Path,
              *, reduce_range: bool = False, float_head: bool = False,
              float_layers: str = "none") -> tuple[list[str], dict[str, Any]]:  # fmt: skip
    """Quantize into ``out``; returns the nodes kept float (the head, with ``float_head``) and, with
    ``float_layers``, what its search found (the nodes it left float and why: :func:`scope.record`)."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class _Reader(CalibrationDataReader):
        def __init__(self, data: Mapping[str, np.ndarray]) -> None:
            # A model with a static batch dim takes one item at a time.
            batch = CALIBRATION_BATCH if model.batchable() else (model.fixed_batch() or 1)
            self._iter = _calibration_batches(data, batch, model)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._iter, None)

    prepared = out.with_name("prepared.onnx")
    try:
        # Per-channel QDQ writes DequantizeLinear's `axis`, which exists from opset 13: older
        # exports (Paddle2ONNX's opset 11, ddddocr's 12) are converted first, or ORT cannot load the result.
        source = _at_least_opset_13(model, out.with_name("opset13.onnx"))
        # ORT's documented first step: shape inference and graph cleanup so more ops quantize.
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        _own_biases(prepared)
        head = _float_head(prepared) if float_head else []
        if method == "dynamic":
            quantize_dynamic(str(prepared), str(out), weight_type=QuantType.QInt8, per_channel=True)
            return head, {}
        assert calibration is not None

        def static(float_nodes: Sequence[str] = ()) -> Any:
            quantize_static(
                str(prepared),
                str(out),
                _Reader(calibration),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                # u8 activations x s8 weights: the pair x86's integer dot products take (VNNI's
                # VPDPBUSD, AVX2's VPMADDUBSW). s8 x s8, ORT's default, measured 0.27-0.84x ORT fp32
                # on an AVX-512 VNNI EPYC against 0.92-1.43x for u8 x s8 (benchmarks/ort_int8_ceiling.py).
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                reduce_range=reduce_range,
                nodes_to_exclude=[*head, *(n for n in float_nodes if n not in head)],
            )
            return onnx.load(str(out))

        if float_layers == "none":
            static()
            return head, {}
        from autodeploy.inhouse.quantize.scope import float_scope, record

        axes = {name: model.batch_axis(name) for name in model.input_names}
        # ORT's static int8 calibrates min/max already: nothing to widen
        found, _ = float_scope(_named(prepared), calibration, static, mode=float_layers, placement="onnxruntime", axes=axes)
        onnx.save(found.candidate, str(out))  # the chosen build, not the last one tried
        return head, record(found)
    except BuildError:
        raise
    except Exception as exc:
        raise BuildError(
            f"onnxruntime {method} int8 quantization failed{_where_quantizer_failed(exc)}: {type(exc).__name__}: {exc}",
            fix="try another int8 (--engine inhouse or openvino: their own quantizers)"
            + (", or --knob quant_method=dynamic" if method == "static" else ""),
        ) from exc
    finally:
        prepared.unlink(missing_ok=True)
        out.with_name("opset13.onnx").unlink(missing_ok=True)


def _where_quantizer_failed(exc: BaseException) -> str:
    """`` at node NAME (OP)`` or `` at tensor NAME``: what ORT's quantizer was working on when it raised, read
    from the innermost frame of its traceback that holds one (its loops name them ``node`` and ``tensor_name``);
    an exception from numpy deep inside names neither, and the user needs the op to act."""
    import onnx

    tb, found = exc.__traceback__, ""
    while tb is not None:
        scope = tb.tb_frame.f_locals
        node, tensor = scope.get("node"), scope.get("tensor_name")
        if isinstance(node, onnx.NodeProto):
            found = f" at node {node.name or '(unnamed)'} ({node.op_type})"
        elif isinstance(tensor, str) and tensor:
            found = f" at tensor {tensor}"
        tb = tb.tb_next
    return found


def _own_biases(path: Path) -> None:
    """Give each Conv/ConvTranspose/Gemm a bias initializer of its own, under a name no tensor has.

    ORT's quantizer copies a bias that several nodes share as ``<bias><n>``, checking only initializer
    names: basic-pitch (a TF export) feeds one bias to 17 Convs, ``conv1d_25`` + ``2`` was a Conv's output,
    the copy replaced that activation and ORT refused its own result (``Transpose ... input shape = {36}``).
    """
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    taken = set(initializers) | {n for node in graph.node for n in (*node.input, *node.output)}
    taken |= {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    claimed: set[str] = set()
    changed = False
    for node in graph.node:
        if node.op_type not in ("Conv", "ConvTranspose", "Gemm") or len(node.input) < 3:
            continue
        bias = node.input[2]
        if bias not in initializers:
            continue
        if bias in claimed:
            name, n = f"{bias}_of_{node.name or node.output[0]}", 0
            while name in taken:
                name, n = f"{bias}_of_{node.name or node.output[0]}_{n}", n + 1
            copy = onnx.TensorProto()
            copy.CopyFrom(initializers[bias])
            copy.name = name
            graph.initializer.append(copy)
            taken.add(name)
            node.input[2], changed = name, True
        claimed.add(bias)
    if changed:
        onnx.save(model, str(path))


def _named(path: Path) -> Any:
    """The model in ``path``, its unnamed nodes named (and saved so), as ``nodes_to_exclude`` names them."""
    import onnx

    model = onnx.load(str(path))
    if any(not node.name for node in model.graph.node):
        for i, node in enumerate(model.graph.node):
            node.name = node.name or f"{node.op_type}_{i}"
        onnx.save(model, str(path))
    return model


def _float_head(path: Path) -> list[str]:
    """The names of the nodes no weighted op depends on (the head), naming unnamed nodes in ``path`` first."""
    graph = _named(path).graph
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    feeds_weights: dict[str, bool] = {}
    for node in reversed(graph.node):  # topological order: consumers are decided before their producers
        feeds_weights[node.name] = any(c.op_type in WEIGHTED_OPS or feeds_weights.get(c.name, False)
                                       for out in node.output for c in consumers.get(out, ()))  # fmt: skip
    return [n.name for n in graph.node if n.op_type not in WEIGHTED_OPS and not feeds_weights[n.name]]


def _at_least_opset_13(model: ModelInfo, path: Path) -> Path:
    """The model itself from opset 13 on; else a copy converted to opset 13 by ONNX's version converter."""
    if model.opset >= 13:
        return model.path
    import onnx
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(onnx.load(str(model.path)), 13)
    except Exception as exc:
        raise BuildError(
            f"onnxruntime int8 needs opset >= 13 for per-channel weights; converting {model.name} "
            f"from opset {model.opset} failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}",
            fix="re-export the model at opset 13 or later, or use another engine's int8",
        ) from None
    onnx.save(converted, str(path))
    return path


def _calibration_batches(
    data: Mapping[str, np.ndarray], batch: int, model: ModelInfo
) -> Iterator[dict[str, np.ndarray]]:
    from autodeploy.data import feeds

    axes = {name: model.batch_axis(name) for name in data}
    n = len(next(iter(data.values())))
    for start in range(0, n, batch):
        yield feeds(data, start, batch, axes)
