"""Fleet jobs: a model submitted once, tuned by an agent on every device (docs/architecture.md, "Fleet").

* :mod:`.jobs`: the submitter's side: ``submit``, ``status``, ``export``, ``cancel``.
* :mod:`.agent`: the device's side: register, heartbeat, take a run, tune, ship the winner.
* :mod:`.ledger`: the record in the results store (agents, jobs, runs, blobs): what happened.
* :mod:`.queue`: PgQueuer, in its own schema: who holds which run, leases, re-picks.

PostgreSQL only (SQLite is refused in one line); pgqueuer and psycopg come with the ``fleet`` extra and are
imported when a queue is opened.
"""
