"""``autodeploy schema``: the JSON Schema that every ``--format json`` record follows."""

from __future__ import annotations

import json
import sys


def schema() -> None:
    """Print the JSON Schema (draft 2020-12) of the trial and study records that --format json prints."""
    from autodeploy.report import SCHEMA

    sys.stdout.write(json.dumps(SCHEMA, indent=2) + "\n")
