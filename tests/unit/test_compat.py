"""gpuserve/facts/compat.py: the command line as pyinfra's own CLI parses it."""

from __future__ import annotations

import sys

from gpuserve.facts.compat import cli_params


def test_pyinfras_argv_is_parsed_by_its_own_click_command(monkeypatch) -> None:
    # deploy files run in greenlets that do not see the CLI's click context
    monkeypatch.setattr(sys, "argv", ["/repo/.venv/bin/pyinfra", "-y", "inventory/lab.py",
                                      "deploy/serve.py", "--dry", "--diff", "--serial",
                                      "--data", "profile=glm5-nvfp4-tp8-ep8"])
    params = cli_params()
    assert params["inventory"] == "inventory/lab.py"
    assert params["dry"] and params["diff"] and params["serial"] and params["yes"]


def test_another_program_is_not_taken_for_pyinfra(monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/usr/bin/myscript", "--dry", "inventory.py"])
    assert cli_params() == {}
    monkeypatch.setattr(sys, "argv", ["/repo/.venv/bin/pyinfra", "-y", "inv.py", "deploy/x.py"])
    assert cli_params()["dry"] is False
