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

On a GPU (the vLLM interpreter's torch sees CUDA: :func:`vllm_backend`) the server runs on the trainer's GPU
(``CUDA_VISIBLE_DEVICES`` of this rank's device, :func:`child_visible_devices`: one server per data-parallel
rank, each synced by its own rank) and is started before the trainer loads its model, so vLLM's start-up check of
free memory does not count the trainer's. ``gpu_memory_utilization`` is checked against what the served model
needs and what the trainer beside it keeps (:func:`check_memory_fraction`, estimates): a fraction that cannot fit
is refused in one line before anything starts. ``--enforce-eager`` (no CUDA graphs) is on for the CPU backend
only unless ``model.vllm.enforce_eager`` says otherwise. Sleep mode (``model.vllm.sleep``; by default on when the
server shares the trainer's GPU): ``--enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1``, and the engine asks
``POST /sleep?level=1`` before each update (weights to host memory, KV cache freed) and ``POST /wake_up`` before
the LoRA sync that follows.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from slea.policy.openai_engine import GeneratorError, OpenAIGenerator
from slea.policy.vllm_probe import lora_rank

if TYPE_CHECKING:
    from slea.config import ModelSection

BASE = "base"  # the served name of the base model (adapters are named per sync)
# argv: parent pid, then the command; exits at once when the parent is already gone
_PDEATH = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
           "os.getppid() == int(sys.argv[1]) or sys.exit(1); os.execv(sys.argv[2], sys.argv[2:])")


def free_port() -> int:
    """A localhost port nobody listens on now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def enforce_eager(setting: bool | None, backend: str) -> bool:
    """``model.vllm.enforce_eager``: as set, or (None) on for vLLM's CPU backend only (CUDA graphs on GPUs)."""
    return setting if setting is not None else backend == "cpu"


def sleeps(setting: bool | None, backend: str, colocated: bool) -> bool:
    """``model.vllm.sleep``: as set, or (None) on when the server shares the trainer's GPU. Sleep mode is a
    CUDA feature of vLLM: asked of the CPU backend it is a :class:`~slea.config.ConfigError`."""
    from slea.config import ConfigError

    if setting and backend != "cuda":
        raise ConfigError("model.vllm.sleep: vLLM's sleep mode needs its CUDA backend; this vLLM runs on the CPU")
    return setting if setting is not None else (backend == "cuda" and colocated)


def server_command(model_cfg: ModelSection, port: int, *, backend: str = "cpu", sleep: bool = False) -> list[str]:
    """The ``api_server`` command line for ``model_cfg`` (a :class:`slea.config.ModelSection`) on ``port``, for
    vLLM's ``backend`` (``cpu`` or ``cuda``); ``sleep``: with sleep mode."""
    from slea.policy.model import resolve

    v = model_cfg.vllm
    cmd = [v.python or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(resolve(model_cfg.name_or_path)), "--served-model-name", BASE,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", model_cfg.dtype,
           "--enable-lora", "--max-lora-rank", str(lora_rank(model_cfg.lora_r)), "--max-loras", "1",
           "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
           "--gpu-memory-utilization", str(v.gpu_memory_utilization)]
    if enforce_eager(v.enforce_eager, backend):
        cmd.append("--enforce-eager")
    if sleep:
        cmd.append("--enable-sleep-mode")
    if model_cfg.tokenizer:
        cmd += ["--tokenizer", str(resolve(model_cfg.tokenizer))]
    if v.max_model_len is not None:
        cmd += ["--max-model-len", str(v.max_model_len)]
    return cmd + list(v.args)


# torch.distributed's description of the trainer's group: a server started by a rank must not take it for its own
_GROUP_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def _child_env(python: str | None, *, visible: str | None = None, sleep: bool = False) -> dict[str, str]:
    """The server's environment: offline, no usage stats, runtime LoRA loading on; another venv's python does
    not get this one's PYTHONPATH/VIRTUAL_ENV; not the trainer's process-group variables; ``visible``: its
    ``CUDA_VISIBLE_DEVICES``; ``sleep``: the dev-mode endpoints /sleep and /wake_up on."""
    env = {k: v for k, v in os.environ.items() if k not in _GROUP_ENV}
    if python is not None and Path(python).resolve() != Path(sys.executable).resolve():
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    if sleep:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


@functools.lru_cache(maxsize=16)
def vllm_backend(python: str | None) -> str:
    """``cuda`` when the torch of vLLM's interpreter (``python``; None: this one) sees a CUDA device, else
    ``cpu`` (vLLM's CPU backend). Asked once per interpreter and process."""
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    try:
        proc = subprocess.run([python or sys.executable, "-c", probe], check=False, capture_output=True,
                              timeout=120, env=_child_env(python))
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    return "cuda" if proc.returncode == 0 else "cpu"


def child_visible_devices(parent: str | None, index: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` of a server on the trainer's ``cuda:index``: the ``index``-th entry of the
    parent's list when it has one (indices are relative to it), else ``index`` itself."""
    if parent is not None and parent.strip():
        items = [x.strip() for x in parent.split(",") if x.strip()]
        if index < len(items):
            return items[index]
    return str(index)


GIB = 1024 ** 3


@dataclass(frozen=True)
class ServedMemory:
    """What a vLLM server of a model needs in GPU memory (bytes; estimates): its weights in the served dtype, the
    KV cache of one ``max_model_len`` sequence (the least vLLM starts with), LoRA buffers of one adapter at the
    server's rank, and an allowance for activations, CUDA graphs and the CUDA context."""

    weights: int
    kv_one_sequence: int
    lora: int
    overhead: int = int(1.5 * GIB)

    @property
    def total(self) -> int:
        return self.weights + self.kv_one_sequence + self.lora + self.overhead


def served_memory(arch: dict, *, dtype_bytes: int, max_model_len: int, lora_rank: int, lora_modules: int) -> ServedMemory:
    """:class:`ServedMemory` of a decoder of ``arch`` (``params``, ``layers``, ``kv_heads``, ``head_dim``,
    ``lora_in_out``: Σ (in + out) of the adapted modules of one layer)."""
    kv = 2 * arch["layers"] * arch["kv_heads"] * arch["head_dim"] * dtype_bytes * max_model_len
    lora = lora_rank * arch["lora_in_out"] * arch["layers"] * dtype_bytes if lora_modules else 0
    return ServedMemory(weights=arch["params"] * dtype_bytes, kv_one_sequence=kv, lora=lora)


def check_memory_fraction(fraction: float, total_bytes: int, need: ServedMemory, trainer_bytes: int = 0) -> None:
    """A one-line :class:`~slea.config.ConfigError` naming ``model.vllm.gpu_memory_utilization`` when the server's
    share of the GPU (``fraction`` of ``total_bytes``) cannot hold what it needs, or leaves less than the
    trainer beside it keeps resident (``trainer_bytes``: its weights, adapters, gradients and optimizer state;
    0 when the trainer is not on this GPU)."""
    from slea.config import ConfigError

    have = fraction * total_bytes
    if have < need.total:
        raise ConfigError(
            f"model.vllm.gpu_memory_utilization: {fraction:g} of {total_bytes / GIB:.1f} GiB is {have / GIB:.1f} "
            f"GiB; the server needs about {need.total / GIB:.1f} GiB (weights {need.weights / GIB:.1f}, KV cache "
            f"of one max_model_len sequence {need.kv_one_sequence / GIB:.2f}, LoRA {need.lora / GIB:.2f}, "
            f"runtime {need.overhead / GIB:.1f}): set it to at least {need.total / total_bytes + 0.01:.2f}")
    left = total_bytes - have
    if trainer_bytes and left < trainer_bytes + need.overhead:
        raise ConfigError(
            f"model.vllm.gpu_memory_utilization: {fraction:g} leaves {left / GIB:.1f} GiB of {total_bytes / GIB:.1f} "
            f"beside the server; the trainer keeps about {trainer_bytes / GIB:.1f} GiB there (plus its CUDA "
            f"context and activations): set it to at most "
            f"{(total_bytes - trainer_bytes - need.overhead) / total_bytes:.2f} (model.base_dtype: bfloat16 "
            f"halves the trainer's weights)")


def model_arch(model_cfg: ModelSection) -> dict:
    """The sizes :func:`served_memory` needs, from the model's ``config.json`` (its weights built on the meta
    device: nothing is allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from slea.policy.model import resolve

    config = AutoConfig.from_pretrained(resolve(model_cfg.name_or_path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    in_out = 0
    layer = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList))[0]
    for name, mod in layer.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] in model_cfg.lora_targets:
            in_out += mod.in_features + mod.out_features
    return {"params": params, "layers": config.num_hidden_layers,
            "kv_heads": getattr(config, "num_key_value_heads", None) or heads, "head_dim": head_dim,
            "lora_in_out": in_out}


def trainer_resident_bytes(arch: dict, *, base_bytes: int, lora_params: int) -> int:
    """What the trainer keeps on its GPU between updates: the base weights in ``base_bytes`` per weight, and
    each fp32 LoRA weight with its gradient and AdamW's two moments (16 bytes)."""
    return arch["params"] * base_bytes + 16 * lora_params


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


def check_colocated_memory(model_cfg: ModelSection, device) -> None:
    """:func:`check_memory_fraction` for a server on the GPU of the trainer's ``device`` (a ``cuda`` device the
    trainer's torch sees); the trainer counts when it is on that GPU (always, for ``device``)."""
    import torch

    from slea.device import resolve_base_dtype

    arch = model_arch(model_cfg)
    dtype_bytes = 2 if model_cfg.dtype == "bfloat16" else 4
    need = served_memory(arch, dtype_bytes=dtype_bytes, max_model_len=model_cfg.vllm.max_model_len or 4096,
                         lora_rank=lora_rank(model_cfg.lora_r), lora_modules=len(model_cfg.lora_targets))
    base = resolve_base_dtype(model_cfg.base_dtype, device=device, lora=True, dtype=model_cfg.dtype)
    lora = model_cfg.lora_r * arch["lora_in_out"] * arch["layers"]
    trainer = trainer_resident_bytes(arch, base_bytes=2 if base == torch.bfloat16 else 4, lora_params=lora)
    total = torch.cuda.get_device_properties(device).total_memory
    check_memory_fraction(model_cfg.vllm.gpu_memory_utilization, total, need, trainer)


class ManagedVLLM:
    """A vLLM server for ``model_cfg``, started now and healthy on return; :meth:`stop` (idempotent) ends it.
    ``device``: the trainer's device (``run.device`` resolved; None: the CPU). On vLLM's CUDA backend the server
    runs on that GPU (or on the GPU of ``LOCAL_RANK`` when the trainer is on the CPU), its memory fraction checked
    first, and sleeps around updates when it shares the trainer's GPU (:func:`sleeps`)."""

    def __init__(self, model_cfg: ModelSection, device=None):
        import torch

        from slea.device import local_rank

        v = model_cfg.vllm
        device = torch.device(device or "cpu")
        self.backend = vllm_backend(v.python)
        colocated = self.backend == "cuda" and device.type == "cuda"
        self.sleeps = sleeps(v.sleep, self.backend, colocated)
        visible = None
        if self.backend == "cuda":
            index = device.index if device.type == "cuda" and device.index is not None else local_rank()
            visible = child_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), index)
            if colocated:
                check_colocated_memory(model_cfg, device)
        self.port = v.port + local_rank() if v.port else free_port()  # one server per data-parallel rank
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.command = server_command(model_cfg, self.port, backend=self.backend, sleep=self.sleeps)
        fd, name = tempfile.mkstemp(prefix="slea-vllm-", suffix=".log")
        self.log_path = Path(name)
        env = _child_env(v.python, visible=visible, sleep=self.sleeps)
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(launch_command(self.command), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
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
    """The openai engine over a :class:`ManagedVLLM` it starts for ``model_cfg`` (or ``server``, one started
    earlier: before the trainer took its GPU memory); :meth:`close` stops it. It sleeps the server around
    updates when the server was started with sleep mode."""

    def __init__(self, model, tok, model_cfg: ModelSection, *, stop_at_newline: bool = True,
                 server: ManagedVLLM | None = None, device=None):
        self.server = server if server is not None else ManagedVLLM(model_cfg, device)
        try:
            settings = model_cfg.openai.model_copy(update={"base_url": self.server.url, "model": BASE,
                                                           "sleep": self.server.sleeps})
            super().__init__(model, tok, settings, stop_at_newline=stop_at_newline)
        except BaseException:
            self.server.stop()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.server.stop()
