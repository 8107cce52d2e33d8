"""A ``slea serve`` process for tests and benchmarks: started in a subprocess, ready once it prints the address it
serves at, and stopped for sure (terminated, then killed if it lingers). tests/test_serve.py,
tests/policy/test_serve_openai_client.py, tests/test_howto.py, :mod:`slea.testing.serve_hostile` and
experiments/agent_served.py start theirs here."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

SRC = Path(__file__).resolve().parents[2]  # this slea's source folder, first on the server's PYTHONPATH
STOP_S = 15.0  # how long a terminated server has to exit before it is killed


@dataclass
class Server:
    """A running ``slea serve``: its process and the base URL it printed (``http://HOST:PORT/v1``)."""

    proc: subprocess.Popen
    url: str

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 0)

    def stop(self) -> None:
        """SIGTERM, and SIGKILL when the process has not exited :data:`STOP_S` seconds later."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_server(*args: str, env: Mapping[str, str] | None = None, cwd: str | Path | None = None) -> Server:
    """Run ``python -m slea.cli serve ARGS`` (pass ``--port 0`` for a free port) with ``env`` (default: this
    process's environment) and this slea's sources first on ``PYTHONPATH``, and return once it prints ``serving
    NAME at URL``. A server that exits or prints anything else first is killed and raised as a RuntimeError with
    its output. What it logs afterwards is read in a thread, so a full pipe never blocks it."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "slea.cli", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    line = proc.stdout.readline()  # "serving tiny at http://127.0.0.1:PORT/v1" (or an error, then EOF)
    if not line.startswith("serving ") or " at http://" not in line:
        proc.kill()
        raise RuntimeError(f"slea serve did not start: {line}{proc.stdout.read()[-2000:]}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return Server(proc, line.split(" at ", 1)[1].strip())


@contextlib.contextmanager
def serving(*args: str, env: Mapping[str, str] | None = None, cwd: str | Path | None = None) -> Iterator[Server]:
    """:func:`start_server` for the ``with`` block; the server is stopped when it ends, however it ends."""
    server = start_server(*args, env=env, cwd=cwd)
    try:
        yield server
    finally:
        server.stop()
