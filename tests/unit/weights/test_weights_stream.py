"""Weights hashed while they stream (gpuserve/data/scripts/weights_fetch.py with
hub_client.py), against a small Hub on loopback written here so each test decides its
server's behaviour byte by byte: a corrupted byte anywhere in a file, a resumed part (read
once), a body cut short, files fetched in parallel (and no more than ``workers`` at
once), and the minimum rate, decided by a fake clock over a drip that sends one byte per
byte the client consumed (no test depends on how fast this machine is)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from gpuserve.commands.weights import fetch_module
from gpuserve.memory.remote import hub_module

REPO, COMMIT = "org/model", "a" * 40
HUB = hub_module()


def _files() -> dict[str, bytes]:
    """Three LFS shards of different sizes and two small git-hashed files, made of
    seeded pseudo-random bytes (a byte anywhere is as likely to matter)."""
    def data(seed: int, n: int) -> bytes:
        out, block = bytearray(), hashlib.sha256(str(seed).encode()).digest()
        while len(out) < n:
            block = hashlib.sha256(block).digest()
            out += block
        return bytes(out[:n])

    return {"config.json": b'{"model_type": "llama"}\n', "README.md": data(9, 3001),
            "model-00001-of-00003.safetensors": data(1, 700_001),
            "model-00002-of-00003.safetensors": data(2, 3 << 20),
            "model-00003-of-00003.safetensors": data(3, 1_000_003)}


def _entry(name: str, body: bytes) -> dict:
    oid = hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()
    doc = {"type": "file", "path": name, "size": len(body), "oid": oid}
    if name.endswith(".safetensors"):
        doc["lfs"] = {"oid": hashlib.sha256(body).hexdigest(), "size": len(body)}
    return doc


class Stub:
    """The Hub's tree listing and resolve URLs (with Range) for ``files``; ``faults``
    change what a GET sends: ``{name: [fault, ...]}``, each used once, in order."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.faults = files, {}
        self.sent: dict[str, int] = {}  # body bytes sent per file
        self.ranges: list[tuple[str, int]] = []  # (file, first byte) of every GET
        self.lock = threading.Lock()
        self.active = self.most = 0
        self.barrier: threading.Barrier | None = None
        self.consumed = threading.Semaphore(0)  # the drip's handshake

    def fault(self, name: str, **kind) -> None:
        self.faults.setdefault(name, []).append(kind)

    def take(self, name: str) -> dict:
        with self.lock:
            return self.faults[name].pop(0) if self.faults.get(name) else {}


def _handler(stub: Stub):
    class Handler(BaseHTTPRequestHandler):
        timeout = 20  # a test that goes wrong ends, never hangs

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = unquote(urlsplit(self.path).path)
            if path.startswith(f"/api/models/{REPO}/tree/"):
                body = json.dumps([_entry(n, b) for n, b in stub.files.items()]).encode()
                return self._send(200, body)
            prefix = f"/{REPO}/resolve/{COMMIT}/"
            name = path.removeprefix(prefix)
            if not path.startswith(prefix) or name not in stub.files:
                return self._send(404, b"{}", {"X-Error-Code": "EntryNotFound"})
            with stub.lock:
                stub.active += 1
                stub.most = max(stub.most, stub.active)
            try:
                self._file(name)
            finally:
                with stub.lock:
                    stub.active -= 1

        def _file(self, name: str) -> None:
            data, start = stub.files[name], 0
            rng = self.headers.get("Range")
            if rng:
                start = int(rng.removeprefix("bytes=").split("-")[0])
            stub.ranges.append((name, start))
            if stub.barrier is not None and name.endswith(".safetensors"):
                stub.barrier.wait()  # every shard's request in flight at once
            f = stub.take(name)
            body = bytearray(data[start:])
            if "corrupt" in f:
                body[f["corrupt"] - start] ^= 0xFF
            headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} \
                if rng else {}
            self.send_response(206 if rng else 200)
            for k, v in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(k, v)
            self.end_headers()
            if "drip" in f:  # one byte, then wait until the client took it
                for i in range(len(body)):
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    if not stub.consumed.acquire(timeout=10):
                        return
                return
            body = body[:f["cut"] - start] if "cut" in f else body
            self.wfile.write(body)
            with stub.lock:
                stub.sent[name] = stub.sent.get(name, 0) + len(body)
            if "cut" in f:
                self.close_connection = True

        def _send(self, status: int, body: bytes, headers: dict | None = None) -> None:
            self.send_response(status)
            for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

    return Handler


@pytest.fixture
def stub():
    s = Stub(_files())
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(s))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    s.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield s
    if s.barrier is not None:
        s.barrier.abort()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def reads(monkeypatch):
    """Every file the host script opens for reading: (path, bytes read)."""
    module = fetch_module()
    seen: list[list] = []

    class Counted:
        def __init__(self, f, entry) -> None:
            self.f, self.entry = f, entry

        def read(self, n=-1):
            data = self.f.read(n)
            self.entry[1] += len(data)
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def counted_open(path, mode="r", *a, **kw):
        f = open(path, mode, *a, **kw)  # noqa: SIM115 - closed by Counted
        if "b" in mode and "r" in mode:
            seen.append([str(path), 0])
            return Counted(f, seen[-1])
        return f

    monkeypatch.setattr(module, "open", counted_open, raising=False)
    monkeypatch.setattr(module.time, "sleep", lambda s: None)  # the retry's back-off
    return seen


def _fetch(stub: Stub, tmp_path: Path, **kw):
    target = str(tmp_path / "models" / "org--model" / COMMIT)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    kw.setdefault("disk_check", False)
    module = fetch_module()
    marker = module.fetch(REPO, COMMIT, target, endpoint=stub.url, report=lambda doc: None,
                          options=module.FetchOptions(**kw))
    return marker, Path(target)


def _same(stub: Stub, target: Path) -> None:
    for name, data in stub.files.items():
        assert (target / name).read_bytes() == data, name


def test_a_clean_fetch_hashes_every_byte_as_it_arrives_and_reads_none_back(
        stub, tmp_path, reads):
    marker, target = _fetch(stub, tmp_path)
    _same(stub, target)
    assert marker["refetched"] == [] and reads == []  # nothing read back from disk
    assert stub.sent == {n: len(d) for n, d in stub.files.items()}  # each byte once
    assert sorted(f["path"] for f in marker["files"]) == sorted(stub.files)
    assert not (target / ".cache").exists() and (target / ".gpuserve-complete.json").is_file()


@pytest.mark.parametrize("name", ["model-00002-of-00003.safetensors", "README.md"])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_corrupted_byte_anywhere_is_caught_and_only_that_file_fetched_again(
        stub, tmp_path, reads, name, where):
    size = len(stub.files[name])
    stub.fault(name, corrupt={"first": 0, "middle": size // 2, "last": size - 1}[where])
    marker, target = _fetch(stub, tmp_path)
    _same(stub, target)
    assert marker["refetched"] == [name] and reads == []
    assert stub.sent[name] == 2 * size
    assert all(stub.sent[n] == len(d) for n, d in stub.files.items() if n != name)


def test_a_file_corrupted_every_time_is_refused_naming_it(stub, tmp_path, reads):
    name = "model-00001-of-00003.safetensors"
    for _ in range(3):
        stub.fault(name, corrupt=12345)
    with pytest.raises(fetch_module().Refused, match=f"verification: '{name}' still differ"
                       ".* after 3 downloads") as e:
        _fetch(stub, tmp_path)
    assert e.value.code == fetch_module().EXIT_VERIFY
    assert not (tmp_path / "models" / "org--model" / COMMIT).exists()


def _part(tmp_path: Path, name: str) -> Path:
    entry = _entry(name, _files()[name])
    sha = entry.get("lfs", {}).get("oid") or entry["oid"]
    staging = tmp_path / "models" / "org--model" / f"{COMMIT}.partial"
    parts = staging / ".cache" / "gpuserve"
    parts.mkdir(parents=True, exist_ok=True)
    return parts / f"{sha}.incomplete"


def test_a_resumed_file_hashes_its_part_once_then_the_rest_as_it_arrives(
        stub, tmp_path, reads):
    name = "model-00002-of-00003.safetensors"
    data = stub.files[name]
    part = _part(tmp_path, name)
    part.write_bytes(data[:1_234_567])
    marker, target = _fetch(stub, tmp_path)
    _same(stub, target)
    assert (name, 1_234_567) in stub.ranges
    assert stub.sent[name] == len(data) - 1_234_567
    assert reads == [[str(part), 1_234_567]]  # the part, once; nothing else read back
    assert marker["refetched"] == []


def test_a_resumed_part_with_a_wrong_byte_is_fetched_again(stub, tmp_path, reads):
    name = "model-00003-of-00003.safetensors"
    data = bytearray(stub.files[name])
    data[77] ^= 1
    _part(tmp_path, name).write_bytes(bytes(data[:500_000]))
    marker, target = _fetch(stub, tmp_path)
    _same(stub, target)
    assert marker["refetched"] == [name]
    assert [(n, s) for n, s in stub.ranges if n == name] == [(name, 500_000), (name, 0)]


def test_a_truncated_body_is_resumed_without_reading_back(stub, tmp_path, reads):
    name = "model-00001-of-00003.safetensors"
    stub.fault(name, cut=300_000)
    stub.fault(name, cut=500_000)
    marker, target = _fetch(stub, tmp_path)
    _same(stub, target)
    assert [(n, s) for n, s in stub.ranges if n == name] == [
        (name, 0), (name, 300_000), (name, 500_000)]
    assert reads == [] and marker["refetched"] == []  # the hash went on in memory


def test_a_body_truncated_every_time_ends_with_a_resumable_error(stub, tmp_path, reads):
    name = "config.json"
    for _ in range(5):
        stub.fault(name, cut=5)
    with pytest.raises(HUB.HubError, match="the body ended at byte 5 of 24 .truncated") as e:
        _fetch(stub, tmp_path)
    assert e.value.resumable


def test_files_download_in_parallel(stub, tmp_path, reads):
    stub.barrier = threading.Barrier(3, timeout=15)  # all three shards or none
    _marker, target = _fetch(stub, tmp_path, workers=4)
    _same(stub, target)
    assert stub.most >= 3


def test_the_worker_count_bounds_the_downloads_at_once(stub, tmp_path, reads):
    _marker, target = _fetch(stub, tmp_path, workers=1)
    _same(stub, target)
    assert stub.most == 1


def test_files_with_the_same_bytes_share_no_partial_file(stub, tmp_path, reads):
    shard = stub.files["model-00002-of-00003.safetensors"]
    stub.files["copy/model-00002-of-00003.safetensors"] = shard
    marker, target = _fetch(stub, tmp_path, workers=8)
    _same(stub, target)
    assert marker["refetched"] == []


# ------------------------------------------------------------------ the minimum rate


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("rate, per_second, fails_at", [
    (100, 99, 30), (100, 100, None), (100, 3000, None), (100, 0, 30), (0, 0, None)])
def test_the_rate_window_decides_by_its_arithmetic(rate, per_second, fails_at):
    clock = FakeClock()
    meter = HUB.Meter("x", stall=10_000, min_rate=rate, clock=clock)
    for second in range(1, 301):
        clock.now = float(second)
        if fails_at == second:
            with pytest.raises(HUB.HubError, match=f"x: {per_second * 30} bytes in 30 s, "
                               f"below {rate} bytes/s .host data weights_min_rate"):
                meter.check(per_second)
            return
        meter.check(per_second)
    assert fails_at is None


def test_the_deadline_ends_a_body_that_keeps_the_rate():
    clock = FakeClock()
    meter = HUB.Meter("x", stall=120, min_rate=1, deadline=50, limit="weights_timeout",
                      clock=clock)
    clock.now = 49
    meter.check(1 << 20)
    clock.now = 51
    with pytest.raises(HUB.HubError, match="x: not done within weights_timeout") as e:
        meter.check(1 << 20)
    assert e.value.kind == "timeout" and e.value.resumable


class DripHash:
    """A hasher that moves the fake clock one second per byte it is fed: the drip is
    exactly 1 byte/s whatever this machine's speed, and lets the server send the next."""

    def __init__(self, stub: Stub, clock: FakeClock) -> None:
        self.stub, self.clock, self.bytes = stub, clock, 0

    def resume(self, part, have) -> None:
        pass

    def update(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        self.clock.now += len(chunk)
        self.stub.consumed.release(len(chunk))


@pytest.mark.parametrize("min_rate, ends", [(2, True), (1, False)])
def test_a_drip_below_the_minimum_rate_ends_within_one_window(stub, tmp_path, min_rate,
                                                              ends):
    name = "README.md"
    stub.files[name] = stub.files[name][:100]
    stub.fault(name, drip=True)
    clock = FakeClock()
    client = HUB.Client(stub.url, None, HUB.Limits(stall=10_000, min_rate=min_rate), clock=clock)
    hasher = DripHash(stub, clock)
    part = tmp_path / "part"
    url = client.resolve_url(REPO, COMMIT, name)
    if not ends:
        client.download(url, str(part), 100, hasher=hasher, what="'README.md'")
        assert part.read_bytes() == stub.files[name] and clock.now == 100
        return
    with pytest.raises(HUB.HubError, match="'README.md': 30 bytes in 30 s, below 2 bytes/s "
                       r"\(host data weights_min_rate\)") as e:
        client.download(url, str(part), 100, hasher=hasher, what="'README.md'")
    assert e.value.kind == "timeout" and e.value.resumable
    assert part.stat().st_size == 30 and hasher.bytes == 30  # kept for the rerun


def test_a_document_request_has_a_total_deadline(stub):
    clock = FakeClock()
    client = HUB.Client(stub.url, None, HUB.Limits(request_deadline=60), clock=clock)
    clock.now = 0
    meter = client.meter("tree page")
    clock.now = 61
    with pytest.raises(HUB.HubError, match="tree page: not done within the 60 s a request "
                       "may take"):
        meter.check(1 << 20)


@pytest.mark.parametrize("option, value", [("--workers", "0"), ("--workers", "65"),
                                           ("--min-rate", "-1"), ("--timeout", "0")])
def test_gpuserve_weights_refuses_a_bad_limit_before_any_request(stub, tmp_path, capsys,
                                                                 option, value):
    from gpuserve.cli import main

    rc = main(["weights", "--hf", f"{REPO}@{COMMIT}", "--hf-endpoint", stub.url, option,
               value, str(tmp_path / "models")])
    err = capsys.readouterr().err
    assert rc != 0 and f"{option}:" in err and "must be" in err
    assert stub.ranges == [] and not (tmp_path / "models").exists()


def test_a_document_dripping_within_the_rate_ends_at_its_deadline(stub):
    """A body fast enough for the rate floor (0 here) still ends at the request's total
    deadline: the fake clock moves a second per reading and lets the server send one
    more byte, so the 1,000-byte body needs far more than the 50 s allowed."""
    stub.files["README.md"] = stub.files["README.md"][:1000]
    stub.fault("README.md", drip=True)

    class Ticking(FakeClock):
        def __call__(self) -> float:
            self.now += 1
            stub.consumed.release()
            return self.now

    client = HUB.Client(stub.url, None, HUB.Limits(stall=10_000, min_rate=0,
                                                  request_deadline=50), clock=Ticking())
    with pytest.raises(HUB.HubError, match="README.md: not done within the 50 s a request "
                       "may take") as e:
        client.read_capped(client.resolve_url(REPO, COMMIT, "README.md"), 1 << 20,
                           "README.md")
    assert e.value.kind == "timeout"
