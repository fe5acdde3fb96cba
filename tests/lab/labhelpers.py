"""What several lab test modules check on the lab host, in one place.

Imported by name (``from labhelpers import ...``): pytest puts tests/lab on sys.path
for the modules there (no package, rootdir import mode ``prepend``)."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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
    # each candidate's serve deploy is the real pyinfra CLI, forked (lab.pyinfra_launcher)
    r = lab.run_tool("gpuserve", "tune", where[0], str(file), "--results", str(results),
                     "--data", f"sglang_extra_env={json.dumps(env)}", *where[1:],
                     "--pyinfra", lab.pyinfra_launcher(),
                     timeout=1500)
    return r.returncode, clean(r.stdout)


#: the lab gateway's API key (inventory/lab.py: the lab's own, not a secret)
ROUTER_KEY = "lab-router-key-not-a-secret-0001"
#: an OpenAI completion through the gateway (a 200 with choices answers it)
COMPLETION = ("/v1/completions", {"model": "glm-5", "prompt": "The capital of France is",
                                  "max_tokens": 4, "temperature": 0}, "choices")
#: SGLang's native ``/generate`` (smg in PD mode wants the model named in the body)
GENERATE = ("/generate", {"model": "glm-5", "text": "The capital of France is",
                          "sampling_params": {"max_new_tokens": 4, "temperature": 0}}, "text")


@dataclass
class Client:
    """Requests through the gateway on ``port``, one at a time every 0.2 s, until stopped
    (at most ``max_requests``, at most ``max_seconds``): every answer must be a 200 whose
    JSON has the ``request``'s answer key (:data:`COMPLETION`, :data:`GENERATE`)."""

    port: int
    request: tuple[str, dict, str] = COMPLETION
    max_requests: int = 3000
    max_seconds: float = 900.0
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _one(self) -> None:
        path, body, answer = self.request
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("POST", path, body=json.dumps(body).encode(), headers={
                "Authorization": f"Bearer {ROUTER_KEY}", "Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200 or not json.loads(data).get(answer):
                self.failures.append(f"{time.strftime('%X')} HTTP {resp.status}: {data[:200]!r}")
            else:
                self.ok += 1
        except (OSError, ValueError) as exc:
            self.failures.append(f"{time.strftime('%X')} {type(exc).__name__}: {exc}")
        finally:
            conn.close()

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        for _ in range(self.max_requests):
            if self._stop.is_set() or time.monotonic() > deadline:
                return
            self._one()
            time.sleep(0.2)

    def __enter__(self) -> Client:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=120)


#: the lab fleet's hosts as its inventories name them (the module's own host first)
FLEET_HOSTS = ("lab-gpu", "lab-gpu-2", "lab-gpu-3")


class LabFleet:
    """The module's lab host (``lab``) and its clones (``others``, lab names), which the
    fleet inventories name :data:`FLEET_HOSTS` in that order, behind a gateway on
    ``gateway_port``."""

    def __init__(self, lab, others: list[str], gateway_port: int):
        self.lab, self.others, self.gateway_port = lab, others, gateway_port
        self.env = dict(lab.env, GPUSERVE_LAB_FLEET=",".join([lab.name, *others]))

    def ssh(self, host: str, cmd: str, check: bool = True) -> str:
        """``cmd``'s output on the fleet host named ``host`` in the inventory."""
        if host == FLEET_HOSTS[0]:
            return self.lab.ssh(cmd, check=check).stdout
        return self.lab.lab_cli("ssh", "--name", self.others[FLEET_HOSTS.index(host) - 1],
                                "--", cmd, check=check, timeout=120).stdout


@contextmanager
def linked_clones(lab) -> Iterator[tuple[list[str], int]]:
    """(the clones' lab names, the gateway port forwarded from the module's host): the
    rest of :data:`FLEET_HOSTS` cloned from ``lab`` and linked to it, downed and unlinked
    on the way out."""
    others = [f"{lab.name}-{i}" for i in range(2, len(FLEET_HOSTS) + 1)]
    try:
        for other in others:
            lab.lab_cli("up", "--name", other, "--clone-from", lab.name, timeout=900)
        lab.lab_cli("link", lab.name, *others)
        port = int(lab.lab_cli("forward", "--name", lab.name, "30080")
                   .stdout.strip().splitlines()[-1])
        yield others, port
    finally:
        for other in others:
            lab.lab_cli("down", "--name", other, check=False)
        lab.lab_cli("unlink", "--name", lab.name, check=False)
