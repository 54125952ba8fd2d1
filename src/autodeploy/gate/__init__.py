"""CI regression gate: baseline vs candidate, interleaved A/B runs, a statistical verdict.

* :mod:`autodeploy.gate.measure`: the arms (model + config, or bundle) and the interleaved rounds.
* :mod:`autodeploy.gate.stats`: pure statistics (Mann-Whitney U per metric, Holm, bootstrap CI).
* :mod:`autodeploy.gate.core`: the pipeline, :class:`GateResult` and the exit codes.
* :mod:`autodeploy.gate.report`: markdown summary and JUnit XML.

Verdicts and exit codes: ``pass`` 0, ``fail`` 1, ``inconclusive`` 2; bad input 64, an error
that stops the gate 70 (``cli/gate.py``).
"""

from autodeploy.gate.core import EXIT_CODES, GateResult, GateSettings, run_gate
from autodeploy.gate.measure import Arm, bundle_arm, model_arm
from autodeploy.gate.stats import Criteria

__all__ = [
    "EXIT_CODES",
    "Arm",
    "Criteria",
    "GateResult",
    "GateSettings",
    "bundle_arm",
    "model_arm",
    "run_gate",
]
