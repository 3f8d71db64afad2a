"""The command layer turns every failure into one line on stderr and an exit code, never a traceback."""

from __future__ import annotations

import pytest
import typer

from edgedeploy.cli.common import guard
from edgedeploy.errors import TargetError


@pytest.mark.parametrize("exc,code,text", [
    (TargetError("t.toml: key `name` is 'a\nb'", "rename it"), 4, "t.toml: key `name` is 'a b'"),
    (PermissionError(13, "Permission denied", "/x/report.html"), 3, "/x/report.html: Permission denied"),
    (TypeError("unexpected"), 1, "internal error (TypeError: unexpected)"),
])
def test_failures_are_one_line_and_an_exit_code(capsys, exc, code, text):
    with pytest.raises(typer.Exit) as out:
        with guard():
            raise exc
    assert out.value.exit_code == code
    err = capsys.readouterr().err
    assert text in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_command_lines_own_exits_pass_through():
    with pytest.raises(typer.Exit) as out:
        with guard():
            raise typer.Exit(0)
    assert out.value.exit_code == 0
