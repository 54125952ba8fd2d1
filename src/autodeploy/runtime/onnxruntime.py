"""ONNX Runtime (CPU execution provider).

``settings``: ``model_file`` and ONNX Runtime's own ``SessionOptions`` names:
``intra_op_num_threads`` (0: ORT's default, one per physical core), ``inter_op_num_threads``,
``execution_mode`` (``ORT_SEQUENTIAL``/``ORT_PARALLEL``) and ``graph_optimization_level``
(``ORT_DISABLE_ALL`` ... ``ORT_ENABLE_ALL``). For several requests in flight (:meth:`Runner.pool`),
``sessions`` says how they run: ``shared`` (concurrent ``run`` calls on one session from N threads;
ORT documents ``InferenceSession.run`` as thread-safe) or ``per_request`` (N sessions, one per thread).
``intra_op_thread_affinities``: ``one_cpu_each`` pins each thread of the intra-op pool to a logical CPU of
its own, resolved here, on the machine that runs it, into ORT's session config entry
``session.intra_op_thread_affinities`` (see :func:`affinities`); absent or ``none``: no pinning.
``compiled_cache`` (given at open time, :mod:`.cache`): the graph as ORT optimized it here is saved to a cache
folder (``SessionOptions.optimized_model_filepath``) and later opens load it with the optimizations off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import cache, machine
from .base import IO, Pool, Runner, ThreadPool, Unsupported

PACKAGES = ("onnxruntime",)
#: What a fresh process imports to run this engine (a cold start times it apart from the load).
IMPORTS = ("onnxruntime",)
MODEL_FILE = "model.onnx"
#: ONNX Runtime's own compiled cache: the optimized graph, saved once and loaded as it is.
CACHE = cache.Declared("optimized model file (SessionOptions.optimized_model_filepath): the graph as ONNX Runtime "
                       "optimized it on this CPU, loaded with graph optimizations off")  # fmt: skip
OPTIMIZED_FILE = "optimized.onnx"


SESSIONS = ("shared", "per_request")
#: How the intra-op pool's threads are pinned: not at all (ORT's default once the thread count is set), or
#: each to a logical CPU of its own.
AFFINITIES = ("none", "one_cpu_each")


def open(model_dir: Path, settings: Mapping[str, Any], io: IO) -> Runner:  # noqa: A001 - the runtime interface
    if settings.get("sessions", "shared") not in SESSIONS:
        raise Unsupported(f"sessions={settings.get('sessions')!r} is not one of {SESSIONS}",
                          fix="set sessions to shared or per_request")  # fmt: skip
    settings = {**settings, "affinities": affinities(settings)}
    source = Path(model_dir) / settings.get("model_file", MODEL_FILE)
    asked = cache.settings_of(settings)
    if asked is None:
        return _OrtRunner(session(source, settings), io, source, settings)
    folder, key = asked
    version = machine.installed_version(PACKAGES)
    state = cache.begin(folder, "onnxruntime", version, key)
    optimized = folder / OPTIMIZED_FILE
    if state == cache.USED:  # optimized already: optimizing it again is the time the cache saves
        settings = {**settings, "graph_optimization_level": "ORT_DISABLE_ALL"}
        runner = _OrtRunner(session(optimized, settings), io, optimized, settings)
    else:
        runner = _OrtRunner(session(source, settings, save_optimized=optimized), io, source, settings)
        cache.seal(folder, "onnxruntime", version, key)
    runner.cache = state
    return runner


def affinities(settings: Mapping[str, Any]) -> str | None:
    """ORT's ``session.intra_op_thread_affinities`` for ``settings``, or ``None`` (no pinning).

    ORT pins the ``intra_op_num_threads - 1`` threads of its pool, never the calling thread, and reads
    one entry per pool thread, ``;``-separated, numbering logical processors from 1 (``"2;3"``: the two
    pool threads of 3 on CPUs 1 and 2). ``one_cpu_each`` gives pool thread k the k-th CPU this process may
    run on (``sched_getaffinity``: a container's or ``taskset``'s set), leaving the first to the caller.
    ORT only logs an id outside the machine and runs unpinned, so the ids are checked here.
    """
    policy = settings.get("intra_op_thread_affinities", "none")
    if policy == "none":
        return None
    if policy not in AFFINITIES:
        raise Unsupported(f"intra_op_thread_affinities={policy!r} is not one of {AFFINITIES}",
                          fix="set it to none or one_cpu_each")  # fmt: skip
    threads = int(settings.get("intra_op_num_threads", 0))
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if threads < 2 or threads > len(allowed):
        raise Unsupported(f"intra_op_thread_affinities={policy} pins intra_op_num_threads={threads} threads, one per "
                          f"logical CPU, and this process may run on {len(allowed)}",
                          fix=f"set intra_op_num_threads to 2..{len(allowed)}, or intra_op_thread_affinities to none")  # fmt: skip
    return ";".join(str(cpu + 1) for cpu in allowed[1:threads])


def session(model: str | Path | bytes, settings: Mapping[str, Any] | None = None, *,
            save_optimized: Path | None = None) -> Any:  # fmt: skip
    """An ONNX Runtime CPU session on ``model`` (a file, or a serialized ModelProto) with ``settings``'
    ``SessionOptions`` (the names above; absent ones take ORT's defaults); ``save_optimized``: where ORT writes
    the graph it optimized (``optimized_model_filepath``).

    The one place autodeploy opens ONNX Runtime: the runners here, and the sessions that are not a
    measured artifact (the quantizer's calibration and judge, the zoo's builders, TFLite's layout probe),
    so every session is made, and can be read, in one way.
    """
    import onnxruntime as ort

    settings = settings or {}
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(settings.get("intra_op_num_threads", 0))
    options.inter_op_num_threads = int(settings.get("inter_op_num_threads", 0))
    options.execution_mode = getattr(ort.ExecutionMode, settings.get("execution_mode", "ORT_SEQUENTIAL"))
    options.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, settings.get("graph_optimization_level", "ORT_ENABLE_ALL")
    )
    options.log_severity_level = 3  # warnings from quantized graphs are noise in a benchmark
    if save_optimized is not None:
        options.optimized_model_filepath = str(save_optimized)
    pinned = affinities(settings)
    if pinned:
        options.add_session_config_entry("session.intra_op_thread_affinities", pinned)
    return ort.InferenceSession(
        model if isinstance(model, bytes) else str(model), sess_options=options, providers=["CPUExecutionProvider"]
    )


class _OrtRunner(Runner):
    def __init__(self, session: Any, io: IO, model: Path, settings: Mapping[str, Any]) -> None:
        super().__init__(io)
        self._session = session
        self._model, self._settings = model, dict(settings)  # what a request's own session opens

    def _pool(self, requests: int | None) -> Pool:
        # Default: as many requests as the cores hold at the session's thread count.
        threads = int(self._settings.get("intra_op_num_threads", 0)) or (os.cpu_count() or 1)
        n = requests or max(1, (os.cpu_count() or 1) // threads)
        names = list(self.output_names)
        if self._settings.get("sessions", "shared") == "shared":
            sessions = [self._session] * n
        else:
            sessions = [self._session] + [session(self._model, self._settings) for _ in range(n - 1)]
        pool = ThreadPool([lambda feeds, s=s: s.run(names, dict(feeds)) for s in sessions])
        pool.info.update(sessions=len({id(s) for s in sessions}), intra_op_num_threads=threads)
        return pool

    def _run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self._session.run(list(self.output_names), dict(feeds))

    def describe(self) -> dict[str, Any]:
        """The session config entries set beyond the ``SessionOptions`` attributes (the pinning as applied)."""
        pinned = self._settings.get("affinities")
        return {"session.intra_op_thread_affinities": pinned} if pinned else {}

    def _close(self) -> None:
        del self._session
