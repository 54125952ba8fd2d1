"""Run the ``autodeploy`` CLI in-process for tests."""

from __future__ import annotations

from autodeploy.cli.app import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``autodeploy ARGV``; return (exit code, stdout, stderr)."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err
