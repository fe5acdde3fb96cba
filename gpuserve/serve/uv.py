"""uv, the installer of every locked venv (SGLang's and the gateway's): its pin and the
shell steps that build a venv with it.

Why uv: it downloads and unpacks a lock's wheels in parallel and links them from its
cache, where pip fetches and unpacks one at a time (docs/performance.md has the figures).
It resolves nothing here: ``--no-deps --require-hashes`` over the lock's requirements,
as pip did. uv itself reaches the host as a pinned artifact, never a script from the
network: PyPI's ``uv`` wheel, sha256-pinned in ``gpuserve/data/tools/uv.json``
(tools/gen_uv_pin.py), installed by the host's pip with ``--require-hashes`` into a
small tools venv beside the venvs, from the same index, mirror or wheelhouse as the
lock (``gpuserve wheelhouse`` carries it). The how is in docs/deploys.md.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gpuserve.errors import InputError

PIN_PATH = Path(__file__).resolve().parent.parent / "data" / "tools" / "uv.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"\d+\.\d+\.\d+")
#: pip's index options (gpuserve.serve.install.pip_args) that uv takes as they are;
#: ``--trusted-host`` is uv's alias of ``--allow-insecure-host``.
_SAME_OPTIONS = {"--index-url": 1, "--find-links": 1, "--no-index": 0, "--trusted-host": 1}
#: uv's environment for a deploy: no Python download (the venv's interpreter is the
#: one the deploy chose), no progress bars in the job log.
UV_ENV = "UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1"


@dataclass(frozen=True)
class UvWheel:
    filename: str
    arch: str
    url: str
    sha256: str
    size: int


@dataclass(frozen=True)
class UvPin:
    version: str
    wheels: tuple[UvWheel, ...]

    def requirement(self) -> str:
        """``uv==V --hash=sha256:A --hash=sha256:B ...``: every pinned wheel's hash, so
        pip takes the one the host's platform wants and nothing else."""
        hashes = " ".join(f"--hash=sha256:{w.sha256}" for w in self.wheels)
        return f"uv=={self.version} {hashes}"

    def wheels_for(self, arch: str) -> tuple[UvWheel, ...]:
        return tuple(w for w in self.wheels if w.arch == arch)


def _field(doc: dict, key: str, kind: type, source: str, where: str = "") -> object:
    value = doc.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InputError(source, f"{where}{key}", f"must be a {kind.__name__}, got "
                         f"{value!r:.60}")
    return value


def load_pin(path: Path = PIN_PATH) -> UvPin:
    """The uv pin, validated: a version, and wheels each with a sha256 and a size."""
    source = str(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(source, "(file)", f"cannot be read as JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("package") != "uv":
        raise InputError(source, "package", "must be \"uv\"")
    version = _field(doc, "version", str, source)
    if not _VERSION.fullmatch(version):
        raise InputError(source, "version", f"must be a release such as 0.13.9, got "
                         f"{version!r:.40}")
    wheels = []
    for i, w in enumerate(_field(doc, "wheels", list, source)):
        where = f"wheels[{i}]."
        if not isinstance(w, dict):
            raise InputError(source, f"wheels[{i}]", "must be an object")
        sha = _field(w, "sha256", str, source, where)
        name = _field(w, "filename", str, source, where)
        url = _field(w, "url", str, source, where)
        if not _SHA256.fullmatch(sha):
            raise InputError(source, f"{where}sha256", "must be 64 lowercase hex digits")
        if not name.startswith(f"uv-{version}-") or not name.endswith(".whl"):
            raise InputError(source, f"{where}filename", f"{name!r:.80} is not a uv "
                             f"{version} wheel")
        if not url.startswith("https://") or not url.endswith("/" + name):
            raise InputError(source, f"{where}url", "must be the https URL of the file")
        wheels.append(UvWheel(name, _field(w, "arch", str, source, where), url, sha,
                              _field(w, "size", int, source, where)))
    if not wheels:
        raise InputError(source, "wheels", "must list at least one wheel")
    return UvPin(version, tuple(wheels))


@lru_cache(maxsize=1)
def pin() -> UvPin:
    """The committed pin (read once)."""
    return load_pin()


def tools_dir(venv: str) -> str:
    """``<home>/tools`` for a venv ``<home>/venvs/<name>``: beside the venvs, on their
    filesystem (uv's cache links into the venv from there)."""
    return f"{posixpath.dirname(posixpath.dirname(venv))}/tools"


def uv_path(venv: str, version: str) -> str:
    return f"{tools_dir(venv)}/uv-{version}/bin/uv"


def uv_options(pip_options: list[str]) -> list[str]:
    """pip's index options as uv's: the same flags, checked one by one (an option uv
    would read otherwise is refused here rather than on the host)."""
    out, i = [], 0
    while i < len(pip_options):
        flag = pip_options[i]
        if flag not in _SAME_OPTIONS:
            raise ValueError(f"pip option {flag!r} has no uv counterpart here")
        width = _SAME_OPTIONS[flag]
        out += pip_options[i:i + 1 + width]
        i += 1 + width
    return out


def uv_config_text(pip_config: str) -> str:
    """The uv.toml equivalent of gpuserve's pip credentials file (``[global]`` with
    ``index-url`` / ``find-links`` lines, gpuserve.serve.install.pip_config_text):
    the same URLs under ``[pip]``, as TOML strings."""
    lines = ["[pip]"]
    for line in pip_config.splitlines():
        key, sep, value = line.partition(" = ")
        if not sep:
            continue
        if key == "index-url":
            lines.append(f"index-url = {json.dumps(value)}")
        elif key == "find-links":
            lines.append(f"find-links = [{json.dumps(value)}]")
    return "\n".join(lines) + "\n"


def bootstrap_step(venv: str, python: str, pip_options: list[str], version: str,
                   requirement: str, pip_config_path: str | None) -> str:
    """Shell: the pinned uv in its tools venv unless that uv is already there, installed
    by pip with ``--require-hashes`` from the lock's own index, mirror or wheelhouse."""
    q = shlex.quote
    tools = tools_dir(venv)
    home = f"{tools}/uv-{version}"
    req = f"{home}.txt"
    options = " ".join(q(a) for a in pip_options)
    env = f"PIP_CONFIG_FILE={q(pip_config_path)} " if pip_config_path else ""
    install = (f"mkdir -p {q(tools)} && rm -rf {q(home)} && "
               f"printf '%s\\n' {q(requirement)} > {q(req)} && "
               f"{q(python)} -m venv {q(home)} && "
               f"{env}{q(home)}/bin/pip install --disable-pip-version-check --no-input "
               f"--require-hashes --no-deps --only-binary=:all: {options} -r {q(req)}")
    return (f'[ "$({q(home)}/bin/uv --version 2>/dev/null | cut -d " " -f 1-2)" = '
            f'{q("uv " + version)} ] || {{ {install}; }}')


def install_steps(venv: str, python: str, requirements: str, pip_options: list[str],
                  version: str, uv_config_path: str | None) -> list[str]:
    """Shell: the venv by uv (the chosen interpreter, never a downloaded one), the lock's
    wheels by ``uv pip install --require-hashes --no-deps`` with uv's cache beside the
    venvs (removed after it, whatever its status, which the step keeps), ``uv pip check``.
    ``--compile-bytecode``: the unit's ProtectSystem=strict keeps the venv read-only to the
    server, which would otherwise compile every module it imports at every start (uv,
    unlike pip, compiles nothing by default)."""
    q = shlex.quote
    uv = f"{UV_ENV} {q(uv_path(venv, version))}"
    cache = f"{tools_dir(venv)}/uv-cache"
    config = (f"--config-file {q(uv_config_path)} --no-config" if uv_config_path
              else "--no-config")
    options = " ".join(q(a) for a in uv_options(pip_options))
    target = f"--python {q(venv)}/bin/python"
    install = (f"UV_CACHE_DIR={q(cache)} {uv} pip install {config} {target} "
               f"--require-hashes --no-deps --only-binary :all: --link-mode hardlink "
               f"--compile-bytecode {options} -r {q(requirements)}")
    return [f"{uv} venv {q(venv)} --no-config --python {q(python)}",
            f"{{ {install}; status=$?; rm -rf {q(cache)}; (exit $status); }}",
            f"{uv} pip check --no-config {target}"]
