"""The service account must be one gpuserve created: root, UID 0 names and existing
accounts or groups gpuserve did not create are refused before any host change."""

from __future__ import annotations

import pytest
from pyinfra.facts.server import Groups, Users

from gpuserve.errors import InputError
from gpuserve.roles.sglang import ACCOUNT_MARK, check_account
from gpuserve.serve.install import validate_user

SOURCE = "inventory/gpu.py"
# /etc/passwd lines as on Debian 12, read through pyinfra's own Users fact (the one
# server.user reads), as "ENTRY|group|groups|lastlog|password"
ROOT = "root:x:0:0:root:/root:/bin/bash"
TOOR = "toor:x:0:0:second root:/root:/bin/bash"
ADMIN = "debian:x:1000:1000:Debian,,,:/home/debian:/bin/bash"
LEGACY = "sglang:x:999:999:gpuserve SGLang server:/opt/gpuserve/cache:/usr/sbin/nologin"
OURS = f"sglang:x:999:999:{ACCOUNT_MARK}:/opt/gpuserve/cache:/usr/sbin/nologin"


def entry(line: str | None) -> dict | None:
    if line is None:
        return None
    name = line.split(":")[0]
    return Users().process([f"{line}|{name}|{name}||"])[name]


def refused(line: str | None, user: str, group_line: str | None = None) -> InputError:
    with pytest.raises(InputError) as e:
        check_account(entry(line), user in Groups().process([group_line or ""]), user, SOURCE)
    assert e.value.file == SOURCE and e.value.field == "sglang_user"
    return e.value


def test_root_is_refused_at_prepare_time() -> None:
    with pytest.raises(InputError) as e:
        validate_user("root", SOURCE)
    assert (e.value.file, e.value.field) == (SOURCE, "sglang_user")
    assert "does not exist yet" in e.value.message
    assert validate_user("sglang", SOURCE) == "sglang"


@pytest.mark.parametrize("line", [ROOT, TOOR])
def test_any_uid_0_account_is_refused(line: str) -> None:
    name = line.split(":")[0]
    assert "UID 0" in refused(line, name).message


def test_existing_foreign_account_is_never_taken_over() -> None:
    err = refused(ADMIN, "debian", "debian:x:1000:")
    assert "gpuserve did not create it" in err.message and "never modifies" in err.message


def test_existing_group_without_the_user_is_refused() -> None:
    # useradd would make the new account a member of sudo/docker/shadow
    err = refused(None, "sudo", "sudo:x:27:debian")
    assert "groupdel sudo" in err.message


@pytest.mark.parametrize("line", [OURS, LEGACY])
def test_gpuserve_accounts_are_accepted_including_earlier_versions(line: str) -> None:
    check_account(entry(line), True, "sglang", SOURCE)


def test_absent_account_is_created() -> None:
    check_account(None, False, "sglang", SOURCE)
