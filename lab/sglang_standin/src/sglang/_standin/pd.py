"""PD disaggregation of the stand-in: a prefill server's bootstrap server and KV hand-off,
a decode server's fetch of it.

Follows SGLang 0.5.23 (srt/disaggregation/common/conn.py, CommonKVBootstrapServer):
the prefill server runs an HTTP bootstrap server on --disaggregation-bootstrap-port with
``GET /health`` ("OK"), ``PUT /route`` (a prefill rank registers its rank_ip/rank_port
with its attn_tp/cp/dp and pp sizes and ranks) and ``GET /route`` (the decode side asks
with prefill_dp_rank, prefill_cp_rank, target_tp_rank, target_pp_rank: all -1 gives the
prefill server's layout, else that rank's rank_ip/rank_port; 400 without the four
inputs, 503 before every rank registered, 404 for an unknown rank). The gateway (smg in
PD mode) sends each request to one prefill and one decode server with
``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` added; the decode server
looks the prefill rank up through the bootstrap server and receives the request's KV
cache for that room. ``bootstrap_host`` 2.2.2.2 is SGLang's FAKE_BOOTSTRAP_HOST (its own
warmups): nothing is transferred.

STAND-IN TRANSFER, not Mooncake: the KV bytes (KV_BYTES_PER_TOKEN a prompt token,
default 64) move over a plain TCP socket on the prefill's rank_port, pulled by the decode
server (``ROOM\\n`` -> 8-byte length + bytes), where SGLang's engines write them into the
decode server's GPU memory over RDMA. A mooncake backend still needs
``mooncake.engine`` importable, as SGLang's does at start.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang._standin import logs
from sglang._standin.server import Histogram
from sglang._standin.sim import env_float

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang/srt/disaggregation/utils.py
RANK_KEYS = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
# bucket bounds of SGLang 0.5.23 (metrics_collector.py: kv_transfer_latency_ms,
# kv_transfer_speed_gb_s, kv_transfer_total_mb)
LATENCY_MS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
SPEED_GB_S_BUCKETS = (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)
TOTAL_MB_BUCKETS = (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)


class PdStats:
    """The PD counters SGLang exports (see the module's docstring), under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.transfer_queue = 0  # decode: waiting for their KV cache
        self.bootstrap_failed = 0
        self.transfer_failed = 0
        self.latency_ms = Histogram(LATENCY_MS_BUCKETS)
        self.speed_gb_s = Histogram(SPEED_GB_S_BUCKETS)
        self.total_mb = Histogram(TOTAL_MB_BUCKETS)

    def sent(self, size: int, seconds: float) -> None:
        with self.lock:
            self.latency_ms.observe(seconds * 1000)
            self.speed_gb_s.observe(size / max(seconds, 1e-9) / 1e9)
            self.total_mb.observe(size / 1e6)


class Bootstrap:
    """The prefill server's rank table, as CommonKVBootstrapServer keeps it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.layout: dict | None = None
        self.ranks: dict[tuple[int, int, int, int], dict] = {}

    def put(self, data: dict) -> None:
        with self.lock:
            if self.layout is None:
                self.layout = {"attn_tp_size": data["attn_tp_size"],
                               "attn_cp_size": data["attn_cp_size"],
                               "dp_size": data["attn_dp_size"], "pp_size": data["pp_size"],
                               "page_size": data["page_size"],
                               "kv_cache_dtype": data["kv_cache_dtype"],
                               "follow_bootstrap_room": True,
                               "enable_dsa_cache_layer_split": False,
                               "enable_kv_cache_sharding": False,
                               "prefill_http_port": data.get("prefill_http_port"),
                               "decode_allocation_policy": "early"}
            key = (data["attn_dp_rank"], data["attn_cp_rank"], data["attn_tp_rank"],
                   data["pp_rank"])
            self.ranks[key] = {"rank_ip": data["rank_ip"], "rank_port": int(data["rank_port"])}

    def ready(self) -> bool:
        lay = self.layout
        return lay is not None and len(self.ranks) >= (
            lay["dp_size"] * lay["attn_cp_size"] * lay["attn_tp_size"] * lay["pp_size"])


def _bootstrap_handler(table: Bootstrap):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a) -> None:
            pass

        def _reply(self, code: int, text: str, ctype: str = "text/plain") -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/health":
                return self._reply(200, "OK")
            if url.path != "/route":
                return self._reply(404, "Not Found")
            query = dict(urllib.parse.parse_qsl(url.query))
            if not all(query.get(k) for k in RANK_KEYS):
                return self._reply(400, "Missing inputs for bootstrap server.")
            if not table.ready():
                return self._reply(503, f"Prefill server not fully registered yet "
                                        f"({len(table.ranks)} workers registered).")
            key = tuple(int(query[k]) for k in RANK_KEYS)
            if key == (-1, -1, -1, -1):
                return self._reply(200, json.dumps(table.layout), "application/json")
            info = table.ranks.get(key)
            if info is None:
                return self._reply(404, "Bootstrap info not found for dp_rank={} cp_rank={} "
                                        "tp_rank={} pp_rank={}".format(*key))
            return self._reply(200, json.dumps(info), "application/json")

        def do_PUT(self) -> None:  # noqa: N802
            if self.path.split("?", 1)[0] != "/route":
                return self._reply(404, "Not Found")
            length = int(self.headers.get("Content-Length") or 0)
            table.put(json.loads(self.rfile.read(length) or b"{}"))
            return self._reply(200, "OK")

    return Handler


class KvStore:
    """The prefill side's KV caches by bootstrap room, until the decode side takes them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rooms: dict[int, tuple[bytes, float]] = {}

    def put(self, room: int, data: bytes) -> None:
        with self.cond:
            now = time.monotonic()
            self.rooms = {r: v for r, v in self.rooms.items() if now - v[1] < 300}
            self.rooms[room] = (data, now)
            self.cond.notify_all()

    def take(self, room: int, timeout: float) -> bytes | None:
        with self.cond:
            if not self.cond.wait_for(lambda: room in self.rooms, timeout):
                return None
            return self.rooms.pop(room)[0]


def _serve_kv(listener: socket.socket, store: KvStore, timeout: float,
              stats: PdStats) -> None:
    """The stand-in transfer: one connection per room, ``ROOM\\n`` in, length + bytes out
    (length 2**64-1: the prefill never produced that room in time)."""
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_send_room, args=(conn, store, timeout, stats),
                         daemon=True).start()


def _send_room(conn: socket.socket, store: KvStore, timeout: float, stats: PdStats) -> None:
    with conn:
        line = conn.makefile("rb").readline(64)
        data = store.take(int(line.strip() or b"-1"), timeout)
        if data is None:
            conn.sendall(struct.pack("!Q", (1 << 64) - 1))
            return
        start = time.monotonic()
        conn.sendall(struct.pack("!Q", len(data)) + data)
        stats.sent(len(data), time.monotonic() - start)


class PdRole:
    """This server's part in a PD fleet: ``mode`` prefill or decode."""

    def __init__(self, mode: str, host: str, bootstrap_port: int, http_port: int,
                 backend: str) -> None:
        self.mode = mode
        self.backend = backend
        self.bytes_per_token = int(env_float("KV_BYTES_PER_TOKEN", 64))
        self.timeout = env_float("KV_TRANSFER_TIMEOUT", 60.0)
        self.store = KvStore()
        self.transfers = 0
        self.stats = PdStats()
        if mode == "prefill":
            self._start_prefill(host, bootstrap_port, http_port)

    def _start_prefill(self, host: str, bootstrap_port: int, http_port: int) -> None:
        table = Bootstrap()
        httpd = ThreadingHTTPServer((host, bootstrap_port), _bootstrap_handler(table))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        listener = socket.create_server((host, 0))
        threading.Thread(target=_serve_kv, args=(listener, self.store, self.timeout,
                                                 self.stats), daemon=True).start()
        # the rank registers itself, as SGLang's KV manager does (_register_to_bootstrap)
        table.put({"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1,
                   "attn_cp_rank": 0, "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1,
                   "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
                   "rank_ip": host, "rank_port": listener.getsockname()[1],
                   "page_size": 1, "kv_cache_dtype": "auto",
                   "prefill_http_port": http_port})

    @staticmethod
    def room_of(body: dict) -> tuple[str, int, int] | None:
        """(bootstrap host, port, room) of a request, None without them (or a batch)."""
        host, port, room = (body.get(k) for k in ("bootstrap_host", "bootstrap_port",
                                                  "bootstrap_room"))
        if not isinstance(host, str) or isinstance(room, list) or room is None:
            return None
        return host, int(port) if port is not None else 8998, int(room)

    def produced(self, body: dict, prompt_tokens: int) -> None:
        """Prefill: the request's KV cache is ready for its decode server."""
        where = self.room_of(body)
        if self.mode == "prefill" and where and where[0] != FAKE_BOOTSTRAP_HOST:
            self.store.put(where[2], bytes([where[2] % 251]) * (
                prompt_tokens * self.bytes_per_token))

    def receive(self, body: dict, prompt_tokens: int) -> str | None:
        """Decode: fetch the request's KV cache from its prefill server (blocking); an
        error text when it cannot be had (the request then fails)."""
        where = self.room_of(body)
        if self.mode != "decode" or where is None or where[0] == FAKE_BOOTSTRAP_HOST:
            return None
        host, port, room = where
        with self.stats.lock:
            self.stats.transfer_queue += 1
        try:
            return self._receive(host, port, room, prompt_tokens)
        finally:
            with self.stats.lock:
                self.stats.transfer_queue -= 1

    def _fail(self, kind: str, message: str) -> str:
        with self.stats.lock:
            if kind == "bootstrap":
                self.stats.bootstrap_failed += 1
            else:
                self.stats.transfer_failed += 1
        return message

    def _receive(self, host: str, port: int, room: int, prompt_tokens: int) -> str | None:
        base = f"http://{host}:{port}/route?"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(base + urllib.parse.urlencode({k: -1 for k in RANK_KEYS}),
                             timeout=10) as r:
                json.loads(r.read())
            with opener.open(base + urllib.parse.urlencode({k: 0 for k in RANK_KEYS}),
                             timeout=10) as r:
                rank = json.loads(r.read())
        except (OSError, ValueError) as exc:
            return self._fail("bootstrap", f"KV bootstrap at {host}:{port} room {room} "
                              f"failed: {exc}")
        try:
            ip = rank["rank_ip"] if rank["rank_ip"] not in ("0.0.0.0", "::") else host
            with socket.create_connection((ip, rank["rank_port"]), timeout=self.timeout + 5) \
                    as conn:
                conn.sendall(f"{room}\n".encode())
                reader = conn.makefile("rb")
                (size,) = struct.unpack("!Q", reader.read(8))
                data = reader.read(size) if size != (1 << 64) - 1 else b""
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            return self._fail("transfer", f"KV transfer from {host}:{port} room {room} "
                              f"failed: {exc}")
        if size == (1 << 64) - 1 or len(data) != prompt_tokens * self.bytes_per_token:
            return self._fail("transfer", f"KV transfer from {host}:{port} room {room}: "
                              "no KV cache in time")
        self.transfers += 1
        logs.log(f"PD decode: room {room}: {len(data)} KV bytes from {ip}:{rank['rank_port']} "
                 f"(bootstrap {host}:{port}; stand-in TCP transfer, not {self.backend})")
        return None

    def waiting(self) -> int:
        """Requests waiting for their KV cache (SGLang counts its decode prealloc and
        transfer queues as waiting in its load report)."""
        with self.stats.lock:
            return self.stats.transfer_queue

    def inflight(self) -> int:
        """Prefill: KV caches produced and not yet taken by their decode server."""
        with self.store.cond:
            return len(self.store.rooms)
