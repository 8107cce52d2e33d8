"""The ``openai`` generator: one OpenAI-compatible ``/v1/completions`` request per batch of prompts, or (``model.openai.api:
chat``, a frozen policy only) one ``/v1/chat/completions`` request per prompt.

The prompt goes as token ids (``model.openai.prompt_format: ids``; the completions API takes a list of token-id
lists) or as the text the tokenizer decodes them to (``text``: the server re-tokenizes, which may not give back
the same ids). ``logprobs`` is asked for; every answer comes back as slea's :class:`Generation`: token ids and the
log-prob of each sampled token. The ids are read, in this order, from the choice's ``token_ids`` (vLLM's
``return_token_ids``, and ``slea serve``), from ``logprobs.tokens`` written as ``token_id:N`` (vLLM's
``return_tokens_as_token_ids``), or else by re-tokenizing each returned token string alone: a string that is not
exactly one token of the local tokenizer is an error, never a guess (a warning says ids were re-tokenized).

The log-probs must be ``log_softmax(logits / T)`` of the sampled tokens, what the training forward computes:
``slea serve`` returns exactly that; other servers may return the untempered distribution's (vLLM: see its
``logprobs_mode``). The gap is measured, not assumed: the mean and max |π_trainer / π_rollout − 1| are
``update/mismatch_dev_mean`` and ``update/mismatch_max_dev`` in metrics.jsonl, as with the in-process engine.

Sampling keys (``rng_keys``) go as the ``rng_keys`` extension field, which ``slea serve`` honours (the same
per-row streams as the in-process engine); other servers ignore it and sample with their own RNG.

Nothing trains (``trains=False``: ``slea agent``, ``slea eval``): log-probs are neither asked for nor required,
and ``api: chat`` sends each prompt's chat messages (:class:`slea.policy.served.ChatPrompt`) for the server's own
chat template to render; the answer's token ids come from the server when it returns them (``return_token_ids``),
else from the local tokenizer, else stay empty. A tool env's turn (its prompt carries the schemas,
:class:`slea.policy.served.ChatPromptBuilder`) is sent as OpenAI tool calling: ``tools``, the past calls as
assistant ``tool_calls`` (ids ``call_N``, JSON-string arguments) and their results as ``role: "tool"`` messages
(:func:`wire_messages`); the answer's ``tool_calls`` come back as the text the rollout parses in its tool syntax
(the generated text when it reads as those calls, else the calls written in that syntax), with the server's
token ids when it returns them. With ``api: completions`` (training) nothing changes for tool envs: the local
template renders the tools into the prompt ids and the rollout parses the generated text, as in-process.
:meth:`OpenAIGenerator.check` asks the server, once, for what the chosen mode needs and fails in one line when it
lacks it. :meth:`OpenAIGenerator.answer_texts` answers chat prompts in free text (the LLM experience extractor's
lessons).

Weights: :meth:`OpenAIGenerator.sync_weights` saves the policy's LoRA adapter (slea/policy/adapters.py) and
``POST``s ``/v1/load_lora_adapter`` (vLLM's dynamic LoRA loading: start vLLM with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); later requests name the new adapter as their ``model``. The server
must read the folder: ``model.openai.sync_dir`` on a shared file system when it runs elsewhere.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slea.policy.generation import Generation

if TYPE_CHECKING:
    from slea.config import OpenAISection

log = logging.getLogger(__name__)
RETRY_STATUS = frozenset({429, 502, 503, 504})
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


class GeneratorError(RuntimeError):
    """The server could not be reached, refused a request, or answered something unusable (one line)."""


class OpenAIGenerator:
    """Generates through an OpenAI-compatible server; ``model``/``tok`` are the local policy and tokenizer (the
    tokenizer renders text prompts and re-tokenizes token strings; the model's adapter is what syncs send)."""

    def __init__(self, model, tokenizer, settings: OpenAISection, *, stop_at_newline: bool = True,
                 trains: bool = True):
        try:
            import httpx
        except ImportError:
            raise GeneratorError("model.generator: openai needs httpx: pip install 'slea[openai]'") from None
        self.model = model
        self.tok = tokenizer
        self.cfg = settings
        self.stop_at_newline = stop_at_newline
        self.trains = trains  # log-probs asked for and required (a frozen policy needs none)
        self.calls = 0
        self.served: str | None = settings.model
        self.syncs = 0
        self.asleep = False  # the server was put to sleep (model.openai.sleep) and not woken yet
        self._sync_root: Path | None = None
        self._warned = False
        key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(base_url=settings.base_url.rstrip("/"), headers=headers,
                                   timeout=httpx.Timeout(settings.timeout_s),
                                   transport=httpx.HTTPTransport(retries=settings.retries))

    # -- HTTP ------------------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: dict | None = None, *, text: bool = False) -> dict:
        """One JSON request; connection failures and 429/502/503/504 are retried ``retries`` times (bounded
        back-off), everything else is a :class:`GeneratorError` naming the URL and the server's answer.
        ``text``: the answer is plain text (vLLM's LoRA endpoints), returned as ``{"text": ...}``."""
        import httpx

        url = f"{self.cfg.base_url.rstrip('/')}{path}"
        for attempt in range(self.cfg.retries + 1):
            try:
                resp = self.client.request(method, path, json=body)
            except httpx.TimeoutException:
                raise GeneratorError(f"openai generator: {url} gave no answer within model.openai.timeout_s="
                                     f"{self.cfg.timeout_s}s") from None
            except httpx.HTTPError as exc:
                raise GeneratorError(f"openai generator: cannot reach {url} ({type(exc).__name__}: {exc}; "
                                     f"{self.cfg.retries} retries); is the server running? (`slea serve MODEL` "
                                     f"starts one: docs/served_model.md)") from None
            if resp.status_code in RETRY_STATUS and attempt < self.cfg.retries:
                time.sleep(min(0.25 * 2 ** attempt, 2.0))
                continue
            if resp.status_code >= 400:
                raise GeneratorError(f"openai generator: {method} {url} answered {resp.status_code}: "
                                     f"{resp.text[:300]}")
            if text:
                return {"text": resp.text}
            try:
                return resp.json()
            except ValueError:
                raise GeneratorError(f"openai generator: {url} answered no JSON: {resp.text[:200]!r}") from None
        raise AssertionError("unreachable")

    def served_model(self) -> str:
        """The ``model`` requests name: the last synced adapter, ``model.openai.model``, or the server's first."""
        if self.served is None:
            models = self.request("GET", "/models").get("data") or []
            if not models:
                raise GeneratorError(f"openai generator: {self.cfg.base_url}/models lists no model")
            self.served = models[0]["id"]
        return self.served

    # -- generation ------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int = 12, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, rng_keys: Sequence[Sequence[int]] | None = None,
                 stop_at_newline: bool | None = None, stop: Sequence[str] = ()) -> list[Generation]:
        """One answer per prompt (the in-process engine's signature and meaning, :class:`HFGenerator`)."""
        self.calls += 1
        if rng_keys is not None and len(rng_keys) != len(prompts):
            raise ValueError(f"{len(rng_keys)} rng_keys for {len(prompts)} prompts")
        if top_k and not self.cfg.extensions:
            raise GeneratorError("openai generator: rollout.top_k needs model.openai.extensions (a vLLM field)")
        newline = self.stop_at_newline if stop_at_newline is None else stop_at_newline
        stop = [*(["\n"] if newline else []), *(s for s in stop if s)]
        if getattr(self.cfg, "api", "completions") == "chat":
            return self._chat(prompts, max_new_tokens, temperature, top_p, top_k, rng_keys, stop)
        out: list[Generation] = []
        step = self.cfg.batch_size
        for start in range(0, len(prompts), step):
            chunk = prompts[start:start + step]
            keys = None if rng_keys is None else [[int(k) for k in key] for key in rng_keys[start:start + step]]
            body = self._body(chunk, max_new_tokens, temperature, top_p, top_k, keys, stop)
            answer = self.request("POST", "/completions", body)
            out.extend(self._parse(answer, len(chunk)))
        return out

    def _body(self, chunk, max_new_tokens, temperature, top_p, top_k, keys, stop) -> dict:
        prompt = ([list(map(int, p)) for p in chunk] if self.cfg.prompt_format == "ids"
                  else [self.tok.decode(p) for p in chunk])
        body = {"model": self.served_model(), "prompt": prompt, "max_tokens": max_new_tokens,
                "temperature": temperature, "top_p": top_p, "n": 1}
        if self.trains:
            body["logprobs"] = 1
        if stop:
            body["stop"] = list(stop)
        if self.cfg.extensions:
            body.update(return_token_ids=True, return_tokens_as_token_ids=True, include_stop_str_in_output=True,
                        skip_special_tokens=False)
            if top_k:
                body["top_k"] = top_k
            if keys is not None:
                body["rng_keys"] = keys
        return body

    def _parse(self, answer: dict, n: int) -> list[Generation]:
        choices = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise GeneratorError(f"openai generator: {n} prompts sent, {len(choices)} choices returned")
        return [self._generation(c) for c in choices]

    def _generation(self, choice: dict) -> Generation:
        lp = choice.get("logprobs") or {}
        logprobs = lp.get("token_logprobs")
        if not self.trains and logprobs is None:  # nothing trains: the answer's text and ids are enough
            return self._frozen(choice.get("token_ids"), choice.get("text"))
        if logprobs is None or any(v is None for v in logprobs):
            raise GeneratorError("openai generator: the server returned no per-token log-probs (logprobs)")
        ids = choice.get("token_ids")
        if ids is None:
            ids = self._ids_of(lp.get("tokens") or [])
        if len(ids) != len(logprobs):
            raise GeneratorError(f"openai generator: {len(ids)} token ids for {len(logprobs)} log-probs")
        ids = [int(t) for t in ids]
        return Generation(ids, [float(v) for v in logprobs], self.tok.decode(ids, skip_special_tokens=True))

    def _ids_of(self, tokens: list[str]) -> list[int]:
        """Token ids of ``logprobs.tokens``: ``token_id:N`` strings, else each string re-tokenized alone."""
        ids = []
        for s in tokens:
            m = _TOKEN_ID.match(s)
            if m:
                ids.append(int(m.group(1)))
                continue
            enc = self.tok(s, add_special_tokens=False).input_ids
            if len(enc) != 1:
                raise GeneratorError(f"openai generator: the server's token {s!r} is {len(enc)} tokens of the "
                                     f"local tokenizer; ask the server for token ids (model.openai.extensions)")
            ids.append(enc[0])
        if tokens and not _TOKEN_ID.match(tokens[0]) and not self._warned:
            self._warned = True
            log.warning("openai generator: the server returned token strings; ids re-tokenized one by one")
        return ids

    def _frozen(self, ids, text) -> Generation:
        """An answer without log-probs (nothing trains): the server's token ids, else the local tokenizer's
        encoding of its text, else none; the text decoded from the ids when there are both (as in-process)."""
        text = text if isinstance(text, str) else ""
        if ids is None and self.tok is not None:
            ids = self.tok(text, add_special_tokens=False).input_ids
        ids = [int(t) for t in ids or []]
        if ids and self.tok is not None:
            text = self.tok.decode(ids, skip_special_tokens=True)
        return Generation(ids, [], text)

    # -- chat completions (api: chat; a frozen policy) ---------------------------------------------------------
    def _chat(self, prompts, max_new_tokens, temperature, top_p, top_k, rng_keys, stop) -> list[Generation]:
        """One ``/chat/completions`` request per prompt (its chat messages), ``batch_size`` in flight."""
        if self.trains:
            raise GeneratorError("model.openai.api: chat returns text, not the token ids and log-probs training "
                                 "needs; use model.openai.api: completions")
        missing = [i for i, p in enumerate(prompts) if getattr(p, "messages", None) is None]
        if missing:
            raise GeneratorError("model.openai.api: chat needs each prompt's chat messages (build the prompts "
                                 "with slea.policy.served.prompt_builder)")
        bodies = []
        for i, p in enumerate(prompts):
            body = self._chat_body(p.messages, max_new_tokens, temperature, top_p)
            if stop:
                body["stop"] = list(stop)
            if self.cfg.extensions:
                body["return_token_ids"] = True
                if top_k:
                    body["top_k"] = top_k
                if rng_keys is not None:
                    body["rng_keys"] = [[int(k) for k in rng_keys[i]]]
            bodies.append(body)
        answers = self._each(bodies)
        return [self._chat_answer(c, getattr(p, "tool_parser", None)) for c, p in zip(answers, prompts)]

    def _chat_answer(self, choice: dict, parser) -> Generation:
        """A chat choice as a :class:`Generation`. Its ``tool_calls`` (a tool env's prompt: ``parser`` is its tool
        syntax) become the text the rollout parses: the generated text itself when it reads as those calls in
        ``parser``'s syntax, else the calls written in it (an argument that is not a JSON object stays as sent and
        makes the step invalid, with the reason). The ids are the server's (``return_token_ids``: every generated
        token, the calls' included), else the local tokenizer's encoding of that text."""
        message = choice.get("message") or {}
        calls = [_call(tc) for tc in message.get("tool_calls") or []]
        if not calls or parser is None:
            return self._frozen(choice.get("token_ids"), message.get("content"))
        ids, written = choice.get("token_ids"), parser.format(calls)
        if ids is not None and self.tok is not None:
            said = self.tok.decode([int(t) for t in ids], skip_special_tokens=True)
            if parser.parse(said)[0] == calls:
                written = said
        if ids is None and self.tok is not None:
            ids = self.tok(written, add_special_tokens=False).input_ids
        return Generation([int(t) for t in ids or []], [], written)

    def _chat_body(self, messages, max_tokens: int, temperature: float, top_p: float = 1.0) -> dict:
        msgs, tools = wire_messages(messages)
        body = {"model": self.served_model(), "messages": msgs, "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p, "n": 1}
        if tools:
            body["tools"] = tools
        if msgs and msgs[-1].get("role") == "assistant":  # a prefill the answer continues (vLLM's field)
            if self.cfg.extensions:
                body.update(continue_final_message=True, add_generation_prompt=False)
            else:  # a strict server: the prefill cannot be continued, so it is dropped
                msgs.pop()
        return body

    def _each(self, bodies: list[dict]) -> list[dict]:
        """Each chat body sent (``batch_size`` requests in flight); the first choice of each answer."""
        def one(body):
            choices = self.request("POST", "/chat/completions", body).get("choices") or []
            if not choices:
                raise GeneratorError("openai generator: a chat completion came back without choices")
            return choices[0]

        if len(bodies) <= 1:
            return [one(b) for b in bodies]
        with ThreadPoolExecutor(max_workers=min(self.cfg.batch_size, len(bodies))) as pool:
            return list(pool.map(one, bodies))

    def answer_texts(self, prompts: list, *, max_tokens: int, temperature: float = 0.0,
                     rng_keys: Sequence[Sequence[int]] | None = None) -> list[str]:
        """Free-text answers (no stop at a newline, EOS ends them) to prompts that are a user message or chat
        messages (a last assistant message is a prefill the answer continues): the LLM experience extractor's
        ``generate_text``. ``api: chat`` sends the messages; ``api: completions`` renders them with the local
        tokenizer's chat template and sends the text."""
        convs = [[{"role": "user", "content": p}] if isinstance(p, str) else list(p) for p in prompts]
        if getattr(self.cfg, "api", "completions") == "chat":
            bodies = []
            for i, msgs in enumerate(convs):
                body = self._chat_body(msgs, max_tokens, temperature)
                if rng_keys is not None and self.cfg.extensions:
                    body["rng_keys"] = [[int(k) for k in rng_keys[i]]]
                bodies.append(body)
            return [(c.get("message") or {}).get("content") or "" for c in self._each(bodies)]
        if self.tok is None:
            raise GeneratorError("model.openai.api: completions needs the local tokenizer to render chat prompts")
        texts = [render_chat(self.tok, msgs) for msgs in convs]
        out: list[str] = []
        for start in range(0, len(texts), self.cfg.batch_size):
            chunk = texts[start:start + self.cfg.batch_size]
            body = {"model": self.served_model(), "prompt": chunk, "max_tokens": max_tokens,
                    "temperature": temperature, "n": 1}
            if rng_keys is not None and self.cfg.extensions:
                body["rng_keys"] = [[int(k) for k in key] for key in rng_keys[start:start + len(chunk)]]
            choices = sorted(self.request("POST", "/completions", body).get("choices") or [],
                             key=lambda c: c.get("index", 0))
            if len(choices) != len(chunk):
                raise GeneratorError(f"openai generator: {len(chunk)} prompts sent, {len(choices)} choices returned")
            out += [c.get("text") or "" for c in choices]
        return out

    # -- what the server offers ------------------------------------------------------------------------------
    def check(self) -> None:
        """One small request of the chosen kind, before any episode: a :class:`GeneratorError` in one line when
        the server is not there, lacks the endpoint ``model.openai.api`` needs, or (training) gives no
        log-probs."""
        model = self.served_model()
        api = getattr(self.cfg, "api", "completions")
        url = f"{self.cfg.base_url.rstrip('/')}/{'chat/completions' if api == 'chat' else 'completions'}"
        try:
            if api == "chat":
                self.request("POST", "/chat/completions", {"model": model, "max_tokens": 1, "temperature": 0,
                                                           "messages": [{"role": "user", "content": "Hello"}]})
                return
            prompt = (self.tok("Hello", add_special_tokens=False).input_ids if self.tok is not None else [0])
            body = {"model": model, "prompt": [prompt] if self.cfg.prompt_format == "ids" else ["Hello"],
                    "max_tokens": 1, "temperature": 0}
            if self.trains:
                body["logprobs"] = 1
            answer = self.request("POST", "/completions", body)
        except GeneratorError as exc:
            if any(f"answered {code}" in str(exc) for code in (404, 405, 501)):
                other = "completions" if api == "chat" else "chat"
                raise GeneratorError(f"model.openai.api: {api}: the server offers no {url} ({exc}); try "
                                     f"model.openai.api: {other}") from None
            raise
        if self.trains:
            choices = answer.get("choices") or [{}]
            lp = (choices[0].get("logprobs") or {}).get("token_logprobs")
            if not lp or any(v is None for v in lp):
                raise GeneratorError(f"openai generator: {url} returns no per-token log-probs, which training "
                                     f"needs (a frozen model needs none: slea agent, slea eval)")

    # -- weights ---------------------------------------------------------------------------------------------
    def sync_weights(self, model) -> str:
        """Save ``model``'s LoRA adapter and have the server load it; later requests use it. Returns its name."""
        from slea.policy.adapters import save_adapter

        if not hasattr(model, "peft_config"):
            from slea.config import ConfigError

            raise ConfigError("model.generator: openai sends trained weights to the server as LoRA adapters; set "
                              "model.lora: true")
        self.wake_up()  # a server asleep for the update takes its weights back before the adapter
        if self._sync_root is None:
            root = self.cfg.sync_dir
            self._sync_root = Path(root) if root else Path(tempfile.mkdtemp(prefix="slea-sync-"))
            self._sync_root.mkdir(parents=True, exist_ok=True)
            if not root:  # a temp folder goes when the generator does (the server holds the loaded weights)
                weakref.finalize(self, shutil.rmtree, str(self._sync_root), True)
        self.syncs += 1
        name = f"slea-sync-{os.getpid()}-{self.syncs}"
        folder = save_adapter(model, self._sync_root / name)
        previous = self.served if self.syncs > 1 else None
        self.request("POST", "/load_lora_adapter", {"lora_name": name, "lora_path": str(folder.resolve())},
                     text=True)
        self.served = name
        if previous is not None:
            self._unload(previous)
        return name

    def _unload(self, name: str) -> None:
        try:
            self.request("POST", "/unload_lora_adapter", {"lora_name": name}, text=True)
        except GeneratorError:  # slea serve replaces the adapter on load: the old name is already gone
            pass
        assert self._sync_root is not None, "only a synced adapter is unloaded"
        shutil.rmtree(self._sync_root / name, ignore_errors=True)

    # -- sleep mode (model.openai.sleep; vLLM's dev endpoints at the server's root) ------------------------------
    def sleep(self) -> None:
        """Before an update: ``POST /sleep?level=1`` (vLLM offloads its weights to host memory and drops its KV
        cache, so the trainer beside it on the GPU has the memory); a no-op unless ``model.openai.sleep``."""
        if getattr(self.cfg, "sleep", False) and not self.asleep:
            self._root("/sleep?level=1")
            self.asleep = True

    def wake_up(self) -> None:
        """``POST /wake_up`` when the server sleeps (:meth:`sync_weights` does it before sending the adapter)."""
        if self.asleep:
            self._root("/wake_up")
            self.asleep = False

    def _root(self, path: str) -> None:
        import httpx

        url = self.cfg.base_url.rstrip("/").removesuffix("/v1") + path
        try:
            resp = self.client.post(url)
        except httpx.HTTPError as exc:
            raise GeneratorError(f"openai generator: cannot reach {url} ({type(exc).__name__}: {exc})") from None
        if resp.status_code >= 400:
            raise GeneratorError(f"openai generator: POST {url} answered {resp.status_code}: {resp.text[:300]} "
                                 f"(sleep mode needs a vLLM server started with --enable-sleep-mode and "
                                 f"VLLM_SERVER_DEV_MODE=1)")

    def close(self) -> None:
        self.client.close()
        if self._sync_root is not None and not self.cfg.sync_dir:
            shutil.rmtree(self._sync_root, ignore_errors=True)


def render_chat(tok, messages: list[dict]) -> str:
    """Chat messages as the prompt text of ``tok``'s chat template (a last assistant message is a prefill the
    answer continues; without a template: the contents, blank-line separated)."""
    msgs = list(messages)
    prefill = msgs.pop()["content"] if len(msgs) > 1 and msgs[-1].get("role") == "assistant" else ""
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) + prefill
    return "\n\n".join(m["content"] for m in msgs) + "\n\n" + prefill


def wire_messages(messages: list[dict]) -> tuple[list[dict], list[dict] | None]:
    """Chat messages in transformers' tool format (what :meth:`slea.policy.prompt_builder.PromptBuilder.tool_messages`
    builds: the system message's ``tools``, an assistant's ``tool_calls`` with object arguments, ``role: "tool"``
    results in call order) as the OpenAI API takes them: ``(messages, tools)``, each call with an id
    (``call_N``) and its arguments as a JSON string, each result with the ``tool_call_id`` of the call it answers."""
    out: list[dict] = []
    tools = None
    pending: list[str] = []  # the ids of the last assistant's calls not answered yet
    n = 0
    for m in messages:
        m = dict(m)
        if "tools" in m:
            tools = m.pop("tools") or None
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls: list[dict[str, Any]] = []
            for tc in m["tool_calls"]:
                fn = tc.get("function", tc)
                n += 1
                args = fn.get("arguments", {})
                calls.append({"id": tc.get("id") or f"call_{n}", "type": "function",
                              "function": {"name": fn.get("name", ""),
                                           "arguments": args if isinstance(args, str) else json.dumps(args)}})
            m["tool_calls"] = calls
            m["content"] = m.get("content") or None
            pending = [c["id"] for c in calls]
        elif m.get("role") == "tool":
            m = {"role": "tool", "content": m.get("content") or "",
                 "tool_call_id": m.get("tool_call_id") or (pending.pop(0) if pending else "")}
        out.append(m)
    return out, tools


def _call(tool_call: dict) -> dict:
    """An OpenAI ``tool_calls`` entry as a canonical call ``{"name", "arguments"}`` (the arguments decoded when
    they are a JSON object, else left as sent)."""
    fn = tool_call.get("function") if isinstance(tool_call, dict) else None
    fn = fn if isinstance(fn, dict) else {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            decoded = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            decoded = None
        args = decoded if isinstance(decoded, dict) else args
    return {"name": str(fn.get("name") or ""), "arguments": args if args is not None else {}}
