"""The one redaction rule (gpuserve/redact.py): a secret that contains or overlaps another
leaks no part of either, one marker everywhere, and the stdlib host scripts' copies are
byte-identical to it."""

from __future__ import annotations

from gpuserve.redact import REDACTED, redact

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
