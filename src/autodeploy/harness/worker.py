"""The worker process: one job, in its own process, reported as JSON.

Run as ``python -m autodeploy.harness.worker SPEC.json RESULT.json``. The parent's supervisor
(:mod:`autodeploy.harness.supervisor`) enforces the timeout and memory cap and classifies deaths
by signal; this side classifies everything it can catch into a failure kind. The current
phase is written to ``RESULT.json.phase`` so the parent can show progress.
"""

from __future__ import annotations

import faulthandler
import functools
import gc
import importlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from autodeploy.accuracy.kinds import parse_override
from autodeploy.accuracy.measure import GraphFacts, as_tensor, compare, graph_facts, is_time_major
from autodeploy.accuracy.records import Accuracy, AccuracyVerdict
from autodeploy.accuracy.rules import with_metric
from autodeploy.adapters.base import Artifact, Engine, Runner, TrialConfig
from autodeploy.adapters.registry import load_target
from autodeploy.data import Dataset
from autodeploy.device import probe_device
from autodeploy.errors import UnsupportedConfigError
from autodeploy.harness import cold_start, energy
from autodeploy.harness.cold_start import COMPILED_DIR, ColdStart
from autodeploy.harness.concurrency import BatchPolicy, LoopRun, closed_loop, open_loop
from autodeploy.harness.metric import load_metric, score
from autodeploy.harness.result import Measurement, reason
from autodeploy.harness.scenarios import search_rate
from autodeploy.harness.spec import WorkerSpec
from autodeploy.harness.stats import MIN_SAMPLES_P99, summarize
from autodeploy.harness.supervisor import die_with_parent
from autodeploy.harness.timing import TimingPolicy, time_calls
from autodeploy.inhouse.search_time import STOPPED_KEY, time_limit
from autodeploy.model import ModelInfo, copy_unchanged
from autodeploy.objectives import scenario_of
from autodeploy.runtime.cache import Declared, cache_key


class _Failed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.engine_version: str | None = None  # a failed build says which engine version failed (bench learns it)


def _step(kind: str, fn: Callable[[], Any]) -> Any:
    """Run one step; any exception becomes a failure of ``kind`` (MemoryError becomes ``oom``)."""
    try:
        return fn()
    except _Failed:
        raise
    except MemoryError as exc:
        raise _Failed("oom", f"MemoryError: {exc}") from None
    except UnsupportedConfigError as exc:
        raise _Failed("unsupported", str(exc)) from None
    except Exception as exc:  # the engine's whole reason: the line naming the node is rarely its first
        raise _Failed(kind, reason(exc)) from None


class _Job:
    def __init__(self, spec: WorkerSpec, result_path: Path) -> None:
        self.spec = spec
        self.result_path = result_path
        self.model = ModelInfo.from_dict(spec.model)

    @functools.cached_property
    def config(self) -> TrialConfig:
        """The config a build, a measurement or a reference runs (a quantize job runs no engine: it has none)."""
        return TrialConfig.from_dict(self.spec.config)

    @functools.cached_property
    def engine(self) -> Engine:
        return load_target(self.config.engine, self.spec.engine_target)

    def _axes(self) -> dict[str, int | None]:
        """The batch axis of every input and output, as the model (or --batch-axis) says."""
        return {n: self.model.batch_axis(n) for n in (*self.model.input_names, *self.model.output_names)}

    def phase(self, name: str) -> None:
        Path(f"{self.result_path}.phase").write_text(name)

    def ready(self) -> str:
        """Probe and check the config; return the engine version."""
        availability = self.engine.probe(probe_device())
        if not availability.available:
            raise _Failed("unavailable", str(availability).removeprefix("unavailable: "))
        _step("unsupported", lambda: self.engine.check(probe_device(), self.model, self.config))
        return availability.version or self.engine.probe_version()

    def build(self) -> dict[str, Any]:
        version = self.ready()
        self.phase("build")
        calibration = None
        if self.spec.calibration_path:
            calibration = Dataset.load(Path(self.spec.calibration_path)).inputs
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="autodeploy-model-") as private:
            # Every engine builds from a private copy, read without following links and checked
            # against the intake hash: what the reference judged is what gets built.
            model = _step("build_failed", lambda: _private_copy(self.model, Path(private)))
            try:
                with time_limit(self.spec.search_s):  # an int8 float-layer search stops there with its best
                    artifact = _step(
                        "build_failed",
                        lambda: self.engine.build(model, self.config, calibration, Path(self.spec.workdir),
                                                  calibration_hash=self.spec.calibration_sha256, version=version,
                                                  target=probe_device()),
                    )  # fmt: skip
            except _Failed as failed:
                failed.engine_version = version
                raise
        return {
            "artifact_path": str(artifact.path),
            "artifact_reused": artifact.reused,
            "engine_version": version,
            "build_s": time.perf_counter() - start,
        }

    def quantize(self) -> dict[str, Any]:
        """``autodeploy inhouse quantize``: the graph passes, then the INT8 quantizer with ``spec.quant``;
        the QDQ model goes to ``output_path``, the reports come back."""
        import onnx

        from autodeploy.inhouse.passes import optimize
        from autodeploy.inhouse.quantize import QuantConfig, quantize

        config = QuantConfig(**(self.spec.quant or {}))
        calibration = Dataset.load(Path(self.spec.calibration_path or "")).inputs
        with tempfile.TemporaryDirectory(prefix="autodeploy-model-") as private:
            model = _step("build_failed", lambda: _private_copy(self.model, Path(private)))  # as build() reads it
            proto = _step("build_failed", lambda: onnx.load(str(model.path)))
        self.phase("optimizing")
        optimized, passes = _step("build_failed", lambda: optimize(proto))
        self.phase(f"calibrating ({config.calibration}) and quantizing")
        quantized, report = _step("build_failed", lambda: quantize(optimized, calibration, config))
        _step("build_failed", lambda: onnx.save(quantized, self.spec.output_path or ""))
        return {"passes": passes.to_dict(), "quantization": report.to_dict()}

    def load(self) -> tuple[Runner, dict[str, str]]:
        """The loaded runner and the SHA-256 of every artifact file, hashed just before loading."""
        artifact = Artifact.read(Path(self.spec.artifact_path or ""))
        self.phase("load")
        digests = artifact.digests()
        return _step("load_failed", lambda: self.engine.load(artifact, self.config, self.model)), digests

    def measure(self) -> dict[str, Any]:
        version = self.ready()
        evaluation = Dataset.load(Path(self.spec.evaluation_path or ""))
        batches = evaluation.batches(self.config.batch, self._axes())
        gc.collect()
        baseline = _reset_peak_rss()
        started = time.perf_counter()  # from the load on: what timing costs, beside the accuracy
        runner, digests = self.load()
        feeds = batches[0]
        policy = TimingPolicy(**self.spec.policy)
        meters = energy.find()  # read around the timed phase; none here: CPU time only, and why
        self.phase("warm-up and timing")
        if not scenario_of(self.spec.scenario).in_flight:  # one call at a time
            timed = _step("run_failed", lambda: time_calls(lambda: runner.run(feeds), policy, meters=meters))
            samples, duration, warmup, stopped_by = timed.samples_ns, timed.duration_s, timed.warmup_calls, timed.stopped_by
            load, cost = timed.load, timed.cost
            throughput = self.config.batch * len(samples) / (samples.sum() / 1e9)
            extra: dict[str, Any] = {}
        else:
            _step("run_failed", lambda: runner.run(feeds))  # the feeds are checked once, by the sync path
            loop, extra = _step("run_failed", lambda: self._concurrent(runner, evaluation, feeds, policy, meters))
            samples, duration, warmup, stopped_by = loop.samples_ns, loop.duration_s, loop.warmup_calls, loop.stopped_by
            load, cost = loop.load, loop.cost
            throughput = self.config.batch * len(samples) / duration
        meters.close()
        compiled = runner.describe()
        if compiled:
            extra["compiled"] = compiled
        timing_s = time.perf_counter() - started
        started = time.perf_counter()
        if self.spec.accuracy is not None:  # accuracy depends on the artifact: measured once, by another trial
            peak = _peak_rss() - baseline
            runner.close()
            accuracy = Accuracy.from_dict(self.spec.accuracy)
        else:
            self.phase("accuracy")
            outputs, time_major = _step("run_failed",
                                        lambda: run_all(runner, batches, len(evaluation), self._axes()))  # fmt: skip
            peak = _peak_rss() - baseline
            runner.close()
            accuracy = self._compare(outputs, evaluation, time_major)
        accuracy_s = time.perf_counter() - started
        artifact = Artifact.read(Path(self.spec.artifact_path or ""))
        cold = _step("run_failed", lambda: self._cold_start(artifact, feeds)) if self.spec.cold_start else None
        measurement = Measurement(
            scenario=self.spec.scenario, batch=self.config.batch, latency=summarize(samples),
            throughput=throughput, peak_rss_mb=peak / 2**20, artifact_mb=artifact.size_bytes() / 2**20,
            build_s=None,  # the parent knows it
            warmup_calls=warmup, duration_s=duration, accuracy=accuracy,
            samples_ms=tuple(float(x) for x in samples / 1e6), serving=extra or None, load=load,
            cost=None if cost is None else cost.per_item(self.config.batch),
            cold_start=cold,
        )  # fmt: skip
        return {
            "engine_version": version,
            "measurement": measurement.to_dict(),
            "artifact_path": str(artifact.path),
            "artifact_files": digests,
            "extra": {"stopped_by": stopped_by, "eval_items": len(evaluation),
                      "timing_s": timing_s, "accuracy_s": accuracy_s,
                      **({"accuracy_reused_from": self.spec.accuracy_from} if self.spec.accuracy is not None else {}),
                      # converted by autodeploy (a .tflite through tf2onnx): the converter and its version
                      **({"source": artifact.meta["source"]} if artifact.meta.get("source") else {}),
                      # its int8 float-layer search stopped at its time limit: the limit and the builds it judged
                      **({STOPPED_KEY: artifact.meta[STOPPED_KEY], "float_builds": artifact.meta.get("float_builds")}
                         if artifact.meta.get(STOPPED_KEY) is not None else {}),
                      **extra},
        }

    def _compare(self, outputs: dict[str, np.ndarray], evaluation: Dataset, time_major: frozenset[str]
                 ) -> Accuracy:  # fmt: skip
        reference = dict(np.load(self.spec.reference_path or "", allow_pickle=False))
        # What each output is, from the ONNX graph read once (no weights): what makes, reads and declares each output.
        graph = _step("run_failed", lambda: self._graph())
        # The model's own declaration (its metadata), then the user's --accuracy over it.
        overrides = dict(graph.declared)
        overrides.update(parse_override(text) for text in self.spec.accuracy_overrides)
        accuracy = _step("run_failed", lambda: compare(outputs, reference, labels=evaluation.labels,
                                                       max_accuracy_drop=self.spec.max_accuracy_drop,
                                                       min_cosine=self.spec.min_cosine, producers=graph.producers,
                                                       overrides=overrides, time_major=time_major,
                                                       readers=graph.readers))  # fmt: skip
        if self.spec.metric:  # the user's task metric, on the outputs and on the reference
            accuracy = _step("run_failed", lambda: _with_metric(accuracy, self.spec, outputs, reference, evaluation.labels))
        return accuracy

    def _graph(self) -> GraphFacts:
        """The graph facts of the model's outputs: of its ONNX; of a ``.tflite``, of the ONNX tf2onnx makes of it (the
        same file every engine's run is judged by, cached beside the artifacts as ONNX Runtime's build caches it), so
        a face mesh ``[N, 1, 1, 1404]`` is no embedding by its shape; an IR, or a ``.tflite`` tf2onnx refuses or is
        not installed for: none (kinds from shapes and values, and each verdict line says so)."""
        if self.model.format == "onnx":
            return graph_facts(self.model.path)
        from autodeploy import tflite_onnx
        from autodeploy.errors import ConversionError

        if self.model.format != tflite_onnx.TF2ONNX.framework or tflite_onnx.missing() is not None:
            return GraphFacts()
        try:
            converted = tflite_onnx.as_onnx(self.model, Path(self.spec.workdir) / tflite_onnx.CONVERTER)
        except ConversionError:
            return GraphFacts()
        return graph_facts(converted.path)

    def _cold_start(self, artifact: Artifact, feeds: dict[str, np.ndarray]) -> ColdStart:
        """The artifact started ``spec.cold_start`` times in fresh processes, with and without its engine's compiled
        cache (:mod:`autodeploy.harness.cold_start`), each running the first batch once: after the timing and
        accuracy, with the runner closed, so no start shares the machine with this process's model."""
        self.phase(f"cold start: {self.spec.cold_start} fresh processes")
        settings = self.engine.runtime_settings(artifact, self.config, self.model)
        module = self.engine.runtime_module(self.config)
        declared = getattr(importlib.import_module(module), "CACHE", None) or Declared(None, "its runtime declares none")
        key = cache_key(artifact.key, settings)
        folder = Path(self.spec.workdir).parent / COMPILED_DIR / f"{artifact.path.name}-{key['settings']}"
        interface = {part: self.model.to_dict()[part] for part in ("inputs", "outputs")}
        return cold_start.measure(module, artifact.path, settings, interface, feeds, declared=declared, key=key,
                                  cache_dir=folder, starts=int(self.spec.cold_start or 0))  # fmt: skip

    def _concurrent(self, runner: Runner, evaluation: Dataset, feeds: dict[str, np.ndarray],
                    policy: TimingPolicy, meters: energy.Meters) -> tuple[LoopRun, dict[str, Any]]:  # fmt: skip
        """offline / multi-stream: the closed loop; server: the closed loop for capacity, then the rate search.

        The pool's requests stay in flight until drained, so the peak RSS read after covers them all.
        """
        knobs = self.config.knobs
        requests = knobs.get("num_requests", "AUTO")
        pool = runner.pool(None if requests == "AUTO" else int(requests))
        try:
            loop = closed_loop(pool, feeds, policy, meters=meters)
            extra: dict[str, Any] = {"concurrency": {**pool.info, "requests": pool.requests}}
            if scenario_of(self.spec.scenario).rate_under_sla:
                self.phase(f"{self.spec.scenario} scenario")
                sized = _sized_feeds(evaluation, self.config.batch, self._axes(), pool.fixed_batch)
                batching = BatchPolicy(self.config.batch, int(knobs.get("max_queue_delay_us", 0)))
                capacity = self.config.batch * len(loop.samples_ns) / loop.duration_s  # items/s: a query is one item
                server = search_rate(lambda rate, i: open_loop(pool, sized.__getitem__, rate, MIN_SAMPLES_P99,
                                                               batching, seed=i),
                                     self.spec.sla_ms or 0.0, capacity)  # fmt: skip
                split = {**(server.split or {}), "max_batch": batching.max_batch,
                         "max_queue_delay_us": batching.max_delay_us, "requests": pool.requests}
                extra["server"] = {**server.to_dict(), "split": split}
        finally:
            pool.close()
        return loop, extra

    def reference(self) -> dict[str, Any]:
        """FP32 outputs of the baseline engine (ONNX Runtime; the engine that reads a model file run as
        given) on the evaluation inputs, saved as .npz."""
        evaluation = Dataset.load(Path(self.spec.evaluation_path or ""))
        if self.model.source:  # exported from PyTorch: the .pt2's ExportedProgram is the reference
            from autodeploy.pytorch import program_runner

            self.phase("reference (PyTorch)")
            runner: Any = _step("run_failed", lambda: program_runner(self.model))
        else:
            self.ready()
            artifact_info = self.build()
            self.spec = WorkerSpec(**{**self.spec.__dict__, "artifact_path": artifact_info["artifact_path"]})
            runner, _ = self.load()
            self.phase("reference")
        outputs, _ = _step(
            "run_failed",
            lambda: run_all(runner, evaluation.batches(self.config.batch, self._axes()), len(evaluation), self._axes()),
        )
        runner.close()
        # A non-finite reference cannot judge anything: every trial would read as "inaccurate".
        bad = [k for k, v in outputs.items() if v.dtype.kind in "fc" and not np.isfinite(v).all()]
        if bad:
            raise _Failed("run_failed", f"output(s) {', '.join(map(repr, bad))} hold NaN or inf on the "
                          "evaluation inputs (NaN/inf weights, or inputs outside the model's range); "
                          "fix the model's weights, or give --data it was made for")  # fmt: skip
        out = Path(self.spec.output_path or "")
        tmp = out.with_name(out.name + ".tmp.npz")
        np.savez(tmp, **outputs)
        os.replace(tmp, out)
        return {"reference_path": str(out)}


def _with_metric(accuracy: Accuracy, spec: WorkerSpec, outputs: dict[str, np.ndarray],
                 reference: dict[str, np.ndarray], labels: np.ndarray | None) -> Accuracy:  # fmt: skip
    """``accuracy`` with the user's task metric on the outputs and on the reference, judged by its budget."""
    name = spec.metric or ""
    fn = load_metric(name)
    value, ref = score(fn, name, outputs, labels), score(fn, name, reference, labels)
    judged = with_metric(AccuracyVerdict(accuracy.constraint, accuracy.passed), name, value, ref,
                         spec.max_metric_drop)  # fmt: skip
    return replace(accuracy, constraint=judged.constraint, passed=judged.passed, metric=name, metric_value=value,
                   reference_metric_value=ref)  # fmt: skip


def _private_copy(model: ModelInfo, folder: Path) -> ModelInfo:
    """``model`` copied into ``folder`` (with its external data), hash-checked, as a new :class:`ModelInfo`."""
    copy_unchanged(model, folder, model.path.name)
    return replace(model, path=folder / model.path.name)


def run_all(
    runner: Runner, batches: list[dict[str, np.ndarray]], n: int, axes: dict[str, int | None]
) -> tuple[dict[str, np.ndarray], frozenset[str]]:
    """Run every batch and return each output item-leading over the items, padding trimmed, and the
    names of the outputs that came time-major (:func:`~autodeploy.accuracy.measure.is_time_major`: split on axis 1).

    An output's batch axis (``axes``, default 0) is moved to the front. A time-major ``[T, B, V]``
    output whose declared batch axis 0 holds no call's items (ddddocr's CRNN declares ``[1, seqlen]``
    and returns CTC logits ``[seq, 1, classes]``) is split on axis 1: each item gets its own ``[T, V]``.
    Any other output without one (e.g. a state without batch), or whose size there is not the call's
    batch, is repeated for each item of its call: outputs line up item by item, never cut mid-call.
    """
    collected: dict[str, list[np.ndarray]] = {}
    time_major: set[str] = set()
    for feeds in batches:
        items = _items(feeds, axes)
        for name, value in runner.run(feeds).items():
            value, axis = as_tensor(value), axes.get(name, 0)  # a ZipMap's maps: its [N, classes]
            if axis is not None and axis < value.ndim and value.shape[axis] == items:
                value = np.moveaxis(value, axis, 0)
            elif is_time_major(value, axis, items):
                value = np.moveaxis(value, 1, 0)
                time_major.add(name)
            else:
                value = np.repeat(value[None], items, axis=0)
            collected.setdefault(name, []).append(value)
    return {name: np.concatenate(parts)[:n] for name, parts in collected.items()}, frozenset(time_major)


def _sized_feeds(evaluation: Dataset, batch: int, axes: dict[str, int | None],
                 fixed: bool) -> dict[int, dict[str, np.ndarray]]:  # fmt: skip
    """The feeds of a call of 1..``batch`` items; padded to ``batch`` where the engine runs one fixed shape."""
    from autodeploy.data import feeds

    full = feeds(evaluation.inputs, 0, batch, axes)
    return {k: full if fixed else feeds(evaluation.inputs, 0, k, axes) for k in range(1, batch + 1)}


def _items(feeds: dict[str, np.ndarray], axes: dict[str, int | None]) -> int:
    """How many items one call carries: the batch dim of its first batched input (1 if none is)."""
    for name, value in feeds.items():
        axis = axes.get(name, 0)
        if axis is not None and axis < value.ndim:
            return int(value.shape[axis])
    return 1


def _reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS counter where Linux allows it; return current RSS in bytes."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5 resets VmHWM (Linux >= 4.0)
    except OSError:
        pass
    return _status_kb("VmRSS") * 1024


def _peak_rss() -> int:
    peak = _status_kb("VmHWM")
    if peak:
        return peak * 1024
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _status_kb(field: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _serialize(value: Any) -> Any:
    from dataclasses import asdict, is_dataclass

    return asdict(value) if is_dataclass(value) else value


def main(argv: list[str]) -> int:
    faulthandler.enable()  # a segfault in an engine leaves its C stack in our stderr log
    die_with_parent()
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    spec = WorkerSpec.read(spec_path)
    try:
        job = _Job(spec, result_path)
        modes = {"build": job.build, "measure": job.measure, "reference": job.reference, "quantize": job.quantize}
        payload = modes[spec.mode]()
        result = {"status": "ok", **{k: _serialize(v) for k, v in payload.items()}}
    except _Failed as failure:
        result = {"status": "failed", "failure_kind": failure.kind, "failure_message": str(failure),
                  "engine_version": failure.engine_version}  # fmt: skip
    tmp = result_path.with_name(result_path.name + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
