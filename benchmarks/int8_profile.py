"""Where int8 time goes on OpenVINO: the CPU plugin's own per-layer counters (``PERF_COUNT``,
``InferRequest.get_profiling_info()``) for NNCF's int8, the in-house int8 (OpenVINO runtime) and bf16.

Each artifact is built by its engine exactly as a study builds it (``Engine.build``, the zoo model's own
calibration split, or a corpus model's calibration crops), compiled at batch 1 with ``PERF_COUNT`` on, and
run ``--iters`` times round-robin; the counters of every run are summed. Printed per config: the total, the
share of each (layer type, kernel) pair, the layers that run outside an int8 kernel, and the Reorder and
FakeQuantize layers the plugin kept; then the convolutions whose time differs most between two configs,
matched by their ONNX name (both the NNCF IR and the in-house QDQ model keep it). Shares within one run are
what to read on a busy machine; the absolute times move with the load.

Usage::

    python benchmarks/int8_profile.py --model zoo:resnet50 [--threads 2] [--iters 30]
    python benchmarks/int8_profile.py --model nudenet --configs nncf,inhouse,inhouse-search,bf16
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autodeploy.adapters import registry  # noqa: E402
from autodeploy.adapters.base import TrialConfig  # noqa: E402
from autodeploy.device import probe_device  # noqa: E402
from autodeploy.model import load_model  # noqa: E402

#: label -> (engine, precision, knobs)
CONFIGS = {
    "nncf": ("openvino", "int8", {}),
    "nncf-search": ("openvino", "int8", {"float_layers": "search"}),
    "inhouse": ("inhouse", "int8", {"runtime": "openvino"}),
    "inhouse-all-int8": ("inhouse", "int8", {"runtime": "openvino", "fallback": False}),
    "inhouse-search": ("inhouse", "int8", {"runtime": "openvino", "calibration": "minmax"}),
    "inhouse-symmetric": ("inhouse", "int8", {"runtime": "openvino", "fallback": False, "activation_symmetric": True}),
    "bf16": ("openvino", "bf16", {}),
    "fp32": ("openvino", "fp32", {}),
}
#: Kernel names of the CPU plugin that compute in int8 (oneDNN's ``..._I8``/``..._int8`` implementations).
INT8_KERNEL = ("I8", "i8", "int8", "U8", "u8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:resnet50", help="zoo:NAME or a corpus model name (nudenet)")
    parser.add_argument("--configs", default="nncf,inhouse,inhouse-all-int8,bf16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--items", type=int, default=32, help="calibration items")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    device = probe_device()
    print(device.cpu_line())
    info, calibration, feeds = _model(args.model, args.items, args.workdir)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="autodeploy-int8-profile-"))
    compiled = {}
    for label in args.configs.split(","):
        engine_name, precision, knobs = CONFIGS[label]
        engine = registry.get(engine_name)
        config = TrialConfig(engine_name, precision, batch=1, threads=args.threads, knobs=knobs)
        artifact = engine.build(info, config, calibration, workdir / "artifacts", target=device)
        settings = engine.runtime_settings(artifact, config, info)
        compiled[label] = _compile(artifact.path / settings["model_file"], settings, feeds)
        kept = artifact.meta.get("kept_float")
        print(f"{label}: {engine_name} {precision} {knobs} built; float layers: {kept if kept is not None else '-'}")
    for request, _ in compiled.values():
        for _ in range(3):
            request.infer(feeds)
    runs: dict[str, dict[str, list[float]]] = {label: defaultdict(list) for label in compiled}
    kinds: dict[str, dict[str, tuple[str, str]]] = {label: {} for label in compiled}
    for _ in range(args.iters):
        for label, (request, _) in compiled.items():
            request.infer(feeds)
            for p in request.get_profiling_info():
                if p.status.name == "EXECUTED":
                    runs[label][p.node_name].append(p.real_time.total_seconds() * 1e3)
                    kinds[label][p.node_name] = (p.node_type, p.exec_type)
    # each layer's median over the runs: a neighbour's burst moves the mean of a layer, rarely its median
    sums = {label: {node: float(np.median(t)) for node, t in by_node.items()} for label, by_node in runs.items()}
    macs = _macs_by_node(info.path, feeds)
    for label in compiled:
        _report(label, sums[label], kinds[label])
        _intensity(label, sums[label], kinds[label], macs)
    labels = list(compiled)
    for a, b in zip(labels, labels[1:], strict=False):
        _compare(a, b, sums, kinds)


def _model(name: str, items: int, workdir: Path | None):
    """The model, its calibration items and one evaluation item as feeds."""
    if name.startswith("zoo:"):
        from autodeploy import zoo

        data = zoo.dataset(name[4:])
        info = load_model(zoo.get(name[4:]))
        calibration = {k: v[:items] for k, v in data["calibration"].items()}
        feeds = {k: v[:1] for k, v in data["inputs"].items()}
        return info, calibration, feeds
    from sklearn.datasets import load_sample_images
    from tests.realmodels.corpus import MODELS

    real = next(m for m in MODELS if m.name == name)
    path = real.extract(workdir or Path(tempfile.mkdtemp(prefix="autodeploy-int8-profile-model-")))
    if isinstance(path, str):
        raise SystemExit(f"{name}: {path}")
    info = load_model(path, real.shapes, name=real.name)
    arrays = real.make(list(load_sample_images().images), items + 1)
    return info, {k: v[:items] for k, v in arrays.items()}, {k: v[items:] for k, v in arrays.items()}


def _compile(path: Path, settings: dict, feeds: dict):
    from autodeploy.runtime import openvino as ov_runtime

    model = ov_runtime.read(path)
    properties = {**settings["properties"], "PERF_COUNT": True}
    net = ov_runtime.compile_at(model, {k: v.shape for k, v in feeds.items()}, properties)
    return net.create_infer_request(), net


def _report(label: str, times: dict[str, float], kinds: dict[str, tuple[str, str]]) -> dict:
    total = sum(times.values())
    by_kind: dict[tuple[str, str], float] = defaultdict(float)
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for node, ms in times.items():
        by_kind[kinds[node]] += ms
        counts[kinds[node]] += 1
    print(f"\n== {label}: {total:.2f} ms per inference in executed layers ({len(times)} layers; each layer's median)")
    for (node_type, exec_type), ms in sorted(by_kind.items(), key=lambda kv: -kv[1])[:14]:
        print(f"  {100 * ms / total:5.1f}%  {ms:7.3f} ms  {counts[(node_type, exec_type)]:4d} x {node_type:18} {exec_type}")
    convs = {n: ms for n, ms in times.items() if kinds[n][0] in ("Convolution", "FullyConnected", "MatMul")}
    slow = {n: ms for n, ms in convs.items() if not any(k in kinds[n][1] for k in INT8_KERNEL)}
    if slow:
        share = 100 * sum(slow.values()) / total
        print(f"  convolutions outside an int8 kernel: {len(slow)} of {len(convs)}, {share:.1f}% of the time: "
              + ", ".join(f"{n} ({kinds[n][1]}, {ms:.3f} ms)" for n, ms in sorted(slow.items(), key=lambda kv: -kv[1])[:6]))
    for node_type in ("Reorder", "FakeQuantize", "Subgraph", "Eltwise"):
        chosen = {n: ms for n, ms in times.items() if kinds[n][0] == node_type}
        if chosen:
            print(f"  {node_type}: {len(chosen)} layers, {100 * sum(chosen.values()) / total:.1f}% "
                  + "(" + ", ".join(f"{n} {ms:.3f}" for n, ms in sorted(chosen.items(), key=lambda kv: -kv[1])[:4]) + ")")
    return {"total": total, "by_kind": dict(by_kind)}


def _macs_by_node(path: Path, feeds: dict) -> dict[str, tuple[int, int]]:
    """ONNX Conv name -> (multiply-adds at ``feeds``' shapes, input channels per group)."""
    import onnx

    from autodeploy.inhouse.quantize import qdq

    try:
        from autodeploy.inhouse.quantize.evidence import static_shapes
    except ImportError:  # an autodeploy from before issue 41 (PYTHONPATH=OLD/src): no GOP/s lines
        return {}

    model = qdq.name_nodes(onnx.load(str(path)))
    shapes = static_shapes(model, feeds)
    consts = qdq.constants(model.graph)
    out = {}
    for node in model.graph.node:
        if node.op_type != "Conv" or node.input[1] not in consts or not shapes.get(node.output[0]):
            continue
        w = consts[node.input[1]].shape
        out[node.name] = (int(np.prod(shapes[node.output[0]])) * int(np.prod(w[1:])), int(w[1]))
    return out


def _intensity(label: str, times: dict[str, float], kinds: dict, macs: dict[str, tuple[int, int]]) -> None:
    """Achieved GOP/s (2 ops a multiply-add) of the convolutions, by their input channels per group: small
    channel counts leave an int8 kernel's VNNI lanes (4 channels a lane, 16 lanes) and its caches half used."""
    buckets: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for node, ms in times.items():
        found = macs.get(node.removesuffix("/WithoutBiases"))
        if found is None or kinds[node][0] != "Convolution" or ms <= 0:
            continue
        mac, cin = found
        key = "<=16" if cin <= 16 else "<=32" if cin <= 32 else "<=64" if cin <= 64 else "<=128" if cin <= 128 else ">128"
        buckets[key][0] += mac
        buckets[key][1] += ms
    if not buckets:
        return
    total_mac, total_ms = sum(b[0] for b in buckets.values()), sum(b[1] for b in buckets.values())
    parts = [f"C_in {k}: {2 * b[0] / b[1] / 1e6:.0f} GOP/s on {100 * b[1] / total_ms:.0f}% of conv time"
             for k, b in sorted(buckets.items(), key=lambda kv: kv[0])]
    print(f"  convolutions: {2 * total_mac / total_ms / 1e6:.0f} GOP/s over {2 * total_mac / 1e9:.2f} GOP; " + "; ".join(parts))


def _compare(a: str, b: str, sums: dict, kinds: dict) -> None:
    """Convolutions matched by their ONNX name (a fused layer carries its first op's name): the largest gaps."""

    def convs(label: str) -> dict[str, tuple[float, str]]:
        out = {}
        for node, ms in sums[label].items():  # in execution order
            if kinds[label][node][0] in ("Convolution", "FullyConnected", "FullyConnectedQuantizedLegacy", "MatMul"):
                out[node.removesuffix("/WithoutBiases")] = (ms, kinds[label][node][1])
        return out

    left, right = convs(a), convs(b)
    if not set(left) & set(right) and len(left) == len(right):  # named apart (an IR of an unnamed ONNX): by order
        left = {f"#{i} {n}": v for i, (n, v) in enumerate(left.items())}
        right = {f"#{i} {n}": v for i, (n, v) in enumerate(right.items())}
        pairs = dict(zip(left, right, strict=True))
        right = {k: right[pairs[k]] for k in left}
    common = sorted(set(left) & set(right), key=lambda n: -abs(left[n][0] - right[n][0]))
    gap = sum(right[n][0] - left[n][0] for n in common)
    print(f"\n== {b} vs {a}: {len(common)} convolutions matched by name, {b} {gap:+.3f} ms on them in total")
    for n in common[:10]:
        print(f"  {n:45} {a} {left[n][0]:.3f} ms ({left[n][1]})  {b} {right[n][0]:.3f} ms ({right[n][1]})")
    others = {k: sum(ms for node, ms in sums[label].items() if kinds[label][node][0] not in
                     ("Convolution", "FullyConnected", "FullyConnectedQuantizedLegacy", "MatMul"))
              for k, label in (("a", a), ("b", b))}  # fmt: skip
    print(f"  everything else: {a} {others['a']:.3f} ms, {b} {others['b']:.3f} ms")
    print(f"  convolutions in total: {a} {sum(v[0] for v in left.values()):.3f} ms, {b} {sum(v[0] for v in right.values()):.3f} ms")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
