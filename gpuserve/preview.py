"""What a deploy would change on a host, as text: the preview of ``--dry --diff``.

Pure, one for every deploy (serve, host, gateway): the deploy (roles/base/preview.py) reads
the live files and hands them here with the plan's own texts and decisions, so the
preview is the plan the real run executes, not a second guess. Secrets never reach the
text: the plan's secret values and any line whose key names a token, key, secret or
password are redacted on both sides of a diff.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuserve.redact import REDACTED
from gpuserve.redact import redact as redact_values

# KEY=value (EnvironmentFile) or key: value (the --config YAML) whose key names a secret
_SECRET_LINE = re.compile(
    r"^(\s*[\w.-]*(?:token|api[-_]?key|secret|password)[\w.-]*\s*[=:]\s*)(\S.*)$",
    re.IGNORECASE)


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret value and every secret-named line's value replaced."""
    text = redact_values(text, secrets)
    return "\n".join(_SECRET_LINE.sub(lambda m: m.group(1) + REDACTED, line)
                     for line in text.split("\n"))


def file_diff(path: str, live: str | None, planned: str | None,
              secrets: Iterable[str | None] = (), whole_secret: bool = False) -> list[str]:
    """A unified diff of ``path`` from its live text (None: absent) to the planned one
    (None: removed), secrets redacted (``whole_secret``: every line, a key file's);
    [] when they are equal."""
    if live == planned:
        return []
    kept = list(secrets)

    def shown(text: str) -> list[str]:
        return [REDACTED] if whole_secret else redact(text, kept).splitlines()

    before = shown(live) if live is not None else []
    after = shown(planned) if planned is not None else []
    if whole_secret and before == after:  # a key file whose value changes
        before = [f"{REDACTED} (live)"]
    return list(difflib.unified_diff(
        before, after, fromfile=f"{path} (live)" if live is not None else "/dev/null",
        tofile=f"{path} (planned)" if planned is not None else "/dev/null", lineterm=""))


def gib(size: int) -> str:
    return f"{size / 1024**3:.2f} GiB"


def lock_install(lock_name: str, what: str, version: str, packages: int,
                 download_bytes: int, venv: str) -> str:
    """The ``would install`` text of a locked venv (the SGLang server's, the gateway's)."""
    return (f"lock {lock_name}: {what} {version}, {packages} packages, "
            f"{gib(download_bytes)} of wheels, into {venv}")


@dataclass
class Preview:
    """One host's preview: what the real run would do, decided by the plan."""

    host: str
    diffs: dict[str, list[str]] = field(default_factory=dict)  # path -> diff lines
    would: list[str] = field(default_factory=list)  # "install ...", "fetch ...", "hold ..."
    steps: list[str] = field(default_factory=list)  # systemctl steps of the activation
    restarts: dict[str, str] = field(default_factory=dict)  # subject -> what and why
    preflight: list[str] = field(default_factory=list)  # the preflight's verdict lines
    operations: list[str] = field(default_factory=list)  # what would run, in order
    acts: bool = False  # an operation beyond the above would change the host

    @property
    def changes(self) -> bool:
        return bool(self.diffs or self.would or self.steps or self.acts)


def restart_reason(changed: list[str], steps: list[str], stale: bool,
                   what: str = "server") -> str:
    """Why the activation restarts (or starts) the ``what`` (the server, the gateway)."""
    if not steps:
        return f"no restart: the {what} runs the planned files"
    action = "restart" if "restart" in steps else "start" if "start" in steps else steps[-1]
    if changed:
        return f"{action}: {', '.join(changed)} would change"
    if stale:
        return f"{action}: the {what} runs an older configuration than its files"
    return f"{action}: the unit is not running"


def preview_lines(p: Preview) -> list[str]:
    """The preview as lines to print, diffs last per file."""
    lines = [f"{p.host}: preview: {'changes' if p.changes else 'no changes'} "
             "(nothing on the host was changed)"]
    lines += [f"{p.host}: preview: preflight: {line.removeprefix('preflight: ')}"
              for line in p.preflight]
    lines += [f"{p.host}: preview: would {line}" for line in p.would]
    lines += [f"{p.host}: preview: {subject}: {why}" for subject, why in p.restarts.items()]
    lines += [f"{p.host}: preview: operation: {op}" for op in p.operations]
    for path, diff in p.diffs.items():
        lines.append(f"{p.host}: preview: diff of {path}:")
        lines += [f"    {line}" for line in diff]
    return lines
