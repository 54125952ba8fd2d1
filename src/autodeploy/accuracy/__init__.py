"""Accuracy against the fp32 reference: what "accurate enough" means for each output, and the comparison.

What an output means and so what it is judged by (:mod:`.kinds`), the records a comparison makes and the
budget's limits (:mod:`.records`), the pass/fail rule and the worst output (:mod:`.rules`), and the comparison
itself (:mod:`.measure`: each output against the reference, the graph's facts of each output read once).
Below both the harness, which measures every trial's accuracy with it, and the in-house quantizer, whose
judge runs the same comparison on calibration data so the int8 it chooses is judged as the harness will
judge it; :mod:`autodeploy.verdict` reads the drop for the study's constraints. Importing this package imports
nothing; :mod:`.kinds`, :mod:`.records` and :mod:`.rules` are stdlib only, :mod:`.measure` needs numpy.
"""
