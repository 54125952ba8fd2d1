"""One runtime per engine: open an artifact folder with tuned settings and run it.

``runtime/<engine>.py`` holds ``PACKAGES`` (the distributions whose version is the engine
version), optionally ``VERSION_LOCKED = True`` (its artifacts run only under the engine version
that built them: a bundle's loader then allows no other), ``IMPORTS`` (what a fresh process imports to run it: a
cold start times it apart from the load), ``CACHE`` (the engine's compiled cache, or why it has none:
``cache.py``; ``settings["compiled_cache"]`` asks ``open`` to start from it) and ``open(model_dir, settings, io) -> Runner``. ``settings`` are the engine's own
option names (ONNX Runtime ``intra_op_num_threads``, OpenVINO ``compile_model`` properties,
...), exactly as an adapter derives them from a trial config and as a bundle's manifest
records them. The harness worker (through the adapters' ``load``) and the bundle loader run
these same files; a bundle ships them verbatim in its ``runtime/`` folder. Every engine autodeploy opens
is opened here, also where no artifact is run: ``onnxruntime.session``, ``openvino.read`` and
``openvino.compile_at``, ``tflite.interpreter`` serve the quantizer's calibration and judge, the zoo's
builders and the adapters' probes (``tests/test_engine_openings.py`` keeps it so). ``device.py`` holds the
record of the machine the engines build for (``DeviceInfo``), below the adapters and the registry; bundles
do not ship it.

Contract for every module here: it imports only the standard library, numpy and, inside
``open``, its own engine; other modules of this package only by relative import, so the
package runs unchanged outside autodeploy. Importing this package imports nothing.
"""
