"""PyTorch models in: a ``.pt2`` through ``autodeploy bench``, an ``nn.Module`` through ``autodeploy.tune``,
both exported with ``torch.onnx.export(dynamo=True)`` and judged against PyTorch's own outputs, so an
export that changes the outputs fails its fp32 verdict as a broken conversion (``autodeploy.pytorch``)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'autodeploy[torch]'")

import autodeploy  # noqa: E402
from autodeploy.errors import ModelError  # noqa: E402
from autodeploy.harness.timing import TimingPolicy  # noqa: E402
from autodeploy.pt2 import check as check_archive  # noqa: E402
from autodeploy.pytorch import failing_op, load_program  # noqa: E402
from autodeploy.results_db import Store, TrialFilter  # noqa: E402
from tests.cli_runner import run_cli  # noqa: E402

FAST = TimingPolicy(
    warmup_min_calls=2, warmup_max_s=0.2, min_samples=16, min_duration_s=0.05, max_duration_s=5
)
ONE_ROUND = {"finalists": {"count": 1, "rounds": 1, "min_samples": 16, "min_duration_s": 0.05}}


class Net(torch.nn.Module):
    """Conv + linear: what the exporter handles."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class Centred(Net):
    """Each item's output depends on the others in its batch (centred over the batch): exported from an
    example of batch 1, the batch axis is fixed to 1 (torch's 0/1 specialization) and every item comes
    out as zeros, where PyTorch returns the centred scores."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y - y.mean(0, keepdim=True)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTODEPLOY_DB", f"sqlite:///{tmp_path / 'r.db'}")
    return tmp_path, f"sqlite:///{tmp_path / 'r.db'}"


def _pt2(path, module=None):
    x = torch.randn(2, 3, 8, 8)
    program = torch.export.export(module or Net(), (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, str(path))
    return path


def test_bench_of_a_pt2_is_judged_against_pytorch(env, capsys):
    tmp_path, db = env
    code, out, err = run_cli(capsys, "bench", str(_pt2(tmp_path / "net.pt2")), "--threads", "1",
                             "--min-samples", "16", "--min-duration", "0.05")  # fmt: skip
    assert code == 0, err
    said = " ".join(out.split())
    assert "vs PyTorch (the .pt2's ExportedProgram)" in said and "pass" in said
    with Store.open(db) as store:
        trial = store.trial(TrialFilter(id=1))
    source = json.loads((Path(trial.artifact_path) / "artifact.json").read_text())["meta"][
        "source"
    ]  # shipped with it
    assert source["framework"] == "pytorch" and source["exporter"] == "torch.onnx.export(dynamo=True)"
    assert source["torch"] == torch.__version__ and source["reference"] == "program"


def test_tune_of_a_module_is_judged_against_its_own_outputs(env):
    tmp_path, db = env
    summary = autodeploy.tune(Net(), example_inputs=(torch.randn(2, 3, 8, 8),), config=ONE_ROUND,
                              engines=["onnxruntime"], precisions=["fp32"], threads=[1], trials=1,
                              min_samples=16, min_duration_s=0.05, db=db)  # fmt: skip
    assert summary.winner is not None and summary.trials["complete"] >= 1
    assert summary.reference == "PyTorch (the nn.Module, eager)"


def test_an_export_that_fixes_the_batch_to_1_fails_its_verdict_against_pytorch(env):
    tmp_path, db = env
    # the example has batch 1, so Dim.AUTO specializes the batch axis to 1; PyTorch runs 8 items a call
    stored = autodeploy.bench(
        Centred(), example_inputs=(torch.randn(1, 3, 8, 8),), threads=1, timing=FAST, db=db
    )
    assert stored.model.input("x").shape == (1, 3, 8, 8)  # the export fixed it
    assert stored.result.failure_kind == "conversion" and not stored.result.accuracy.passed
    assert "PyTorch" in stored.result.failure_message or stored.model.source["reference"] == "module"
    # a model whose items are independent loses nothing by the same fixed axis
    with pytest.warns(UserWarning, match="export takes a batch of 1 only, so no batch is searched") as said:
        fixed = autodeploy.bench(Net(), example_inputs=(torch.randn(1, 3, 8, 8),), threads=1, timing=FAST, db=db)
    assert fixed.ok and fixed.result.accuracy.passed, fixed.result.failure_message
    # Issue 52 item 4: the fixed batch is said (a warning and the model's notes), and the model takes its class's name
    assert any("give example_inputs with a batch of 2 or more" in str(w.message) for w in said)
    assert fixed.model.name == "Net" and any("batch of 1 only" in n for n in fixed.model.notes)
    assert {r.model_name for r in Store.open(db).trials(TrialFilter())} == {"Centred", "Net"}  # not module-<hash>


def test_an_op_without_onnx_translation_fails_in_one_line_naming_it(env):
    @torch.library.custom_op("autodeploy_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    class Custom(Net):
        def forward(self, x):
            return twice(super().forward(x))

    with pytest.raises(ModelError) as caught:
        autodeploy.bench(Custom(), example_inputs=(torch.randn(2, 3, 8, 8),), timing=FAST, db=env[1])
    message = str(caught.value)
    assert "\n" not in message and "autodeploy_test.twice" in message and "fix:" in message


def test_a_program_torch_exports_but_cannot_save_fails_in_one_line_and_leaves_no_staging_file(env):
    """Issue 52 items 1 and 15: a forward that rolls by ``round(self.shift.item() * bins)`` exports, and then
    ``torch.export.save`` raised a multi-line error out of autodeploy, leaving ``.module-PID.pt2`` in the cache."""

    class Roll(Net):
        def __init__(self) -> None:
            super().__init__()
            self.shift = torch.nn.Parameter(torch.tensor(0.25))

        def forward(self, x):
            return torch.roll(super().forward(x), round(self.shift.item() * 5), dims=-1)

    with pytest.raises(ModelError) as caught:
        autodeploy.bench(Roll(), example_inputs=(torch.randn(2, 3, 8, 8),), timing=FAST, db=env[1])
    message = str(caught.value)
    assert "\n" not in message and message.startswith("torch.export.save cannot serialize the exported program")
    assert "fix: compute Python numbers taken from tensors in forward" in message
    assert not list((env[0] / "cache").rglob(".module-*"))  # nothing staged is left behind


def test_torch_symbols_never_reach_a_shape_line(env, capsys):
    """Issue 52 item 7: a dim exported as ``batch`` read ``s77`` in every shape line (``--shape ... does not fit input
    'x' (s77x3x8x8)``): the exported ONNX names it ``batch``, and torch's other symbols ``INPUT_dimAXIS``."""
    import onnx

    tmp_path, _ = env
    code, out, err = run_cli(capsys, "bench", str(_pt2(tmp_path / "net.pt2")), "--shape", "x=1x3x9x9")
    assert code == 2 and "does not fit input 'x' (batchx3x8x8)" in err, err
    (exported,) = (tmp_path / "cache").rglob("model.onnx")
    dims = [d.dim_param for value in onnx.load(str(exported), load_external_data=False).graph.input
            for d in value.type.tensor_type.shape.dim if d.dim_param]  # fmt: skip
    assert dims == ["batch"]


def test_a_pt2_with_a_pickled_entry_is_refused_before_torch_reads_it(tmp_path):
    good = _pt2(tmp_path / "net.pt2")
    check_archive(good)  # a plain program passes
    bad = tmp_path / "bad.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name.endswith("model_weights_config.json"):
                config = json.loads(data)
                next(iter(config["config"].values()))["use_pickle"] = True
                data = json.dumps(config).encode()
            dst.writestr(name, data)
    check_archive(bad)  # every entry is one torch.export.save writes: the config says what is pickled
    with pytest.raises(ModelError, match="as a pickle"):
        load_program(bad)


def test_failing_op_reads_the_exporters_words():
    assert (
        failing_op("No ONNX function found for <OpOverload(op='aten.foo', overload='default')>") == "aten.foo"
    )
    assert failing_op("node %y = call_function[target=torch.ops.aten.bar.default](args") == "aten.bar"
    assert failing_op("nothing here") is None
