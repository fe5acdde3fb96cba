"""A private ``listen_address`` without an API key is served, and the deploy's checks
reach it: the host scripts find where the server listens in /proc/net/tcp{,6}.

Wanted: "listening address and API key chosen safely by default (loopback or a named
private address unless a key is set; say so in the message)". The listen rule accepted a
private address, but the plan then refused it because the health gate, smoke and
benchmark talked to 127.0.0.1 only, which a server bound to 10.0.0.21 never answers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.lock_choice import HostRuntime
from gpuserve.paths import SCRIPTS_DIR
from tests.serve_plans import plan_of

sys.path.insert(0, str(SCRIPTS_DIR))
import sglang_bench  # noqa: E402
import sglang_probe  # noqa: E402

HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
          "  timeout inode\n")
KEY = "sk-listen-0123456789abcdef"


def runtime(home: str) -> HostRuntime:
    return HostRuntime(name="gpu1", python="3.11.2", glibc="2.36", driver="580.126.20",
                       cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8)


def plan(**data):
    return plan_of({"profile": "glm5-nvfp4-tp8", **data}, "inventory/gpu.py", runtime)


@pytest.mark.parametrize("address", ["10.0.0.21", "172.16.4.4", "192.168.1.5", "fd00::5"])
def test_a_private_address_without_a_key_is_served_with_a_warning(address) -> None:
    p = plan(listen_address=address)
    assert p.service.host == address
    assert any("private address" in w and "sglang_api_key" in w for w in p.service.warnings)
    assert p.service.config_text is None  # no key was invented


@pytest.mark.parametrize("address,words", [("0.0.0.0", "every interface"),
                                           ("::", "every interface"),
                                           ("8.8.8.8", "a public address"),
                                           ("100.64.0.1", "a public address")])
def test_all_interfaces_or_public_without_a_key_is_refused_saying_what_to_do(address,
                                                                            words) -> None:
    with pytest.raises(InputError) as err:
        plan(listen_address=address)
    assert (err.value.file, err.value.field) == ("inventory/gpu.py", "listen_address")
    message = err.value.message
    assert words in message and "set sglang_api_key" in message
    assert "127.0.0.1 or a private address" in message


def test_another_loopback_address_is_served_and_reached_there() -> None:
    assert plan(listen_address="127.0.0.2").service.host == "127.0.0.2"


def test_with_a_key_a_named_public_address_is_served() -> None:
    assert plan(listen_address="203.0.113.7", sglang_api_key=KEY).service.host == \
        "203.0.113.7"


def tables(tmp_path: Path, tcp: str = "", tcp6: str = ""):
    (tmp_path / "tcp").write_text(HEADER + tcp)
    (tmp_path / "tcp6").write_text(HEADER + tcp6)
    return ((str(tmp_path / "tcp"), False), (str(tmp_path / "tcp6"), True))


def row(local: str, state: str = "0A") -> str:
    return f"   0: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 0 0 1\n"


@pytest.mark.parametrize("tcp,tcp6,want", [
    (row("1500000A:7530"), "", "10.0.0.21"),            # 10.0.0.21:30000
    (row("0100007F:7530"), "", "127.0.0.1"),            # loopback
    (row("0200007F:7530"), "", "127.0.0.2"),            # another loopback address
    ("", row("00000000000000000000000001000000:7530"), "[::1]"),
    (row("00000000:7530"), "", "127.0.0.1"),            # every interface
    ("", row("000000000000000000000000" "00000000:7530"), "127.0.0.1"),  # ::
    ("", row("000000FD000000000000000005000000:7530"), "[fd00::5]"),
    (row("1500000A:7531"), "", "127.0.0.1"),            # another port
    (row("1500000A:7530", state="01"), "", "127.0.0.1"),  # established, not listening
    ("garbage\n", "", "127.0.0.1"),
])
def test_server_host_reads_where_the_port_listens(tmp_path, tcp, tcp6, want) -> None:
    assert sglang_probe.server_host(30000, tables(tmp_path, tcp, tcp6)) == want


def test_without_proc_tables_it_is_loopback(tmp_path) -> None:
    missing = ((str(tmp_path / "none"), False),)
    assert sglang_probe.server_host(30000, missing) == "127.0.0.1"


def test_the_bench_client_is_pointed_where_the_server_listens(monkeypatch) -> None:
    monkeypatch.setattr(sglang_bench, "server_host", lambda port: "10.0.0.21")
    argv = ["--backend", "sglang", "--base-url", "http://127.0.0.1:30000", "--model", "m"]
    assert sglang_bench.reach_server(argv)[3] == "http://10.0.0.21:30000"
    assert sglang_bench.reach_server(["--base-url", "http://other:1"])[1] == "http://other:1"
