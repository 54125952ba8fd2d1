"""The memory planner: lifetimes, reuse, and the three totals."""

import onnx

from autodeploy.inhouse.memory import plan_memory


def _chain(n: int) -> onnx.ModelProto:
    nodes = "\n".join(f"t{i + 1} = Relu(t{i})" for i in range(n - 1))
    return onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[N,256] t0) => (float[N,256] t{n - 1}) {{
            {nodes}
        }}"""
    )


def test_chain_reuses_two_buffers():
    plan = plan_memory(_chain(6), {"N": 2})
    size = 2 * 256 * 4
    assert len(plan.tensors) == 5 and plan.no_reuse == 5 * size
    assert plan.lower_bound == 2 * size and plan.arena == 2 * size  # ping-pong between two buffers
    assert plan.dims == {"N": 2} and plan.saving == 0.6


def test_overlapping_lifetimes_never_share_bytes():
    model = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float[4,4] x) => (float[4,4] y) {
            a = Relu(x)
            b = Sigmoid(x)
            c = Add(a, b)
            d = Relu(c)
            y = Add(d, a)
        }"""
    )
    plan = plan_memory(model)
    by_name = {t.name: t for t in plan.tensors}
    assert by_name["a"].last == 4 and by_name["y"].last == 5  # a is read by the last node
    for s in plan.tensors:
        for t in plan.tensors:
            if s is not t and s.first <= t.last and t.first <= s.last:
                assert s.offset + s.nbytes <= t.offset or t.offset + t.nbytes <= s.offset
    assert plan.lower_bound <= plan.arena <= plan.no_reuse


def test_unknown_sizes_are_reported_not_guessed():
    model = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
        g (float[4] x) => (float[4] y) {
            z = custom.Mystery(x)
            y = Relu(z)
        }"""
    )
    plan = plan_memory(model)
    assert "z" in plan.unknown and plan.to_dict()["unknown_size"]


def test_estimate_grows_with_batch_and_prunes_what_cannot_fit(tmp_path):
    from autodeploy.inhouse.memory import cannot_fit, estimate
    from autodeploy.model import load_model

    path = tmp_path / "chain.onnx"
    onnx.save(_chain(6), str(path))
    one, eight = (estimate(onnx.load(str(path)), {"t0": (b, 256)}, b) for b in (1, 8))
    assert one.lower_bound == 2 * 256 * 4 and eight.lower_bound == 8 * one.lower_bound
    assert eight.predicted_mb > one.predicted_mb
    info = load_model(path)
    need = estimate(onnx.load(str(path)), {"t0": (4096, 256)}, 4096).floor_mb("fp32")  # 8 MB live
    assert cannot_fit(info, 4096, "fp32", None) is None
    assert cannot_fit(info, 4096, "fp32", need * 2) is None
    reason = cannot_fit(info, 4096, "fp32", need / 2)
    assert reason is not None and "--max-memory-mb" in reason and "batch 4096" in reason
    assert cannot_fit(info, 4096, "int8", need / 2) is None, (
        "int8 may need a quarter: never pruned on fp32 sizes"
    )
