"""How each distribution's paths are proven: gpuserve/data/host/proven.yaml is
docs/hosts.md's matrix as data (held to it here), said by ``gpuserve check``."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.host.proven import (
    PATHS,
    distribution_of,
    proven,
    proven_line,
    proven_on_host,
    support,
)
from gpuserve.launch.interpreter import known_distributions, recorded_facts

HOSTS_MD = Path(__file__).resolve().parents[3] / "docs" / "hosts.md"


def matrix_rows() -> dict[str, str]:
    """docs/hosts.md "The matrix": distribution name -> its table row."""
    text = HOSTS_MD.read_text().split("## The matrix", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln]
    return {ln.split("|")[1].strip(): ln for ln in rows[1:]}


def test_every_recorded_distribution_is_in_the_data_and_the_matrix() -> None:
    rows = matrix_rows()
    data = support()["distributions"]
    assert set(data) == set(known_distributions())
    assert {entry["name"] for entry in data.values()} == \
        {name for name in rows if not name.startswith("anything else")}


@pytest.mark.parametrize("distro", known_distributions())
def test_the_matrix_says_what_the_data_says(distro) -> None:
    """A level in the data is the matrix's word for it in that distribution's row."""
    row = matrix_rows()[support()["distributions"][distro]["name"]]
    for path in PATHS:
        level, _ = proven(distro, path)
        if level == "untested" and path == "host":
            assert "host deploy untested" in row, distro
        elif level in ("lab", "recorded"):
            assert f"**{level}**" in row, (distro, path)
    if all(proven(distro, p)[0] != "lab" for p in PATHS):
        assert "**lab**" not in row, distro


@pytest.mark.parametrize("distro", known_distributions())
def test_a_host_s_os_release_names_its_distribution(distro) -> None:
    assert distribution_of(recorded_facts(distro).os_release) == distro
    assert distribution_of({"ID": "rocky", "VERSION_ID": "9"}) is None


def test_check_says_how_each_path_is_proven(tmp_path, capsys) -> None:
    inv = tmp_path / "inv.py"
    inv.write_text("gpu = [('gpu1', {'ssh_hostname': '192.0.2.10', 'profile': "
                   "'glm5-nvfp4-tp8', 'host_distribution': 'ubuntu2404'}), "
                   "('gpu2', {'ssh_hostname': '192.0.2.11', 'profile': 'glm5-nvfp4-tp8'})]\n")
    rc = main(["check", str(inv)])
    out = capsys.readouterr().out
    assert rc == 0, out
    how = [ln.split("how", 1)[1].strip() for ln in out.splitlines()
           if ln.split()[:1] == ["how"]]
    assert how == [proven_line("ubuntu2404", "serve"), proven_line("ubuntu2404", "host")]
    assert how[1].startswith("Ubuntu 24.04 host deploy: untested; ")
    assert how[0].startswith("Ubuntu 24.04 serve path: tested against recorded outputs only")
    assert "# how proven (lab-tested, recorded outputs, untested) is said for hosts whose " \
           "data names host_distribution" in out  # gpu2 names none


def test_the_deploy_names_the_host_s_own_distribution() -> None:
    assert proven_on_host(recorded_facts("debian12").os_release, "host") == \
        proven_line("debian12", "host")
    assert proven_on_host({"ID": "rocky", "VERSION_ID": "9"}, "host") == \
        "rocky 9 host deploy: untested; not in docs/hosts.md's matrix"
