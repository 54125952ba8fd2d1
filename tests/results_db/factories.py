"""Trial results built directly from the dataclasses (no engine runs)."""

from __future__ import annotations

import dataclasses
from typing import Any

from autodeploy.accuracy.records import Accuracy, OutputAccuracy
from autodeploy.adapters.base import TrialConfig
from autodeploy.harness.result import LatencyStats, Measurement, TrialResult
from autodeploy.results_db import DeviceRecord, ModelRecord

MODEL = ModelRecord(
    sha256="ab" * 32,
    name="tiny-cnn",
    path="/models/tiny_cnn.onnx",
    inputs=[{"name": "x", "dtype": "float32", "shape": ["N", 3, 32, 32]}],
    outputs=[{"name": "logits", "dtype": "float32", "shape": ["N", 10]}],
)
DEVICE = DeviceRecord(
    fingerprint="fp-" + "0" * 16, cpu="Test CPU @ 3.0GHz", info={"cores": 8, "isa": ["avx2"]}
)


def config(engine: str = "onnxruntime", **kw: Any) -> dict[str, Any]:
    return {"engine": engine, "precision": "fp32", "batch": 1, "threads": 4, "knobs": {}, **kw}


def ok_result(uid: str = "trial-ok", *, median: float | None = 1.25, **kw: Any) -> TrialResult:
    """A measured result; keywords naming a :class:`Measurement` field (``latency``, ``accuracy``, ...) change
    the measurement, the others the result (``config`` may be a dict)."""
    samples = tuple(1.0 + i / 1000 for i in range(700))
    latency = LatencyStats(
        n=len(samples), median=median, mean=1.35, stdev=0.05, cv=0.037, min=1.0, max=1.699,
        median_ci=(1.2, 1.3), p90=1.63, p90_ci=(1.62, 1.64), p99=1.69, p99_ci=(1.68, 1.7), unstable=False,
    )  # fmt: skip
    accuracy = Accuracy(
        outputs=(OutputAccuracy("logits", max_abs=1e-6, mean_rel=2e-7, cosine=1.0, top1_agreement=1.0),),
        n_samples=64, constraint="top1_agreement >= 0.99", passed=True,
    )  # fmt: skip
    measured = {f.name for f in dataclasses.fields(Measurement)}
    measurement = Measurement(
        scenario="single-stream", batch=1, latency=latency, throughput=800.0, peak_rss_mb=42.0, artifact_mb=1.5,
        build_s=0.3, warmup_calls=12, duration_s=2.5, accuracy=accuracy, samples_ms=samples,
    )  # fmt: skip
    measurement = dataclasses.replace(measurement, **{k: v for k, v in kw.items() if k in measured})
    fields: dict[str, Any] = dict(
        uid=uid, config=config(), status="ok", engine_version="1.20.0", measurement=measurement,
    )  # fmt: skip
    fields.update({k: v for k, v in kw.items() if k not in measured})
    fields["config"] = _config(fields["config"])
    return TrialResult(**fields)


def failed_result(uid: str = "trial-failed", **kw: Any) -> TrialResult:
    return TrialResult.failed(
        uid, _config(config(engine="openvino", precision="int8")), "build_failed", "boom\nline 2", **kw
    )


def _config(value: TrialConfig | dict[str, Any]) -> TrialConfig:
    return value if isinstance(value, TrialConfig) else TrialConfig.from_dict(value)
