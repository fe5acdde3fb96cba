"""The shared @fake harness (conftest.py's ``fake_deploy``): operations come back in
pyinfra's order with their commands, facts read while preparing answer from the
responses, and host data reaches the deploy."""

from __future__ import annotations

import io

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import Command
from pyinfra.operations import files, server


@deploy("probe")
def probe() -> None:
    answer = host.get_fact(Command, command="cat /etc/marker")
    server.shell(name="first", commands=[f"echo {answer} {host.data.get('word')}"])
    files.put(name="second", src=io.StringIO("text\n"), dest="/tmp/x")
    server.shell(name="third", commands=["true"])


def test_operations_come_back_in_order_with_facts_and_data_applied(fake_deploy) -> None:
    ops = fake_deploy(probe, {"cat /etc/marker": ["seen"]}, {"word": "hello"})
    assert ops.names() == ["probe | first", "probe | second", "probe | third"]
    assert ops[0][1] == [("run", "echo seen hello")]
    assert ops.uploads() == {"/tmp/x": "text\n"}
    assert ops.runs()[-1] == "true"
    assert "cat /etc/marker" in " ".join(ops.host.connector.executed_commands)
