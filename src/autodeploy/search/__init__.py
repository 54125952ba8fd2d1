"""The search: a plain Optuna study over engine × precision × batch × threads × knobs per device.

``config.py`` validates a study config once at the edge; ``space.py`` turns an Optuna trial
into a :class:`~autodeploy.adapters.base.TrialConfig` (define-by-run); ``objective.py`` turns
a measured result into objective values and constraint violations; ``study.py`` drives the
study (``run_study``): ``screening.py`` measures one trial, ``finalists.py`` re-measures the best
configs interleaved (``rounds.py``; ``pairing.py`` the winner and the baseline again as pairs where load spoiled
their rounds) and picks the winner (``winner.py``), ``storage.py`` is Optuna's side (RDB storage, sampler,
heartbeat, ranking); ``context.py`` and ``summary.py`` hold what a run is given and what it says.
"""
