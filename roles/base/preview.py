"""The deploys' preview under ``pyinfra ... --dry`` (with ``--diff``: the files' diffs).

pyinfra's ``--dry`` stops before executing; operations that act only when executing
(install, switch, checks, a driver's files, a reboot) show nothing there, so a switch
looked like a no-op. This prints, per host and from the host's own plan and prefetched
state, what the real run would change (gpuserve/preview.py): every deploy's from what its
roles noted where they add their operations (roles/base/planned.py). It runs at prepare time
and reads only: the live texts of the files that would change come in one batch
(roles/base/prefetch.py).
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.facts.files import FileContents

from gpuserve.preview import Preview, file_diff, preview_lines
from gpuserve.roles.base import planned
from gpuserve.roles.base.prefetch import Read, fact, prefetch


def live_diffs(files: dict[str, str | None], with_diff: bool, secrets: list[str | None],
               whole_secret: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """Each path's diff from its live text (read in one batch) to the planned one (None:
    removed), secrets redacted (``whole_secret``: paths whose every line is); without
    ``--diff`` a line saying there are changes."""
    if with_diff and files:
        prefetch([Read.of(FileContents, path=p) for p in files])  # one command
    diffs = {}
    for path, text in files.items():
        if not with_diff:
            diffs[path] = ["(changes; --diff shows them)"]
            continue
        live = fact(FileContents, path=path)
        live_text = "\n".join(live) + "\n" if live is not None else None
        diffs[path] = file_diff(path, live_text, text, secrets, path in whole_secret)
    return diffs


def print_planned_preview(with_diff: bool, secrets: list[str | None],
                          preflight: list[str] | tuple[str, ...] = (),
                          by_value: tuple[str, ...] = ()) -> None:
    """Log what this host's roles noted they would change (roles/base/planned.py): the
    host, gateway and serve deploys' preview. ``preflight``: the plan's lines, said
    first; ``by_value``: files noted as secret whose diff redacts only the ``secrets``'
    values (the serve unit's EnvironmentFile and --config file), not every line."""
    notes = planned.notes()
    files = {path: f.text for path, f in notes.files.items()}
    hidden = frozenset(path for path, f in notes.files.items()
                       if f.secret and path not in by_value)
    diffs = live_diffs(files, with_diff, secrets, hidden)
    preview = Preview(host=host.name, diffs={p: d for p, d in diffs.items() if d},
                      would=list(notes.would), steps=list(notes.steps),
                      restarts=dict(notes.restarts), operations=list(notes.operations),
                      acts=notes.acts or bool(files), preflight=list(preflight))
    for line in preview_lines(preview):
        logger.info(line)
