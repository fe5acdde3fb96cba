"""What a no-op run over N hosts costs the controller, beside the same run over one host.

    python -m lab up --name NAME --kind container|vm   # a lab host that is provisioned
    .venv/bin/python bench/fleet_noop.py --name NAME [--hosts 1,8,32] [--runs 3]
                                         [--deploy host|exec|both]

On a container lab host (``--kind container``) every one of the N hosts is a container
of its own: clones of NAME (``python -m lab up --name NAME-fleet-NN --clone-from NAME``:
its disk copied with the filesystem frozen, its own network namespace, slirp4netns and
SSH port), each with its own host data from inventory/lab.py; the clones are taken down
at the end (``--keep`` leaves them). On the VM, as follows:

The N hosts are cheap SSH endpoints, all in ONE lab VM: the bench starts N extra sshd
processes in the guest (``/usr/sbin/sshd -p PORT -o PidFile=/run/sshd-PORT.pid``, the
guest's own config and host key) on ports 2201.., forwards each to a free 127.0.0.1
port of this machine (lab/fleet.py ``forward``: QMP ``hostfwd_add``, kept in the
instance's state and reused), and writes a temporary pyinfra inventory with hosts
bench-01.. that all carry the lab host's data (inventory/lab.py ``host_data_for``)
with their own ``ssh_port``, and one known_hosts file pinning the lab's host key for
every ``[127.0.0.1]:PORT`` (strict host-key checking stays on). paramiko's connect,
banner and auth timeouts are raised to ``--connect-timeout`` (120 s): at 32 hosts the
one guest did not send every SSH banner within paramiko's default 15 s.

For each N it times, over ``--runs`` runs (medians, and min-max of the wall time):

- ``pyinfra -y INVENTORY deploy/host.py``: on a provisioned host a no-op rerun, two
  remote commands per host (the first run at N = 1 is discarded, as in
  bench/rerun_cost.py; every timed run must change and fail nothing);
- ``pyinfra -y INVENTORY exec -- true``: start pyinfra, connect, run one command;

with the wall time, the controller's own CPU time (user + sys of the pyinfra process
and its children: ``resource.getrusage(RUSAGE_CHILDREN)`` deltas around each run), the
ratio of both to N = 1, the CPU time per host, and what each host beyond the first
adds to it. pyinfra runs up to 20 hosts per core at once (its default ``--parallel``),
so the hosts of one run connect together.

All N endpoints are one guest under QEMU TCG (2 vCPUs): the guest's work for N hosts
runs on the same two emulated CPUs, so the wall time over-states what N real hosts
would cost the controller; the CPU columns are the controller's own. The extra sshd
processes are stopped at the end (the forwards stay in QEMU until the VM goes down).
No test asserts on these times.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab.keys import HOST_KEY, known_hosts_line, public_key  # noqa: E402
from lab.sshutil import run_in  # noqa: E402
from lab.state import instance_name, keys_dir, read_state  # noqa: E402

PYINFRA = str(ROOT / ".venv" / "bin" / "pyinfra")
FIRST_GUEST_PORT = 2201
GROUP = "gpu"
COMMANDS = {"host": ("deploy/host.py",), "exec": ("exec", "--", "true")}
CONNECT_TIMEOUT = 120.0  # paramiko's 15 s banner timeout is not enough for 32 at once
LABELS = {"host": "deploy/host.py (no-op rerun)", "exec": "exec -- true"}


def host_names(n: int) -> list[str]:
    width = max(2, len(str(n)))
    return [f"bench-{i:0{width}d}" for i in range(1, n + 1)]


def guest_ports(n: int) -> list[int]:
    return list(range(FIRST_GUEST_PORT, FIRST_GUEST_PORT + n))


def known_hosts_text(ports: list[int], host_pub: str) -> str:
    """One known_hosts file pinning the guest's host key at every forwarded port."""
    return "".join(known_hosts_line("127.0.0.1", p, host_pub) for p in ports)


def inventory_text(data: dict, ports: list[int], known_hosts: str,
                   connect_timeout: float = CONNECT_TIMEOUT) -> str:
    """A pyinfra inventory (Python) with one host per forwarded port, all with ``data``
    (the lab host's, literal) and their own ``ssh_port`` and the shared known_hosts.
    paramiko's connect, banner and auth timeouts become ``connect_timeout``: one TCG
    guest answers many handshakes at once slowly (each sshd connection re-executes sshd
    and does its key exchange on the same two emulated CPUs)."""
    timeouts = {k: connect_timeout for k in ("timeout", "banner_timeout", "auth_timeout")}
    data = {**data, "ssh_paramiko_connect_kwargs": timeouts}
    lines = ['"""Temporary inventory written by bench/fleet_noop.py: every host is the '
             'same lab guest."""', "", f"_DATA = {data!r}", "", f"{GROUP} = ["]
    for name, port in zip(host_names(len(ports)), ports, strict=True):
        lines.append(f"    ({name!r}, {{**_DATA, 'ssh_port': {port}, "
                     f"'ssh_known_hosts_file': {known_hosts!r}}}),")
    lines.append("]")
    return "\n".join(lines) + "\n"


def start_sshd_script(ports: list[int]) -> str:
    """Shell for the guest: an sshd per port unless one runs there already."""
    return "".join(
        f"pf=/run/sshd-{p}.pid; if ! {{ [ -s $pf ] && kill -0 $(cat $pf) 2>/dev/null; }}; "
        f"then /usr/sbin/sshd -p {p} -o PidFile=$pf || exit 1; fi; " for p in ports) + "true"


def stop_sshd_script(ports: list[int]) -> str:
    return "".join(f"pf=/run/sshd-{p}.pid; [ -s $pf ] && kill $(cat $pf); rm -f $pf; "
                   for p in ports) + "true"


@dataclass
class Sample:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    hosts_cpu: list[float] = field(default_factory=list)  # container hosts only

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


def table(label: str, runs: int, samples: dict[int, Sample]) -> str:
    """The per-N table: ratios to the smallest N (1 by default), CPU per host, and the
    CPU each host beyond the smallest N adds."""
    base_n = min(samples)
    base = samples[base_n]
    out = [f"{label}: {runs} runs per N (medians; wall min-max)",
           f"  {'hosts':>5}  {'wall s':>7} {'(min-max)':<15} {f'x N={base_n}':>7}  "
           f"{'CPU s':>6}  {f'x N={base_n}':>7}  {'CPU/host s':>10}  "
           f"{'CPU/extra host s':>16}"]
    if base.hosts_cpu:
        out[-1] += f"  {'hosts CPU s':>11}"
    for n in sorted(samples):
        s = samples[n]
        spread = f"({min(s.wall):.2f}-{max(s.wall):.2f})"
        wall_x = s.wall_median / base.wall_median if base.wall_median else float("nan")
        cpu_x = s.cpu_median / base.cpu_median if base.cpu_median else float("nan")
        extra = (f"{(s.cpu_median - base.cpu_median) / (n - base_n):16.3f}" if n > base_n
                 else f"{'-':>16}")
        out.append(f"  {n:>5}  {s.wall_median:7.2f} {spread:<15} {wall_x:6.1f}x  "
                   f"{s.cpu_median:6.2f}  {cpu_x:6.1f}x  {s.cpu_median / n:10.3f}  {extra}"
                   + (f"  {statistics.median(s.hosts_cpu):11.2f}" if s.hosts_cpu else ""))
    return "\n".join(out)


def hosts_cpu_seconds(names: list[str]) -> float:
    """CPU seconds the container lab hosts ``names`` have used: their cgroups' (cgroup2
    ``cpu.stat`` usage_usec: systemd, sshd, the deploy's commands) and their
    slirp4netns processes' (user-mode networking outside the cgroups; /proc/PID/stat).
    They run on this same machine, so beside the controller's CPU they say whether a
    run's wall time is the controller's or the hosts' work on the shared cores."""
    from lab import container

    total = 0.0
    for name in names:
        st = read_state(name)
        netns = (st.extra.get("netns") if st else None) or container.netns_name(name)
        for cg in container.host_cgroups(netns):
            stat = cg / "cpu.stat"
            if stat.exists():
                usage = dict(line.split() for line in stat.read_text().splitlines())
                total += int(usage.get("usage_usec", 0)) / 1e6
        pid = st.extra.get("slirp_pid") if st else None
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def parse_hosts(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of host counts: {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"host counts must be >= 1: {text!r}")
    return values


def timed(argv: list[str], env: dict[str, str], timeout: float) -> tuple[float, float, str, int]:
    """(wall s, CPU s of the process tree, output, exit code) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{shlex.join(argv)}: no answer in {timeout:.0f} s") from None
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout + proc.stderr, proc.returncode


def guest(name: str, script: str) -> None:
    try:
        run_in(name, script, timeout=300)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None


def lab_host_data(name: str) -> dict:
    """The lab host's data (inventory/lab.py), loaded for instance ``name``."""
    import importlib.util

    os.environ["GPUSERVE_LAB_NAME"] = name  # the module builds its own host on import
    spec = importlib.util.spec_from_file_location("gpuserve_lab_inventory",
                                                  ROOT / "inventory" / "lab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.host_data_for(name)


def measure(kind: str, inventory: Path, runs: int, env: dict[str, str],
            timeout: float, hosts: list[str] | None = None) -> Sample:
    """``runs`` timed runs; with ``hosts`` (container lab hosts), their CPU too."""
    argv = [PYINFRA, "-y", str(inventory), *COMMANDS[kind]]
    sample = Sample()
    for _ in range(runs):
        hosts_before = hosts_cpu_seconds(hosts) if hosts else 0.0
        wall, cpu, out, rc = timed(argv, env, timeout)
        if hosts:
            sample.hosts_cpu.append(hosts_cpu_seconds(hosts) - hosts_before)
        # a deploy's "[host] Success" is a change (exec reports its command that way)
        if rc != 0 or (kind == "host" and re.search(r"\] (Success|Error)\b", out)):
            hosts = [ln.strip() for ln in out.splitlines()
                     if re.search(r"\[bench-\d+\].*(Success|Error|[Cc]ould not)", ln)]
            raise SystemExit(f"{shlex.join(argv)}: changed or failed something ({rc}):\n"
                             + "\n".join(hosts[:10]) + f"\n...\n{out[-1500:]}")
        sample.wall.append(wall)
        sample.cpu.append(cpu)
    return sample


def clone_names(name: str, n: int) -> list[str]:
    """NAME itself, then NAME-fleet-02 .. NAME-fleet-NN."""
    return [name] + [f"{name}-fleet-{i:02d}" for i in range(2, n + 1)]


def containers_inventory_text(datas: list[dict],
                              connect_timeout: float = CONNECT_TIMEOUT) -> str:
    """A pyinfra inventory (Python) with one container host per entry of ``datas`` (each
    host's own lab host data, literal)."""
    timeouts = {k: connect_timeout for k in ("timeout", "banner_timeout", "auth_timeout")}
    lines = ['"""Temporary inventory written by bench/fleet_noop.py: a container lab host '
             'each."""', "", f"{GROUP} = ["]
    for host, data in zip(host_names(len(datas)), datas, strict=True):
        lines.append(f"    ({host!r}, {{**{data!r}, "
                     f"'ssh_paramiko_connect_kwargs': {timeouts!r}}}),")
    lines.append("]")
    return "\n".join(lines) + "\n"


def lab_cli(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "lab", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"python -m lab {shlex.join(args)} failed:\n{r.stderr[-2000:]}")


def run_containers(args: argparse.Namespace, name: str, kinds: list[str],
                   env: dict[str, str]) -> tuple[dict[str, dict[int, Sample]], float | None,
                                                 str]:
    """Every host its own container: clone NAME up to the largest N, measure, take the
    clones down (unless --keep)."""
    names = clone_names(name, max(args.hosts))
    samples: dict[str, dict[int, Sample]] = {k: {} for k in kinds}
    first, stopped = None, ""
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="fleet-noop-") as tmp:
            if "host" in kinds:  # before cloning: the clones start from a no-op state
                inventory = Path(tmp) / "fleet_noop_source.py"
                inventory.write_text(containers_inventory_text([lab_host_data(name)],
                                                               args.connect_timeout))
                first, _, out, rc = timed([PYINFRA, "-y", str(inventory),
                                           *COMMANDS["host"]], env, args.timeout)
                if rc != 0:
                    raise SystemExit(f"deploy/host.py failed ({rc}):\n{out[-3000:]}")
            for clone in names[1:]:
                lab_cli("up", "--name", clone, "--kind", "container", "--clone-from", name)
            print(f"  ({len(names) - 1} clones of {name} up in "
                  f"{time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
            datas = [lab_host_data(n) for n in names]
            for n in args.hosts:
                inventory = Path(tmp) / f"fleet_noop_{n}.py"
                inventory.write_text(containers_inventory_text(datas[:n],
                                                               args.connect_timeout))
                stopped = _measure_all(kinds, inventory, n, args, env, samples, names[:n])
                if stopped:
                    break
    finally:
        if not args.keep:
            for clone in names[1:]:
                subprocess.run([sys.executable, "-m", "lab", "down", "--name", clone],
                               cwd=ROOT, capture_output=True, timeout=300)
    return samples, first, stopped


def _measure_all(kinds: list[str], inventory: Path, n: int, args: argparse.Namespace,
                 env: dict[str, str], samples: dict[str, dict[int, Sample]],
                 hosts: list[str]) -> str:
    for kind in kinds:
        try:
            samples[kind][n] = measure(kind, inventory, args.runs, env, args.timeout, hosts)
        except SystemExit as exc:  # keep what was measured at smaller N
            return f"stopped at N={n} ({kind}): {exc}"
        s = samples[kind][n]
        print(f"  ({kind}, {n} hosts: wall {s.wall_median:.2f} s, "
              f"CPU {s.cpu_median:.2f} s)", file=sys.stderr, flush=True)
    return ""


def print_results(kinds: list[str], args: argparse.Namespace,
                  samples: dict[str, dict[int, Sample]], first: float | None,
                  stopped: str) -> None:
    if first is not None:
        print(f"(first deploy run discarded: {first:.1f} s; on the VM at N={args.hosts[0]}, "
              "on containers on the source before it is cloned)")
    for kind in kinds:
        if samples[kind]:
            print()
            print(table(LABELS[kind], args.runs, samples[kind]))
    if stopped:
        print(f"\n{stopped[-3000:]}")
        sys.exit(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=parse_hosts, default=[1, 8, 32],
                   help="host counts, comma-separated (default 1,8,32)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--deploy", choices=("host", "exec", "both"), default="both")
    p.add_argument("--name", default=os.environ.get("GPUSERVE_LAB_NAME", "default"),
                   help="lab instance (a provisioned host)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per pyinfra run")
    p.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT,
                   help="paramiko's connect, banner and auth timeouts (seconds)")
    p.add_argument("--keep", action="store_true",
                   help="container hosts: leave the clones running at the end")
    args = p.parse_args()
    name = instance_name(args.name)
    kinds = ["host", "exec"] if args.deploy == "both" else [args.deploy]
    st = read_state(name)
    if st is None:
        raise SystemExit(f"lab instance {name!r} is not running: `python -m lab up` first")
    if st.kind == "container":
        env = dict(os.environ, GPUSERVE_LAB_NAME=name)
        samples, first, stopped = run_containers(args, name, kinds, env)
        print(f"lab instance {name} and its clones: each of the N hosts is a container of "
              "its own (systemd-nspawn,")
        print("native speed); the CPU columns are the controller's own (user+sys of the "
              "pyinfra process and its children),")
        print("'hosts CPU s' the N hosts' own (their cgroups and slirp4netns), on the same "
              f"{os.cpu_count()} cores.")
        print_results(kinds, args, samples, first, stopped)
        return

    from lab import fleet

    data = lab_host_data(name)
    host_pub = public_key(keys_dir() / HOST_KEY)
    env = dict(os.environ, GPUSERVE_LAB_NAME=name)
    ports = guest_ports(max(args.hosts))
    guest(name, start_sshd_script(ports))
    samples: dict[str, dict[int, Sample]] = {k: {} for k in kinds}
    first = None
    stopped = ""
    try:
        forwarded = [fleet.forward(name, port) for port in ports]
        with tempfile.TemporaryDirectory(prefix="fleet-noop-") as tmp:
            known_hosts = Path(tmp) / "known_hosts"
            known_hosts.write_text(known_hosts_text(forwarded, host_pub))
            known_hosts.chmod(0o600)
            for n in args.hosts:
                if stopped:
                    break
                inventory = Path(tmp) / f"fleet_noop_{n}.py"
                inventory.write_text(inventory_text(data, forwarded[:n], str(known_hosts),
                                                   args.connect_timeout))
                if first is None and "host" in kinds:  # may still change something
                    first, _, out, rc = timed([PYINFRA, "-y", str(inventory),
                                               *COMMANDS["host"]], env, args.timeout)
                    if rc != 0:
                        raise SystemExit(f"deploy/host.py failed ({rc}):\n{out[-3000:]}")
                for kind in kinds:
                    try:
                        samples[kind][n] = measure(kind, inventory, args.runs, env,
                                                   args.timeout)
                    except SystemExit as exc:  # keep what was measured at smaller N
                        stopped = f"stopped at N={n} ({kind}): {exc}"
                        break
                    s = samples[kind][n]
                    print(f"  ({kind}, {n} hosts: wall {s.wall_median:.2f} s, "
                          f"CPU {s.cpu_median:.2f} s)", file=sys.stderr, flush=True)
    finally:
        guest(name, stop_sshd_script(ports))
    print(f"lab instance {name}: all N hosts are sshd processes in ONE guest (QEMU TCG, "
          "2 vCPUs);")
    print("the guest's work is shared, so wall time over-states the controller's cost; "
          "the CPU")
    print("columns are the controller's own (user+sys of the pyinfra process and its "
          "children).")
    print_results(kinds, args, samples, first, stopped)


if __name__ == "__main__":
    main()
