"""``gpuserve check``: near misses of gpuserve's host-data keys are refused, the user's
own keys and pyinfra's are not; inventory entries pyinfra would mangle are named."""

from __future__ import annotations

import pytest

from gpuserve.commands.check import misspelt_keys, validate_groups
from gpuserve.errors import InputError


@pytest.mark.parametrize("key", ["rack", "owner", "ssh_port", "ssh_known_hosts_file",
                                 "_sudo", "_sudo_user", "docker_identifier", "profile",
                                 "sglang_version", "nvidia_driver_branch", "datacenter"])
def test_own_pyinfra_and_gpuserve_keys_pass(key) -> None:
    misspelt_keys({key: 1}, "inv.py")


@pytest.mark.parametrize("key,right", [("sglang_verison", "sglang_version"),
                                       ("profle", "profile"),
                                       ("nvidia_driver_brnach", "nvidia_driver_branch"),
                                       ("keep_venv", "keep_venvs")])
def test_near_misses_are_refused_with_the_key_they_miss(key, right) -> None:
    with pytest.raises(InputError) as err:
        misspelt_keys({key: 1}, "inv.py")
    assert err.value.file == "inv.py" and err.value.field == key
    assert f"did you mean {right}?" in err.value.message


def test_the_same_host_in_two_groups_is_pyinfra_s_normal_case() -> None:
    validate_groups("inv.py", {"gpu": [("gpu1", {"profile": "p"})], "big": ["gpu1"],
                               "all8": (["gpu1"], {"keep_venvs": 3})})


def test_the_same_host_twice_in_one_group_is_refused() -> None:
    with pytest.raises(InputError) as err:
        validate_groups("inv.py", {"gpu": ["gpu1", ("gpu1", {"profile": "p"})]})
    assert err.value.field == "gpu[1]" and "first at gpu[0]" in err.value.message
