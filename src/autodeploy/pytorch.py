"""PyTorch models as users have them: a ``.pt2`` file (``torch.export.save``) or an ``nn.Module`` with
its example inputs, exported to ONNX here and judged against PyTorch's own outputs.

The export is ``torch.onnx.export(program, dynamo=True)``; the ONNX it writes is the model every engine
builds from (and a bundle ships), cached by the ``.pt2``'s SHA-256 and the torch version. Its
:data:`ModelInfo.source <autodeploy.model.ModelInfo.source>` records the exporter and its version, and
makes PyTorch the accuracy reference (:func:`autodeploy.harness.run.reference`), so an export that
changes the model's outputs fails its fp32 verdict as a broken conversion:

- a ``.pt2``: its ``ExportedProgram`` runs the evaluation inputs in the reference worker;
- an ``nn.Module``: the module itself runs them, eagerly, in the caller's process, where it lives
  (it cannot reach a worker without pickle), before any trial
  (:func:`autodeploy.harness.torch_reference.write_module_reference`).

Trust: ``torch.export.load`` is code on untrusted bytes (pickles, AOTInductor libraries, ``eval`` of the
graph's symbolic sizes, guards compiled from source), as PyTorch's documentation warns. It is never called:
:mod:`autodeploy.pt2` reads the archive by allowlist and builds the program from its raw payloads. The file is
only ever read in a child process (the export child, the reference worker), each under a memory cap and a time
limit, with an environment that holds no results-database URL or secret (:func:`autodeploy.child.child_env`).

torch is imported inside the functions that need it: ``import autodeploy`` never imports it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy import sealed
from autodeploy.child import ChildFailed, child_main, default_memory_cap_mb, run_module
from autodeploy.converters import ONNX_FILE, Converter
from autodeploy.errors import ModelError, UsageError
from autodeploy.errors import one_line as errors_one_line
from autodeploy.runtime import machine

if TYPE_CHECKING:
    from autodeploy.model import ModelInfo

SUFFIX = ".pt2"
EXPORTER = "torch.onnx.export(dynamo=True)"
INSTALL = "pip install 'autodeploy[torch]'"
#: The ONNX export of a large model takes a while; a hostile file may hang the loader.
EXPORT_TIMEOUT_S = 900.0
#: How accuracy is named where the reference is PyTorch (``source["reference"]``).
REFERENCE_NAMES = {
    "module": "PyTorch (the nn.Module, eager)",
    "program": "PyTorch (the .pt2's ExportedProgram)",
}


def is_pt2(ref: object) -> bool:
    """True for a path ending in ``.pt2``."""
    return isinstance(ref, str | os.PathLike) and str(ref).lower().endswith(SUFFIX)


def is_module(model: object) -> bool:
    """True for a ``torch.nn.Module`` (checked without importing torch: a module is only ever passed in)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def reference_name(source: Mapping[str, Any]) -> str:
    """What accuracy is judged against for a model with this ``source``: ``PyTorch (...)``."""
    return REFERENCE_NAMES.get(str(source.get("reference")), "PyTorch")


def torch_version() -> str:
    """The installed torch's version, read without importing it.

    Raises:
        ModelError: torch is not installed.
    """
    found = machine.version("torch")
    if found is None:
        raise ModelError("a PyTorch model needs PyTorch, which is not installed", fix=INSTALL)
    return found


def _sha256(path: Path) -> str:
    """Raises: ModelError: the file cannot be read."""
    digest = sealed.file_sha256(path)
    if digest is None:
        raise ModelError(f"cannot read {path}", fix="check the file exists and is readable")
    return digest


def _installed() -> dict[str, Any]:
    """What the cache record of an export is bound to besides the file: the installed torch and onnxscript (read
    from the packages, never from a record: :mod:`autodeploy.sealed`)."""
    return {"torch": torch_version(), "onnxscript": machine.version("onnxscript")}


#: The route's row: the ONNX of one ``.pt2`` goes in ``pytorch/`` of the cache, per file content and torch version
#: (another exporter, another ONNX), beside its sealed record (:mod:`autodeploy.converters`).
TORCH = Converter("pytorch", "torch", ("exporter", EXPORTER), "export.json", _installed, under="pytorch")


# -- intake: .pt2 -> ONNX ----------------------------------------------------------------------


def to_onnx(pt2: Path, cache: Path) -> tuple[Path, dict[str, Any]]:
    """The ONNX of ``pt2`` (exported in a child process on first use, then cached) and its source record:
    ``{"framework", "file", "sha256", "exporter", "torch", "onnxscript", "reference"}``.

    Raises:
        ModelError: torch is missing, the file is no loadable ``.pt2``, holds pickles, or an op has no
            ONNX translation (one line naming it).
    """
    pt2 = Path(pt2).resolve()
    if not pt2.is_file():
        raise ModelError(
            f"model file not found: {pt2}", fix="save the model with torch.export.save(program, PATH)"
        )
    from autodeploy import pt2 as archive

    archive.check(pt2).close()  # refused here, before any child starts, by its entries alone (no torch)
    bound = TORCH.bound(_sha256(pt2))
    folder = TORCH.folder(cache, bound)
    if not TORCH.cached(folder, bound):
        folder.mkdir(parents=True, exist_ok=True)
        _export_in_child(pt2, folder)
        TORCH.seal(folder, bound)
    return folder / ONNX_FILE, TORCH.source(bound, str(pt2), reference="program")


def _export_in_child(pt2: Path, folder: Path) -> None:
    cap_mb = default_memory_cap_mb()
    try:
        run_module(__name__, str(pt2), str(folder), timeout_s=EXPORT_TIMEOUT_S, memory_cap_mb=cap_mb)
    except ChildFailed as failed:
        if failed.timed_out:
            raise ModelError(f"exporting {pt2} to ONNX took over {EXPORT_TIMEOUT_S:g} s; it was stopped",
                             fix="export it yourself with torch.onnx.export(program, dynamo=True) and pass the .onnx") from None  # fmt: skip
        if failed.reported:  # our own one line
            raise ModelError(failed.reason) from None
        if any("MemoryError" in line or "bad_alloc" in line for line in failed.said[-5:]):
            raise ModelError(f"exporting {pt2} to ONNX needed more than the memory cap ({cap_mb:,} MB); it was stopped",
                             fix="export it yourself with torch.onnx.export(program, dynamo=True) on a larger machine") from None  # fmt: skip
        raise ModelError(f"exporting {pt2} to ONNX failed: {errors_one_line(failed.reason)}",
                         fix="check the file was written by torch.export.save, or export the ONNX yourself") from None  # fmt: skip


def load_program(pt2: Path) -> Any:
    """The ``ExportedProgram`` of a ``.pt2``, read by allowlist (:func:`autodeploy.pt2.load`; only in a child
    process: the export child, the reference worker)."""
    from autodeploy import pt2 as archive

    return archive.load(pt2)


def export_program(program: Any, folder: Path) -> None:
    """``torch.onnx.export(program, dynamo=True)`` into ``folder/model.onnx`` (the caller seals its record).

    Raises:
        ModelError: an op has no ONNX translation or the export failed otherwise: one line naming the op.
    """
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    try:
        onnx_program = torch.onnx.export(program, dynamo=True, verbose=False)
        onnx_program.save(str(folder / ONNX_FILE))
    except Exception as exc:
        op = failing_op(str(exc))
        what = f"has no ONNX translation for op {op}" if op else "failed"
        raise ModelError(f"{EXPORTER} {what}: {one_line(exc)}",
                         fix="rewrite that part with ops ONNX has, or register a translation "
                             "(torch.onnx.export(custom_translation_table=...)) and pass the .onnx") from None  # fmt: skip
    readable_dims(folder / ONNX_FILE)


#: torch.export's names for its symbolic sizes (``s77``), which an exported ONNX keeps as its dims' names.
_TORCH_SYMBOL = re.compile(r"^s\d+$")


def readable_dims(path: Path) -> None:
    """Rename torch's symbols (``s77``) among ``path``'s dim names, which every shape line would show (``s77x1024``):
    a symbol on axis 0 of an input is ``batch``, any other ``INPUT_dimAXIS`` of the first input that has it. The
    same symbol keeps one name wherever it appears (outputs, value infos). The weights are not read or rewritten."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    names: dict[str, str] = {}
    for value in proto.graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if _TORCH_SYMBOL.match(dim.dim_param) and dim.dim_param not in names:
                names[dim.dim_param] = "batch" if axis == 0 and "batch" not in names.values() else f"{value.name}_dim{axis}"
    if not names:
        return
    for value in (*proto.graph.input, *proto.graph.output, *proto.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in names:
                dim.dim_param = names[dim.dim_param]
    onnx.save(proto, str(path))


def failing_op(text: str) -> str | None:
    """The op an exporter error names: ``adtest.twice`` from ``No ONNX function found for <OpOverload(op=...)``
    or ``target=torch.ops.aten.foo.default``."""
    for pattern in (r"OpOverload\(op='([\w.:]+)'", r"target=torch\.ops\.([\w.]+?)(?:\.default)?[(\]),\s]",
                    r"\b(aten::\w+)"):  # fmt: skip
        found = re.search(pattern, text)
        if found:
            return found.group(1)
    return None


def one_line(exc: BaseException) -> str:
    """The line of a torch error that says what broke (the exporter's summary line, else its last line)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line and not line.startswith(("-", "(Refer", "⬆"))]
    telling = [line for line in lines if line.startswith("<class") or "No ONNX function" in line]
    line = (telling or lines or [type(exc).__name__])[0]
    return re.sub(r"^<class '[\w.]+\.(\w+)'>:", r"\1:", line)[:300]


# -- intake: nn.Module -> .pt2 + ONNX ------------------------------------------------------------


def from_module(module: Any, example_inputs: Sequence[Any] | None, cache: Path, *,
                dynamic_shapes: Any = None, batch_dim: int | None = 0) -> Path:  # fmt: skip
    """Export a live ``nn.Module`` (``torch.export.export``, then ONNX), both in this process, where its
    custom ops are registered; return the ``.pt2`` saved in the cache (the ONNX is cached beside it).

    ``dynamic_shapes`` is ``torch.export``'s own; by default axis ``batch_dim`` of every tensor input is
    ``Dim.AUTO`` (an example batch of 1 fixes it to 1: torch's 0/1 specialization), none when ``batch_dim``
    is ``None``.

    Raises:
        UsageError: no example inputs.
        ModelError: the export failed (one line naming the op), or torch cannot save what it exported.
    """
    import torch

    if example_inputs is None:
        raise UsageError("a PyTorch nn.Module needs example inputs to be exported",
                         fix="pass example_inputs=(tensor, ...) shaped as the model takes them")  # fmt: skip
    args = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
    if dynamic_shapes is None and batch_dim is not None:
        dynamic_shapes = tuple({batch_dim: torch.export.Dim.AUTO} if isinstance(a, torch.Tensor) else None
                               for a in args)  # fmt: skip
    try:
        program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    except Exception as exc:
        op = failing_op(str(exc))
        raise ModelError(f"torch.export.export failed{f' at op {op}' if op else ''}: {one_line(exc)}",
                         fix="pass example_inputs the model takes, and dynamic_shapes it can honour "
                             "(torch.export's own argument)") from None  # fmt: skip
    staging = cache / TORCH.under / f".module-{os.getpid()}.pt2"
    staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.export.save(program, str(staging))
    except Exception as exc:  # torch exported it but cannot write it (a SerializeError, an assertion inside it)
        staging.unlink(missing_ok=True)  # a failed intake leaves nothing in the cache
        raise ModelError(f"torch.export.save cannot serialize the exported program: {one_line(exc)}",
                         fix="compute Python numbers taken from tensors in forward (.item(), round(), int()) once in "
                             "__init__ instead, or export the ONNX yourself (torch.onnx.export) and give the .onnx") from None  # fmt: skip
    sha = _sha256(staging)
    pt2 = staging.with_name(f"module-{sha[:24]}.pt2")
    os.replace(staging, pt2)
    bound = TORCH.bound(sha)
    folder = TORCH.folder(cache, bound)
    if not TORCH.cached(folder, bound):
        export_program(program, folder)
        TORCH.seal(folder, bound)
    return pt2


# -- the reference -----------------------------------------------------------------------------


class TorchRunner:
    """A callable PyTorch model (an ``ExportedProgram``'s module, an ``nn.Module``) as a runner of
    numpy feeds by the ONNX's input names, returning the ONNX's output names (outputs flattened in order)."""

    def __init__(self, fn: Any, model: ModelInfo) -> None:
        self.fn, self.model = fn, model

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        import torch
        from torch.utils._pytree import tree_leaves

        args = [torch.from_numpy(feeds[name]) for name in self.model.input_names]
        with torch.inference_mode():
            leaves = [t for t in tree_leaves(self.fn(*args)) if isinstance(t, torch.Tensor)]
        names = self.model.output_names
        if len(leaves) != len(names):
            raise RuntimeError(f"the PyTorch model returned {len(leaves)} tensors, its ONNX export {len(names)} "
                               f"outputs ({', '.join(names)})")  # fmt: skip
        return {name: t.detach().cpu().numpy() for name, t in zip(names, leaves, strict=True)}

    def close(self) -> None:
        pass


def program_runner(model: ModelInfo) -> TorchRunner:
    """The ``.pt2`` named by ``model.source`` as a runner (in the reference worker)."""
    program = load_program(Path(model.source["file"]))
    return TorchRunner(program.module(), model)


# -- the child ---------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """``python -m autodeploy.pytorch PT2 FOLDER``: load the checked archive, export its ONNX into FOLDER."""
    return child_main(lambda: export_program(load_program(Path(argv[0])), Path(argv[1])), reported=ModelError)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
