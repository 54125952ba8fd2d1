"""A plug-in engine that autodeploy knows nothing about: onnx's own reference evaluator.

It is what adding an engine takes: one adapter file (:mod:`.adapter`), one runtime file
(:mod:`.runtime`) and one registry entry, here an ``autodeploy.engines`` entry point of an
installed distribution (``tests/adapters/test_plugin.py`` installs one into a temporary
site folder). Nothing in ``src/`` names it.

:mod:`.served` is a second plug-in that runs on autodeploy's ONNX Runtime runtime, so it can be
bundled: it declares a Triton backend and a runner extra of its own, and wins a study against ONNX
Runtime on a model whose weights are also graph inputs (``tests/bundle/test_plugin_engine.py``).
"""
