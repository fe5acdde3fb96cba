"""The one redaction rule (gpuserve/redact.py): a secret that contains or overlaps another
leaks no part of either, one marker everywhere, and the stdlib host scripts' copies are
byte-identical to it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuserve import preview
from gpuserve.launch.secrets import host_secret_values, redact_args
from gpuserve.measure.results import ResultRecord
from gpuserve.redact import REDACTED, redact
from gpuserve.serve.weights import hub_module, one_line

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "gpuserve" / "data" / "scripts"
#: The host scripts that cannot import gpuserve and carry a copy of the rule.
COPIES = ("sglang_redact.py", "hub_client.py")
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


# ------------------------------------------------------------------ the copies


def definitions(path: Path) -> dict[str, str]:
    """The source text of the top-level ``REDACTED`` assignment and ``redact`` function."""
    source = path.read_text()
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] \
                == ["REDACTED"]:
            found["REDACTED"] = ast.get_source_segment(source, node)
        elif isinstance(node, ast.FunctionDef) and node.name == "redact":
            found["redact"] = ast.get_source_segment(source, node)
    return found


def test_the_host_scripts_carry_the_rule_byte_for_byte() -> None:
    original = definitions(REPO / "gpuserve" / "redact.py")
    assert set(original) == {"REDACTED", "redact"}
    for name in COPIES:
        assert definitions(SCRIPTS / name) == original, f"{name}: its copy drifted"
    # no other host script grows a redactor of its own
    others = [p.name for p in SCRIPTS.glob("*.py")
              if p.name not in COPIES and definitions(p)]
    assert others == []


MARKERS = ("<redacted>", "[REDACTED]", "***", "<masked>", "[redacted]")


def test_no_other_marker_or_redactor_in_the_product() -> None:
    """Every redaction goes through gpuserve.redact (or a copy): no marker literal and no
    other function named like a redactor in gpuserve/ or roles/."""
    allowed = {REPO / "gpuserve" / "redact.py", *(SCRIPTS / n for n in COPIES)}
    found = []
    for path in [*(REPO / "gpuserve").rglob("*.py"), *(REPO / "roles").rglob("*.py")]:
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in MARKERS:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
            if isinstance(node, ast.FunctionDef) and node.name in (
                    "_redact", "mask_values", "scrub"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.name}()")
    # measure/results walks a record's structure and calls redact() on each string
    assert found == ["gpuserve/measure/results.py:181: _redact()"]


# ------------------------------------------------------------------ every caller


def test_preview_hides_a_secret_containing_another() -> None:
    text = preview.redact(f"--api-key-file x\nARG={LONG} {SHORT}", [SHORT, LONG])
    assert "def123" not in text and SHORT not in text
    assert text.endswith(f"ARG={REDACTED} {REDACTED}")
    diff = preview.file_diff("/etc/x", "A=1\n", f"A={LONG} {SHORT}\n", [SHORT, LONG])
    assert not any(SHORT in line for line in diff[2:])
    assert f"+A={REDACTED} {REDACTED}" in diff


def test_hub_messages_hide_a_secret_containing_another() -> None:
    out = one_line(f"GET failed for {LONG} ({SHORT})", (SHORT, LONG))
    assert out == f"GET failed for {REDACTED} ({REDACTED})"
    assert hub_module().REDACTED == REDACTED


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
