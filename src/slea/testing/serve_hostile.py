"""Hostile and broken requests against a ``slea serve`` process on 127.0.0.1: the table of a bad-input audit
(docs/reliability.md, "Serving, library imports and run folders under hostile input"), each with the answer the server must give, a normal request to time after each,
the server's resident memory, and a concurrent soak of good and bad requests. tests/reliability/test_serve_hostile.py
and ``bench/soak.py serve`` use it; it only ever connects to the loopback address.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slea.testing.server import Server, start_server

HOST = "127.0.0.1"  # never another address
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})")


@dataclass
class Served(Server):
    """A ``slea serve`` process (:class:`slea.testing.server.Server`: ``proc``, ``url``, ``port``, ``stop``) and the
    API key requests send."""

    key: str = ""

    def rss_mb(self) -> float:
        """Resident memory of the server process (Linux /proc), MB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS in /proc")


def start(key: str = "soak-key", *args: str, model: str = "tiny") -> Served:
    """``slea serve MODEL --port 0 --dtype float32 ARGS`` with ``SLEA_API_KEY=key``, once it prints its port."""
    server = start_server(model, "--host", HOST, "--port", "0", "--dtype", "float32", *args,
                          env=dict(os.environ, SLEA_API_KEY=key))
    return Served(server.proc, server.url, key)


# -- raw HTTP on a socket (what a careless or hostile client sends) -----------------------------------------------
def raw(port: int, data: bytes, wait: float = 10.0, close_after: float | None = None, responses: int = 1,
        piece: int | None = None, pause: float = 0.0) -> bytes:
    """Send ``data`` on a new connection (with ``piece``, in writes of that many bytes ``pause`` seconds apart, so
    the server reads it in pieces) and read until ``responses`` answers are complete, the server closes it or
    ``wait`` seconds pass (or, with ``close_after``, hang up after that many seconds without reading: a client that
    goes away)."""
    step = piece or max(len(data), 1)
    with socket.create_connection((HOST, port), timeout=wait) as s:
        try:
            for i in range(0, len(data), step):
                s.sendall(data[i:i + step])
                time.sleep(pause)
        except OSError:  # the server answered and closed before the whole request went (a 413 does)
            pass
        if close_after is not None:
            time.sleep(close_after)
            return b""
        out = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(1 << 16)
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
            out += chunk
            if _complete(out) >= responses:
                break
        return out


def _complete(data: bytes) -> int:
    """How many whole responses (headers and a Content-Length or chunked body) ``data`` holds; a response that
    closes the connection counts only when the server closes it."""
    n = 0
    while True:
        head, sep, rest = data.partition(b"\r\n\r\n")
        m = re.search(rb"(?i)content-length: (\d+)", head)
        size = int(m.group(1)) if m else _chunked_size(rest) if b"transfer-encoding: chunked" in head.lower() else None
        if not sep or size is None or len(rest) < size or b"connection: close" in head.lower():
            return n
        n += 1
        data = rest[size:]


def _chunked_size(body: bytes) -> int | None:
    """The length of a whole chunked body at the start of ``body``, or None before its last chunk has come."""
    at = 0
    while (end := body.find(b"\r\n", at)) >= 0:
        size = int(body[at:end].split(b";")[0] or b"0", 16)
        at = end + 2 + size + 2
        if size == 0:
            return at if len(body) >= at else None
    return None


def statuses(data: bytes) -> list[int]:
    return [int(m) for m in _STATUS.findall(data)]


def request(method: str, path: str, body: bytes = b"", key: str | None = None, headers: dict | None = None
            ) -> bytes:
    """One HTTP/1.1 request as bytes (Content-Length from ``body`` unless ``headers`` set one)."""
    h = {"Host": f"{HOST}", "Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    h.update(headers or {})
    if "Content-Length" not in h and "Transfer-Encoding" not in h and (body or method == "POST"):
        h["Content-Length"] = str(len(body))
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode() + body


def post(served: Served, path: str, body, key: bool = True, wait: float = 30.0) -> int:
    """POST a JSON body (a dict, or raw bytes as they are) and return the status."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    got = statuses(raw(served.port, request("POST", path, data, served.key if key else None), wait))
    return got[0] if got else 0


GOOD = {"prompt": "You see a coin.", "max_tokens": 4, "temperature": 0}


def normal(served: Served) -> tuple[int, float]:
    """A normal completion: (status, seconds)."""
    t0 = time.perf_counter()
    status = post(served, "/v1/completions", GOOD)
    return status, time.perf_counter() - t0


# -- the audit's table: (row, what is sent, the status the server must answer) ----------------------------------
# 128 answers of 4000 tokens: 16,000 decode steps (the engine decodes 32 rows at a time), minutes on any CPU
LONG = {"prompt": "Hi", "max_tokens": 4000, "temperature": 1.0, "seed": 5, "n": 128}


def _long(stream: bool) -> bytes:
    return json.dumps({**LONG, "stream": stream}).encode()


def _chunked(served: Served) -> int:
    body = json.dumps(GOOD).encode()
    data = request("POST", "/v1/completions", b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n", served.key,
                   {"Transfer-Encoding": "chunked"}) + request("GET", "/v1/models", key=served.key)
    got = statuses(raw(served.port, data, wait=2, responses=3))  # a third answer would be a desync
    return 200 if got == [200, 200] else (got[0] if len(got) == 1 else 0)  # two requests, exactly two answers


def _disconnect(served: Served, stream: bool) -> int:
    raw(served.port, request("POST", "/v1/completions", _long(stream), served.key), close_after=0.5)
    return 499  # nobody reads an answer; the next request's latency shows the generation stopped


def _big_body(served: Served) -> int:
    data = request("POST", "/v1/completions", b"x" * 60_000, served.key, {"Content-Length": str(50_000_000)})
    got = statuses(raw(served.port, data, wait=10))
    return got[0] if got else 0


def _long_urls(served: Served, n: int = 400) -> int:
    codes = {statuses(raw(served.port, request("GET", "/v1/models?q=" + "a" * 60_000, key=served.key), 5) or [0])[0]
             for _ in range(n)}
    return codes.pop() if len(codes) == 1 else 0


def _long_url_in_pieces(served: Served) -> int:
    """A 60 KB URL sent in three writes 0.1 s apart, so the server reads it in pieces (as it may under load)."""
    data = request("GET", "/v1/models?q=" + "a" * 60_000, key=served.key)
    got = statuses(raw(served.port, data, wait=5, piece=20_000, pause=0.1))
    return got[0] if got else 0


IDLE_FLOOD = 100  # connections held open by a flood row: more than the 64 that locked the old server
CLOSE_WAIT_S = 15.0  # a held connection must be closed by then (slea serve's --header-timeout: 10 s by default)


@contextlib.contextmanager
def held(port: int, n: int, prefix: bytes = b""):
    """``n`` connections to the server, each sent ``prefix`` (nothing: an idle connection), held open; all closed on
    exit."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(socket.create_connection((HOST, port), timeout=5))
            if prefix:
                socks[-1].sendall(prefix)
        time.sleep(0.2)  # accepted, and read, by the server
        yield socks
    finally:
        for s in socks:
            s.close()


def closed_by_server(socks: list[socket.socket], within: float) -> int:
    """How many of ``socks`` the server closes within ``within`` seconds (whatever it sends first)."""
    deadline, closed = time.monotonic() + within, 0
    for s in socks:
        try:
            while True:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                if not s.recv(1 << 16):
                    closed += 1
                    break
        except TimeoutError:
            break
        except OSError:  # reset: closed too
            closed += 1
    return closed


def health(port: int) -> int:
    got = statuses(raw(port, request("GET", "/health"), 5))
    return got[0] if got else 0


def _beside(served: Served) -> int:
    """``/health``, then a normal completion: 200 when both are answered 200, else the first other status."""
    codes = [health(served.port), normal(served)[0]]
    return next((c for c in codes if c != 200), 200)


def _idle_flood(served: Served) -> int:
    with held(served.port, IDLE_FLOOD):
        return _beside(served)


def _half_request_flood(served: Served) -> int:
    """Half a request line on each held connection: the requests beside them are answered, and the server closes
    every held one within :data:`CLOSE_WAIT_S` (408 when it does not)."""
    with held(served.port, IDLE_FLOOD, b"GET /v1/mod") as socks:
        status = _beside(served)
        closed = closed_by_server(socks, CLOSE_WAIT_S)
    return status if status != 200 or closed == len(socks) else 408


def _bad_length(value: str) -> Callable[[Served], int]:
    def send(served: Served) -> int:
        got = statuses(raw(served.port, request("POST", "/v1/completions", b"{}", served.key,
                                                {"Content-Length": value}), wait=5))
        return got[0] if got else 0
    return send


def _post(body, key: bool = True, path: str = "/v1/completions") -> Callable[[Served], int]:
    return lambda served: post(served, path, body, key)


HOSTILE: list[tuple[str, str, Callable[[Served], int], int]] = [
    ("1", "max_tokens 10**9, temperature 0", _post({"prompt": "Hi", "max_tokens": 10**9, "temperature": 0}), 400),
    ("1b", "n 1,000,000", _post({"prompt": "Hi", "n": 1_000_000}), 400),
    ("2", "max_tokens 10**8, seed 1", _post({"prompt": "Hi", "max_tokens": 10**8, "seed": 1}), 400),
    ("3", "a 200,000-character prompt", _post({"prompt": "Hello world. " * 15_385, "max_tokens": 4}), 400),
    ("4", "no credentials", _post(GOOD, key=False), 401),
    ("4", "load_lora_adapter of a folder outside --lora-dir",
     _post({"lora_name": "x", "lora_path": "/etc"}, path="/v1/load_lora_adapter"), 403),
    ("5", "Content-Length: abc", _bad_length("abc"), 400),
    ("5", "Content-Length: -1", _bad_length("-1"), 400),
    ("5", "a chunked body, then a second request on the connection", _chunked, 200),
    ("6", "a 50 MB body", _big_body, 413),
    ("6", "400 GETs with 60 KB URLs", _long_urls, 414),
    ("6", "a 60 KB URL that arrives in pieces", _long_url_in_pieces, 414),
    ("7", "lone surrogate \\udcff (JSON escape)", _post(b'{"prompt": "a\\udcffb", "max_tokens": 2}'), 400),
    ("7", "lone surrogate (raw bytes, invalid UTF-8)", _post(b'{"prompt": "a\xed\xb3\xbfb", "max_tokens": 2}'), 400),
    ("7", "temperature NaN", _post(b'{"prompt": "ab", "temperature": NaN}'), 400),
    ("7", "100,000-deep [", _post(b"[" * 100_000), 400),
    ("7", "logprobs 1000", _post({"prompt": "ab", "logprobs": 1000}), 400),
    ("7", "temperature Infinity", _post(b'{"prompt": "ab", "temperature": Infinity}'), 400),
    ("7", "top_p NaN", _post(b'{"prompt": "ab", "top_p": NaN}'), 400),
    ("8", "stream: true, the client disconnects", lambda s: _disconnect(s, True), 499),
    ("8", "not streamed, the client disconnects", lambda s: _disconnect(s, False), 499),
    ("14", f"{IDLE_FLOOD} connections that send nothing, held open: /health and a completion beside them",
     _idle_flood, 200),
    ("15", f"{IDLE_FLOOD} connections that send half a request line, held open: the same; all closed by the server",
     _half_request_flood, 200),
]
FLOODS = (_idle_flood, _half_request_flood)  # rows the soak's clients do not pick (its idle_sockets holds a flood)


# -- the soak: good and bad requests from several clients at once -------------------------------------------------
def _good_kinds(served: Served) -> list[Callable[[], int]]:
    chat = {"messages": [{"role": "user", "content": "You see a coin."}], "max_tokens": 4, "temperature": 0}
    return [lambda: post(served, "/v1/completions", GOOD),
            lambda: post(served, "/v1/completions", {**GOOD, "n": 2, "temperature": 1.0, "seed": 3, "logprobs": 1}),
            lambda: post(served, "/v1/completions", {**GOOD, "stream": True}),
            lambda: post(served, "/v1/chat/completions", chat),
            lambda: statuses(raw(served.port, request("GET", "/v1/models", key=served.key), 10) or [0])[0]]


def _flood(port: int, n: int, stop: threading.Event, opened: list[int]) -> None:
    """Keep ``n`` idle connections open until ``stop``: every 0.5 s, those the server closed are opened again
    (``opened[0]`` counts the openings)."""
    socks: list[socket.socket] = []
    try:
        while not stop.is_set():
            socks = [s for s in socks if _still_open(s)]
            while len(socks) < n:
                socks.append(socket.create_connection((HOST, port), timeout=5))
                opened[0] += 1
            stop.wait(0.5)
    finally:
        for s in socks:
            s.close()


def _still_open(s: socket.socket) -> bool:
    """Whether the server has not closed ``s`` (a peek that does not wait); a closed one is closed here too."""
    s.setblocking(False)
    try:
        if s.recv(1, socket.MSG_PEEK):
            return True
    except BlockingIOError:
        return True
    except OSError:
        pass
    s.close()
    return False


def soak(served: Served, seconds: float = 30.0, clients: int = 4, bad_frac: float = 0.4, seed: int = 0,
         idle_sockets: int = 0) -> dict:
    """``clients`` threads send good and hostile requests (``bad_frac`` of them hostile: the table's rows but the
    400 long URLs and the floods) for ``seconds``, beside ``idle_sockets`` connections that send nothing (held open,
    reopened when the server closes them). An error: a good request not answered 200, or a hostile one not
    answered as the table says. Returns requests, errors, p50 / p99 latency of the good requests, the server's
    RSS at the start and end (MB) and the idle connections opened."""
    bad = [h for h in HOSTILE if h[2] is not _long_urls and h[2] not in FLOODS]
    good = _good_kinds(served)
    lat: list[float] = []
    errors: list[str] = []
    counts = {"good": 0, "bad": 0}
    lock = threading.Lock()
    rss_start = served.rss_mb()
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        while time.monotonic() < stop:
            if rng.random() < bad_frac:
                row, what, send, want = rng.choice(bad)
                try:
                    got = send(served)
                except OSError as exc:
                    got, what = 0, f"{what} ({exc})"
                with lock:
                    counts["bad"] += 1
                    if got != want:
                        errors.append(f"row {row} {what}: {got}, expected {want}")
            else:
                t0 = time.perf_counter()
                try:
                    got = rng.choice(good)()
                except OSError:
                    got = 0
                with lock:
                    counts["good"] += 1
                    if got == 200:
                        lat.append(time.perf_counter() - t0)
                    else:
                        errors.append(f"good request: {got}")

    flooding, opened = threading.Event(), [0]
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    flood = threading.Thread(target=_flood, args=(served.port, idle_sockets, flooding, opened))
    flood.start()
    time.sleep(0.5 if idle_sockets else 0.0)  # the flood is in place before the first good request
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flooding.set()
    flood.join()
    status, after = normal(served)
    lat.sort()

    def q(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else None

    return {"seconds": seconds, "clients": clients, "requests": counts["good"] + counts["bad"], **counts,
            "errors": len(errors), "error_examples": errors[:5], "good_latency_p50_s": q(0.50),
            "good_latency_p99_s": q(0.99), "rss_start_mb": round(rss_start, 1), "rss_end_mb": round(served.rss_mb(), 1),
            "normal_after": {"status": status, "seconds": round(after, 3)}, "idle_sockets": idle_sockets,
            "idle_opened": opened[0]}
