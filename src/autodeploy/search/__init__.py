"""The search: a plain Optuna study over engine × precision × batch × threads × knobs per device.

``config.py`` validates a study config once at the edge; ``space.py`` turns an Optuna trial
into a :class:`~autodeploy.adapters.base.TrialConfig` (define-by-run); ``objective.py`` turns
a measured result into objective values and constraint violations; ``study.py`` drives the
study, re-measures the finalists interleaved and picks the winner.
"""
