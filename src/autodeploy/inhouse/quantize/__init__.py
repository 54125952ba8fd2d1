"""Post-training INT8 quantization to QDQ ONNX, with an accuracy-aware fallback.

:func:`quantize` (:mod:`.pipeline`, whose docstring lists its steps) with its :class:`QuantConfig`
(:mod:`.common`, shared by the steps) and :class:`QuantReport`. The steps live in submodules that
never import this package: :mod:`.qdq`, :mod:`.calibrate`, :mod:`.smooth`, :mod:`.bias`,
:mod:`.fallback`, :mod:`.mixed`, :mod:`.evidence`, :mod:`.run`; :mod:`.scope` serves the engines'
own quantizers.
"""

from autodeploy.inhouse.quantize.common import QuantConfig
from autodeploy.inhouse.quantize.pipeline import QuantReport, quantize

__all__ = ["QuantConfig", "QuantReport", "quantize"]
