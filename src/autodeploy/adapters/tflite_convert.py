"""The TFLite converter's child process: ``python -m autodeploy.adapters.tflite_convert JOB.json``.

It runs in its own process because onnx2tf calls ``sys.exit`` on errors, prints freely and
loads TensorFlow (seconds, and memory the worker need not keep). ``JOB.json`` holds one of:

* ``onnx2tf``: keyword arguments for ``onnx2tf.convert`` (the ONNX file → a SavedModel and the
  float32/float16 .tflite files), and ``onnxslim`` (bool): simplify the ONNX file in place with
  onnxslim first (one rung of :data:`autodeploy.adapters.tflite.LADDER`);
* ``quantize``: ``{"saved_model": DIR, "output": PATH, "precision": "int8-dynamic" | "int8",
  "calibration": {INPUT: NPY_PATH}}``: one quantized file converted from the SavedModel that
  onnx2tf wrote, so no precision pays for onnx2tf again. This replaces onnx2tf's
  ``output_integer_quantized_tflite``, which converts five variants (dynamic range, int8,
  full-int8 I/O and two int16-activation ones) when only one is used: on ResNet-50 the four
  unused ones took about 5 of 7 minutes. The settings are onnx2tf's own: dynamic range is
  ``Optimize.DEFAULT`` with no representative data; full int8 adds the calibration data, int8
  builtins plus select TF ops, per-channel weights, float32 inputs and outputs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

SIGNATURE_KEY = "serving_default"


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    if "quantize" in job:
        _quantize(job["quantize"])
        return 0
    if job.get("onnxslim"):
        import onnxslim

        source = job["onnx2tf"]["input_onnx_file_path"]
        onnxslim.slim(source, source)
    import onnx2tf

    onnx2tf.convert(**job["onnx2tf"])
    return 0


def _quantize(job: dict[str, Any]) -> None:
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(job["saved_model"])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    if job["precision"] == "int8":
        converter.representative_dataset = _representative(job["saved_model"], job["calibration"])
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.SELECT_TF_OPS]
    Path(job["output"]).write_bytes(converter.convert())


def _representative(saved_model: str, paths: dict[str, str]) -> Any:
    """The calibration data, batch by batch, under the SavedModel signature's input names."""
    import tensorflow as tf

    signature = tf.saved_model.load(saved_model).signatures[SIGNATURE_KEY]
    specs: dict[str, Any] = signature.structured_input_signature[1]
    calibration = {name: np.load(path) for name, path in paths.items()}
    if len(specs) == 1 and len(calibration) == 1:  # one input: its SavedModel name may differ
        calibration = {next(iter(specs)): next(iter(calibration.values()))}
    missing = sorted(set(specs) - set(calibration))
    if missing:
        raise SystemExit(f"no calibration data for the SavedModel inputs {missing}")
    items = min(len(v) for v in calibration.values())
    batch = next(iter(specs.values())).shape[0] or 1  # a fixed batch dimension takes whole batches

    def representative() -> Any:
        for start in range(0, items - batch + 1, batch):
            yield {k: tf.constant(v[start : start + batch], tf.float32) for k, v in calibration.items()}

    return representative


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
