"""https unless trusted, and the keyring digest, at the host deploy's prepare time
(gpuserve/plans/host.plan_host, which deploy/host.py and ``gpuserve check`` both run)."""

from __future__ import annotations

import pytest

from gpuserve.errors import InputError
from gpuserve.host import keyring, mirrors
from gpuserve.plans.host import plan_host

SRC = "inventory/gpu.py"
REPO = "http://10.0.2.2:8000/cuda/repos/debian12/x86_64/"


def test_plain_http_repo_is_refused_naming_the_field_and_the_fix():
    with pytest.raises(InputError) as info:
        plan_host({"nvidia_repo_url": REPO}, SRC)
    assert (info.value.file, info.value.field) == (SRC, "nvidia_repo_url")
    assert 'trusted_mirrors: ["http://10.0.2.2:8000/"]' in info.value.message


def test_trusted_prefix_admits_the_mirror_and_only_it():
    settings = plan_host({"nvidia_repo_url": REPO, "trusted_mirrors": ["http://10.0.2.2:8000"]},
                         SRC)
    assert settings.repo_url == REPO
    for other in ("http://10.0.2.2:8000.evil.test/cuda/", "http://10.0.2.2:80/cuda/",
                  "http://10.0.2.20:8000/cuda/"):
        with pytest.raises(InputError) as info:
            plan_host({"nvidia_repo_url": other, "trusted_mirrors": ["http://10.0.2.2:8000"]},
                      SRC)
        assert info.value.field == "nvidia_repo_url", other


def test_https_and_local_repos_need_no_trust():
    assert plan_host({"nvidia_repo_url": "https://m.example/cuda/"}, SRC).repo_url
    assert plan_host({"nvidia_repo_url": "file:///srv/cuda/"}, SRC).repo_url
    assert plan_host({}, SRC).repo_url is None  # NVIDIA's own, https


@pytest.mark.parametrize("value", ["abc", "g" * 64, 42, ["ab" * 32]])
def test_bad_keyring_sha256_is_refused(value):
    with pytest.raises(InputError) as info:
        plan_host({"nvidia_keyring_sha256": value}, SRC)
    assert (info.value.file, info.value.field) == (SRC, "nvidia_keyring_sha256")


def test_keyring_sha256_is_normalised_and_the_table_covers_the_supported_distros():
    assert keyring.validate_sha256(" " + "AB" * 32 + " ", SRC) == "ab" * 32
    for where in ("debian12/x86_64", "ubuntu2204/x86_64", "ubuntu2404/x86_64"):
        digest = keyring.pinned(where)
        assert digest and len(digest) == 64 and int(digest, 16) >= 0, where
    assert keyring.repo_dir(
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
    ) == "debian12/x86_64"
    with pytest.raises(InputError) as info:
        keyring.expected_sha256(None, "https://x/cuda/repos/fedora41/x86_64/", SRC)
    assert info.value.field == "nvidia_keyring_sha256" and "fedora41/x86_64" in info.value.message


def test_credentials_are_never_shown():
    with pytest.raises(InputError) as info:
        mirrors.require_https("http://u:s3cret@m.example/simple", "pip_index_url", (), SRC)
    assert "s3cret" not in str(info.value)
    assert mirrors.is_trusted("http://u:p@m.example/x/", ("http://m.example/",))
