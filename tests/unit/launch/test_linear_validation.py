"""Validating a huge argv costs work linear in its length (counted, not timed).

argparse's ``_parse_known_args`` is quadratic in the number of options, so a 2 MB
extra_args list took minutes; gpuserve.launch.catalog drops repeated segments in one
pass and refuses more distinct options than any real command line has. The counts
below are operations, so the test is deterministic on any machine (the timings are in
bench/input_limits.py)."""

from __future__ import annotations

import pytest

from gpuserve.errors import InputError
from gpuserve.launch import catalog
from gpuserve.launch.catalog import MAX_OPTIONS, load_catalog, without_repeated_segments

VERSION = "0.5.23"


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of the pre-pass's per-token test and of argparse's per-token work."""
    counts = {"prepass": 0, "argparse": 0}
    is_long = catalog._is_long_option

    def count_prepass(arg: str) -> bool:
        counts["prepass"] += 1
        return is_long(arg)

    parser_class = type(load_catalog(VERSION).parser(False))
    parse_optional = parser_class._parse_optional

    def count_argparse(self, arg: str):
        counts["argparse"] += 1
        return parse_optional(self, arg)

    monkeypatch.setattr(catalog, "_is_long_option", count_prepass)
    monkeypatch.setattr(parser_class, "_parse_optional", count_argparse, raising=False)
    return counts


def repeated(n: int) -> list[str]:
    pattern = ["--enable-metrics", "--log-level", "info", "--tp-size", "2"]
    return (pattern * (n // len(pattern) + 1))[:n]


def test_200000_repeated_args_validate_with_linear_work(counted: dict[str, int]) -> None:
    flags = load_catalog(VERSION)
    flags.validate(repeated(200_000))
    assert 0 < counted["argparse"] <= 10  # argparse saw one copy of each segment
    small = counted["prepass"]
    counted["prepass"] = 0
    flags.validate(repeated(400_000))
    assert 200_000 <= small <= 3 * 200_000  # a few tests per token
    assert 1.9 <= counted["prepass"] / small <= 2.1  # twice the args, twice the work


def test_200000_distinct_options_are_refused_before_argparse(counted) -> None:
    args = [f"--tp-size={n}" for n in range(200_000)]
    with pytest.raises(InputError, match="too many options") as info:
        load_catalog(VERSION).validate(args, "p.yaml", "extra_args")
    assert info.value.file == "p.yaml" and info.value.field == "extra_args"
    assert counted["argparse"] == 0
    assert counted["prepass"] <= 3 * 200_000


@pytest.mark.parametrize(
    ("bad", "words"),
    [(["--tp-size", "two"], "invalid"), (["--no-such-flag"], "unrecognized"),
     (["--log-level"], "expected one argument")],
)
def test_dropping_repeats_keeps_every_refusal(bad: list[str], words: str) -> None:
    args = repeated(1000) + bad + repeated(1000)
    with pytest.raises(InputError, match=words):
        load_catalog(VERSION).validate(args)


def test_segments_are_kept_in_order_and_double_dash_ends_them() -> None:
    args = ["x", "--a", "1", "--b", "--a", "1", "--a", "2", "--b", "--", "--a", "1"]
    assert without_repeated_segments(args) == ["x", "--a", "1", "--b", "--a", "2", "--", "--a",
                                               "1"]
    # a token with a space is an argument to argparse, so it stays inside its segment
    assert without_repeated_segments(["--a", "--b c", "--a", "--b d"]) == [
        "--a", "--b c", "--a", "--b d"]
    assert MAX_OPTIONS >= 1024  # room for list-valued flags repeated on real argvs
