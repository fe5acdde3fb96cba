"""A profile's Hub model source, ``model.hf: org/name@<revision>``, and where it lives.

Why pinned: a branch moves, and a checkpoint that changes under a profile changes what
the memory preflight judged and what the service loads. A 40-hex commit is taken as is;
anything else (a branch or tag) only with ``model.allow_floating_revision: true``, and
the serve deploy then resolves it once, records the commit on the host and refuses a
later move unless host data ``hf_revision_update`` asks for it (docs/weights.md).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

#: A Hub repository id: ``org/name`` (huggingface_hub's validate_repo_id: letters,
#: digits, ``-_.``, at most 96 characters; no ``--`` or ``..``).
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
COMMIT = re.compile(r"[0-9a-f]{40}")
#: A git ref name as the Hub accepts it in a URL (branch, tag): no spaces, ``..``, ``~^:``.
REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
#: Hugging Face user access tokens (``hf_`` + letters/digits); a profile may hold none.
TOKEN_SHAPE = re.compile(r"hf_[A-Za-z0-9]{16,}")
#: The file whose presence marks a verified, complete revision directory.
COMPLETE_MARKER = ".gpuserve-complete.json"


@dataclass(frozen=True)
class HfSource:
    """``org/name@revision``; ``revision`` is a commit unless ``floating``."""

    repo_id: str
    revision: str

    @property
    def pinned(self) -> bool:
        return bool(COMMIT.fullmatch(self.revision))

    @property
    def spec(self) -> str:
        return f"{self.repo_id}@{self.revision}"

    def repo_dir(self, models_dir: str) -> str:
        """``<models_dir>/<org>--<name>``: every revision of the repository below it."""
        return posixpath.join(models_dir, self.repo_id.replace("/", "--"))

    def revision_dir(self, models_dir: str, commit: str) -> str:
        """The immutable directory of one commit (shared by every profile naming it)."""
        return posixpath.join(self.repo_dir(models_dir), commit)

    def ref_record(self, models_dir: str) -> str:
        """Where the commit a floating revision resolved to is recorded on the host."""
        return posixpath.join(self.repo_dir(models_dir), "refs", self.revision.replace("/", "%2F"))


def source_problem(text: str, allow_floating: bool) -> str | None:
    """Why ``text`` is not a usable ``org/name@revision`` (None when it is)."""
    if TOKEN_SHAPE.search(text):
        return ("holds what looks like a Hugging Face token: a profile is a committed file; "
                "set the token in host data hf_token (kept in a 0600 file on the host)")
    repo, sep, revision = text.partition("@")
    if not sep or not revision:
        return (f"{text!r:.100} names no revision: write org/name@<40-hex commit> (a branch "
                "only with model.allow_floating_revision: true)")
    if not REPO_ID.fullmatch(repo) or "--" in repo or ".." in repo:
        return f"{repo!r:.100} is not a Hub repository id (org/name)"
    if COMMIT.fullmatch(revision):
        return None
    if not REF.fullmatch(revision) or ".." in revision:
        return f"revision {revision!r:.60} is neither a 40-hex commit nor a branch or tag name"
    if not allow_floating:
        return (f"revision {revision!r:.60} is not a 40-hex commit: pin the commit "
                "(org/name@<commit>, shown on the Hub's 'Files and versions' page) or set "
                "model.allow_floating_revision: true to resolve it once per host")
    return None


def parse_source(text: str, allow_floating: bool = False) -> HfSource:
    """The source of a checked ``text`` (raise ValueError with :func:`source_problem`)."""
    problem = source_problem(text, allow_floating)
    if problem:
        raise ValueError(problem)
    repo, _, revision = text.partition("@")
    return HfSource(repo, revision)


def offline_path_problem(path: str) -> str | None:
    """Why a ``model.path`` cannot be served (None when it can): the unit runs with
    ``HF_HUB_OFFLINE=1``, so a Hub id there (``deepseek-ai/DeepSeek-V3``) or a relative
    path loads nothing on a fresh host; the profile must name a pinned Hub source, which
    the serve deploy fetches and verifies, or an absolute directory on the host."""
    if not path or path.startswith("/"):
        return None
    hub = bool(REPO_ID.fullmatch(path)) and "--" not in path and ".." not in path
    what = "a Hub id" if hub else "not an absolute path"
    return (f"{path!r:.100} is {what}, but the server runs offline (HF_HUB_OFFLINE=1) and "
            "would find no weights on a fresh host: write model.hf: "
            f"{path if hub else 'org/name'}@<40-hex commit> (the deploy fetches and "
            "verifies it; docs/weights.md) or an absolute path on the host")
