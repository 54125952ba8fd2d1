"""Load an autodeploy bundle with nothing installed but numpy and the engine's own package.

Every bundle ships a copy of this file at its root, so this works in a bare environment::

    import sys; sys.path.insert(0, BUNDLE)
    import loader
    predictor = loader.load(BUNDLE)
    outputs = predictor.run({"x": batch})

That is why this module imports only the standard library and numpy at module level, the
engine package inside its runner, and never the rest of autodeploy (only its exception base,
when it happens to be installed). :func:`load` first verifies every file against the
manifest's SHA-256 and size, then checks that the engine version and this machine fit (CPU
features a bf16 winner needs, the GPU architecture a TensorRT plan was built for), then opens
the engine with the tuned settings recorded in the manifest (``runtime``: the engine's own
option names, exactly as the benchmark applied them).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = 1
KIND = "autodeploy-bundle"
MANIFEST = "manifest.json"
#: ``"<sha256 of manifest.json>  manifest.json"``: the manifest cannot hold its own digest.
MANIFEST_DIGEST = "manifest.sha256"
MODEL_DIR = "model"
LOADER = "loader.py"
#: Importing the shipped loader from the bundle folder writes its bytecode here; it is not bundle content.
IGNORED_DIRS = frozenset({"__pycache__"})
#: The distributions that provide each engine's runtime (TensorRT ships under several names).
PACKAGES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime",),
    "openvino": ("openvino",),
    "tflite": ("ai-edge-litert",),
    "tensorrt": ("tensorrt", "tensorrt-cu12", "tensorrt-cu13"),
}
#: Engines whose artifacts only run under the exact version that built them.
VERSION_LOCKED = frozenset({"tensorrt"})
REEXPORT = "export the bundle again from the results store (autodeploy export)"
_CHUNK = 1 << 20

try:  # inside autodeploy, bundle errors belong to its one exception tree
    from autodeploy.errors import AutodeployError as _ErrorBase
except ImportError:  # shipped alone: a stand-in with the same message format

    class _ErrorBase(Exception):  # type: ignore[no-redef]
        exit_code = 1

        def __init__(self, message: str, *, fix: str | None = None) -> None:
            self.message, self.fix = message, fix
            super().__init__(message if fix is None else f"{message}; fix: {fix}")


class BundleError(_ErrorBase):
    """A bundle is damaged, incomplete or unsafe, or cannot run on this machine."""


# -- integrity -------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def digest_line(manifest_bytes: bytes) -> str:
    """The exact content of ``manifest.sha256`` for these manifest bytes."""
    return f"{hashlib.sha256(manifest_bytes).hexdigest()}  {MANIFEST}\n"


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The manifest of the bundle at ``root``, after checking it against ``manifest.sha256``."""
    root = Path(root)
    path, digest_path = root / MANIFEST, root / MANIFEST_DIGEST
    for p in (path, digest_path):
        if p.is_symlink() or not p.is_file():
            raise BundleError(f"{root} is not a complete bundle: {p.name} is missing", fix=REEXPORT)
    data = path.read_bytes()
    if digest_path.read_bytes() != digest_line(data).encode():
        raise BundleError(
            f"bundle {root}: {MANIFEST} does not match {MANIFEST_DIGEST} (one of them was changed or corrupted)",
            fix=REEXPORT,
        )
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise BundleError(f"bundle {root}: {MANIFEST} is not valid JSON ({exc})", fix=REEXPORT) from None
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        raise BundleError(f"{root}/{MANIFEST} is not an autodeploy bundle manifest", fix=REEXPORT)
    if manifest.get("schema") != SCHEMA:
        raise BundleError(
            f"bundle {root} has manifest schema {manifest.get('schema')}, this loader reads schema {SCHEMA}",
            fix="use the autodeploy version that exported it, or export it again",
        )
    return manifest


def verify(root: str | Path) -> dict[str, Any]:
    """Check every file of the bundle against the manifest (SHA-256 and size); return the manifest.

    Raises:
        BundleError: naming the first file that is missing, changed, or not in the manifest.
    """
    root = Path(root)
    manifest = read_manifest(root)
    files: Mapping[str, Mapping[str, Any]] = manifest.get("files") or {}
    for rel, entry in sorted(files.items()):
        path = root / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise BundleError(
                f"bundle {root}: the manifest lists {rel!r}, which is outside the bundle", fix=REEXPORT
            )
        if path.is_symlink() or not path.is_file():
            raise BundleError(f"bundle {root}: {rel} is missing", fix=REEXPORT)
        size = path.stat().st_size
        if size != entry["size"]:
            raise BundleError(
                f"bundle {root}: {rel} has {size} bytes, the manifest says {entry['size']} (changed or truncated)",
                fix=REEXPORT,
            )
        if sha256_file(path) != entry["sha256"]:
            raise BundleError(
                f"bundle {root}: {rel} does not match its SHA-256 in the manifest (changed or corrupted)",
                fix=REEXPORT,
            )
    expected = set(files) | {MANIFEST, MANIFEST_DIGEST}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if IGNORED_DIRS.intersection(rel.parts) or (path.is_dir() and not path.is_symlink()):
            continue
        if rel.as_posix() not in expected:
            raise BundleError(f"bundle {root}: {rel.as_posix()} is not listed in the manifest", fix=REEXPORT)
    return manifest


# -- compatibility -------------------------------------------------------------------------


def installed_version(engine: str) -> str | None:
    """The installed version of ``engine``'s runtime package, from metadata (imports nothing)."""
    for dist in PACKAGES.get(engine, ()):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def cpu_info() -> tuple[str, frozenset[str]] | None:
    """This CPU's model name and feature flags (Linux ``/proc/cpuinfo``); ``None`` when unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:  # the first processor block is enough
            fields[key.strip()] = value.strip()
    flags = fields.get("flags") or fields.get("Features") or ""
    model = fields.get("model name") or fields.get("Model") or platform.processor() or "unknown"
    return model, frozenset(flags.lower().split())


def gpu_capabilities() -> list[str] | None:
    """Compute capability (``"8.9"``) of each NVIDIA GPU from nvidia-smi; ``None`` without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def check_compatible(
    manifest: Mapping[str, Any],
    *,
    allow_other_version: bool = False,
    cpu: tuple[str, frozenset[str]] | None | bool = True,
    gpus: list[str] | None | bool = True,
) -> list[str]:
    """Refuse when this machine cannot run the bundle; return warnings for what only changes speed.

    Refused: the engine package missing, another engine version (a warning instead with
    ``allow_other_version``, except for engines whose artifacts are version-locked), CPU
    features the precision needs, the GPU architecture a plan was built for. ``cpu`` and
    ``gpus`` default to probing this machine; tests pass fixed values.
    """
    engine, want = manifest["engine"]["name"], manifest["engine"]["version"]
    precision = manifest["settings"]["precision"]
    fix_install = "pip install -r requirements.txt (in the bundle folder)"
    have = installed_version(engine)
    if have is None:
        raise BundleError(f"this bundle runs on {engine} {want}, which is not installed", fix=fix_install)
    warnings: list[str] = []
    if have != want:
        message = f"this bundle was benchmarked with {engine} {want}, this machine has {have}"
        if engine in VERSION_LOCKED or not allow_other_version:
            raise BundleError(
                message,
                fix=fix_install + ("" if engine in VERSION_LOCKED else ", or allow_other_version=True"),
            )
        warnings.append(message + "; outputs and speed may differ")
    requires = manifest.get("requires") or {}
    cpu = cpu_info() if cpu is True else cpu
    if requires.get("isa_any_of"):
        needed = list(requires["isa_any_of"])
        if not cpu:
            warnings.append(f"cannot read this CPU's features to check for {' or '.join(needed)}")
        elif not set(needed) & cpu[1]:
            raise BundleError(
                f"this {engine} {precision} bundle needs a CPU with {' or '.join(needed)} "
                f"({requires.get('why', 'for its precision')}); this CPU ({cpu[0]}) has none of them",
                fix="run it on such a CPU, or tune on this machine and export that winner",
            )
    if cpu and manifest["device"].get("cpu") and cpu[0] != manifest["device"]["cpu"]:
        warnings.append(
            f"benchmarked on {manifest['device']['cpu']}, this CPU is {cpu[0]}: latency will differ"
        )
    if requires.get("gpu_compute_capability"):
        cc = str(requires["gpu_compute_capability"])
        found = gpu_capabilities() if gpus is True else gpus
        if not found:
            raise BundleError(f"this {engine} bundle needs an NVIDIA GPU of compute capability {cc}; none found",
                              fix="run it on a machine with such a GPU and its driver (nvidia-smi must list it)")  # fmt: skip
        if cc not in found:
            raise BundleError(
                f"this {engine} plan was built for compute capability {cc}, this machine's GPUs are {', '.join(found)}",
                fix="re-tune on a GPU of this architecture and export that winner",
            )
    return warnings


# -- the predictor -------------------------------------------------------------------------


class Predictor:
    """A verified bundle opened with its tuned settings. ``run(feeds)`` -> ``{output name: array}``."""

    def __init__(self, root: Path, manifest: dict[str, Any], warnings: list[str]) -> None:
        self.root, self.manifest, self.warnings = root, manifest, warnings
        model = manifest["model"]
        self.input_dtypes = {s["name"]: np.dtype(s["dtype"]) for s in model["inputs"]}
        self.output_names = tuple(s["name"] for s in model["outputs"])
        engine = manifest["engine"]["name"]
        if engine not in _OPENERS:
            raise BundleError(
                f"this loader has no runner for engine {engine!r}", fix="use a newer autodeploy"
            )
        self._run, self._close = _OPENERS[engine](root / MODEL_DIR, manifest, self.output_names)
        self._closed = False

    @property
    def settings(self) -> dict[str, Any]:
        """The tuned config (engine, precision, batch, threads, knobs) this bundle applies."""
        return dict(self.manifest["settings"])

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; feeds must match the model's input names and dtypes."""
        if self._closed:
            raise RuntimeError("Predictor.run called after close()")
        missing, extra = set(self.input_dtypes) - set(feeds), set(feeds) - set(self.input_dtypes)
        if missing or extra:
            raise BundleError(f"feeds do not match the model inputs: missing {sorted(missing)}, unexpected {sorted(extra)}",
                              fix=f"pass exactly {sorted(self.input_dtypes)}")  # fmt: skip
        for name, array in feeds.items():
            if np.asarray(array).dtype != self.input_dtypes[name]:
                raise BundleError(f"input {name!r} has dtype {np.asarray(array).dtype}, the model wants {self.input_dtypes[name]}",
                                  fix=f"cast it with .astype({str(self.input_dtypes[name])!r})")  # fmt: skip
        outputs = self._run({k: np.asarray(v) for k, v in feeds.items()})
        return dict(zip(self.output_names, outputs, strict=True))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Predictor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(path: str | Path, *, allow_other_version: bool = False) -> Predictor:
    """Verify the bundle folder at ``path``, check it fits this machine, and open it.

    Raises:
        BundleError: a file is missing or changed, or this machine cannot run the bundle.
    """
    root = Path(path)
    if not root.is_dir():
        raise BundleError(f"{root} is not a bundle folder",
                          fix="pass the exported folder (autodeploy.bundle.load also opens .tar.gz)")  # fmt: skip
    manifest = verify(root)
    warnings = check_compatible(manifest, allow_other_version=allow_other_version)
    return Predictor(root, manifest, warnings)


# -- one small runner per engine: (run(feeds) -> outputs in model order, close()) --------------

Opened = tuple[Callable[[Mapping[str, np.ndarray]], list[np.ndarray]], Callable[[], None]]


def _open_onnxruntime(model_dir: Path, manifest: Mapping[str, Any], outputs: tuple[str, ...]) -> Opened:
    import onnxruntime as ort

    rt = manifest["runtime"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(rt["intra_op_num_threads"])
    options.inter_op_num_threads = int(rt["inter_op_num_threads"])
    options.execution_mode = getattr(ort.ExecutionMode, rt["execution_mode"])
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, rt["graph_optimization_level"])
    options.log_severity_level = 3
    session = ort.InferenceSession(
        str(model_dir / rt["model_file"]), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return (lambda feeds: session.run(list(outputs), dict(feeds))), (lambda: None)


def _open_openvino(model_dir: Path, manifest: Mapping[str, Any], outputs: tuple[str, ...]) -> Opened:
    import openvino as ov

    core = ov.Core()
    ov_model = core.read_model(str(model_dir / manifest["runtime"]["model_file"]))
    properties = dict(manifest["runtime"]["properties"])
    compiled: dict[
        tuple[Any, ...], tuple[Any, list[Any]]
    ] = {}  # one static compile per feed shape, as benchmarked

    def run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        key = tuple(sorted((name, a.shape) for name, a in feeds.items()))
        if key not in compiled:
            m = ov_model
            if m.is_dynamic():
                m = m.clone()
                m.reshape({name: list(a.shape) for name, a in feeds.items()})
            c = core.compile_model(m, "CPU", properties)
            compiled[key] = (c.create_infer_request(), [c.output(name) for name in outputs])
        request, ports = compiled[key]
        results = request.infer(dict(feeds), share_inputs=True, share_outputs=False)
        return [results[port] for port in ports]

    return run, compiled.clear


def _open_tflite(model_dir: Path, manifest: Mapping[str, Any], outputs: tuple[str, ...]) -> Opened:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    rt = manifest["runtime"]
    resolver = OpResolverType.AUTO if rt["xnnpack"] else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = Interpreter(model_path=str(model_dir / rt["model_file"]), num_threads=rt["num_threads"],
                     experimental_op_resolver_type=resolver)  # fmt: skip
    layout = json.loads((model_dir / rt["layout_file"]).read_text())
    by_name = {d["name"]: d for d in it.get_input_details()}
    out_by_name = {d["name"]: d for d in it.get_output_details()}
    dtypes = {s["name"]: np.dtype(s["dtype"]) for s in manifest["model"]["outputs"]}
    shapes: dict[int, tuple[int, ...]] = {}

    def permute(a: np.ndarray, perm: list[int] | None) -> np.ndarray:
        return a if perm is None else a.transpose(perm)

    def run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        arrays = [(by_name[e["tflite"]], np.ascontiguousarray(permute(feeds[e["name"]], e["perm"]),
                   dtype=by_name[e["tflite"]]["dtype"])) for e in layout["inputs"]]  # fmt: skip
        if any(shapes.get(d["index"]) != a.shape for d, a in arrays):
            for d, a in arrays:
                it.resize_tensor_input(d["index"], list(a.shape))
                shapes[d["index"]] = a.shape
            it.allocate_tensors()
        for d, a in arrays:
            it.set_tensor(d["index"], a)
        it.invoke()
        by_out = {e["name"]: e for e in layout["outputs"]}
        return [np.ascontiguousarray(permute(it.get_tensor(out_by_name[by_out[n]["tflite"]]["index"]), by_out[n]["perm"]))
                .astype(dtypes[n], copy=False) for n in outputs]  # fmt: skip

    return run, (lambda: None)


def _open_tensorrt(model_dir: Path, manifest: Mapping[str, Any], outputs: tuple[str, ...]) -> Opened:
    import tensorrt as trt

    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart  # older cuda-python

    def check(result: Any) -> Any:
        err, *values = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise BundleError(f"CUDA call failed: {err}")
        return values[0] if len(values) == 1 else values

    props = check(cudart.cudaGetDeviceProperties(check(cudart.cudaGetDevice())))
    built = str(manifest["requires"]["gpu_compute_capability"])
    if f"{props.major}.{props.minor}" != built:
        raise BundleError(f"this TensorRT plan was built for compute capability {built}, the current GPU is "
                          f"{props.major}.{props.minor}", fix="select a GPU of that architecture (CUDA_VISIBLE_DEVICES)")  # fmt: skip
    plan = (model_dir / manifest["runtime"]["model_file"]).read_bytes()
    engine = trt.Runtime(trt.Logger(trt.Logger.ERROR)).deserialize_cuda_engine(plan)
    if engine is None:
        raise BundleError("TensorRT could not deserialize the plan", fix=REEXPORT)
    context, stream = engine.create_execution_context(), check(cudart.cudaStreamCreate())
    buffers: dict[str, tuple[int, int]] = {}
    h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost

    def device(name: str, nbytes: int) -> int:
        pointer, size = buffers.get(name, (0, 0))
        if size < nbytes:
            if pointer:
                check(cudart.cudaFree(pointer))
            pointer = int(check(cudart.cudaMalloc(max(nbytes, 1))))
            buffers[name] = (pointer, nbytes)
            context.set_tensor_address(name, pointer)
        return pointer

    def run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        for name, value in feeds.items():
            host = np.ascontiguousarray(value, dtype=trt.nptype(engine.get_tensor_dtype(name)))
            context.set_input_shape(name, host.shape)
            check(
                cudart.cudaMemcpyAsync(device(name, host.nbytes), host.ctypes.data, host.nbytes, h2d, stream)
            )
        hosts = [np.empty(tuple(context.get_tensor_shape(n)), dtype=trt.nptype(engine.get_tensor_dtype(n)))
                 for n in outputs]  # fmt: skip
        for name, host in zip(outputs, hosts, strict=True):
            device(name, host.nbytes)
        if not context.execute_async_v3(stream):
            raise BundleError("TensorRT execute_async_v3 failed")
        for name, host in zip(outputs, hosts, strict=True):
            check(cudart.cudaMemcpyAsync(host.ctypes.data, buffers[name][0], host.nbytes, d2h, stream))
        check(cudart.cudaStreamSynchronize(stream))
        return hosts

    def close() -> None:
        for pointer, _ in buffers.values():
            cudart.cudaFree(pointer)
        buffers.clear()
        cudart.cudaStreamDestroy(stream)

    return run, close


_OPENERS: dict[str, Callable[[Path, Mapping[str, Any], tuple[str, ...]], Opened]] = {
    "onnxruntime": _open_onnxruntime,
    "openvino": _open_openvino,
    "tflite": _open_tflite,
    "tensorrt": _open_tensorrt,
}

if __name__ == "__main__":  # `python loader.py` inside a bundle: verify it and say whether it runs here
    here = Path(__file__).resolve().parent
    found = check_compatible(verify(here))
    print(f"{here}: every file verified; runs here" + "".join(f"\nwarning: {w}" for w in found))
