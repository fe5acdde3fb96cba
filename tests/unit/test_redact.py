"""The one redaction rule (gpuserve/redact.py): a secret that contains or overlaps another
leaks no part of either, one marker everywhere, and the stdlib host scripts' copies are
byte-identical to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve import preview
from gpuserve.launch.secrets import host_secret_values, redact_args
from gpuserve.measure.results import ResultRecord
from gpuserve.redact import REDACTED, redact

REPO = Path(__file__).resolve().parents[2]
SHORT, LONG = "abc", "abcdef123"  # the short secret is the long one's head


def test_a_secret_containing_another_is_hidden_whole_in_either_order() -> None:
    text = f"key={LONG} token={SHORT}."
    for secrets in ([SHORT, LONG], [LONG, SHORT], (SHORT, LONG), {SHORT, LONG}):
        assert redact(text, secrets) == f"key={REDACTED} token={REDACTED}."
    # the tail of the long one is what a shortest-first replace would have shown
    assert "def123" not in redact(text, [SHORT, LONG])


def test_overlapping_and_touching_secrets_become_one_marker() -> None:
    assert redact("x abcXdef y", ["abcX", "Xdef"]) == f"x {REDACTED} y"
    assert redact("abcabc-abc", ["abc"]) == f"{REDACTED}-{REDACTED}"
    assert redact("aaaa", ["aa"]) == REDACTED


def test_a_marker_is_never_searched_again_and_short_secrets_count() -> None:
    # "red" is inside "<redacted>": replacing in turn would have mangled the marker
    assert redact("abcdef123 red", [LONG, "red"]) == f"{REDACTED} {REDACTED}"
    assert redact("a1b", ["1"]) == f"a{REDACTED}b"


def test_empty_and_missing_values_are_nothing_to_look_for() -> None:
    assert redact("text", ["", None]) == "text"
    assert redact("text", []) == "text"
    assert redact("", [SHORT]) == ""


def test_bytes_in_bytes_out() -> None:
    out = redact(f"k {LONG}\n".encode(), [SHORT.encode(), LONG.encode()])
    assert out == f"k {REDACTED}\n".encode()


# ------------------------------------------------------------------ every caller


def test_preview_hides_a_secret_containing_another() -> None:
    text = preview.redact(f"--api-key-file x\nARG={LONG} {SHORT}", [SHORT, LONG])
    assert "def123" not in text and SHORT not in text
    assert text.endswith(f"ARG={REDACTED} {REDACTED}")
    diff = preview.file_diff("/etc/x", "A=1\n", f"A={LONG} {SHORT}\n", [SHORT, LONG])
    assert not any(SHORT in line for line in diff[2:])
    assert f"+A={REDACTED} {REDACTED}" in diff


@pytest.mark.parametrize("order", [(SHORT, LONG), (LONG, SHORT)])
def test_journal_views_hide_a_secret_containing_another(order) -> None:
    # gpuserve logs, the operate journal and the start records: host data's secrets
    short, long = order
    data = {"hf_token": long, "sglang_extra_env": {"MY_API_KEY": short, "NCCL_DEBUG": "x"}}
    secrets = host_secret_values(data)
    line = f"loading with {LONG} and {SHORT} done"
    assert redact(line, secrets) == f"loading with {REDACTED} and {REDACTED} done"


def test_records_hide_a_secret_containing_another() -> None:
    rec = ResultRecord(kind="smoke", profile="p", note=f"server said {LONG} / {SHORT}",
                       context={"env": {"HF_TOKEN": SHORT, "OPENAI_API_KEY": LONG}})
    text = rec.to_json()
    assert SHORT not in text and "def123" not in text
    assert f"server said {REDACTED} / {REDACTED}" in text


def test_the_displayed_argument_mask_is_the_marker() -> None:
    assert redact_args(["--api-key", LONG]) == ["--api-key", REDACTED]
    assert preview.REDACTED is REDACTED
