"""https for every URL in host data, unless the inventory marks the mirror trusted.

Why: apt verifies NVIDIA's repository by its signature, and pip by the lock's hashes,
but the first download (the cuda-keyring package that *carries* that signing key) and
the choice of what pip trusts are only as good as the transport. A plain-http URL is
therefore refused unless host data names its mirror in ``trusted_mirrors`` (a list of
URL prefixes, e.g. ``["http://10.0.2.2:8000/"]`` for a loopback mirror). Shared by the
host deploy (gpuserve/plans/host.py: ``nvidia_repo_url``) and the serve deploy
(roles/sglang: ``pip_index_url``, ``pip_find_links``), so both refuse alike at prepare
time, before any host change.
"""

from __future__ import annotations

from urllib.parse import urlparse

from gpuserve.errors import InputError

FIELD = "trusted_mirrors"
HOW_TO_TRUST = ("use https://, or mark the mirror trusted in host data: "
                "trusted_mirrors: [\"{prefix}\"] (only for a mirror on a network you control)")


def _shown(url: str) -> str:
    """``url`` without ``user:password@`` (messages never print credentials)."""
    parsed = urlparse(url)
    return parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl()


def _prefix(url: str) -> str:
    """``scheme://host[:port]/``: the prefix a user would mark trusted for ``url``."""
    parsed = urlparse(_shown(url))
    return f"{parsed.scheme}://{parsed.netloc}/"


def validate_trusted_mirrors(value: object, source: str) -> tuple[str, ...]:
    """Host data ``trusted_mirrors``: http(s) URL prefixes, each ending in ``/``.

    The trailing ``/`` is added when missing so that ``http://mirror:80`` cannot also
    match ``http://mirror:8080/`` or ``http://mirror:80.evil.example/`` by prefix."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InputError(source, FIELD, "must be a list of mirror URL prefixes such as "
                         f"[\"http://10.0.2.2:8000/\"], got {type(value).__name__}")
    out = []
    for item in value:
        parsed = urlparse(item) if isinstance(item, str) else None
        if (parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname
                or "@" in parsed.netloc or parsed.query or parsed.fragment
                or any(c.isspace() or ord(c) < 32 for c in item)):
            raise InputError(source, FIELD, "each entry must be an http(s) URL prefix "
                             "without credentials, query or spaces, such as "
                             f"\"http://10.0.2.2:8000/\", got {str(item)[:80]!r}")
        out.append(item if item.endswith("/") else item + "/")
    return tuple(out)


def is_trusted(url: str, trusted: tuple[str, ...]) -> bool:
    """Whether ``url`` (credentials ignored) lies under a trusted prefix."""
    shown = _shown(url)
    return any(shown.startswith(prefix) for prefix in trusted)


def require_https(url: str | None, field: str, trusted: tuple[str, ...], source: str,
                  allow_file: bool = False) -> str | None:
    """``url`` unchanged when https (or file:// / an absolute path, where ``allow_file``:
    nothing crosses the network), or http under a
    trusted prefix; otherwise InputError naming ``field`` and how to mark it trusted."""
    if url is None:
        return None
    scheme = urlparse(url).scheme
    local = scheme == "file" or (scheme == "" and url.startswith("/"))
    if scheme == "https" or (allow_file and local):
        return url
    if scheme == "http":
        if is_trusted(url, trusted):
            return url
        raise InputError(source, field, f"{_shown(url)[:120]!r} is plain http: a network "
                         "attacker could replace what it serves; "
                         + HOW_TO_TRUST.format(prefix=_prefix(url)))
    allowed = "https or file (or an absolute path)" if allow_file else "https"
    raise InputError(source, field, f"must be an {allowed} URL, got scheme {scheme!r}")


def mirror_from(mirror: object, field: str, trusted_mirrors: object,
                source: str) -> str | None:
    """Host data ``field``'s value naming a mirror (None when unset): a string that is
    https, a plain-http URL under ``trusted_mirrors`` (host data's value), or file:// /
    an absolute path on the host; InputError naming ``field`` otherwise. The callers read
    both keys themselves, so tools/gen_reference.py sees which deploy reads them."""
    if mirror is None:
        return None
    if not isinstance(mirror, str):
        raise InputError(source, field, f"must be a URL, got {mirror!r:.80}")
    trusted = validate_trusted_mirrors(trusted_mirrors or [], source)
    return require_https(mirror, field, trusted, source, allow_file=True)
