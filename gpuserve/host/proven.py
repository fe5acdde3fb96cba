"""How each distribution's deploy paths are proven (lab-tested, tested against recorded
outputs, untested), from ``gpuserve/data/host/proven.yaml``: docs/hosts.md's support
matrix as data, so ``gpuserve check`` and the host deploy can say it on every host line.

Why: a green check on a path nobody ever ran (the Ubuntu host deploy) read as proof; the
matrix said otherwise only in prose.
"""

from __future__ import annotations

import functools

from gpuserve import safeload
from gpuserve.paths import DATA_DIR

PATHS = ("host", "serve", "gateway")
#: What each path is called on a report line.
PATH_WORDS = {"host": "host deploy", "serve": "serve path", "gateway": "gateway path"}


@functools.cache
def support() -> dict:
    """The whole data file (levels and distributions)."""
    return safeload.load_yaml_file(DATA_DIR / "host" / "proven.yaml")


def proven(distribution: str, path: str) -> tuple[str, str] | None:
    """(level, where) of ``path`` on ``distribution`` (a gpuserve/data/distros name), or
    None for a distribution the matrix does not list."""
    entry = support()["distributions"].get(distribution)
    if entry is None:
        return None
    cell = entry[path]
    return cell["level"], cell["where"]


def proven_line(distribution: object, path: str) -> str:
    """``Ubuntu 24.04 host deploy: untested; <why>``, or what to set to learn it."""
    if not isinstance(distribution, str) or proven(distribution, path) is None:
        return (f"{PATH_WORDS[path]}: how proven depends on the distribution (set "
                "host_distribution; docs/hosts.md)")
    level, where = proven(distribution, path)  # type: ignore[misc]
    name = support()["distributions"][distribution]["name"]
    return f"{name} {PATH_WORDS[path]}: {support()['levels'][level]}; {where}"


def distribution_of(os_release: dict) -> str | None:
    """The matrix's name of the distribution an os-release describes (its ID and
    VERSION_ID against each recorded os-release), None when it lists none such."""
    from gpuserve.launch.interpreter import known_distributions, recorded_facts

    for name in known_distributions():
        recorded = recorded_facts(name).os_release
        if (recorded.get("ID"), recorded.get("VERSION_ID")) == (
                os_release.get("ID"), os_release.get("VERSION_ID")):
            return name
    return None


def proven_on_host(os_release: dict, path: str) -> str:
    """:func:`proven_line` for the distribution a host's os-release names; one the
    matrix does not list is untested (the deploys use apt and Debian's package names)."""
    name = distribution_of(os_release)
    if name is not None:
        return proven_line(name, path)
    what = f"{os_release.get('ID', '?')} {os_release.get('VERSION_ID', '?')}"
    return f"{what[:60]} {PATH_WORDS[path]}: untested; not in docs/hosts.md's matrix"
