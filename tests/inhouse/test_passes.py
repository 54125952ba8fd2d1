"""Each pass on small ONNX text graphs: how many rewrites, same outputs, ``onnx.checker`` passes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from autodeploy.errors import UsageError
from autodeploy.inhouse.passes import DEFAULT_PIPELINE, PASSES, optimize

RNG = np.random.default_rng(0)


def _model(text: str, **initializers: np.ndarray) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in initializers.items())
    onnx.checker.check_model(model)
    return model


def _outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    if any(n.domain == "com.microsoft" for n in model.graph.node):
        import onnxruntime as ort

        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds
        )
    return ReferenceEvaluator(model).run(None, feeds)


def _check(model, passes, feeds, *, rewrites, target="onnx", ops=None, atol=1e-5):
    """Run ``passes``; assert the first pass's rewrite count, the checker, the interface, equal outputs."""
    out, report = optimize(model, passes, target=target)
    assert report.passes[0].rewrites == rewrites, report
    assert not report.rolled_back, report.rolled_back
    onnx.checker.check_model(out)
    assert [i.name for i in out.graph.input] == [i.name for i in model.graph.input]
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    for got, want in zip(_outputs(out, feeds), _outputs(model, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)
    if ops is not None:
        assert [n.op_type for n in out.graph.node] == ops
    return out, report


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def test_fold_constants_evaluates_constant_subgraphs():
    model = _model(
        f"""{HEADER}
        g (float[2,3] x) => (float[2,3] y) {{
            two = Constant<value = float[1] {{2.0}}>()
            three = Constant<value = float[1] {{3.0}}>()
            s = Add(two, three)
            y = Mul(x, s)
        }}"""
    )
    out, _ = _check(model, ["fold-constants"], {"x": _x(2, 3)}, rewrites=3, ops=["Mul"])


def test_identity_and_dropout_removed_but_interface_kept():
    model = _model(
        f"""{HEADER}
        g (float[2,3] x) => (float[2,3] y, float[2,3] z) {{
            a = Relu(x)
            b = Identity(a)
            c = Dropout(b)
            y = Identity(c)
            z = Identity(x)
        }}"""
    )
    # z = Identity(x) would rename the graph input: refused with that reason.
    out, report = _check(model, ["remove-identity"], {"x": _x(2, 3)}, rewrites=3, ops=["Relu", "Identity"])
    assert any("graph input" in reason for reason in report.passes[0].refused)


def test_training_dropout_is_kept():
    model = _model(
        f"""{HEADER}
        g (float[2,3] x, bool t) => (float[2,3] y) {{
            a = Relu(x)
            r = Constant<value = float {{0.5}}>()
            b = Dropout(a, r, t)
            y = Relu(b)
        }}"""
    )
    out, report = optimize(model, ["remove-identity"])
    assert out is model and "training_mode is not a constant false" in str(report.passes[0].refused)


def test_conv_batchnorm_fold():
    model = _model(
        f"""{HEADER}
        g (float[1,3,8,8] x) => (float[1,4,8,8] y) {{
            c = Conv<pads = [1,1,1,1]>(x, w, b)
            y = BatchNormalization<epsilon = 0.001>(c, gamma, beta, mean, var)
        }}""",
        w=_x(4, 3, 3, 3),
        b=_x(4),
        gamma=_x(4),
        beta=_x(4),
        mean=_x(4),
        var=np.abs(_x(4)) + 0.1,
    )
    _check(model, ["fold-batchnorm", "eliminate-dead"], {"x": _x(1, 3, 8, 8)}, rewrites=1, ops=["Conv"])


def test_matmul_add_to_gemm_only_for_2d():
    model = _model(
        f"""{HEADER}
        g (float[5,4] x, float[2,5,4] x3) => (float[5,6] y, float[2,5,6] y3) {{
            m = MatMul(x, w)
            y = Add(bias, m)
            m3 = MatMul(x3, w)
            y3 = Add(m3, bias)
        }}""",
        w=_x(4, 6),
        bias=_x(6),
    )
    out, report = _check(model, ["matmul-add-to-gemm"], {"x": _x(5, 4), "x3": _x(2, 5, 4)}, rewrites=1)
    assert [n.op_type for n in out.graph.node].count("Gemm") == 1
    assert "Gemm is 2-D only" in str(report.passes[0].refused)


LAYERNORM = """
        g (float[2,5,8] x) => (float[2,5,8] y) {{
            mean = ReduceMean{axes}(x{axes_input})
            d = Sub(x, mean)
            two = Constant<value = float {{2.0}}>()
            sq = Pow(d, two)
            var = ReduceMean{axes}(sq{axes_input})
            eps = Constant<value = float {{1e-5}}>()
            ve = Add(var, eps)
            std = Sqrt(ve)
            n = Div(d, std)
            s = Mul(n, gamma)
            y = Add(s, beta)
        }}"""


@pytest.mark.parametrize("opset", [17, 18])
def test_layernorm_fusion(opset):
    attr, inp = ("<axes = [-1]>", "") if opset == 17 else ("", ", axes")
    text = f'<ir_version: 8, opset_import: ["" : {opset}]>' + LAYERNORM.format(axes=attr, axes_input=inp)
    extra = {"axes": np.array([-1], np.int64)} if opset == 18 else {}
    model = _model(text, gamma=_x(8), beta=_x(8), **extra)
    _check(model, ["fuse-layernorm", "eliminate-dead"], {"x": _x(2, 5, 8)}, rewrites=2,
           ops=["LayerNormalization"])  # fmt: skip


def test_layernorm_needs_opset_17():
    text = '<ir_version: 7, opset_import: ["" : 13]>' + LAYERNORM.format(axes="<axes = [-1]>", axes_input="")
    model = _model(text, gamma=_x(8), beta=_x(8))
    out, report = optimize(model, ["fuse-layernorm"])
    assert out is model and "needs opset 17" in str(report.passes[0].refused)


GELU = """
    g (float[4,8] x) => (float[4,8] y) {{
        c = Constant<value = float {{1.4142135}}>()
        xc = Div(x, c)
        e = Erf(xc)
        one = Constant<value = float {{1.0}}>()
        half = Constant<value = float {{0.5}}>()
        {body}
    }}"""


@pytest.mark.parametrize(
    "body",
    [
        "p = Add(e, one)\n q = Mul(x, p)\n y = Mul(q, half)",
        "p = Add(one, e)\n q = Mul(half, x)\n y = Mul(q, p)",
        "p = Add(e, one)\n q = Mul(p, half)\n y = Mul(x, q)",
    ],
)
def test_gelu_fusion_opset_20(body):
    model = _model('<ir_version: 9, opset_import: ["" : 20]>' + GELU.format(body=body))
    _check(model, ["fuse-gelu", "eliminate-dead"], {"x": _x(4, 8)}, rewrites=1, ops=["Gelu"])


def test_gelu_before_opset_20_uses_ort_contrib_op_or_refuses():
    model = _model(HEADER + GELU.format(body="p = Add(e, one)\n q = Mul(x, p)\n y = Mul(q, half)"))
    out, report = optimize(model, ["fuse-gelu"], target="onnx")
    assert out is model and "standard Gelu needs opset 20" in str(report.passes[0].refused)
    out, _ = _check(model, ["fuse-gelu", "eliminate-dead"], {"x": _x(4, 8)}, rewrites=1, target="onnxruntime")
    assert [(n.domain, n.op_type) for n in out.graph.node] == [("com.microsoft", "Gelu")]


def test_activation_fusion_only_for_onnxruntime_target():
    model = _model(
        f"""{HEADER}
        g (float[1,3,8,8] x, float[2,5] a) => (float[1,4,8,8] y, float[2,6] z, float[1,4,8,8] y6) {{
            c = Conv<pads = [1,1,1,1]>(x, w, b)
            y = Relu(c)
            c6 = Conv<pads = [1,1,1,1]>(x, w, b)
            lo = Constant<value = float {{0.0}}>()
            hi = Constant<value = float {{6.0}}>()
            y6 = Clip(c6, lo, hi)
            m = Gemm(a, wg, bg)
            z = Relu(m)
        }}""",
        w=_x(4, 3, 3, 3),
        b=_x(4),
        wg=_x(5, 6),
        bg=_x(6),
    )
    feeds = {"x": _x(1, 3, 8, 8), "a": _x(2, 5)}
    out, report = optimize(model, ["fuse-activation"], target="onnx")
    assert out is model and "FusedConv is an ONNX Runtime contrib op" in str(report.passes[0].refused)
    out, _ = _check(model, ["fuse-activation"], feeds, rewrites=3, target="onnxruntime")
    assert sorted(n.op_type for n in out.graph.node if n.op_type != "Constant") == [
        "FusedConv",
        "FusedConv",
        "FusedGemm",
    ]


def test_eliminate_dead_drops_unused_nodes():
    model = _model(
        f"""{HEADER}
        g (float[2,3] x) => (float[2,3] y) {{
            unused = Sigmoid(x)
            y = Relu(x)
        }}"""
    )
    _check(model, ["eliminate-dead"], {"x": _x(2, 3)}, rewrites=1, ops=["Relu"])


def test_default_pipeline_is_explicit_and_every_pass_is_known():
    from autodeploy.inhouse.passes import LEFT_OUT

    assert set(DEFAULT_PIPELINE) <= set(PASSES) and DEFAULT_PIPELINE[0] == "fold-constants"
    assert set(LEFT_OUT) <= set(PASSES) and not set(LEFT_OUT) & set(DEFAULT_PIPELINE)
    assert set(PASSES) == set(DEFAULT_PIPELINE) | set(LEFT_OUT), (
        "every pass is in the pipeline or says why not"
    )
    with pytest.raises(UsageError, match="unknown pass"):
        optimize(onnx.ModelProto(), ["no-such-pass"])


def test_unchanged_model_comes_back_as_is():
    model = _model(f"{HEADER}\ng (float[2,3] x) => (float[2,3] y) {{ y = Relu(x) }}")
    out, report = optimize(model)
    assert out is model and not report.changed and report.nodes_before == report.nodes_after == 1


def test_a_failing_pass_is_rolled_back_with_its_reason(monkeypatch):
    from autodeploy.inhouse import passes

    def broken(model, target):
        model.graph.outputs.clear()  # would break the interface
        return {"broken": 1}, {}

    monkeypatch.setitem(passes.PASSES, "broken", passes.GraphPass("broken", "test", broken))
    model = _model(f"{HEADER}\ng (float[2,3] x) => (float[2,3] y) {{ y = Relu(x) }}")
    out, report = optimize(model, ["broken"])
    assert out is model and "number of graph inputs or outputs" in report.passes[0].rolled_back


def test_two_convs_sharing_a_weight_each_get_their_own_folded_weights():
    model = _model(
        f"""{HEADER}
        g (float[1,3,8,8] x) => (float[1,4,8,8] y, float[1,4,8,8] z) {{
            c1 = Conv<pads = [1,1,1,1]>(x, w, b)
            y = BatchNormalization(c1, gamma, beta, mean, var)
            c2 = Conv<pads = [1,1,1,1]>(x, w, b)
            z = BatchNormalization(c2, gamma2, beta, mean, var)
        }}""",
        w=_x(4, 3, 3, 3),
        b=_x(4),
        gamma=_x(4),
        gamma2=_x(4),
        beta=_x(4),
        mean=_x(4),
        var=np.abs(_x(4)) + 0.1,
    )
    _check(model, ["fold-batchnorm"], {"x": _x(1, 3, 8, 8)}, rewrites=2)


def test_fold_affine_folds_paddle_bias_and_scale_into_the_conv():
    model = _model(
        f"""{HEADER}
        g (float[1,3,8,8] x) => (float[1,4,8,8] y) {{
            c = Conv<pads = [1,1,1,1]>(x, w)
            b = Add(c, bias)
            s = Mul(k, b)
            y = Add(s, shift)
        }}""",
        w=_x(4, 3, 3, 3),
        bias=_x(1, 4, 1, 1),
        k=np.array(1.7, np.float32),
        shift=np.array(-0.3, np.float32),
    )
    _check(model, ["fold-affine", "eliminate-dead"], {"x": _x(1, 3, 8, 8)}, rewrites=3, ops=["Conv"])


def test_fold_affine_refuses_a_conv_output_with_other_users():
    model = _model(
        f"""{HEADER}
        g (float[1,3,8,8] x) => (float[1,4,8,8] y, float[1,4,8,8] c) {{
            c = Conv<pads = [1,1,1,1]>(x, w)
            y = Add(c, bias)
        }}""",
        w=_x(4, 3, 3, 3),
        bias=_x(1, 4, 1, 1),
    )
    _check(model, ["fold-affine"], {"x": _x(1, 3, 8, 8)}, rewrites=0)  # c is read by the Add and the output
