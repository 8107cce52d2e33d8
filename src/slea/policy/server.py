"""``slea serve``: an OpenAI-compatible server on slea's in-process engine (HFGenerator).

Endpoints (the OpenAI API's text endpoints, as the official ``openai`` client calls them, and the vLLM extensions
RL rollouts need):

- ``GET /v1/models`` (and ``/v1/models/{id}``): the base model (its name as given: ``tiny``, ``embedded``, a
  folder, a run folder's name) and the loaded LoRA adapter, if any.
- ``POST /v1/completions``: ``prompt`` as text, a list of texts, a token-id list or a list of them; ``n``
  answers per prompt (choice ``i * n + j`` is prompt ``i``'s ``j``-th), ``max_tokens`` (default 16),
  ``temperature`` (0 = greedy), ``top_p``, ``top_k``, ``seed``, ``stop`` (up to 4 strings: the answer ends
  before the first one; ``"\\n"`` also stops the engine at the first token holding a newline, as in rollouts),
  ``logprobs`` (the sampled token's ``log_softmax(logits / T)``, what slea's training forward computes;
  ``top_logprobs`` is not filled), ``stream``, and the fields ``return_token_ids`` (the choice's
  ``token_ids``), ``return_tokens_as_token_ids`` (``token_id:N`` strings), ``include_stop_str_in_output``,
  ``skip_special_tokens`` (vLLM's) and ``rng_keys`` (one key per answer: the in-process engine's per-row random
  streams, so a served rollout samples what an in-process one does). ``model`` names the base (adapter off) or
  the loaded adapter.
- ``POST /v1/chat/completions``: ``messages`` rendered by the model's own chat template (generation prompt
  added; vLLM's ``continue_final_message`` continues a last assistant message instead), then as completions:
  ``n``, ``max_tokens`` / ``max_completion_tokens`` (default 256), ``temperature``, ``top_p``, ``seed``,
  ``stop``, ``logprobs: true`` (the sampled token's log-prob per token; ``top_logprobs`` > 0 is refused),
  ``stream`` and the same extensions.
- ``stream: true`` is served as server-sent events (one chunk per token, then ``data: [DONE]``;
  ``stream_options.include_usage`` adds the usage chunk). The answer is generated whole first, then sent.
- ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}``: a LoRA adapter folder (slea/policy/adapters.py:
  peft's ``adapter_config.json`` + ``adapter_model.safetensors``, what the trainer's weight sync writes); one
  adapter at a time, a new one replaces the old. ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``.
- ``POST /sleep`` (``?level=``), ``POST /wake_up``, ``GET /is_sleeping``: vLLM's sleep-mode endpoints, as no-ops
  that keep the state (this server frees nothing): a trainer's sleep/wake calls can be run against it.
  ``Engine.calls`` lists every request (method and path with its query), in order.

A field that would change the answer and that the server cannot honour (tools, logit_bias, penalties, suffix,
best_of, echo, a JSON response format) is a 400 naming it; every error has the OpenAI shape
``{"error": {"message", "type", "param", "code"}}`` (slea/policy/openai_protocol.py). Requests are served one at
a time (a lock around the model; the engine batches the answers of one request). Text prompts are tokenized
without special tokens (slea's prompts carry their chat template's own markers). Built on the standard
library's ThreadingHTTPServer: nothing to install.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from slea.policy.openai_protocol import (
    RequestError,
    chat_messages,
    cut_at_stop,
    deltas,
    error_body,
    integer,
    number,
    refuse_unsupported,
    sse,
    stop_list,
)

log = logging.getLogger(__name__)
CHAT_MAX_TOKENS = 256  # a chat request's default max_tokens (completions: 16, as the OpenAI API)


@dataclass
class Answer:
    """One choice: the kept token ids and their log-probs, its text and why it ended."""

    ids: list[int]
    logprobs: list[float]
    text: str
    finish: str


@dataclass
class Events:
    """A streamed answer: the chunks sent as server-sent events."""

    chunks: list[dict]


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
        self.sleeping = False  # vLLM's sleep mode, as a state only
        self.calls: list[str] = []  # "METHOD /path?query" of every request, in order
        self._engine()

    def set_sleeping(self, asleep: bool) -> str:
        """``/sleep`` and ``/wake_up``: the state changes, nothing is freed (vLLM's answer body is empty too)."""
        self.sleeping = asleep
        return ""

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

    # -- generation ----------------------------------------------------------------------------------------
    def _model(self, body: dict) -> str:
        name = body.get("model") or self.lora or self.base_id
        if name not in (self.base_id, self.lora):
            raise RequestError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")
        return name

    def _answers(self, name: str, rows: list[list[int]], body: dict, default_max: int) -> list[Answer]:
        """The engine's answers to ``rows`` (one per row), cut at ``stop``."""
        temp = number(body, "temperature", 1.0, lo=0.0)
        top_p = number(body, "top_p", 1.0, lo=0.0, hi=1.0) or 1.0
        top_k = max(integer(body, "top_k", 0) or 0, 0)  # vLLM's -1: off
        max_tokens = integer(body, "max_completion_tokens", None, lo=1) or integer(body, "max_tokens", default_max,
                                                                                   lo=1)
        stops = stop_list(body.get("stop"))
        keys = self._keys(body, len(rows), temp)
        with self.lock:
            off = name == self.base_id and hasattr(self.model, "disable_adapter")
            with self.model.disable_adapter() if off else contextlib.nullcontext():
                gens = self.gen.generate(rows, max_new_tokens=max_tokens, temperature=temp, top_p=top_p,
                                         top_k=top_k, rng_keys=keys, stop_at_newline="\n" in stops)
        skip = bool(body.get("skip_special_tokens", True))
        include = bool(body.get("include_stop_str_in_output"))
        out = []
        for g in gens:
            ids, text, stopped = cut_at_stop(lambda t: self.tok.decode(t, skip_special_tokens=skip), g.ids, stops,
                                             include)
            eos = bool(ids) and ids[-1] == self.tok.eos_token_id
            finish = "stop" if stopped or eos or len(g.ids) < max_tokens else "length"
            out.append(Answer(ids, list(g.logprobs[:len(ids)]), text, finish))
        return out

    def complete(self, body: dict) -> dict | Events:
        """``/v1/completions``: a completion object, or its chunks when ``stream``."""
        name = self._model(body)
        refuse_unsupported(body)
        prompts = self._prompts(body.get("prompt"))
        n = integer(body, "n", 1, lo=1)
        rows = [p for p in prompts for _ in range(n)]
        answers = self._answers(name, rows, body, 16)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": name}
        usage = _usage(sum(len(p) for p in prompts), answers)
        if body.get("stream"):
            return Events(self._completion_chunks(head, answers, body, usage))
        return {**head, "choices": [self._choice(i, a, body) for i, a in enumerate(answers)], "usage": usage}

    def chat(self, body: dict) -> dict | Events:
        """``/v1/chat/completions``: the messages through the model's chat template, then as completions."""
        name = self._model(body)
        refuse_unsupported(body)
        if integer(body, "top_logprobs", 0, lo=0):
            raise RequestError(400, "top_logprobs is not supported (logprobs: true gives the sampled token's)",
                               param="top_logprobs")
        msgs = chat_messages(body.get("messages"))
        if not getattr(self.tok, "chat_template", None):
            raise RequestError(400, f"the model {self.base_id} has no chat template: use /v1/completions",
                               param="messages")
        cont = bool(body.get("continue_final_message"))
        if cont and msgs[-1]["role"] != "assistant":
            raise RequestError(400, "continue_final_message: the last message must be the assistant's",
                               param="continue_final_message")
        text = self.tok.apply_chat_template(msgs, tokenize=False, continue_final_message=cont,
                                            add_generation_prompt=not cont and body.get("add_generation_prompt",
                                                                                        True) is not False)
        prompt = self.tok(text, add_special_tokens=False).input_ids
        n = integer(body, "n", 1, lo=1)
        answers = self._answers(name, [prompt] * n, body, CHAT_MAX_TOKENS)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": name}
        usage = _usage(len(prompt), answers)
        if body.get("stream"):
            return Events(self._chat_chunks(head, answers, body, usage))
        choices = []
        for i, a in enumerate(answers):
            c = {"index": i, "message": {"role": "assistant", "content": a.text}, "finish_reason": a.finish,
                 "logprobs": {"content": self._token_logprobs(a)} if body.get("logprobs") else None}
            if body.get("return_token_ids"):
                c["token_ids"] = a.ids
            choices.append(c)
        return {**head, "object": "chat.completion", "choices": choices, "usage": usage}

    def _prompts(self, prompt) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise RequestError(400, "prompt: expected a string, a token-id list, or a non-empty list of them",
                               param="prompt")
        vocab = len(self.tok)
        out = []
        for p in prompt:
            ids = self.tok(p, add_special_tokens=False).input_ids if isinstance(p, str) else p
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
                raise RequestError(400, f"prompt: each prompt must be non-empty text or token ids in 0..{vocab - 1}",
                                   param="prompt")
            out.append(ids)
        return out

    @staticmethod
    def _keys(body: dict, rows: int, temp: float):
        keys = body.get("rng_keys")
        if keys is not None:
            if not isinstance(keys, list) or len(keys) != rows or not all(
                    isinstance(k, list) and all(isinstance(x, int) and x >= 0 for x in k) for k in keys):
                raise RequestError(400, f"rng_keys: expected {rows} lists of non-negative ints", param="rng_keys")
            return keys
        seed = integer(body, "seed", None)
        if seed is not None and temp > 0:
            return [[seed % 2**63, i] for i in range(rows)]
        return None

    def _pieces(self, a: Answer) -> list[str]:
        return [self.tok.decode([t]) for t in a.ids]

    def _choice(self, i: int, a: Answer, body: dict) -> dict:
        choice = {"index": i, "text": a.text, "finish_reason": a.finish, "logprobs": None}
        if body.get("logprobs") is not None:
            pieces = self._pieces(a)
            offsets, at = [], 0
            for p in pieces:
                offsets.append(at)
                at += len(p)
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in a.ids] if as_ids else pieces,
                                  "token_logprobs": a.logprobs, "top_logprobs": None, "text_offset": offsets}
        if body.get("return_token_ids"):
            choice["token_ids"] = list(a.ids)
        return choice

    def _token_logprobs(self, a: Answer) -> list[dict]:
        return [{"token": p, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
                for p, lp in zip(self._pieces(a), a.logprobs)]

    def _stream_pieces(self, a: Answer, body: dict) -> list[str]:
        skip = bool(body.get("skip_special_tokens", True))
        return deltas(lambda t: self.tok.decode(t, skip_special_tokens=skip), a.ids, a.text)

    def _completion_chunks(self, head: dict, answers: list[Answer], body: dict, usage: dict) -> list[dict]:
        chunks = []
        for i, a in enumerate(answers):
            for k, piece in enumerate(self._stream_pieces(a, body)):
                lp = None
                if body.get("logprobs") is not None and k < len(a.ids):
                    lp = {"tokens": [self.tok.decode([a.ids[k]])], "token_logprobs": [a.logprobs[k]],
                          "top_logprobs": None, "text_offset": [0]}
                chunks.append({**head, "choices": [{"index": i, "text": piece, "logprobs": lp,
                                                    "finish_reason": None}]})
            chunks.append({**head, "choices": [{"index": i, "text": "", "logprobs": None,
                                                "finish_reason": a.finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "choices": [], "usage": usage})
        return chunks

    def _chat_chunks(self, head: dict, answers: list[Answer], body: dict, usage: dict) -> list[dict]:
        head = {**head, "object": "chat.completion.chunk"}
        chunks = []
        for i, a in enumerate(answers):
            chunks.append({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}]})
            entries = self._token_logprobs(a) if body.get("logprobs") else []
            for k, piece in enumerate(self._stream_pieces(a, body)):
                lp = {"content": entries[k:k + 1]} if entries else None
                chunks.append({**head, "choices": [{"index": i, "delta": {"content": piece}, "logprobs": lp,
                                                    "finish_reason": None}]})
            chunks.append({**head, "choices": [{"index": i, "delta": {}, "logprobs": None,
                                                "finish_reason": a.finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "choices": [], "usage": usage})
        return chunks


def _usage(prompt_tokens: int, answers: list[Answer]) -> dict:
    used = sum(len(a.ids) for a in answers)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": used, "total_tokens": prompt_tokens + used}


def _handler(engine: Engine):
    routes = {("GET", "/v1/models"): lambda body: engine.models(),
              ("POST", "/v1/completions"): engine.complete,
              ("POST", "/v1/chat/completions"): engine.chat,
              ("POST", "/v1/load_lora_adapter"): engine.load_lora,
              ("POST", "/v1/unload_lora_adapter"): engine.unload_lora,
              ("POST", "/sleep"): lambda body: engine.set_sleeping(True),
              ("POST", "/wake_up"): lambda body: engine.set_sleeping(False),
              ("GET", "/is_sleeping"): lambda body: {"is_sleeping": engine.sleeping}}

    def route_of(method: str, path: str):
        if method == "GET" and path.startswith("/v1/models/"):  # models.retrieve
            name = path[len("/v1/models/"):]
            found = [m for m in engine.models()["data"] if m["id"] == name]
            if not found:
                raise RequestError(404, f"The model `{name}` does not exist.", param="model",
                                   code="model_not_found")
            return lambda body: found[0]
        route = routes.get((method, path))
        if route is None:
            raise RequestError(404, f"Invalid URL ({method} {path}): slea serve has no such route",
                               code="unknown_url")
        return route

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self, method: str) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(size) if size else b""  # read first: an unread body would poison keep-alive
            engine.calls.append(f"{method} {self.path}")
            try:
                route = route_of(method, self.path.split("?", 1)[0].rstrip("/"))
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    raise RequestError(400, "the request body is not JSON") from None
                if not isinstance(body, dict):
                    raise RequestError(400, "the request body must be a JSON object")
                answer = route(body)
                if isinstance(answer, Events):
                    self._send(200, sse(answer.chunks), "text/event-stream")
                else:
                    self._send(200, answer)
            except RequestError as exc:
                self._send(exc.status, error_body(exc.status, str(exc), exc.param, exc.code))
            except Exception as exc:
                log.exception("request failed")
                self._send(500, error_body(500, f"{type(exc).__name__}: {exc}"))

        def _send(self, status: int, payload, content_type: str | None = None) -> None:
            if isinstance(payload, bytes):
                data = payload
            else:
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                content_type = "application/json" if not isinstance(payload, str) else "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if content_type == "text/event-stream":
                self.send_header("Cache-Control", "no-cache")
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
    model, with its last checkpoint's LoRA adapter loaded under the run folder's name). ``dtype`` (``auto``,
    ``bfloat16``, ``float32``; default the run's ``model.dtype``, else ``auto``) is resolved as ``model.dtype``
    is (:func:`slea.precision.resolve_dtype`), so the server computes as ``slea agent``'s in-process engine does."""
    from slea.config import ModelSection, load_config
    from slea.policy.model import load_policy, lora_config
    from slea.precision import cpu_native_bf16, resolve_dtype
    from slea.trainer.checkpoint import run_checkpoint

    run = Path(target)
    if (run / "config.yaml").is_file():
        cfg = load_config(run / "config.yaml", check_unused=False).model
        base, tok = load_policy(cfg.model_copy(update={"lora": False, "init_from": None,
                                                      "generator": "hf", "openai": type(cfg.openai)()}))
        engine = Engine(base, tok, target, dtype=resolve_dtype(dtype or cfg.dtype, native_bf16=cpu_native_bf16()))
        last = run_checkpoint(run)  # CheckpointError when the run's weights are not here
        if cfg.lora:
            engine.attach(run.resolve().name, lora_config(base, cfg), trainable_dir=last)
        else:  # a fully fine-tuned run: its checkpoint holds every weight
            from slea.trainer.checkpoint import load_trainable

            load_trainable(base, last)
        return engine
    # auto, as model.dtype: bf16 where this CPU computes it natively, else fp32 (bf16 is emulated ~30x slower there)
    compute = resolve_dtype(dtype or "auto", native_bf16=cpu_native_bf16())
    model, tok = load_policy(ModelSection(name_or_path=target, lora=False, dtype=compute))
    return Engine(model, tok, target, dtype=compute)
