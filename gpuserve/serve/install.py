"""Host data of the SGLang install, checked before any change: the service account's
name, its home, the venvs kept, and the pip URLs (credentials only over https, plain
http only from trusted mirrors). Pure: roles/sglang installs with what these decide.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from gpuserve.errors import InputError
from gpuserve.host import mirrors
from gpuserve.launch.interpreter import ManagedBuild, managed_builds

DEFAULTS = {
    # Exact SGLang version to install (a lock must exist for it, local part allowed:
    # "0.5.23", "0.5.23+lab"); None: the newest lock the profile and the host allow.
    # accepts: str or None
    "sglang_version": None,
    # A directory of locks generated with tools/gen_lock.py (e.g. for another index),
    # searched before the shipped ones in gpuserve/data/locks/.
    # accepts: str (a directory) or None
    "sglang_locks_dir": None,
    # pip --index-url (None: PyPI, or no index at all when pip_find_links is set)
    # accepts: str (a URL) or None
    "pip_index_url": None,
    # pip --find-links (a local wheel mirror or wheelhouse, e.g. https://mirror/wheels/)
    # accepts: str (a URL or directory) or None
    "pip_find_links": None,
    # URL prefixes of plain-http mirrors the inventory vouches for (e.g.
    # ["http://10.0.2.2:8000/"]); any other pip URL must be https (pip gets
    # --trusted-host only for these). Shared with the host deploy (nvidia_repo_url).
    # accepts: list[str]
    "trusted_mirrors": [],
    # the system user and group the server runs as
    "sglang_user": "sglang",
    # root of everything gpuserve installs: venvs/, locks/, cache/ (the service's HOME), bin/
    "sglang_home": "/opt/gpuserve",
    # verified venvs to keep (besides those the live and the last good unit name)
    "keep_venvs": 2,
    # The CPython that builds the SGLang venvs (never replacing python3): "auto" (the
    # system python3 when a lock is for it, else a released distribution python3.X, else
    # a managed python-build-standalone build), "system", "managed", or an absolute path
    # to an interpreter (gpuserve/launch/interpreter.py; docs/hosts.md).
    # accepts: str: auto, system, managed or an absolute path
    "sglang_python": "auto",
    # Base URL of a python-build-standalone mirror, laid out as its releases
    # (<base>/<build>/<archive>, as uv's UV_PYTHON_INSTALL_MIRROR): where a managed
    # CPython comes from (gpuserve wheelhouse --python-builds fills one). None: the
    # project's GitHub releases.
    # accepts: str (a URL) or None
    "sglang_python_mirror": None,
    # A managed-CPython catalog file in the format of the shipped
    # gpuserve/data/python/managed-cpython.json (tools/gen_python_catalog.py writes one),
    # used instead of it: a newer python-build-standalone release, or a mirror's own
    # builds. Read on the controller.
    # accepts: str (a file) or None
    "sglang_python_builds": None,
    # The distribution the host runs, for gpuserve check's interpreter report without
    # connecting (debian12, debian13, ubuntu2204, ubuntu2404; gpuserve/data/distros).
    # The deploys read the host itself and ignore it.
    # accepts: str or None
    "host_distribution": None,
}


def validate_python(data: dict, source: str, key: str = "sglang_python"
                    ) -> tuple[str, str | None]:
    """Host data ``key`` (``sglang_python``, or the gateway's ``router_python``, which
    when unset is ``sglang_python``'s value) and ``sglang_python_mirror``, checked before
    any change (the mirror as every other URL: https, or a trusted plain-http prefix)."""
    field = key if data.get(key) is not None else "sglang_python"
    value = data.get(field, "auto")
    if not isinstance(value, str) or not (value in ("auto", "system", "managed") or (
            value.startswith("/") and re.fullmatch(r"/[A-Za-z0-9_./+-]+", value)
            and "/../" not in value + "/")):
        raise InputError(source, field, f"{value!r:.80} is not auto, system, "
                         "managed or an absolute interpreter path")
    mirror = mirrors.mirror_from(data.get("sglang_python_mirror"), "sglang_python_mirror",
                                 data.get("trusted_mirrors"), source)
    builds = data.get("sglang_python_builds")
    if builds is not None:
        try:
            managed_builds(Path(str(builds)))
        except InputError as exc:  # not a regular file, too large, not JSON
            raise InputError(source, "sglang_python_builds", f"{builds!r:.120}: "
                             f"{exc.message}"[:300]) from None
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InputError(source, "sglang_python_builds", f"{builds!r:.120} cannot be "
                             f"read as a managed-CPython catalog: {exc}"[:300]) from None
    return value, mirror


@dataclass(frozen=True)
class PythonWish:
    """Host data's interpreter for one role's venvs, read once (:func:`python_wish`)."""

    asked: str  # auto, system, managed or an absolute interpreter path
    mirror: str | None  # sglang_python_mirror
    builds: tuple[ManagedBuild, ...]  # the managed-CPython catalog

    @property
    def explicit_path(self) -> str:
        """The interpreter path when one is asked for, else "" (auto, system, managed)."""
        return self.asked if self.asked.startswith("/") else ""


def python_wish(data: dict, source: str, key: str = "sglang_python") -> PythonWish:
    """:func:`validate_python` with the managed-CPython catalog host data's
    ``sglang_python_builds`` names (else the shipped one), read on the controller."""
    asked, mirror = validate_python(data, source, key)
    return PythonWish(asked, mirror, python_builds(data))


def python_builds(data: dict) -> tuple[ManagedBuild, ...]:
    """The managed CPython catalog host data's ``sglang_python_builds`` names, else the
    shipped one (read on the controller, like ``sglang_locks_dir``)."""
    path = data.get("sglang_python_builds")
    return managed_builds(Path(path)) if isinstance(path, str) and path else managed_builds()


_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def validate_user(user: object, source: str) -> str:
    """Host data ``sglang_user``: a valid name, never root (checked again on the host:
    :func:`check_account` refuses any existing account gpuserve did not create)."""
    if not isinstance(user, str) or not _USER.fullmatch(user):
        raise InputError(source, "sglang_user", f"{user!r:.80} is not a valid system user name")
    if user == "root":
        raise InputError(source, "sglang_user", "root cannot run the server: the deploy would "
                         "change its home and shell (locking out SSH) and the server would "
                         "run with every privilege; leave sglang_user unset (sglang) or name "
                         "an account that does not exist yet, which gpuserve creates")
    return user


def validate_home(home: object, source: str) -> str:
    if not isinstance(home, str) or not home.startswith("/") or home.rstrip("/") in ("", "/"):
        raise InputError(source, "sglang_home", f"{home!r} must be an absolute directory")
    bad = next((c for c in home if not c.isprintable() or c in " '\"$%\\`"), None)
    if bad is not None and not bad.isprintable():
        # a CR or another control character reached systemd_quote as a bare ValueError
        raise InputError(source, "sglang_home", f"{home!r} must not contain control or "
                         f"format characters (U+{ord(bad):04X})")
    if bad is not None:
        raise InputError(source, "sglang_home", f"{home!r} must not contain spaces or quotes")
    if any(part in (".", "..") for part in home.split("/")):
        raise InputError(source, "sglang_home", f"{home!r} must not contain . or .. "
                         "components (give the real directory)")
    return home.rstrip("/")


def validate_keep(keep: object, source: str) -> int:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise InputError(source, "keep_venvs", f"must be a whole number >= 1, got {keep!r}")
    return keep


def bin_dir(home: str) -> str:
    """Where the host scripts live (root-owned): the redactor, the checks' scripts."""
    return f"{home}/bin"


def state_dir(home: str) -> str:
    """The service user's HOME and its only writable place (model/JIT caches)."""
    return f"{home}/cache"


# Credentials in a mirror URL (https://user:pass@mirror/simple) must stay off the pip
# command line (``ps``, ``pyinfra -vvv``): they go into a pip config file, 0600 root, that
# exists only while pip runs (PIP_CONFIG_FILE; loaded after the host's own pip.conf).
PIP_CONFIG = "pip-credentials.conf"
_PIP_KEYS = {"pip_index_url": "index-url", "pip_find_links": "find-links"}


def _has_credentials(url: str) -> bool:
    return "@" in urlparse(url).netloc


def validate_pip_url(url: str | None, field: str, source: str) -> str | None:
    """``url`` (host data ``pip_index_url`` / ``pip_find_links``) unchanged, or InputError.

    Credentials are refused over plain ``http://`` (they would cross the network in
    clear) and when a config file line cannot carry them (whitespace, control
    characters). Messages name the field, never the URL (it holds a password)."""
    if url is None or not _has_credentials(url):
        return url
    parsed = urlparse(url)
    if parsed.scheme != "https":
        raise InputError(source, field, "a mirror URL with credentials (user:password@) must "
                         "use https://: over http they cross the network in clear (the URL "
                         "is not shown)")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise InputError(source, field, "a mirror URL with credentials must not contain "
                         "whitespace or control characters (the URL is not shown)")
    return url


def validate_pip_urls(index_url: str | None, find_links: str | None, trusted: object,
                      source: str) -> tuple[str, ...]:
    """Prepare-time check of the pip URLs (plan_serve and install_sglang): credentials
    only over https, and https unless ``trusted_mirrors`` marks the mirror trusted (a
    find-links directory on the host itself, file:// or a path, crosses no network).
    Returns the validated ``trusted_mirrors``."""
    prefixes = mirrors.validate_trusted_mirrors(trusted, source)
    for field, url in (("pip_index_url", index_url), ("pip_find_links", find_links)):
        validate_pip_url(url, field, source)
        mirrors.require_https(url, field, prefixes, source,
                              allow_file=field == "pip_find_links")
    return prefixes


def strip_credentials(url: str) -> str:
    """``url`` without its ``user:password@`` part (for anything that is shown)."""
    parsed = urlparse(url)
    return parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl()


def pip_config_text(index_url: str | None, find_links: str | None,
                    source: str = "host data") -> str | None:
    """The pip config file carrying the URLs that hold credentials; None when none do."""
    lines = []
    for field, url in (("pip_index_url", index_url), ("pip_find_links", find_links)):
        if url and validate_pip_url(url, field, source) and _has_credentials(url):
            lines.append(f"{_PIP_KEYS[field]} = {url}\n")
    return "[global]\n" + "".join(lines) if lines else None


def pip_args(index_url: str | None, find_links: str | None,
             source: str = "host data", trusted: tuple[str, ...] = ()) -> list[str]:
    """pip's index options for the command line. A URL with credentials is left out
    (:func:`pip_config_text` carries it); only credential-free URLs are shown. A plain
    http URL must lie under a ``trusted`` prefix (else InputError); only such a mirror's
    host gets ``--trusted-host`` (pip would otherwise refuse it, rightly)."""
    validate_pip_urls(index_url, find_links, list(trusted), source)
    args: list[str] = []
    if index_url:
        if not _has_credentials(index_url):
            args += ["--index-url", index_url]
    elif find_links:
        args.append("--no-index")
    if find_links and not _has_credentials(find_links):
        args += ["--find-links", find_links]
    for url in (index_url, find_links):
        parsed = urlparse(url or "")
        if parsed.scheme == "http" and parsed.hostname and parsed.hostname not in args:
            args += ["--trusted-host", parsed.hostname]
    return args
