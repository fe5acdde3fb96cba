"""``gpuserve logs``: the last start's diagnosis from a journal, the unknown-host and
unreachable errors, and secrets masked (the journal itself comes from the lab test)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.commands import _readonly
from gpuserve.commands._readonly import connection_cause, failure, host_data
from gpuserve.commands.logs import last_start
from gpuserve.errors import InputError
from gpuserve.launch.secrets import host_secret_values
from gpuserve.redact import REDACTED, redact
from tests.cli_fork import forked_subprocess

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
STARTED = ("2026-12-05T01:18:26.318730+0000 gpu1 systemd[1]: Started "
           "gpuserve-sglang.service - SGLang server (gpuserve).")


def journal(log: str) -> str:
    """A log fixture as journalctl -o short-iso-precise prints the unit's lines (the
    prefix is journalctl's documented format; the SGLang lines are the fixture's)."""
    lines = [line for line in (FIXTURES / log).read_text().splitlines()
             if line and not line.startswith("#")]
    return "\n".join(f"2026-12-05T01:19:{i % 60:02d}.000000+0000 gpu1 sglang[680]: {line}"
                     for i, line in enumerate(lines))


def test_the_last_start_is_diagnosed_not_an_earlier_one() -> None:
    text = "\n".join([STARTED, journal("fieldnote_glm5_capture_oom.log"),
                      STARTED.replace("01:18:26", "01:30:00"), journal("fieldnote_glm5_tp8.log")])
    start, diagnosis = last_start(text)
    assert start.startswith("2026-12-05T01:30:00")
    standalone = last_start("\n".join([STARTED, journal("fieldnote_glm5_tp8.log")]))[1]
    assert diagnosis is not None and diagnosis.to_dict() == standalone.to_dict()


def test_a_start_without_sglang_lines_yet_and_no_start() -> None:
    assert last_start(STARTED)[1] is None and last_start(STARTED)[0] == STARTED
    assert last_start("2026-12-05T01:00:00.0+0000 gpu1 sglang[1]: hello") == (None, None)


def test_unknown_host_is_named_before_any_connection(tmp_path) -> None:
    inventory = tmp_path / "inv.py"
    inventory.write_text("gpu = ['gpu1', 'gpu2']\n")
    with pytest.raises(InputError) as info:
        host_data(str(inventory), "gpu3", [])
    assert "unknown host 'gpu3'" in str(info.value) and "gpu1, gpu2" in str(info.value)
    with pytest.raises(InputError, match="name one"):
        host_data(str(inventory), None, [])
    assert host_data(str(inventory), "gpu2", ["profile=x"]) == ("gpu2", {"profile": "x"})
    assert main(["logs", str(inventory), "--limit", "gpu3"]) == 2


def test_failure_lines() -> None:
    out = ("--> Connecting to hosts...\n    [gpu1] Could not connect (Connection refused)\n"
           "--> pyinfra error: No hosts remaining!\n")
    assert failure("gpu1", out) == ("gpu1: unreachable: connection refused; fix: check that "
                                    "sshd listens on ssh_port and the address is right")
    assert failure("gpu1", "x\n    [gpu1] gpuserve: error: inv.py: profile: required\n") \
        == "inv.py: profile: required"


def test_secrets_of_host_data_are_masked() -> None:
    data = {"hf_token": "hf_abcdefghijklmnop", "sglang_api_key": "sk-0123456789abcdef",
            "sglang_extra_env": {"MY_API_KEY": "extra-secret-value", "NCCL_DEBUG": "WARN"}}
    secrets = host_secret_values(data)
    text = "token=hf_abcdefghijklmnop key sk-0123456789abcdef extra-secret-value WARN"
    assert redact(text, secrets) == f"token={REDACTED} key {REDACTED} {REDACTED} WARN"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("verb", "key", "says"), [
    ("logs", None, "connection refused on 127.0.0.1 port {port}; fix: check that sshd"),
    ("render", None, "connection refused on 127.0.0.1 port {port}; fix: check that sshd"),
    ("logs", "/nonexistent/id_ed25519", "SSH key missing: /nonexistent/id_ed25519; fix: "
     "set ssh_key to an existing private key file"),
])
def test_an_unreachable_host_is_one_line(tmp_path, capsys, monkeypatch, verb, key,
                                         says) -> None:
    """The read-only run through the real pyinfra CLI and SSH connector, to a loopback
    port nothing listens on; with a key file that does not exist pyinfra prints a
    greenlet's traceback, and the line still says the cause alone."""
    port = closed_port()
    inventory = tmp_path / "inv.py"
    extra = f', "ssh_key": {key!r}' if key else ""
    inventory.write_text(f'hosts = [("dead", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port}, '
                         f'"profile": "glm5-nvfp4-tp8"{extra}}})]\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_readonly, "subprocess", forked_subprocess())  # the same CLI, forked
    assert main([verb, "inv.py", "--limit", "dead"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuserve: error: dead: unreachable: " + says.format(port=port)), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_pyinfra_connector_errors_keep_their_cause() -> None:
    """pyinfra's own SSH connector, in process, bounded by CONNECT_TIMEOUT: what it raises
    for a closed port and for a missing key file becomes one line with the cause."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.exceptions import PyinfraError

    port = closed_port()
    for data, cause in (({"ssh_port": port}, f"connection refused on 127.0.0.1 port {port}"),
                        ({"ssh_port": port, "ssh_key": "/nonexistent/key"},
                         "SSH key missing: /nonexistent/key")):
        inv = Inventory((["127.0.0.1"], {**data, "ssh_connect_retries": 0}))
        state = State(inv, Config(CONNECT_TIMEOUT=5))
        host = next(iter(inv))
        with pytest.raises(PyinfraError) as e:
            host.connect(show_errors=False, raise_exceptions=True)
        line = connection_cause(str(e.value))
        assert line.startswith(cause + "; fix: ") and "\n" not in line, line
        del state
