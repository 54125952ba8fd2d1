"""The TFLite converter's child process: ``python -m autodeploy.adapters.tflite_convert JOB.json``.

It runs in its own process because onnx2tf calls ``sys.exit`` on errors, prints freely and
loads TensorFlow (seconds, and memory the worker need not keep). ``JOB.json`` holds:

* ``onnx2tf``: keyword arguments for ``onnx2tf.convert`` (the ONNX file → a SavedModel and
  the float32/float16 .tflite files, plus dynamic-range int8 when asked);
* ``int8`` (optional): ``{"output": PATH, "calibration": {INPUT: NPY_PATH}}``: full integer
  quantization of that SavedModel, done here rather than by onnx2tf's
  ``output_integer_quantized_tflite``, which converts five variants (dynamic range, int8,
  full-int8 I/O and two int16-activation ones) when only one is used: on ResNet-50 the four
  unused ones took about 5 of 7 minutes. The settings are onnx2tf's own for its
  ``_integer_quant.tflite``: ``Optimize.DEFAULT``, int8 builtins plus select TF ops,
  per-channel weights, float32 inputs and outputs.
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
    import onnx2tf

    onnx2tf.convert(**job["onnx2tf"])
    if job.get("int8"):
        _full_integer(Path(job["onnx2tf"]["output_folder_path"]), job["int8"])
    return 0


def _full_integer(saved_model: Path, int8: dict[str, Any]) -> None:
    import tensorflow as tf

    signature = tf.saved_model.load(str(saved_model)).signatures[SIGNATURE_KEY]
    specs: dict[str, Any] = signature.structured_input_signature[1]
    calibration = {name: np.load(path) for name, path in int8["calibration"].items()}
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

    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.SELECT_TF_OPS]
    converter.representative_dataset = representative
    Path(int8["output"]).write_bytes(converter.convert())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
