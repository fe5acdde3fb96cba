"""Host data values are bounded before any message repeats them, and a profile reference
(host data ``profile``, ``--profile``, ``extends:``) opens only YAML files.

Regressions: a 200,000-deep list in a Python inventory's host data ended in a
RecursionError traceback at the first ``{value!r}``; ``profile: /etc/shadow`` was read
and its first line echoed in the "unknown key" message."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.launch.profiles import load_profile, profile_ref_problem


def deep(n: int) -> list:
    value: list = []
    for _ in range(n):
        value = [value]
    return value


def test_ordinary_host_data_values_pass() -> None:
    for value in (None, 3, "x" * 1000, {"NCCL_DEBUG": "WARN"}, ["a", ["b"]], deep(60)):
        safeload.check_value(value, "inv.py", "k")


@pytest.mark.parametrize("value,words", [
    (deep(200_000), "nested too deeply"),
    ("x" * (5 * 1024 * 1024), "too large"),
    (["x"] * 1_000_000, "too large"),
    ({"A": {"B": "y" * (5 * 1024 * 1024)}}, "too large"),
])
def test_deep_or_huge_values_are_refused_naming_file_and_field(value, words) -> None:
    with pytest.raises(InputError) as err:
        safeload.check_value(value, "inv.py", "sglang_extra_env")
    assert (err.value.file, err.value.field) == ("inv.py", "sglang_extra_env")
    assert words in err.value.message


def test_a_cyclic_value_is_refused_not_walked_forever() -> None:
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(InputError):
        safeload.check_value(cyclic, "inv.py", "nccl_env")


@pytest.mark.parametrize("ref", ["glm5-nvfp4-tp8", "profiles/x.yaml", "/tmp/p.yml",
                                 "../other/p.yaml"])
def test_names_and_yaml_paths_are_profile_references(ref) -> None:
    assert profile_ref_problem(ref) is None


@pytest.mark.parametrize("ref", ["/etc/shadow", "../../etc/passwd", "a\nb", "x" * 65,
                                 "-rf", "profiles/p.yaml/.."])
def test_other_references_are_refused_before_any_file_is_opened(ref) -> None:
    assert profile_ref_problem(ref)
    with pytest.raises(InputError) as err:
        load_profile(ref)
    assert err.value.field == "profile" and "root:" not in str(err.value)


def test_extends_opens_only_yaml(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("extends: ../../../../etc/passwd\nmodel:\n  path: /m\n")
    with pytest.raises(InputError) as err:
        load_profile(path)
    assert err.value.field == "extends" and "not a .yaml or .yml file" in err.value.message
