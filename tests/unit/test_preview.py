"""gpuserve/preview.py: the diff, the redaction and the lines of ``--dry --diff``."""

from __future__ import annotations

from gpuserve.preview import (
    REDACTED,
    Preview,
    file_diff,
    preview_lines,
    redact,
    restart_reason,
)

LIVE_ENV = ("# Profile: glm5-nvfp4-tp8\nHF_TOKEN=hf_live_secret_value\n"
            "GPUSERVE_SGLANG_ARGS=--model-path /models/GLM-5 --tp 8 --mem-fraction-static 0.85\n")
PLANNED_ENV = ("# Profile: glm5-mfs\nHF_TOKEN=hf_new_secret_value\n"
    "GPUSERVE_SGLANG_ARGS=--model-path /models/GLM-5 --tp 8 --mem-fraction-static 0.80\n")


def test_a_switch_diffs_the_changed_flag_with_every_secret_redacted() -> None:
    diff = file_diff("/etc/gpuserve/sglang.env", LIVE_ENV, PLANNED_ENV,
                     secrets=["hf_new_secret_value"])
    text = "\n".join(diff)
    assert "-GPUSERVE_SGLANG_ARGS=--model-path /models/GLM-5 --tp 8 --mem-fraction-static 0.85" \
        in diff
    assert "+GPUSERVE_SGLANG_ARGS=--model-path /models/GLM-5 --tp 8 --mem-fraction-static 0.80" \
        in diff
    assert "hf_live_secret_value" not in text and "hf_new_secret_value" not in text
    assert f"HF_TOKEN={REDACTED}" in text
    assert diff[0] == "--- /etc/gpuserve/sglang.env (live)"


def test_equal_files_have_no_diff_and_absent_ones_diff_from_nothing() -> None:
    assert file_diff("/x", LIVE_ENV, LIVE_ENV) == []
    created = file_diff("/etc/gpuserve/sglang.yaml", None, "api-key: sk-abcdef\n")
    assert created[0] == "--- /dev/null" and f"+api-key: {REDACTED}" in created
    removed = file_diff("/etc/gpuserve/sglang.yaml", "api-key: sk-abcdef\n", None)
    assert removed[1] == "+++ /dev/null" and "sk-abcdef" not in "\n".join(removed)


def test_redaction_takes_values_and_secret_named_keys() -> None:
    assert redact("--served-model-name m sk-123", ["sk-123"]) == \
        f"--served-model-name m {REDACTED}"
    assert redact("SGLANG_API_KEY=abc\nNCCL_P2P_DISABLE=1", []) == \
        f"SGLANG_API_KEY={REDACTED}\nNCCL_P2P_DISABLE=1"


def test_the_restart_says_why() -> None:
    assert restart_reason(["/etc/gpuserve/sglang.env"], ["reset-failed", "restart"], False) \
        == "restart: /etc/gpuserve/sglang.env would change"
    assert restart_reason([], ["restart"], True).startswith("restart: the server runs an older")
    assert restart_reason([], [], False).startswith("no restart")


def test_a_no_op_prints_no_diff_and_says_so() -> None:
    lines = preview_lines(Preview(host="h", restarts={"server": "no restart: x"},
                                  operations=["health gate"]))
    assert lines[0] == "h: preview: no changes (nothing on the host was changed)"
    assert not any("diff of" in line for line in lines)
    switch = Preview(host="h", diffs={"/u": ["--- a", "+++ b", "-x", "+y"]},
                     steps=["restart"], restarts={"server": "restart: /u would change"})
    text = "\n".join(preview_lines(switch))
    assert "h: preview: changes" in text and "diff of /u:" in text and "    +y" in text


def test_a_key_file_diffs_as_redacted_lines_only() -> None:
    """The gateway's API key file is a secret as a whole: its diff never shows a value,
    and a changed key still shows as a change."""
    changed = file_diff("/etc/smg/api-key", "sk-old-value\n", "sk-new-value\n",
                        whole_secret=True)
    text = "\n".join(changed)
    assert "sk-old" not in text and "sk-new" not in text
    assert f"-{REDACTED} (live)" in changed and f"+{REDACTED}" in changed
    assert file_diff("/etc/smg/api-key", "sk-same\n", "sk-same\n", whole_secret=True) == []


def test_would_lines_and_restart_subjects_print_in_order() -> None:
    p = Preview(host="h", would=["install lock x: smg 1.0, 3 packages, 0.01 GiB of wheels, "
                                 "into /v"],
                restarts={"gateway": "restart: /u would change", "reboot": "would follow"},
                acts=True)
    lines = preview_lines(p)
    assert lines[0] == "h: preview: changes (nothing on the host was changed)"
    assert lines[1:4] == ["h: preview: would install lock x: smg 1.0, 3 packages, 0.01 GiB of "
                          "wheels, into /v", "h: preview: gateway: restart: /u would change",
                          "h: preview: reboot: would follow"]
    assert Preview(host="h", acts=True).changes and not Preview(host="h").changes
