"""What verifying the weights costs: fetch+verify against the download alone and against
``hf download``, on loopback, from the lab's Hub stand-in (lab/hub), side by side.

    .venv/bin/python bench/weights_speed.py [--shards 4] [--shard-mib 320] [--runs 3]
                                            [--workers 8] [--dir /tmp] [--link-mbit 0]

It writes a repository of ``--shards`` LFS safetensors-named files of random bytes
(plus a config.json) into a Hub stand-in root under ``--dir``, starts the stand-in in
a process of its own on 127.0.0.1 and, ``--runs`` times (the order rotated each run),
fetches the revision with:

- ``download alone``: the listing, then every file through hub_client's download,
  ``--workers`` at once, with no hash: the floor, what the transfer itself costs;
- ``fetch+verify``: weights_fetch.fetch, the host script's code (listing, disk check,
  download with every file hashed as it arrives, marker, read-only seal);
- ``download, then hash``: the download alone, then every file read back and hashed
  (weights_fetch.verify: how the host script verified before the hash moved into the
  stream, one file after another);
- ``same, cold read-back``: the same, with the downloaded files written out and
  dropped from the page cache (``posix_fadvise``, untimed) before they are read back: a
  checkpoint larger than the page cache, as a 440 GB one is;
- ``hash alone``: sha256 of as many bytes as the files have, from memory, the files
  ``--workers`` at once (no transfer, no disk): the hash's own cost, which fetch+verify
  adds to the download alone where no core is idle;
- ``gpuserve weights``: the command, a process of its own (the interpreter's and
  gpuserve's start-up included);
- ``hf download``: huggingface_hub's command (``.venv/bin/hf``, 8 workers, its own
  process too), which checks sizes but hashes nothing.

Each result is removed before the next method runs (the repository and one copy are on
disk at once: about 2.6 GB with the defaults). It prints the medians (and min-max)
side by side with the ratios to the download alone and to ``hf download``, and the CPU
seconds each used (this process, its commands and the server together: on a machine
busy with other work the wall times move with the load, the CPU seconds much less).
The page cache is hot (the server's files are read from memory after the first run).
``--link-mbit N`` paces everything the server sends to one link of N Mbit/s (its socket
writes, all connections together): a host fetching from a Hub waits on its link, and
the hash runs in that time. Goals:
fetch+verify at most 1.1x the download alone, and no slower than ``hf download``.
No test asserts on these times.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuserve.commands.weights import fetch_module  # noqa: E402
from gpuserve.memory.remote import hub_module  # noqa: E402
from lab.hub import store  # noqa: E402

REPO = "bench/Weights-Speed"
CONFIG = json.dumps({"model_type": "bench"}) + "\n"
VENV = ROOT / ".venv" / "bin"


def make_repo(hub_root: Path, shards: int, shard_bytes: int) -> str:
    """The repository (random bytes, hashed at publish time); its commit id."""
    repo_dir = hub_root / REPO
    tree = repo_dir / ".staging"
    tree.mkdir(parents=True)
    (tree / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    (tree / "config.json").write_text(CONFIG)
    for i in range(1, shards + 1):
        with open(tree / f"model-{i:05d}-of-{shards:05d}.safetensors", "wb") as f:
            left = shard_bytes
            while left:
                block = os.urandom(min(left, 16 << 20))
                f.write(block)
                left -= len(block)
    date = "2026-12-06T00:00:00.000Z"
    cid = store.write_commit(repo_dir, tree, title="bench", date=date, parent=None,
                             eager_max=1 << 62)
    store.write_repo_json(repo_dir, {"id": REPO, "access": "public", "created": date,
                                     "branches": {"main": cid}, "purpose": "bench",
                                     "commits": [{"id": cid, "parent": None,
                                                  "title": "bench", "date": date}],
                                     "config": {}, "tags": []})
    return cid


def start_server(hub_root: Path, link_mbit: float = 0) -> tuple[subprocess.Popen, str]:
    """The stand-in in a process of its own (not this one's interpreter lock). With
    ``link_mbit``, everything it sends shares one link of that many megabits/s (a pacing
    of its socket writes, all connections together), as a host's link to a Hub would."""
    code = ("import sys, time; from pathlib import Path; from lab.hub.server import HubServer\n"
            "rate = float(sys.argv[2]) * 1e6 / 8\n"
            "if rate:\n"
            "    import socketserver, threading\n"
            "    lock, link = threading.Lock(), [time.monotonic()]\n"
            "    def write(self, b, send=socketserver._SocketWriter.write):\n"
            "        with lock:\n"
            "            link[0] = max(link[0], time.monotonic()) + memoryview(b).nbytes / rate\n"
            "            free = link[0]\n"
            "        time.sleep(max(0.0, free - time.monotonic()))\n"
            "        return send(self, b)\n"
            "    socketserver._SocketWriter.write = write\n"
            "s = HubServer(Path(sys.argv[1])).__enter__(); print(s.url, flush=True)\n"
            "while True: time.sleep(3600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(hub_root), str(link_mbit)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise SystemExit("the Hub stand-in did not start")
    return proc, url


def download_alone(url: str, commit: str, out: Path, workers: int) -> list[dict]:
    """The listing and every file, ``workers`` at once, no hash: the transfer's floor."""
    hub = hub_module()
    client = hub.Client(url)
    files = client.list_tree(REPO, commit)

    def one(entry: dict) -> None:
        path = out / entry["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download(client.resolve_url(REPO, commit, entry["path"]), str(path),
                        entry["size"])

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, files))
    return files


def hash_alone(sizes: list[int], workers: int) -> None:
    """sha256 of as many bytes as each file has, from one 1 MiB block in memory, the
    files ``workers`` at once: what the hash costs with no transfer and no disk."""
    block = os.urandom(1 << 20)

    def one(size: int) -> str:
        h = hashlib.sha256()
        for at in range(0, size, len(block)):
            h.update(block[:min(len(block), size - at)])
        return h.hexdigest()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, sizes))


def methods(url: str, commit: str, workers: int,
            sizes: list[int]) -> dict[str, Callable[[Path], float]]:
    """Each method: a function of an empty output directory, returning its seconds."""
    module = fetch_module()
    env = {**os.environ, "HF_ENDPOINT": url, "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}

    def timed(fn: Callable[[], object]) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def then_hash(out: Path, cold: bool = False) -> float:
        t = time.perf_counter()
        files = download_alone(url, commit, out, workers)
        took = time.perf_counter() - t
        if cold:  # untimed: written out, then out of the page cache (these files only)
            for entry in files:
                fd = os.open(out / entry["path"], os.O_RDONLY)
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
        t = time.perf_counter()
        bad = module.verify(str(out), files)
        assert bad == [], bad
        return took + time.perf_counter() - t

    def command(argv: list[str], home: Path) -> None:
        done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True,
                              env={**env, "HF_HOME": str(home)})
        if done.returncode:
            raise SystemExit(f"{argv[0]}: exit {done.returncode}: {done.stderr[-2000:]}")

    return {
        "download alone": lambda out: timed(lambda: download_alone(url, commit, out,
                                                                   workers)),
        "fetch+verify": lambda out: timed(lambda: module.fetch(
            REPO, commit, str(out / "rev"), endpoint=url, report=lambda d: None,
            options=module.FetchOptions(workers=workers))),
        "download, then hash": then_hash,
        "same, cold read-back": lambda out: then_hash(out, cold=True),
        "hash alone": lambda out: timed(lambda: hash_alone(sizes, workers)),
        "gpuserve weights": lambda out: timed(lambda: command(
            [str(VENV / "gpuserve"), "weights", "--hf", f"{REPO}@{commit}",
             "--hf-endpoint", url, "--workers", str(workers), str(out / "models")],
            out / "hf-home")),
        "hf download": lambda out: timed(lambda: command(
            [str(VENV / "hf"), "download", REPO, "--revision", commit, "--local-dir",
             str(out / "hf"), "--max-workers", str(workers)], out / "hf-home")),
    }


def _clear(out: Path) -> None:
    for root, dirs, _files in os.walk(out):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)  # the sealed directory is read-only
    shutil.rmtree(out, ignore_errors=True)


def cpu_s(server_pid: int) -> float:
    """CPU seconds so far of this process, its finished children and the server."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(f"/proc/{server_pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    server = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + server


def measure(url: str, commit: str, work: Path, a: argparse.Namespace,
            server_pid: int) -> tuple[dict, dict]:
    """Wall and CPU seconds (client and server together) of every method, each run."""
    runs, workers = a.runs, a.workers
    sizes = [a.shard_mib << 20] * a.shards + [len(CONFIG)]
    table = methods(url, commit, workers, sizes)
    names = list(table)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for run in range(runs):
        for name in names[run % len(names):] + names[:run % len(names)]:
            out = work / "out"
            _clear(out)
            out.mkdir()
            before = cpu_s(server_pid)
            times[name].append(table[name](out))
            cpu[name].append(cpu_s(server_pid) - before)
            _clear(out)
            print(f"run {run + 1}: {name}: {times[name][-1]:.2f} s, CPU "
                  f"{cpu[name][-1]:.2f} s", file=sys.stderr)
    return times, cpu


def report(times: dict, cpu: dict, total: int, a: argparse.Namespace) -> None:
    med = {n: statistics.median(v) for n, v in times.items()}
    floor, hf = med["download alone"], med["hf download"]
    link = f"one {a.link_mbit:g} Mbit/s link" if a.link_mbit else "as fast as it goes"
    print(f"{REPO}: {total / 1e9:.2f} GB in {a.shards} shards + config.json, loopback "
          f"({link}), {a.workers} workers, medians of {len(next(iter(times.values())))}, "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"{'':22}{'median':>9}  {'min-max':>13}  {'x download':>10}  {'x hf download':>13}"
          f"  {'MB/s':>6}  {'CPU s':>6}  {'x download':>10}")
    cpu_floor = statistics.median(cpu["download alone"])
    for name, v in times.items():
        c = statistics.median(cpu[name])
        print(f"{name:22}{med[name]:8.2f}s  {min(v):5.2f}-{max(v):5.2f} s  "
              f"{med[name] / floor:9.2f}x  {med[name] / hf:12.2f}x  "
              f"{total / med[name] / 1e6:6.0f}  {c:6.2f}  {c / cpu_floor:9.2f}x")
    print(f"goals: fetch+verify <= 1.1x the download alone: "
          f"{med['fetch+verify'] / floor:.2f}x; no slower than hf download: "
          f"{med['fetch+verify'] / hf:.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--shard-mib", type=int, default=320)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--dir", default=None, help="where the repository and copies go")
    p.add_argument("--link-mbit", type=float, default=0, metavar="MBIT",
                   help="the server sends over one link of this many Mbit/s (default: "
                   "as fast as loopback and the CPUs go)")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="weights-speed-", dir=a.dir))
    server = None
    try:
        commit = make_repo(work / "hub", a.shards, a.shard_mib << 20)
        server, url = start_server(work / "hub", a.link_mbit)
        times, cpu = measure(url, commit, work, a, server.pid)
        report(times, cpu, a.shards * (a.shard_mib << 20) + len(CONFIG), a)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        _clear(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
