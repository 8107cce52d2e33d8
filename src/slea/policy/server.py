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
  ``n``, ``max_tokens`` / ``max_completion_tokens`` (default 256, or what the context leaves), ``temperature``,
  ``top_p``, ``seed``, ``stop``, ``logprobs: true`` (the sampled token's log-prob per token; ``top_logprobs`` > 0
  is refused), ``stream`` and the same extensions (``return_token_ids`` also adds the rendered prompt's
  ``prompt_token_ids``).
- Tool calling on ``/v1/chat/completions``: ``tools`` (OpenAI function tools: a unique name of 1-64 letters,
  digits, ``_`` or ``-``, a JSON-Schema object as ``parameters``; at most ``max_tools``), ``tool_choice`` and
  ``parallel_tool_calls``; the history may hold assistant ``tool_calls`` and ``role: "tool"`` results. The prompt
  is rendered as the trainer's (:func:`slea.policy.tool_calls.render`): the chat template's own tools rendering
  where it has one, else the fallback rendering (the schemas in the system message, calls as ``<tool_call>``
  blocks, results as a user message of ``<tool_response>`` blocks). Each answer is read with the tokenizer's tool
  parser (``--tool-parser`` names another); one that makes calls returns ``message.tool_calls`` (``call_...`` ids,
  ``type: "function"``, ``function: {name, arguments: <JSON string>}``), ``content`` the text outside the calls
  or null, ``finish_reason: "tool_calls"`` (streamed: the calls come as ``tool_calls`` deltas after the answer is
  whole); an answer without a valid call is its text (finish ``stop`` or ``length``). ``parallel_tool_calls:
  false`` keeps the first call. ``tool_choice``: ``auto`` (the default with tools); ``none`` shows no tools and
  parses no call (as vLLM's ``--exclude-tools-when-tool-choice-none``); ``required`` and a named function are
  accepted but not enforced (no constrained decoding): the prompt and the parse are ``auto``'s, so an answer
  without a call comes back as text with finish ``stop``, and a call to another tool is returned as made. A call
  is returned whatever its name: the client checks it against its tools.
- ``stream: true`` is served as server-sent events, sent as the tokens are decoded (slea/policy/serve_stream.py:
  a chunk per token and answer, then ``data: [DONE]``; ``stream_options.include_usage`` adds the usage chunk;
  a chat answer with tools offered is sent when whole, its calls read from all of it). A failure once the
  stream has begun (its time limit) is an event holding the error.
- ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}``: a LoRA adapter folder (slea/policy/adapters.py:
  peft's ``adapter_config.json`` + ``adapter_model.safetensors``, what the trainer's weight sync writes); one
  adapter at a time, a new one replaces the old. Off (403) unless the server was started with a folder
  (``--lora-dir``, :attr:`ServeSettings.lora_dir`), and then only folders under it. Checked before anything
  changes (:func:`slea.policy.adapters.read_lora`): a plain LoRA config, exactly the LoRA tensors it gives this
  model (names and shapes), all finite; then loaded beside the served adapter, which it replaces only once
  loaded (:func:`~slea.policy.adapters.swap_lora`). A refused adapter is a 400 naming the file and the reason,
  and changes nothing. ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``.
- ``POST /sleep`` (``?level=``), ``POST /wake_up``, ``GET /is_sleeping``: vLLM's sleep-mode endpoints, as no-ops
  that keep the state (this server frees nothing): a trainer's sleep/wake calls can be run against it.
  ``GET /health``: 200 while the server runs (no key needed). ``Engine.calls`` lists the latest requests
  (method and path with its query), in order (the last ``max_log``).

Input is hostile until checked (docs/reliability.md, "Serving"): a body is read up to ``max_body_bytes`` (413
beyond), parsed and validated against typed models of the OpenAI schema (slea/policy/openai_protocol.py:
strict types, finite numbers, no lone surrogates, bounded nesting); prompt + ``max_tokens`` must fit the model's
context (``max_model_len``), and ``n``, the rows of a request, ``logprobs``, the prompt's tokens and the stop
strings are capped (:class:`ServeSettings`, ``slea serve --help``); with tools the prompt counted is the rendered
one. Cheap caps come first: a prompt's characters, a chat's messages and tools and each tool's JSON are refused
before anything is rendered or tokenized (slea/policy/serve_caps.py), and a request is checked, rendered and
tokenized off the engine, within its time limit (slea/policy/serve_gate.py). A field that would change the answer and that the server cannot honour (tools on ``/v1/completions``, the
legacy functions / function_call, logit_bias, penalties, suffix, best_of, echo, a JSON response format) is a 400
naming it, and so are malformed tools, tool choices and tool-call histories, and messages the chat template
refuses; every error has the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``.

One generation at a time (the engine batches the answers of one request); up to ``max_queue`` requests wait or
run, more are a 429. Requests, not sockets, are bounded (slea/policy/serve_http.py): more than ``max_in_flight``
in progress are a 503 (``/health`` is never refused); a connection must send its request line and headers within
``header_timeout_s``, and past ``max_idle_connections`` idle ones the oldest is closed. A request that has not finished within
``request_timeout_s`` stops generating and is a 504 (503 when it never left the queue); a client that disconnects
stops its generation between two decode steps, streamed or not (:class:`slea.policy.generation.GenerationCancelled`).
With an API key (``--api-key`` or the ``SLEA_API_KEY`` environment variable) every route but ``/health`` needs
``Authorization: Bearer KEY`` (401 without). Text prompts are tokenized without special tokens (slea's prompts
carry their chat template's own markers). Built on FastAPI (Starlette) under uvicorn's h11 protocol, as vLLM's
OpenAI server: HTTP framing (Content-Length, chunked bodies, header sizes, keep-alive) is theirs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, fields
from pathlib import Path

from slea.policy.openai_protocol import (
    AdapterRequest,
    ChatRequest,
    CompletionRequest,
    RequestError,
    chat_messages,
    cut_at_stop,
    integer,
    number,
    parse_request,
    refuse_unsupported,
    stop_list,
    text,
    tool_request,
)
from slea.policy.serve_caps import SizeCaps, check_chat, check_text, longest_token_chars
from slea.policy.serve_gate import Gate
from slea.policy.serve_http import Front, Server
from slea.policy.serve_routes import (
    Request,
    Requests,
    add_adapter_routes,
    add_error_handlers,
    add_generation_routes,
    add_model_routes,
    add_sleep_routes,
)
from slea.policy.serve_stream import Streamer

log = logging.getLogger(__name__)
CHAT_MAX_TOKENS = 256  # a chat request's default max_tokens (completions: 16, as the OpenAI API)
API_KEY_ENV = "SLEA_API_KEY"  # where `slea serve` reads its API key when --api-key is not given
MIN_TEMPERATURE = 1e-6  # below this (and above 0) logits / T overflows float32: refused, 0 is greedy
MAX_KEY_INTS = 64  # ints per rng_keys key (slea's keys hold 2-6)


@dataclass
class ServeSettings:
    """What ``slea serve`` accepts and how much it does for one client (``slea serve --help`` lists each as an
    option). The defaults fit the trainer's own requests (``model.openai.batch_size`` prompts of one answer)."""

    api_key: str | None = None  # every route but /health needs "Authorization: Bearer <key>"
    lora_dir: str | Path | None = None  # /v1/load_lora_adapter loads folders under it; None: off (403)
    max_model_len: int | None = None  # prompt + max_tokens; None: the model's max_position_embeddings
    max_prompt_tokens: int | None = None  # None: max_model_len - 1
    max_n: int = 128  # answers per prompt
    max_rows: int = 512  # prompts x n in one request
    max_logprobs: int = 20  # the completions field `logprobs` (vLLM's default cap)
    max_stops: int = 4  # stop strings (the OpenAI API's 4)
    max_stop_chars: int = 256  # characters per stop string
    max_body_bytes: int = 8 << 20  # a request body; larger: 413
    max_queue: int = 16  # requests waiting for the engine or generating; more: 429
    max_in_flight: int = 64  # requests in progress (idle connections and /health not counted); more: 503
    header_timeout_s: float = 10.0  # a connection's request line and headers, from its opening or last answer
    max_idle_connections: int = 256  # connections without a request in progress; past it the oldest closes
    request_timeout_s: float = 300.0  # from arrival to the last token; past it: generation stops, 504
    max_log: int = 1024  # Engine.calls keeps the latest this many requests
    max_tools: int = 128  # tools in one chat request
    max_tool_chars: int = 32768  # characters of one tool's JSON
    max_messages: int = 1024  # messages in one chat request
    max_prompt_chars: int | None = None  # a prompt's characters; None: max_prompt_tokens x the longest token's
    tool_parser: str | None = None  # the tool-call syntax answers are parsed in; None: the tokenizer's own

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("api_key", "lora_dir", "tool_parser") or v is None:
                continue
            if not (v >= 0 if f.name == "max_logprobs" else v > 0):
                raise ValueError(f"{f.name} must be positive, got {v!r}")
        if self.api_key is not None and (not self.api_key or self.api_key.strip() != self.api_key):
            raise ValueError("api_key must not be empty or begin or end with blanks")
        if self.tool_parser is not None:
            from slea.policy.tool_calls import TOOL_PARSERS

            try:
                TOOL_PARSERS.get(self.tool_parser)
            except (KeyError, TypeError) as exc:
                raise ValueError(f"tool_parser: {exc.args[0] if exc.args else exc}") from None


@dataclass
class Answer:
    """One choice: the kept token ids and their log-probs, its text and why it ended."""

    ids: list[int]
    logprobs: list[float]
    text: str
    finish: str


@dataclass
class Reply:
    """A chat choice's message: its text (``None`` when the answer is only tool calls), its ``tool_calls`` in the
    OpenAI shape, and why it ended (``tool_calls`` when it makes calls)."""

    content: str | None
    calls: list[dict]
    finish: str


@dataclass
class Events:
    """A streamed answer: the chunks sent as server-sent events."""

    chunks: list[dict]


@dataclass
class Plan:
    """How a request's rows are generated, checked before the engine runs."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stops: list[str]
    keys: list | None


@dataclass
class Job:
    """A request checked, rendered and tokenized off the engine's slot (:meth:`Engine.prepare_completion`,
    :meth:`Engine.prepare_chat`): what :meth:`Engine.run` generates, and how it shapes the answer."""

    kind: str  # "completion" or "chat"
    name: str  # the model asked for: the base or the adapter
    body: dict
    rows: list[list[int]]
    plan: Plan
    prompt_tokens: int
    tools: bool = False  # chat: tools offered, calls parsed


class Engine:
    """The served model: a base model, at most one LoRA adapter on it, and the HF engine over them."""

    def __init__(self, model, tok, base_id: str, *, dtype: str = "bfloat16", settings: ServeSettings | None = None):
        self.model = model
        self.tok = tok
        self.base_id = base_id
        self.dtype = dtype
        self.lora: str | None = None
        self.lock = threading.Lock()
        self.created = int(time.time())
        self.sleeping = False  # vLLM's sleep mode, as a state only
        self.calls: deque[str] = deque()  # "METHOD /path?query" of the latest requests, in order
        self.configure(settings or ServeSettings())
        self._engine()

    def configure(self, settings: ServeSettings) -> None:
        """Apply ``settings`` (limits, key, adapter folder); a ``max_model_len`` past the model's context is a
        ``ValueError``."""
        from slea.policy.generation import context_length

        model_len = context_length(self.model)
        if settings.max_model_len is not None and model_len is not None and settings.max_model_len > model_len:
            raise ValueError(f"max_model_len {settings.max_model_len} exceeds the model's context ({model_len} "
                             f"tokens, max_position_embeddings)")
        from slea.policy.tool_calls import parser_for

        self.settings = settings
        self.parser = parser_for(self.tok, settings.tool_parser)  # tool calls: the template's syntax, or the named
        self.context = settings.max_model_len or model_len or 4096
        self.max_prompt = min(settings.max_prompt_tokens or self.context - 1, self.context - 1)
        chars = settings.max_prompt_chars or self.max_prompt * longest_token_chars(self.tok)
        self.caps = SizeCaps(chars, settings.max_messages, settings.max_tools, settings.max_tool_chars)
        self.calls = deque(self.calls, maxlen=settings.max_log)

    def log_call(self, line: str) -> None:
        """Record one request (cut to 200 characters: a long URL costs the log nothing)."""
        self.calls.append(line if len(line) <= 200 else line[:199] + "…")

    def set_sleeping(self, asleep: bool) -> str:
        """``/sleep`` and ``/wake_up``: the state changes, nothing is freed (vLLM's answer body is empty too)."""
        self.sleeping = asleep
        return ""

    def _engine(self) -> None:
        from slea.policy.generation import HFGenerator

        self.model.eval()
        self.gen = HFGenerator(self.model, self.tok, dtype=self.dtype, stop_at_newline=False)

    # -- adapters --------------------------------------------------------------------------------------------
    def attach(self, name: str, config, trainable_dir: Path) -> None:
        """Make ``name`` the adapter: the base wrapped with ``config``, a slea checkpoint's
        ``trainable.safetensors`` loaded (``slea serve RUN``)."""
        from slea.policy.model import add_lora
        from slea.runs.checkpoint import load_trainable

        with self.lock:
            if not hasattr(self.model, "peft_config"):
                self.model = add_lora(self.model, config)
            load_trainable(self.model, trainable_dir)
            self.lora = name
            self._engine()

    def load_lora(self, body: dict) -> str:
        from slea.policy.adapters import read_lora, swap_lora

        root = self.settings.lora_dir
        if root is None:
            raise RequestError(403, "load_lora_adapter is off: start slea serve with --lora-dir DIR to load LoRA "
                                    "adapters from folders under DIR", code="lora_loading_disabled")
        body = parse_request(AdapterRequest, body)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise RequestError(400, "load_lora_adapter needs lora_name and lora_path")
        text(name, "lora_name")
        text(path, "lora_path")
        if len(name) > 256:
            raise RequestError(400, "lora_name: at most 256 characters", param="lora_name")
        try:
            inside = Path(path).resolve().is_relative_to(Path(root).resolve())
        except (OSError, ValueError, RuntimeError):
            inside = False
        if not inside:  # resolved: a symlink or ../ out of the folder is outside it
            raise RequestError(403, f"lora_path must be a folder under {root} (this server's --lora-dir)",
                               param="lora_path", code="lora_path_not_allowed")
        try:  # every check before anything changes: a refused adapter leaves the served one as it was
            config, state = read_lora(path, self.model.config)
        except (FileNotFoundError, OSError, ValueError, TypeError) as exc:
            raise RequestError(400, f"cannot load adapter {path}: {exc}; nothing was changed", param="lora_path",
                               code="invalid_adapter") from None
        with self.lock:
            self.model = swap_lora(self.model, config, state)
            self.lora = name
            self._engine()
        log.info("loaded LoRA adapter %s from %s", name, path)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload_lora(self, body: dict) -> str:
        name = parse_request(AdapterRequest, body).get("lora_name")
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

    def _too_long(self, param: str, tokens: int) -> RequestError:
        return RequestError(400, f"{param}: {tokens} tokens, more than this server takes ({self.max_prompt}: "
                                 f"--max-prompt-tokens, within the {self.context}-token context)", param=param,
                            code="context_length_exceeded")

    def _plan(self, rows: list[list[int]], body: dict, default_max: int, param: str) -> Plan:
        """How ``rows`` are generated, checked: prompt + ``max_tokens`` must fit the context (without
        ``max_tokens``: ``default_max`` or what the context leaves)."""
        limits = self.settings
        temp = number(body, "temperature", 1.0, lo=0.0)
        if 0 < temp < MIN_TEMPERATURE:
            raise RequestError(400, f"temperature: 0 (greedy) or at least {MIN_TEMPERATURE:g}", param="temperature")
        top_p = number(body, "top_p", 1.0, lo=0.0, hi=1.0) or 1.0
        top_k = max(integer(body, "top_k", 0) or 0, 0)  # vLLM's -1: off
        asked = integer(body, "max_completion_tokens", None, lo=1) or integer(body, "max_tokens", None, lo=1)
        longest = max(len(r) for r in rows)
        if longest > self.max_prompt:
            raise self._too_long(param, longest)
        room = self.context - longest
        if asked is not None and asked > room:
            raise RequestError(400, f"This model's maximum context length is {self.context} tokens. However, you "
                                    f"requested {longest + asked} tokens ({longest} in the prompt, {asked} in the "
                                    f"completion). Please reduce the length of the prompt or completion.",
                               param="max_tokens", code="context_length_exceeded")
        stops = stop_list(body.get("stop"), limits.max_stops, limits.max_stop_chars)
        return Plan(asked if asked is not None else min(default_max, room), temp, top_p, top_k, stops,
                    self._keys(body, len(rows), temp))

    def _generate(self, job: Job, cancel=None, on_token=None) -> list[Answer]:
        """The engine's answers to ``job``'s rows (one per row), cut at its stop strings (``on_token``: the
        generator's per-step callback, :meth:`HFGenerator.generate`)."""
        p = job.plan
        with self.lock:
            self._model({"model": job.name})  # an adapter unloaded or replaced since the request was prepared
            off = job.name == self.base_id and hasattr(self.model, "disable_adapter")
            with self.model.disable_adapter() if off else contextlib.nullcontext():
                gens = self.gen.generate(job.rows, max_new_tokens=p.max_tokens, temperature=p.temperature,
                                         top_p=p.top_p, top_k=p.top_k, rng_keys=p.keys,
                                         stop_at_newline="\n" in p.stops, stop=p.stops, cancel=cancel,
                                         on_token=on_token)
        skip = bool(job.body.get("skip_special_tokens", True))
        include = bool(job.body.get("include_stop_str_in_output"))
        out = []
        for g in gens:
            ids, text_, stopped = cut_at_stop(lambda t: self.tok.decode(t, skip_special_tokens=skip), g.ids, p.stops,
                                              include)
            eos = bool(ids) and ids[-1] == self.tok.eos_token_id
            finish = "stop" if stopped or eos or len(g.ids) < p.max_tokens else "length"
            out.append(Answer(ids, list(g.logprobs[:len(ids)]), text_, finish))
        return out

    def _count(self, body: dict, prompts: int) -> int:
        """``n``, within ``max_n`` and (times ``prompts``) ``max_rows``."""
        n = integer(body, "n", 1, lo=1)
        if n > self.settings.max_n:
            raise RequestError(400, f"n: at most {self.settings.max_n} (--max-n)", param="n")
        if n * prompts > self.settings.max_rows:
            raise RequestError(400, f"n: {prompts} prompt(s) x n={n} = {n * prompts} answers, more than "
                                    f"{self.settings.max_rows} in one request (--max-rows)", param="n")
        return n

    def complete(self, body: dict | bytes, cancel=None) -> dict | Events:
        """``/v1/completions`` (a body as a dict or raw JSON): :meth:`prepare_completion`, then :meth:`run`."""
        return self.run(self.prepare_completion(body), cancel)

    def chat(self, body: dict | bytes, cancel=None) -> dict | Events:
        """``/v1/chat/completions``: :meth:`prepare_chat`, then :meth:`run`."""
        return self.run(self.prepare_chat(body), cancel)

    def run(self, job: Job, cancel=None, emit=None) -> dict | Events | None:
        """The answer to a prepared request: its rows generated (``cancel``: checked between decode steps,
        :meth:`HFGenerator.generate`), as a completion or chat completion object. A ``stream`` request's chunks
        go to ``emit`` as its tokens are decoded (slea/policy/serve_stream.py), or, without ``emit``, come back
        together (:class:`Events`)."""
        if not job.body.get("stream"):
            answers = self._generate(job, cancel)
            return (self._completion if job.kind == "completion" else self._chat_completion)(job, answers)
        chunks: list[dict] = []
        skip = bool(job.body.get("skip_special_tokens", True))
        streamer = Streamer(job, self._head(job), lambda t: self.tok.decode(t, skip_special_tokens=skip),
                            lambda t: self.tok.decode([t]), emit or chunks.append)
        answers = self._generate(job, cancel, streamer.step)
        replies = self._replies(job, answers) if job.kind == "chat" else None
        streamer.finish(answers, replies, _usage(job.prompt_tokens, answers))
        return None if emit is not None else Events(chunks)

    def prepare_completion(self, body: dict | bytes) -> Job:
        """A ``/v1/completions`` request checked and tokenized: everything but generating, the cheap checks first
        (the prompts' number and characters before any is tokenized)."""
        body = parse_request(CompletionRequest, body)
        name = self._model(body)
        refuse_unsupported(body)
        lp = body.get("logprobs")
        if lp is not None and lp > self.settings.max_logprobs:
            raise RequestError(400, f"logprobs: at most {self.settings.max_logprobs} (--max-logprobs)",
                               param="logprobs")
        prompts = _prompt_list(body.get("prompt"))
        n = self._count(body, len(prompts))
        ids = [self._tokens(p) for p in prompts]
        rows = [p for p in ids for _ in range(n)]
        return Job("completion", name, body, rows, self._plan(rows, body, 16, "prompt"), sum(len(p) for p in ids))

    def prepare_chat(self, body: dict | bytes) -> Job:
        """A ``/v1/chat/completions`` request checked, rendered and tokenized: the messages through the model's
        chat template (with ``tools``: the template's own tools rendering, else the fallback one, as the trainer's
        prompts). The number of messages and tools and their characters are checked before anything is
        rendered (:func:`slea.policy.serve_caps.check_chat`)."""
        body = parse_request(ChatRequest, body)
        name = self._model(body)
        refuse_unsupported(body, allow=("tools", "tool_choice"))
        if integer(body, "top_logprobs", 0, lo=0):
            raise RequestError(400, "top_logprobs is not supported (logprobs: true gives the sampled token's)",
                               param="top_logprobs")
        check_chat(body, self.caps)
        tools, choice = tool_request(body.get("tools"), body.get("tool_choice"), self.settings.max_tools)
        msgs = chat_messages(body.get("messages"))
        if not getattr(self.tok, "chat_template", None):
            raise RequestError(400, f"the model {self.base_id} has no chat template: use /v1/completions",
                               param="messages")
        cont = bool(body.get("continue_final_message"))
        if cont and msgs[-1]["role"] != "assistant":
            raise RequestError(400, "continue_final_message: the last message must be the assistant's",
                               param="continue_final_message")
        offered = tools if choice != "none" else None  # tool_choice none: no tools shown, none parsed
        n = self._count(body, 1)
        prompt = self._render(msgs, offered, cont, body.get("add_generation_prompt", True) is not False)
        rows = [prompt] * n
        return Job("chat", name, body, rows, self._plan(rows, body, CHAT_MAX_TOKENS, "messages"), len(prompt),
                   tools=offered is not None)

    @staticmethod
    def _head(job: Job) -> dict:
        if job.kind == "completion":
            return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                    "model": job.name}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": job.name}

    def _completion(self, job: Job, answers: list[Answer]) -> dict:
        return {**self._head(job), "choices": [self._choice(i, a, job.body) for i, a in enumerate(answers)],
                "usage": _usage(job.prompt_tokens, answers)}

    def _replies(self, job: Job, answers: list[Answer]) -> list[Reply]:
        parallel = job.body.get("parallel_tool_calls") is not False
        return [self._reply(a, job.tools, parallel) for a in answers]

    def _chat_completion(self, job: Job, answers: list[Answer]) -> dict:
        """A chat completion object: an answer making tool calls in the parser's syntax returns them as
        ``tool_calls``."""
        body = job.body
        choices = []
        for i, (a, r) in enumerate(zip(answers, self._replies(job, answers))):
            message = {"role": "assistant", "content": r.content}
            if r.calls:
                message["tool_calls"] = r.calls
            c = {"index": i, "message": message, "finish_reason": r.finish,
                 "logprobs": {"content": self._token_logprobs(a)} if body.get("logprobs") else None}
            if body.get("return_token_ids"):
                c["token_ids"] = a.ids
            choices.append(c)
        out = {**self._head(job), "object": "chat.completion", "choices": choices,
               "usage": _usage(job.prompt_tokens, answers)}
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = job.rows[0]
        return out

    def _render(self, msgs: list[dict], tools: list[dict] | None, cont: bool, generation_prompt: bool) -> list[int]:
        """The prompt ids of chat messages, ``tools`` offered: the trainer's rendering
        (:func:`slea.policy.tool_calls.render`); a template that refuses the messages is a 400."""
        from jinja2 import TemplateError

        from slea.policy.tool_calls import render

        try:
            rendered = render(self.tok, msgs, tools, self.parser, continue_final_message=cont,
                              add_generation_prompt=not cont and generation_prompt)
        except (TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise RequestError(400, f"messages: the model's chat template cannot render them ({type(exc).__name__}: "
                                    f"{str(exc)[:200]})", param="messages") from None
        return self.tok(rendered, add_special_tokens=False).input_ids

    def _reply(self, a: Answer, parse: bool, parallel: bool) -> Reply:
        """A chat answer as a message: the calls its text makes in the parser's syntax (when tools are offered;
        only the first unless ``parallel``), else its text."""
        calls = self.parser.parse(a.text)[0] if parse else []
        if not calls:
            return Reply(a.text, [], a.finish)
        calls = calls if parallel else calls[:1]
        return Reply(self.parser.content(a.text) or None,
                     [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                       "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
                      for c in calls], "tool_calls")

    def _tokens(self, prompt: str | list[int]) -> list[int]:
        """One prompt's ids: a text within ``max_prompt_chars`` characters, tokenized; an id list within
        ``max_prompt_tokens`` ids, each in the vocabulary (its length checked before its ids)."""
        if isinstance(prompt, str):
            check_text(text(prompt, "prompt"), self.caps, "prompt")
            ids = self.tok(prompt, add_special_tokens=False).input_ids
        else:
            ids = prompt
        if isinstance(ids, list) and len(ids) > self.max_prompt:
            raise self._too_long("prompt", len(ids))
        vocab = len(self.tok)
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
            raise RequestError(400, f"prompt: each prompt must be non-empty text or token ids in 0..{vocab - 1}",
                               param="prompt")
        return ids

    @staticmethod
    def _keys(body: dict, rows: int, temp: float):
        keys = body.get("rng_keys")
        if keys is not None:
            if not isinstance(keys, list) or len(keys) != rows or not all(
                    isinstance(k, list) and 0 < len(k) <= MAX_KEY_INTS and
                    all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**64 for x in k) for k in keys):
                raise RequestError(400, f"rng_keys: expected {rows} lists of 1 to {MAX_KEY_INTS} ints in [0, 2**64)",
                                   param="rng_keys")
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


def _prompt_list(prompt) -> list:
    """``prompt`` as a list of prompts (texts or id lists), unchecked but for its shape."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError(400, "prompt: expected a string, a token-id list, or a non-empty list of them",
                           param="prompt")
    return prompt


def _usage(prompt_tokens: int, answers: list[Answer]) -> dict:
    used = sum(len(a.ids) for a in answers)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": used, "total_tokens": prompt_tokens + used}


def build_app(engine: Engine, settings: ServeSettings | None = None):
    """The ASGI app (FastAPI) over ``engine``: routes (slea/policy/serve_routes.py, by group), limits, key check,
    request log (module docstring)."""
    if Request is None:
        raise ImportError("slea serve needs FastAPI and uvicorn: pip install 'slea[serve]'")
    from fastapi import FastAPI

    if settings is not None:
        engine.configure(settings)
    settings = engine.settings
    gate = Gate(settings.max_queue, settings.request_timeout_s)
    app = FastAPI(title="slea serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gate = gate
    requests = Requests(engine, gate, settings)
    add_model_routes(app, engine)
    add_generation_routes(app, requests)
    add_adapter_routes(app, requests)
    add_sleep_routes(app, engine)
    add_error_handlers(app)
    key = settings.api_key.encode() if settings.api_key else None
    return Front(app, engine.log_call, key, settings.max_in_flight)


def make_server(engine: Engine, host: str = "127.0.0.1", port: int = 8000,
                settings: ServeSettings | None = None) -> Server:
    """The HTTP server over ``engine`` (``port=0``: a free port, ``server.server_address[1]``); ``settings``
    replace the engine's (:class:`ServeSettings`: limits, API key, adapter folder)."""
    from slea.policy.serve_http import ConnectionLimits

    app = build_app(engine, settings)
    s = engine.settings
    gate = app.state.gate
    limits = ConnectionLimits(s.header_timeout_s, s.max_idle_connections, s.max_in_flight)
    return Server(app, host, port, limits, on_stop=gate.stopping.set, on_close=gate.close)


def api_key_from_env() -> str | None:
    """The API key in ``SLEA_API_KEY`` (empty or unset: none)."""
    return os.environ.get(API_KEY_ENV) or None


def load_engine(target: str, *, dtype: str | None = None, settings: ServeSettings | None = None,
                checkpoint: str | None = None, say=None) -> Engine:
    """The engine ``slea serve TARGET`` serves: ``tiny``, ``embedded``, an HF model folder, or a run folder (its
    model, with its newest usable checkpoint's LoRA adapter — or ``checkpoint``, a name under its checkpoints/ —
    loaded under the run folder's name; ``say`` gets one line per damaged newer checkpoint skipped). ``dtype``
    (``auto``, ``bfloat16``, ``float32``; default the run's ``model.dtype``, else ``auto``) is resolved as
    ``model.dtype`` is (:func:`slea.precision.resolve_dtype`), so the server computes as ``slea agent``'s
    in-process engine does."""
    from slea.config import ModelSection, load_config
    from slea.policy.model import load_policy, lora_config
    from slea.precision import cpu_native_bf16, resolve_dtype
    from slea.runs.checkpoint import run_checkpoint
    from slea.runs.folder import RunFolder

    run = Path(target)
    if RunFolder(run).is_run():
        cfg = load_config(RunFolder(run).config, check_unused=False).model
        base, tok = load_policy(cfg.model_copy(update={"lora": False, "init_from": None,
                                                      "generator": "hf", "openai": type(cfg.openai)()}))
        last = run_checkpoint(run, checkpoint, say=say)  # CheckpointError when the run's weights are not here
        engine = Engine(base, tok, target, dtype=resolve_dtype(dtype or cfg.dtype, native_bf16=cpu_native_bf16()),
                        settings=settings)
        if cfg.lora:
            engine.attach(run.resolve().name, lora_config(base, cfg), trainable_dir=last)
        else:  # a fully fine-tuned run: its checkpoint holds every weight
            from slea.runs.checkpoint import load_trainable

            load_trainable(base, last)
        return engine
    # auto, as model.dtype: bf16 where this CPU computes it natively, else fp32 (bf16 is emulated ~30x slower there)
    compute = resolve_dtype(dtype or "auto", native_bf16=cpu_native_bf16())
    model, tok = load_policy(ModelSection(name_or_path=target, lora=False, dtype=compute))
    return Engine(model, tok, target, dtype=compute, settings=settings)
