"""Accuracy against the fp32 reference: the comparison (:mod:`.measure`) that makes the records :mod:`autodeploy.verdict` judges.

Below both the harness, which measures every trial's accuracy with it, and the in-house quantizer, whose
judge runs the same comparison on calibration data so the int8 it chooses is judged as the harness will
judge it. The pass/fail rules themselves, and the records
(``OutputAccuracy``, ``Accuracy``), are :mod:`autodeploy.verdict`'s. Importing this package imports nothing.
"""
