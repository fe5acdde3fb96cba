"""What several lab test modules check on the lab host, in one place.

Imported by name (``from labhelpers import ...``): pytest puts tests/lab on sys.path
for the modules there (no package, rootdir import mode ``prepend``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

UNIT = "gpuserve-sglang.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ENV_PATH = "/etc/gpuserve/sglang.env"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
VENV_RE = re.compile(r"/opt/gpuserve/venvs/(0\.5\.\d+\+lab)-[0-9a-f]{12}(?:-py[0-9a-f]{8})?")


def clean(text: str) -> str:
    return ANSI.sub("", text)


def no_changes(out: str) -> bool:
    """The serve deploy's summary: no operation of the run changed the host."""
    total = [line for line in out.splitlines() if line.strip().startswith("Grand total")]
    return bool(total) and total[-1].split()[3] == "-"  # Hosts, Success(-), Error, ...


def healthy(lab) -> bool:
    r = lab.ssh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health",
                timeout=60)
    return r.stdout.strip() == "200"


def unit_venv(lab) -> str:
    """The venv the live unit runs (its ExecStart names it)."""
    text = lab.ssh(f"cat {UNIT_PATH}", check=True).stdout
    found = VENV_RE.search(text)
    assert found, text
    return found.group(0)


def served_profile(lab) -> str:
    """The profile the live EnvironmentFile holds (its "# Profile: NAME" line; the
    server's arguments are there, the unit names no profile)."""
    out = lab.ssh(f"sed -n 's/^# Profile: //p' {ENV_PATH}", check=True).stdout.split()
    assert len(out) == 1, out
    return out[0]


def venvs(lab) -> list[str]:
    out = lab.ssh("ls -1d /opt/gpuserve/venvs/*/ 2>/dev/null").stdout
    return sorted(line.rstrip("/") for line in out.split())


class LabHub:
    """The lab instance's Hub stand-in (lab/hub), for lab tests.

    ``url``: what a lab host's ``HF_ENDPOINT`` (host data ``hf_endpoint``) is,
    ``http://10.0.2.2:<mirror port>/hub``; ``local_url``: the same from this machine.
    The knobs and counters are the stand-in's ``/_lab/`` endpoints (lab/hub/README.md).
    """

    def __init__(self, lab) -> None:
        self.lab = lab

    @property
    def url(self) -> str:
        return self.lab.state.hub_url

    @property
    def local_url(self) -> str:
        return self.lab.state.hub_local_url

    def control(self, what: str, body: dict | None = None):
        """GET (no body) or POST ``<local_url>/_lab/<what>``; the JSON answer."""
        from lab.hub.server import control

        return control(self.local_url, what, body)

    def reset(self) -> None:
        """Forget counters, pending faults and branch moves."""
        self.control("reset", {})

    def repos(self) -> dict:
        """repo id -> {access, branches, commits, purpose}."""
        return self.control("repos")

    def main_commit(self, repo: str) -> str:
        return self.repos()[repo]["branches"]["main"]

    def stats(self) -> dict:
        """{"requests": [...each request...], "files": {"<repo>/<file>": {"head",
        "get_full", "get_ranged", "bytes"}}} since the last reset."""
        return self.control("stats")

    def cut(self, repo: str, file: str, after: int, times: int = 1) -> None:
        """The next GET of ``file`` stops after byte ``after`` (connection closed); the
        client resumes with a Range from its last whole 10 MiB chunk."""
        self.control("faults", {"kind": "cut", "repo": repo, "file": file, "after": after,
                                "times": times})

    def corrupt(self, repo: str, file: str, offset: int | None = None, times: int = 1) -> None:
        """The next GET of ``file`` serves 16 bytes inverted at ``offset`` (default: the
        middle of the file); the size stays right, the sha256 does not."""
        self.control("faults", {"kind": "corrupt", "repo": repo, "file": file,
                                "offset": offset, "times": times})

    def bare404(self, repo: str, file: str | None = None, times: int = 1) -> None:
        """The next ``times`` requests for ``repo`` (or ``file``) get 404 without
        X-Error-Code, like a proxy or a mirror that is not a Hub."""
        self.control("faults", {"kind": "bare404", "repo": repo, "file": file,
                                "times": times})

    def status(self, repo: str, status: int, file: str | None = None, times: int = 1) -> None:
        """The next ``times`` requests for ``repo`` (or ``file``) are answered ``status``
        (503, or 429 with ``Retry-After: 1``): a Hub in trouble."""
        self.control("faults", {"kind": "status", "repo": repo, "file": file,
                                "status": status, "times": times})

    def cdn(self, host: str | None = "gpuserve-lab-cdn") -> None:
        """LFS files answered 302 to ``http://<host>:<port>/hub/_cdn/...`` as the Hub sends
        them to its CDN (another host: the client keeps the 302's metadata and sends no
        token there); the lab host resolves ``host`` to 10.0.2.2 (/etc/hosts). ``None``:
        served directly again (also after :meth:`reset`)."""
        if host:
            self.lab.ssh(f"grep -q ' {host}$' /etc/hosts || echo '10.0.2.2 {host}' "
                         ">> /etc/hosts", check=True)
        self.control("config", {"cdn_host": host})

    def move_branch(self, repo: str, commit: str, branch: str = "main") -> None:
        """Point ``branch`` at another of the repository's commits (the branch moved)."""
        self.control("refs", {"repo": repo, "branch": branch, "commit": commit})


def lab_hub(lab) -> LabHub:
    """The Hub stand-in of the ``lab`` fixture's instance, counters and faults reset."""
    hub = LabHub(lab)
    hub.reset()
    return hub


def host_provisioned(lab) -> None:
    """The host deploy, where the driver is missing (a fresh lab: no module before this
    one ran it)."""
    if lab.ssh("command -v nvidia-smi").returncode != 0:
        lab.run_pyinfra("deploy/host.py", "--data", "nvidia_install_headers=False")


def serve_inventory_profile(lab) -> None:
    """The host serving its inventory profile, whatever ran before (nothing, on a fresh
    lab): the host deploy where the driver is missing, then the serve deploy."""
    served = lab.ssh("test -f /etc/gpuserve/sglang.env").returncode == 0
    if served and served_profile(lab) == "glm5-nvfp4-tp8" and healthy(lab):
        return
    host_provisioned(lab)
    lab.run_pyinfra("deploy/serve.py", "--data", "bench=off")
    assert served_profile(lab) == "glm5-nvfp4-tp8" and healthy(lab)


def tune(lab, results: Path, surface: str, file: Path, noise: float = 0.0,
         limit: tuple[str, ...] = ()) -> tuple[int, str]:
    """`gpuserve tune` of ``file`` on the lab host (or, with ``limit``, on those hosts of
    inventory/lab_pair.py), the stand-in following ``surface`` with ``noise``; (rc,
    output without colours)."""
    env = {"GPUSERVE_LAB_STANDIN_LOAD_SECONDS": "3", "GPUSERVE_LAB_STANDIN_SURFACE": surface}
    if noise:
        env.update(GPUSERVE_LAB_STANDIN_SURFACE_NOISE=str(noise),
                   GPUSERVE_LAB_STANDIN_SURFACE_SEED="1")
    where = ["inventory/lab_pair.py", "--limit", ",".join(limit)] if limit else \
        ["inventory/lab.py"]
    r = lab.run_tool("gpuserve", "tune", where[0], str(file), "--results", str(results),
                     "--data", f"sglang_extra_env={json.dumps(env)}", *where[1:],
                     timeout=1500)
    return r.returncode, clean(r.stdout)
