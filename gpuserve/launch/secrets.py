"""Which SGLang launch arguments carry a secret: one judge for every place that asks.

Why one function: argparse accepts any unambiguous prefix of a long option (``--api-k``
sets the API key), and word filters on the spelling both miss those and flag valid
settings such as ``--max-total-tokens``. Each flag is resolved as the SGLang version's
parser resolves it and judged by its dest. The profile loader, the service plan,
``gpuserve render`` and the result records all call :func:`secret_flags` /
:func:`split_secret_args`.

How: docs/security.md, "gpuserve.launch.secrets: how a flag is judged"
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from functools import cache
from typing import TYPE_CHECKING, NamedTuple

from gpuserve.redact import REDACTED

if TYPE_CHECKING:  # the catalog module loads large JSON files; import it lazily
    from gpuserve.launch.catalog import FlagCatalog, FlagOption

#: An option is secret when its dest (or a spelling, dashes as underscores) contains one
#: of these words: api keys, passwords, secrets, credentials and bearer-style tokens.
#: "token" alone is no secret (max_total_tokens, tokenizer_path, speculative_token_map).
SECRET_DEST = re.compile(
    r"(?:^|_)(?:api_?key|password|passwd|passphrase|secrets?|credentials?"
    r"|(?:hf|auth|access|bearer|api|hub)_token)(?:$|_)",
    re.IGNORECASE,
)
#: Secret spellings known without a catalog: every committed catalog's secret options
#: (a test keeps this in step) plus ``--hf-token`` (a spelling some launchers use).
KNOWN_SECRET_FLAGS = ("--admin-api-key", "--api-key", "--hf-token", "--ssl-keyfile-password")
#: Without a catalog, an unknown flag abbreviating a known secret option is secret from
#: this many characters after ``--`` (``--api-`` / ``--admi``); shorter ones are either
#: ambiguous for argparse or resolved through the committed catalogs.
MIN_ABBREV = 4
#: Env names that *are* secrets, judged on whole ``_``-separated words of the name:
#: a ``TOKEN`` only as the last word (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, GITHUB_TOKEN), an
#: API key, secret, password, passphrase or credential as any word (OPENAI_API_KEY,
#: AWS_SECRET_ACCESS_KEY, DB_PASSWORD; a password also glued on, PGPASSWORD). Why not a
#: substring: settings (SGLANG_MAX_TOKENS_PER_BATCH, SGLANG_TOKEN_USAGE_LOG) contain
#: "TOKEN" and are no secret; refusing them in a profile blocked valid tuning, and
#: dropping them from the launch hash made different launches hash alike. Use
#: :func:`is_secret_env_name`.
SECRET_ENV_NAME = re.compile(
    r"(?:^|_)(?:TOKEN$|(?:API_?KEYS?|SECRETS?|PASSWORDS?|PASSWD|PASSPHRASE|CREDENTIALS?)"
    r"(?:$|_))"
    r"|(?:PASSWORD|PASSWD|PASSPHRASE)$",  # glued to a prefix: PGPASSWORD
    re.IGNORECASE,
)


def is_secret_env_name(name: object) -> bool:
    """Whether an environment variable of this name carries a secret: the one judge for
    profiles (refused), ``gpuserve render`` (masked), the launch hash and result records
    (left out, values scrubbed). See :data:`SECRET_ENV_NAME` for the rule."""
    return bool(SECRET_ENV_NAME.search(str(name)))


class SecretFlag(NamedTuple):
    """A secret option in an argv: where, what it resolves to, and how it was written."""

    index: int  # position in the argv
    flag: str  # the full option it resolves to (``--api-key``)
    given: str  # the spelling as written, without ``=value`` (``--api-k``)

    @property
    def abbreviated(self) -> bool:
        return self.given != self.flag


def is_secret_option(option: FlagOption) -> bool:
    """Whether a catalog option carries a secret value (judged by dest and spellings)."""
    names = (option.dest, *(f.lstrip("-").replace("-", "_") for f in option.flags))
    return option.takes_value and any(SECRET_DEST.search(n) for n in names)


def secret_options(catalog: FlagCatalog) -> tuple[FlagOption, ...]:
    """The catalog's options that carry secrets."""
    return tuple(o for o in catalog.options if is_secret_option(o))


class _Index:
    """A catalog's spellings sorted for prefix lookups, with its secret spellings."""

    def __init__(self, catalog: FlagCatalog) -> None:
        # argparse matches the -h/--help every parser has as well
        self.flags = sorted({"--help", *catalog.flags})
        self.secret = frozenset(f for o in secret_options(catalog) for f in o.flags)
        self.abbrev = bool(catalog.data.get("allow_abbrev", True))

    def judge(self, name: str) -> tuple[bool, str | None, bool]:
        """(known, the secret option it resolves to or None, exact) for ``--name``.

        ``known``: the spelling resolves (exactly, uniquely, or ambiguously) to options
        of this catalog. Ambiguous prefixes count as secret when any candidate is: argparse
        refuses them, but its message repeats the whole argument, ``=value`` included.
        """
        if name in self.secret:
            return True, name, True
        lo = bisect.bisect_left(self.flags, name)
        if lo < len(self.flags) and self.flags[lo] == name:
            return True, None, True
        if not self.abbrev or not name.startswith("--"):
            return False, None, False
        hi = bisect.bisect_left(self.flags, name + "\U0010ffff", lo)
        hits = [f for f in self.flags[lo:hi] if f in self.secret]
        return hi > lo, (hits[0] if hits else None), False


@cache
def _index(catalog: FlagCatalog) -> _Index:
    return _Index(catalog)


@cache
def _committed() -> tuple[_Index, ...]:
    from gpuserve.launch.catalog import available_versions, load_catalog

    return tuple(_index(load_catalog(v)) for v in available_versions())


@cache
def _known_secret_flags() -> tuple[str, ...]:
    found = set(KNOWN_SECRET_FLAGS)
    for index in _committed():
        found |= index.secret
    return tuple(sorted(found))


def _by_rule(name: str) -> str | None:
    """The conservative judgement of a spelling no catalog knows: the secret it names."""
    bare = name[2:].replace("-", "_")
    if SECRET_DEST.search(bare):
        return name
    if len(name) - 2 >= MIN_ABBREV:
        return next((f for f in _known_secret_flags() if f.startswith(name)), None)
    return None


def _judge(name: str, catalog: FlagCatalog | None) -> str | None:
    """The secret option ``name`` (a ``--flag`` without ``=value``) resolves to, or None."""
    if catalog is not None:
        known, secret, _ = _index(catalog).judge(name)
        return secret if known else _by_rule(name)
    verdicts = [index.judge(name) for index in _committed()]
    exact = [secret for known, secret, is_exact in verdicts if is_exact]
    if exact:  # an exact spelling is that option wherever it exists
        return next((s for s in exact if s), None)
    secret = next((s for known, s, _ in verdicts if s), None)
    if secret or any(known for known, _, _ in verdicts):
        return secret
    return _by_rule(name)


def secret_flags(args: Iterable[str], catalog: FlagCatalog | None = None) -> list[SecretFlag]:
    """Every argument of ``args`` that sets a secret option, resolved like argparse.

    With ``catalog`` (the SGLang version's), abbreviations resolve as that version's
    parser resolves them, and a spelling it does not know is judged by the conservative
    rule (argparse's error for it would repeat the value). Without one, the committed
    catalogs and the rule judge (docs/security.md, "gpuserve.launch.secrets: how a flag
    is judged").
    """
    found: list[SecretFlag] = []
    seen: dict[str, str | None] = {}
    for index, arg in enumerate(args):
        if not isinstance(arg, str) or not arg.startswith("--") or arg == "--":
            continue
        given = arg.split("=", 1)[0]
        if given not in seen:
            seen[given] = _judge(given, catalog)
        flag = seen[given]
        if flag:
            found.append(SecretFlag(index, flag, given))
    return found


def split_secret_args(
    args: Iterable[str], catalog: FlagCatalog | None = None
) -> tuple[list[str], list[str]]:
    """(``args`` without secret options and their values, the secret values).

    A secret option's value is its ``=value`` or, without one, the next argument unless
    that is another ``--option`` (every secret option of SGLang takes one value).
    """
    argv = [str(a) for a in args]
    hits = {s.index for s in secret_flags(argv, catalog)}
    kept: list[str] = []
    values: list[str] = []
    skip = False
    for index, arg in enumerate(argv):
        if skip:
            skip = False
            if not arg.startswith("--"):
                values.append(arg)
                continue
        if index in hits:
            _, eq, value = arg.partition("=")
            if eq:
                values.append(value)
            skip = not eq
            continue
        kept.append(arg)
    return kept, values


def redact_args(args: Sequence[str], catalog: FlagCatalog | None = None,
                mask: str = REDACTED) -> list[str]:
    """``args`` with every secret option's value replaced by ``mask`` (for display)."""
    out = [str(a) for a in args]
    for hit in secret_flags(out, catalog):
        arg = out[hit.index]
        if "=" in arg:
            out[hit.index] = f"{arg.split('=', 1)[0]}={mask}"
        elif hit.index + 1 < len(out) and not out[hit.index + 1].startswith("--"):
            out[hit.index + 1] = mask
    return out


#: Host-data keys holding secrets (their values never reach output: gpuserve.redact).
SECRET_HOST_KEYS = ("hf_token", "sglang_api_key", "router_api_key")


def host_secret_values(data: dict) -> list[str]:
    """Every secret a host's data holds (the keys above, secret-named extra env), for
    :func:`gpuserve.redact.redact`: any non-empty value (a short one is still a secret,
    as in result records and the server's own output)."""
    values = [data.get(k) for k in SECRET_HOST_KEYS]
    extra = data.get("sglang_extra_env")
    if isinstance(extra, dict):
        values += [v for k, v in extra.items() if is_secret_env_name(k)]
    return [v for v in values if isinstance(v, str) and v]
