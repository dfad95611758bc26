"""Plain helpers for the command-line tests: `stratagem` run in-process, and the shape of its errors.
This module holds no tests."""

from __future__ import annotations

import pytest

from stratagem.cli import main


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    streams = capsys.readouterr()
    return code, streams.out, streams.err


def assert_one_line_error(code: int, err: str, message: str) -> None:
    """Bad input exits 2 with one line naming the problem, never a traceback."""
    assert code == 2, err
    assert message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
