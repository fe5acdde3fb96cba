"""Every command's output reaches the terminal with control characters escaped.

Regression from the CLI sweep: ``compare`` escaped its rows, but ``doctor`` printed a
host's own hostname (from the facts the host reports), ``check`` an inventory's host
names and every error message a profile's unknown key raw, so ESC[2J from a file or a
host cleared the operator's terminal."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

from gpuserve.cli import main
from gpuserve.terminal import EscapingWriter, printable

ESC = "\x1b[2J"


def test_the_writer_escapes_and_keeps_line_breaks() -> None:
    buf = io.StringIO()
    EscapingWriter(buf).write(f"a{ESC}\nb\r\u202e\n")
    assert buf.getvalue() == "a\\x1b[2J\nb\\r\\u202e\n"
    assert printable("glm5-nvfp4-tp8 [1]  ü") == "glm5-nvfp4-tp8 [1]  ü"


def test_doctor_escapes_the_hostname_a_host_reports(tmp_path: Path, capsys) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text('{"hostname": "gpu1\\u001b[2J"}')
    main(["doctor", "--profile", "glm5-nvfp4-tp8", "--facts", str(facts)])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "host gpu1\\x1b[2J" in out


def test_error_messages_escape_what_they_quote(tmp_path: Path, capsys) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text(f'model:\n  path: /m\n"{ESC}evil": 1\n'.replace("\x1b", "\\e"))
    assert main(["render", "--profile", str(profile)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[2Jevil: unknown key" in err


def test_argparse_errors_are_escaped_too(capsys) -> None:
    with contextlib.suppress(SystemExit):
        main(["plan", f"--no-such{ESC}"])
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[2J" in err


def test_streams_are_restored_after_a_command(capsys) -> None:
    before = sys.stdout
    main(["render", "--profile", "glm5-nvfp4-tp8"])
    assert sys.stdout is before
