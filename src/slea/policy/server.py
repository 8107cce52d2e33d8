"""``slea serve``: an OpenAI-compatible completions server on slea's in-process engine (HFGenerator).

Endpoints (the subset of the OpenAI API and of vLLM's extensions that RL rollouts need):

- ``GET /v1/models``: the base model (its name as given: ``tiny``, ``embedded``, a folder, a run folder's name)
  and the loaded LoRA adapter, if any.
- ``POST /v1/completions``: ``prompt`` as text, a list of texts, a token-id list or a list of them; ``max_tokens``,
  ``temperature`` (0 = greedy), ``top_p``, ``top_k``, ``n``, ``seed``, ``stop`` (``"\\n"`` only: a row stops at
  its first token containing a newline, kept, as in rollouts; or none: EOS), ``logprobs`` (the sampled token's
  ``log_softmax(logits / T)``, what slea's training forward computes; ``top_logprobs`` is not filled), and the
  fields ``return_token_ids`` (the choice's ``token_ids``), ``return_tokens_as_token_ids`` (``token_id:N``
  strings), ``include_stop_str_in_output``, ``skip_special_tokens`` (vLLM's) and ``rng_keys`` (one key per
  prompt: the in-process engine's per-row random streams, so a served rollout samples what an in-process one
  does). ``model`` names the base (adapter off) or the loaded adapter.
- ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}``: a LoRA adapter folder (slea/policy/adapters.py:
  peft's ``adapter_config.json`` + ``adapter_model.safetensors``, what the trainer's weight sync writes); one
  adapter at a time, a new one replaces the old. ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``.

Requests are served one at a time (a lock around the model; the engine batches the prompts of one request).
Text prompts are tokenized without special tokens (slea's prompts carry their chat template's own markers).
Built on the standard library's ThreadingHTTPServer: nothing to install.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

log = logging.getLogger(__name__)


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Engine:
    """The served model: a base model, at most one LoRA adapter on it, and the HF engine over them."""

    def __init__(self, model, tok, base_id: str, *, dtype: str = "bfloat16"):
        self.model = model
        self.tok = tok
        self.base_id = base_id
        self.dtype = dtype
        self.lora: str | None = None
        self.lock = threading.Lock()
        self.created = int(time.time())
        self._engine()

    def _engine(self) -> None:
        from slea.policy.generation import HFGenerator

        self.model.eval()
        self.gen = HFGenerator(self.model, self.tok, dtype=self.dtype, stop_at_newline=False)

    # -- adapters --------------------------------------------------------------------------------------------
    def attach(self, name: str, config, state: dict | None = None, trainable_dir: Path | None = None) -> None:
        """Make ``name`` the adapter: wrap the base with ``config`` (re-wrap when the shape differs) and load
        ``state`` (peft's saved names) or a slea checkpoint's ``trainable.safetensors``."""
        from peft import get_peft_model, set_peft_model_state_dict

        from slea.policy.adapters import same_shape

        with self.lock:
            if hasattr(self.model, "peft_config") and not same_shape(self.model.peft_config["default"], config):
                self.model = self.model.unload()  # back to the bare base model
            if not hasattr(self.model, "peft_config"):
                self.model = get_peft_model(self.model, config)
            if trainable_dir is not None:
                from slea.trainer.checkpoint import load_trainable

                load_trainable(self.model, trainable_dir)
            if state is not None:
                res = set_peft_model_state_dict(self.model, state)
                bad = [k for k in getattr(res, "unexpected_keys", []) if "lora_" in k]
                if bad:
                    raise RequestError(400, f"adapter has weights this model lacks, e.g. {bad[0]}")
            self.lora = name
            self._engine()

    def load_lora(self, body: dict) -> str:
        from slea.policy.adapters import read_adapter

        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str):
            raise RequestError(400, "load_lora_adapter needs lora_name and lora_path")
        try:
            config, state = read_adapter(path)
        except (FileNotFoundError, OSError, ValueError, TypeError) as exc:
            raise RequestError(400, f"cannot read adapter {path}: {exc}") from None
        self.attach(name, config, state)
        log.info("loaded LoRA adapter %s from %s", name, path)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload_lora(self, body: dict) -> str:
        name = body.get("lora_name")
        if name is None or name != self.lora:
            raise RequestError(404, f"no LoRA adapter named {name!r} is loaded")
        self.lora = None
        return f"Success: LoRA adapter '{name}' removed successfully."

    def models(self) -> dict:
        ids = [self.base_id] + ([self.lora] if self.lora else [])
        return {"object": "list", "data": [{"id": i, "object": "model", "created": self.created,
                                            "owned_by": "slea", "root": self.base_id} for i in ids]}

    # -- completions -----------------------------------------------------------------------------------------
    def complete(self, body: dict) -> dict:
        import contextlib

        name = body.get("model") or self.lora or self.base_id
        if name not in (self.base_id, self.lora):
            raise RequestError(404, f"The model `{name}` does not exist.")
        if body.get("echo"):
            raise RequestError(400, "echo is not supported")
        prompts = self._prompts(body.get("prompt"))
        n = _int(body, "n", 1, lo=1)
        rows = [p for p in prompts for _ in range(n)]
        temp = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
        keys = self._keys(body, len(rows), temp)
        max_tokens = _int(body, "max_tokens", 16, lo=1)
        stop = _stop(body.get("stop"))
        with self.lock:
            off = name == self.base_id and hasattr(self.model, "disable_adapter")
            with self.model.disable_adapter() if off else contextlib.nullcontext():
                gens = self.gen.generate(rows, max_new_tokens=max_tokens, temperature=temp,
                                         top_p=float(body.get("top_p") or 1.0), top_k=max(_int(body, "top_k", 0), 0),
                                         rng_keys=keys, stop_at_newline=stop)
        choices = [self._choice(i, g, body, max_tokens, stop) for i, g in enumerate(gens)]
        used = sum(len(g.ids) for g in gens)
        prompt_tokens = sum(len(p) for p in rows)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": used,
                          "total_tokens": prompt_tokens + used}}

    def _prompts(self, prompt) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise RequestError(400, "prompt: expected a string, a token-id list, or a non-empty list of them")
        vocab = len(self.tok)
        out = []
        for p in prompt:
            ids = self.tok(p, add_special_tokens=False).input_ids if isinstance(p, str) else p
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
                raise RequestError(400, f"prompt: each prompt must be non-empty text or token ids in 0..{vocab - 1}")
            out.append(ids)
        return out

    @staticmethod
    def _keys(body: dict, rows: int, temp: float):
        keys = body.get("rng_keys")
        if keys is not None:
            if not isinstance(keys, list) or len(keys) != rows or not all(
                    isinstance(k, list) and all(isinstance(x, int) and x >= 0 for x in k) for k in keys):
                raise RequestError(400, f"rng_keys: expected {rows} lists of non-negative ints")
            return keys
        seed = body.get("seed")
        if seed is not None and temp > 0:
            return [[int(seed) % 2**63, i] for i in range(rows)]
        return None

    def _choice(self, i: int, g, body: dict, max_tokens: int, stop: bool) -> dict:
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        pieces = [self.tok.decode([t]) for t in g.ids]
        skip = body.get("skip_special_tokens", True)
        text = self.tok.decode(g.ids, skip_special_tokens=bool(skip))
        if stop and not body.get("include_stop_str_in_output") and "\n" in text:
            text = text[:text.index("\n")]
        ended = bool(g.ids) and (g.ids[-1] == self.tok.eos_token_id or (stop and "\n" in pieces[-1]))
        choice = {"index": i, "text": text,
                  "finish_reason": "stop" if ended or len(g.ids) < max_tokens else "length", "logprobs": None}
        if body.get("logprobs") is not None:
            offsets, at = [], 0
            for p in pieces:
                offsets.append(at)
                at += len(p)
            choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in g.ids] if as_ids else pieces,
                                  "token_logprobs": g.logprobs, "top_logprobs": None, "text_offset": offsets}
        if body.get("return_token_ids"):
            choice["token_ids"] = list(g.ids)
        return choice


def _int(body: dict, key: str, default: int, lo: int | None = None) -> int:
    value = body.get(key, default)
    value = default if value is None else value
    if not isinstance(value, int) or isinstance(value, bool) or (lo is not None and value < lo):
        raise RequestError(400, f"{key}: expected an integer{f' >= {lo}' if lo is not None else ''}")
    return value


def _stop(stop) -> bool:
    """Whether rows stop at a newline: ``stop`` may be none or ``"\\n"`` (the engine stops at EOS anyway)."""
    if stop in (None, [], ""):
        return False
    items = [stop] if isinstance(stop, str) else stop
    if isinstance(items, list) and items and all(s == "\n" for s in items):
        return True
    raise RequestError(400, f"stop: only \"\\n\" is supported (got {stop!r})")


def _handler(engine: Engine):
    routes = {("GET", "/v1/models"): lambda body: engine.models(),
              ("POST", "/v1/completions"): engine.complete,
              ("POST", "/v1/load_lora_adapter"): engine.load_lora,
              ("POST", "/v1/unload_lora_adapter"): engine.unload_lora}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self, method: str) -> None:
            route = routes.get((method, self.path.split("?", 1)[0].rstrip("/")))
            try:
                if route is None:
                    raise RequestError(404, f"no route {method} {self.path}")
                size = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(size) if size else b""
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    raise RequestError(400, "the request body is not JSON") from None
                if not isinstance(body, dict):
                    raise RequestError(400, "the request body must be a JSON object")
                self._send(200, route(body))
            except RequestError as exc:
                self._send(exc.status, {"error": {"message": str(exc), "type": "invalid_request_error",
                                                  "code": exc.status}})
            except Exception as exc:
                log.exception("request failed")
                self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error",
                                           "code": 500}})

        def _send(self, status: int, payload) -> None:
            data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if not isinstance(payload, str) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, fmt, *args) -> None:
            log.debug("%s %s", self.address_string(), fmt % args)

    return Handler


def make_server(engine: Engine, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """The HTTP server over ``engine`` (``port=0``: a free port, ``server.server_address[1]``)."""
    server = ThreadingHTTPServer((host, port), _handler(engine))
    server.daemon_threads = True
    return server


def load_engine(target: str, *, dtype: str | None = None) -> Engine:
    """The engine ``slea serve TARGET`` serves: ``tiny``, ``embedded``, an HF model folder, or a run folder (its
    model, with its last checkpoint's LoRA adapter loaded under the run folder's name)."""
    from slea.config import ModelSection, load_config
    from slea.policy.model import load_policy, lora_config
    from slea.trainer.checkpoint import run_checkpoint

    run = Path(target)
    if (run / "config.yaml").is_file():
        cfg = load_config(run / "config.yaml").model
        base, tok = load_policy(cfg.model_copy(update={"lora": False, "init_from": None,
                                                      "generator": "hf", "openai": type(cfg.openai)()}))
        engine = Engine(base, tok, target, dtype=dtype or cfg.dtype)
        last = run_checkpoint(run)  # CheckpointError when the run's weights are not here
        if cfg.lora:
            engine.attach(run.resolve().name, lora_config(base, cfg), trainable_dir=last)
        else:  # a fully fine-tuned run: its checkpoint holds every weight
            from slea.trainer.checkpoint import load_trainable

            load_trainable(base, last)
        return engine
    model, tok = load_policy(ModelSection(name_or_path=target, lora=False, dtype=dtype or "bfloat16"))
    return Engine(model, tok, target, dtype=dtype or "bfloat16")
