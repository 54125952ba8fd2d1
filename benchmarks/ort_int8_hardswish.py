"""Why the in-house int8 leaves HardSwish in float on ONNX Runtime: the two ways to run it between
two QLinearConvs, measured on one u8 activation tensor.

* float: DequantizeLinear -> HardSigmoid -> Mul -> QuantizeLinear (what the ORT placement writes);
* lookup: Cast(u8 -> int32) -> Gather on a 256-entry u8 table, exact for a unary op on u8 (TVM and
  PyTorch run int8 HardSwish this way; ORT has such kernels only for Sigmoid and LeakyRelu).

Both give the same u8 output (checked); rounds interleaved, medians. Usage::

    python benchmarks/ort_int8_hardswish.py [--shape 1x32x56x56] [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from autodeploy.device import probe_device

S_X, Z_X, S_Y, Z_Y = 0.05, 128, 0.03, 10  # a typical Conv output range, and HardSwish's


def hardswish(x: np.ndarray) -> np.ndarray:
    return x * np.clip(x / 6 + 0.5, 0, 1)


def float_graph() -> tuple[list, list]:
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("HardSigmoid", ["xf"], ["gate"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["xf", "gate"], ["yf"]),
             helper.make_node("QuantizeLinear", ["yf", "sy", "zy"], ["y"])]  # fmt: skip
    scalars = {"sx": np.float32(S_X), "zx": np.uint8(Z_X), "sy": np.float32(S_Y), "zy": np.uint8(Z_Y)}
    return nodes, [numpy_helper.from_array(np.array(v), k) for k, v in scalars.items()]


def lookup_graph() -> tuple[list, list]:
    q = np.arange(256, dtype=np.float32)
    table = np.clip(np.round(hardswish(S_X * (q - Z_X)) / S_Y) + Z_Y, 0, 255).astype(np.uint8)
    nodes = [helper.make_node("Cast", ["x"], ["index"], to=TensorProto.INT32),
             helper.make_node("Gather", ["table", "index"], ["y"], axis=0)]  # fmt: skip
    return nodes, [numpy_helper.from_array(table, "table")]


def session(nodes: list, inits: list, shape: list[int], threads: int) -> ort.InferenceSession:
    io = [helper.make_tensor_value_info(n, TensorProto.UINT8, shape) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph(nodes, "hardswish", io[:1], io[1:], inits),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # fmt: skip
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def median_ms(s: ort.InferenceSession, x: np.ndarray, calls: int = 300) -> float:
    for _ in range(20):
        s.run(None, {"x": x})
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        s.run(None, {"x": x})
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1x32x56x56")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(probe_device().cpu_line())
    shape = [int(d) for d in args.shape.split("x")]
    x = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    sessions = {"float (DQ, HardSigmoid, Mul, Q)": session(*float_graph(), shape, args.threads),
                "lookup (Cast, Gather on a u8 table)": session(*lookup_graph(), shape, args.threads)}  # fmt: skip
    outputs = [s.run(None, {"x": x})[0] for s in sessions.values()]
    steps = int(np.abs(outputs[0].astype(int) - outputs[1].astype(int)).max())
    rounds: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(args.rounds):
        for name, s in sessions.items():
            rounds[name].append(median_ms(s, x))
    base = statistics.median(rounds[next(iter(sessions))])
    print(
        f"onnxruntime {ort.__version__}, u8 tensor {args.shape}, {args.threads} thread(s), {args.rounds} interleaved rounds"
    )
    for name, values in rounds.items():
        ms = statistics.median(values)
        print(f"{name:<38} {ms:7.3f} ms  x float {base / ms:5.2f}")
    print(f"largest difference between the two outputs: {steps} quantization step(s)")


if __name__ == "__main__":
    main()
