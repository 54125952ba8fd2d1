"""Security round 5: a ``.pt2`` is read by allowlist and never runs code (``autodeploy.pt2``).

Each hostile variant is built from a real ``torch.export.save`` archive, changed as an attacker would, and
carries a payload that would create a marker file if anything ran it: a pickle (``os.system``), a symbolic
size that ``sympy.sympify`` would ``eval``, a call target reaching ``os.system`` through ``torch``, a guard's
Python source. Each must be refused in one line (or, for the guards, dropped) and the marker never appear.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'autodeploy[torch]'")

from autodeploy import pt2  # noqa: E402
from autodeploy.child import capped, child_env, code_argv  # noqa: E402
from autodeploy.errors import ModelError  # noqa: E402
from autodeploy.pytorch import load_program  # noqa: E402


class Net(torch.nn.Module):
    """A parameter, a buffer and a tensor constant: every payload kind the format has."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 3)
        self.register_buffer("shift", torch.ones(3))
        self.scale = torch.tensor([1.0, 2.0, 3.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale + self.shift


@pytest.fixture
def good(tmp_path) -> Path:
    program = torch.export.export(Net(), (torch.randn(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    path = tmp_path / "net.pt2"
    torch.export.save(program, str(path))
    return path


def _pickle_running(command: str) -> bytes:
    """A protocol-0 pickle that runs ``command`` when loaded (written by hand: no pickle module here)."""
    return f"cos\nsystem\n(V{command}\ntR.".encode()


def _rewrite(src: Path, dst: Path, *, edit: Callable[[str, bytes], bytes | None] = lambda n, d: d,
             add: dict[str, bytes] | None = None, compression: int = zipfile.ZIP_STORED) -> Path:  # fmt: skip
    """``src`` copied entry by entry into ``dst``: ``edit(name, data)`` returns the new bytes (``None`` drops it),
    ``add`` names more entries (below the archive's root unless they start with ``/``)."""
    with zipfile.ZipFile(src) as a:
        root = a.namelist()[0].split("/")[0]
        with zipfile.ZipFile(dst, "w", compression=compression) as b:
            for name in a.namelist():
                data = edit(name, a.read(name))
                if data is not None:
                    b.writestr(name, data)
            for name, data in (add or {}).items():
                b.writestr(name[1:] if name.startswith("/") else f"{root}/{name}", data)
    return dst


def _edit_json(suffix: str, change: Callable[[dict], None]) -> Callable[[str, bytes], bytes]:
    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith(suffix):
            return data
        obj = json.loads(data)
        change(obj)
        return json.dumps(obj).encode()

    return edit


def _refused(path: Path, marker: Path, match: str) -> None:
    """Loading ``path`` is refused with one line matching ``match``, and nothing ran."""
    with pytest.raises(ModelError, match=match) as caught:
        load_program(path)
    assert "\n" not in str(caught.value)
    assert not marker.exists(), "the hostile payload ran"


def test_a_plain_program_loads_and_computes_what_the_module_does(good):
    program = load_program(good)
    x = torch.randn(5, 4)
    assert torch.allclose(program.module()(x), Net()(x))
    assert set(program.state_dict) == {"fc.weight", "fc.bias", "shift"} and set(program.constants) == {"scale"}


@pytest.mark.parametrize("entry", ["data/weights/model.pt", "data/constants/model.pt"])
def test_legacy_pickled_weights_are_refused_before_anything_reads_them(good, tmp_path, entry):
    marker = tmp_path / "ran"
    folder = entry.rsplit("/", 1)[0]
    config = "model_weights_config.json" if "weights" in folder else "model_constants_config.json"
    bad = _rewrite(good, tmp_path / "bad.pt2", add={entry: _pickle_running(f"touch {marker}")},
                   edit=lambda n, d: None if n.endswith(f"{folder}/{config}") else d)  # fmt: skip
    _refused(bad, marker, "does not write .*a pickle")


def test_the_pre_2_7_archive_is_refused_not_unpickled(good, tmp_path):
    """The old format: a root-level ``archive_format`` beside a pickled ``serialized_state_dict.pt``."""
    marker = tmp_path / "ran"
    with zipfile.ZipFile(good) as a:
        model_json = next(a.read(n) for n in a.namelist() if n.endswith("models/model.json"))
    bad = tmp_path / "old.pt2"
    with zipfile.ZipFile(bad, "w") as b:
        b.writestr("archive_format", "pt2")
        b.writestr("version", "8.20")
        b.writestr("serialized_exported_program.json", model_json)
        b.writestr("serialized_state_dict.pt", _pickle_running(f"touch {marker}"))
        b.writestr("serialized_constants.pt", _pickle_running(f"touch {marker}"))
        b.writestr("serialized_example_inputs.pt", _pickle_running(f"touch {marker}"))
    _refused(bad, marker, "not one folder|pre-2.7")


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ("data/aotinductor/model/model.so", "AOTInductor"),
        ("data/constants/custom_obj_0", "a pickle"),
        ("data/constants/opaque_obj_0", "a pickle"),
        ("extra/notes.txt", "not part of today's format"),
        ("data/weights/weight_0.pt", "a pickle"),
        ("/archive_format", "not one folder"),
    ],
)
def test_every_entry_torch_export_save_does_not_write_is_refused(good, tmp_path, entry, match):
    marker = tmp_path / "ran"
    bad = _rewrite(good, tmp_path / "bad.pt2", add={entry: _pickle_running(f"touch {marker}")})
    _refused(bad, marker, match)


def test_an_aotinductor_library_is_never_loaded(good, tmp_path):
    """A real shared library whose constructor would create the marker, where AOTInductor's loader looks."""
    marker = tmp_path / "ran"
    source = tmp_path / "evil.c"
    source.write_text(f'#include <stdlib.h>\n__attribute__((constructor)) static void run(void) {{ system("touch {marker}"); }}\n')
    library = tmp_path / "evil.so"
    if subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=False).returncode:
        pytest.skip("no C compiler to build the library")
    bad = _rewrite(good, tmp_path / "bad.pt2", add={"data/aotinductor/model/model.so": library.read_bytes(),
                                                     "data/aotinductor/model/model.cpp": b"// nothing"})  # fmt: skip
    _refused(bad, marker, "AOTInductor")


def test_a_weight_marked_use_pickle_is_refused(good, tmp_path):
    marker = tmp_path / "ran"

    def pickled(config: dict) -> None:
        meta = config["config"]["fc.weight"]
        meta["use_pickle"] = True

    bad = _rewrite(good, tmp_path / "bad.pt2", edit=lambda n, d: (
        _pickle_running(f"touch {marker}") if n.endswith("data/weights/weight_0")
        else _edit_json("model_weights_config.json", pickled)(n, d)))  # fmt: skip
    _refused(bad, marker, "as a pickle")


def test_a_symbolic_size_that_sympify_would_eval_is_refused(good, tmp_path):
    marker = tmp_path / "ran"
    payload = f"__import__('os').system('touch {marker}')"

    def plant(program: dict) -> None:
        text = json.dumps(program)
        assert '"expr_str"' in text  # the batch is symbolic: torch wrote its sizes as expressions
        program.update(json.loads(re.sub(r'"expr_str": "[^"]*"', json.dumps({"expr_str": payload})[1:-1], text)))

    bad = _rewrite(good, tmp_path / "bad.pt2", edit=_edit_json("models/model.json", plant))
    _refused(bad, marker, "symbolic size")


def test_a_call_target_outside_torchs_operators_is_refused(good, tmp_path):
    marker = tmp_path / "ran"

    def plant(program: dict) -> None:
        program["graph_module"]["graph"]["nodes"][0]["target"] = "torch.os.system"

    bad = _rewrite(good, tmp_path / "bad.pt2", edit=_edit_json("models/model.json", plant))
    _refused(bad, marker, "no operator")


def test_guards_code_is_dropped_not_compiled(good, tmp_path):
    marker = tmp_path / "ran"

    def plant(program: dict) -> None:
        program["guards_code"] = [f"__import__('os').system('touch {marker}') == 0"]

    bad = _rewrite(good, tmp_path / "bad.pt2", edit=_edit_json("models/model.json", plant))
    x = torch.randn(3, 4)
    assert torch.allclose(load_program(bad).module()(x), Net()(x))
    assert not marker.exists(), "the planted guard ran"


def test_a_zip_bomb_is_refused_by_its_declared_sizes(good, tmp_path):
    """One weight deflated from 256 MiB of zeros to a few hundred KiB: torch never compresses, so it is refused
    before a byte of it is inflated."""
    bad = _rewrite(good, tmp_path / "bomb.pt2", compression=zipfile.ZIP_DEFLATED,
                   edit=lambda n, d: bytes(256 * 2**20) if n.endswith("data/weights/weight_0") else d)  # fmt: skip
    assert bad.stat().st_size < 2 * 2**20
    with pytest.raises(ModelError, match="compressed"):
        pt2.check(bad)


def test_an_entry_twice_and_a_view_past_its_bytes_are_refused(good, tmp_path):
    with pytest.warns(UserWarning, match="Duplicate name"):  # zipfile writes it all the same
        twice = _rewrite(good, tmp_path / "twice.pt2", add={"data/weights/weight_1": b"\0" * 12})
    with pytest.raises(ModelError, match="twice"):
        pt2.check(twice)

    def reach(config: dict) -> None:
        config["config"]["fc.weight"]["tensor_meta"]["storage_offset"] = {"as_int": 10**6}

    past = _rewrite(good, tmp_path / "past.pt2", edit=_edit_json("model_weights_config.json", reach))
    with pytest.raises(ModelError, match="does not fit its bytes"):
        load_program(past)


def test_children_get_no_store_url_nor_secret(monkeypatch):
    monkeypatch.setenv("AUTODEPLOY_DB", "postgresql+psycopg://fleet:s3cret@db/fleet")
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "t0ken")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    seen = subprocess.run(code_argv("import os, json; print(json.dumps(dict(os.environ)))"), env=child_env(),
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    env = json.loads(seen)
    assert not {"AUTODEPLOY_DB", "PGPASSWORD", "MY_SERVICE_TOKEN"} & set(env)
    assert env["OMP_NUM_THREADS"] == "1" and "s3cret" not in seen


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS as Linux applies it")
def test_an_uncapped_child_is_capped():
    """The ``.pt2`` export child runs under :func:`capped`: past its cap an allocation fails in the child."""
    grab = "b = bytearray(600 * 2**20); print('got it')"
    done = subprocess.run(code_argv(grab), env=child_env(), preexec_fn=capped(400), capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert done.returncode != 0 and "MemoryError" in done.stderr and "got it" not in done.stdout


def test_bench_of_a_hostile_pt2_is_one_line_and_runs_nothing(good, tmp_path, monkeypatch, capsys):
    """Through the CLI, as the red team ran it: refused before any child starts, the store left empty."""
    from tests.cli_runner import run_cli

    marker = tmp_path / "ran"
    bad = _rewrite(good, tmp_path / "hostile.pt2", add={"data/weights/model.pt": _pickle_running(f"touch {marker}")})
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    code, out, err = run_cli(capsys, "bench", str(bad), "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert code == 2 and "Traceback" not in err and "which torch.export.save does not write" in err
    assert len([line for line in err.splitlines() if line.strip()]) <= 2  # the line and its fix
    assert not marker.exists() and not (tmp_path / "cache" / "pytorch").exists()


def test_a_planted_onnx_in_the_export_cache_is_exported_again(good, tmp_path):
    """The .pt2's ONNX is cached with a sealed record naming its SHA-256: an ONNX swapped in the cache (or a record
    naming another exporter) is not used, the file is exported again."""
    import onnx

    from autodeploy import pytorch

    onnx_path, source = pytorch.to_onnx(good, tmp_path / "cache")
    assert source["torch"] == torch.__version__ and source["exporter"] == pytorch.EXPORTER
    real = onnx_path.read_bytes()
    planted = onnx.helper.make_model(onnx.helper.make_graph([], "planted", [], []))
    onnx_path.write_bytes(planted.SerializeToString())
    record = onnx_path.with_name("export.json")
    record.write_text(record.read_text().replace(torch.__version__, "9.9.9-audited"))
    again, source = pytorch.to_onnx(good, tmp_path / "cache")
    assert again == onnx_path and again.read_bytes() == real and "audited" not in json.dumps(source)
