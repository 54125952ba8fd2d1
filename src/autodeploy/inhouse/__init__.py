"""Our own ONNX -> ONNX toolchain: graph passes, an INT8 quantizer and a memory planner.

* :mod:`autodeploy.inhouse.passes`: declarative rewrite rules on onnxscript's rewriter and an
  explicit default pipeline; every pass reports what it changed.
* :mod:`autodeploy.inhouse.quantize`: post-training INT8 in QDQ form with our own calibration
  and an accuracy-aware fallback.
* :mod:`autodeploy.inhouse.memory`: tensor lifetimes and a buffer-reuse plan.

The ``inhouse`` engine that builds with these and runs on ONNX Runtime or OpenVINO is
:mod:`autodeploy.adapters.inhouse`, beside the other engines; nothing here imports ``adapters/``.

Nothing here is imported by ``import autodeploy``; the submodules import onnx, onnxscript and
onnxruntime at their top, so import them only where they are used.
"""
