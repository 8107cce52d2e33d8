"""The OpenAI wire format ``slea serve`` speaks: typed request models of the OpenAI schema (pydantic; a body that
does not fit is a 400 naming the field), and small pure functions: request fields read and checked, an answer cut
at its stop strings, chat messages read, errors and server-sent events shaped. The engine that generates is
:mod:`slea.policy.server`; nothing here touches a model (``decode`` is handed in)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Request fields that change what an answer means and that slea serve cannot honour: refused with a 400 naming
# them, never silently ignored (fields that change nothing, such as `user` or `metadata`, are accepted).
UNSUPPORTED = {
    "suffix": "suffix (insertion) is not supported",
    "best_of": "best_of is not supported",
    "logit_bias": "logit_bias is not supported",
    "tools": "tools (function calling) are not supported",
    "tool_choice": "tool_choice (function calling) is not supported",
    "functions": "functions (function calling) are not supported",
    "function_call": "function_call (function calling) is not supported",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
}
MAX_STOPS = 4  # as the OpenAI API


class RequestError(Exception):
    """A request the server refuses: HTTP ``status``, a one-line message, the request field at fault
    (``param``) and a machine-readable ``code`` (OpenAI's error shape, :func:`error_body`)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code


# -- request models: the OpenAI schema's fields slea serve reads, typed; unknown fields pass through (refused by
# refuse_unsupported when they would change the answer, ignored when they change nothing: user, metadata) -------
_Finite = Annotated[float, Field(allow_inf_nan=False)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool | None = None


class _Request(BaseModel):
    """Fields both text endpoints share. Strict: a number sent as a string, a bool as an int, NaN or infinity
    is refused rather than coerced."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: _Finite | None = Field(None, ge=0.0, le=100.0)
    top_p: _Finite | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    n: int | None = Field(None, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: _Finite | None = None
    frequency_penalty: _Finite | None = None
    user: str | None = None
    # vLLM's and slea's extensions
    rng_keys: list[list[Annotated[int, Field(ge=0)]]] | None = None
    return_token_ids: bool | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None


class CompletionRequest(_Request):
    """``POST /v1/completions``."""

    prompt: str | list[int] | list[str] | list[list[int]] | None = None
    logprobs: int | None = Field(None, ge=0)
    echo: bool | None = None
    return_tokens_as_token_ids: bool | None = None


class ChatRequest(_Request):
    """``POST /v1/chat/completions`` (``messages`` are read by :func:`chat_messages`)."""

    messages: list[Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0)
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None


class AdapterRequest(BaseModel):
    """``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``."""

    model_config = ConfigDict(extra="allow", strict=True)
    lora_name: str | None = None
    lora_path: str | None = None


def parse_request(model: type[BaseModel], body: bytes | dict) -> dict:
    """``body`` (raw JSON bytes, or an already-parsed dict) checked against ``model``; the fields that were sent,
    typed, as a dict (absent fields stay absent, as the OpenAI API reads them). A body that is not JSON (a lone
    surrogate escape, nesting past the parser's depth limit included), not an object, or whose field does not fit
    is a 400 :class:`RequestError` naming the field."""
    try:
        req = model.model_validate_json(body) if isinstance(body, (bytes, bytearray, str)) \
            else model.model_validate(body)
    except ValidationError as exc:
        raise _request_error(exc) from None
    return req.model_dump(exclude_unset=True)


def _request_error(exc: ValidationError) -> RequestError:
    first = exc.errors(include_url=False)[0]
    loc = [str(x) for x in first.get("loc", ())]
    kind = first.get("type", "")
    if kind == "json_invalid":
        return RequestError(400, f"the request body is not valid JSON: {first.get('msg', '')}")
    if not loc or kind in ("model_type", "model_attributes_type", "dict_type"):
        return RequestError(400, "the request body must be a JSON object")
    # a union's member name (loc ('prompt', 'list[int]', 0)) says nothing to a client: the field and positions only
    where = ".".join(x for x in loc if not x.startswith(("list[", "str", "int", "float", "bool")))
    return RequestError(400, f"{where}: {first.get('msg', 'invalid value')}", param=loc[0])


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """``{"error": {"message", "type", "param", "code"}}``, the shape the OpenAI API and its clients use."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def refuse_unsupported(body: dict) -> None:
    """A 400 for the first field of :data:`UNSUPPORTED` that is set, or a penalty / echo / non-text response
    format (settings that would change the answer)."""
    for key, why in UNSUPPORTED.items():
        if body.get(key) not in (None, [], {}):
            raise RequestError(400, why, param=key)
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise RequestError(400, f"{key} is not supported (only 0)", param=key)
    if body.get("echo"):
        raise RequestError(400, "echo is not supported", param="echo")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestError(400, "response_format: only {\"type\": \"text\"} is supported", param="response_format")


def integer(body: dict, key: str, default: int | None, lo: int | None = None) -> int | None:
    """``body[key]`` as an int (``default`` when absent or null), at least ``lo``."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or (lo is not None and value < lo):
        raise RequestError(400, f"{key}: expected an integer{f' >= {lo}' if lo is not None else ''}", param=key)
    return value


def number(body: dict, key: str, default: float, lo: float, hi: float | None = None) -> float:
    """``body[key]`` as a float in ``[lo, hi]`` (``default`` when absent or null)."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < lo or (hi is not None and
                                                                                       value > hi):
        raise RequestError(400, f"{key}: expected a number in [{lo:g}, {'inf' if hi is None else f'{hi:g}'}]",
                           param=key)
    return float(value)


def stop_list(stop: object, max_stops: int = MAX_STOPS, max_chars: int | None = None) -> list[str]:
    """``stop`` (none, a string or up to ``max_stops`` strings of at most ``max_chars`` characters each) as a list
    of non-empty strings."""
    if stop is None or stop == "" or stop == []:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items) or len(items) > max_stops:
        raise RequestError(400, f"stop: expected a string or a list of up to {max_stops} non-empty strings",
                           param="stop")
    if max_chars is not None and any(len(s) > max_chars for s in items):
        raise RequestError(400, f"stop: a stop string may hold at most {max_chars} characters", param="stop")
    for s in items:
        text(s, "stop")
    return list(dict.fromkeys(items))


def text(value: str, param: str) -> str:
    """``value`` when it is valid Unicode text; a lone surrogate (``"\\udcff"``, which no tokenizer or UTF-8
    encoder takes) is a 400 naming ``param``."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(400, f"{param}: the text holds a lone surrogate (not valid Unicode)",
                           param=param) from None
    return value


def cut_at_stop(decode: Callable[[list[int]], str], ids: Sequence[int], stops: Sequence[str],
                include: bool = False) -> tuple[list[int], str, bool]:
    """``(ids kept, text, stopped)``: an answer up to its first stop string. The tokens after the one that
    completes the stop are dropped; the text ends before the stop (after it with ``include``: then it is the
    kept tokens' text, so text and ids stay the same answer). Without a stop in the text, all of it."""
    ids = list(ids)
    text = decode(ids)
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return ids, text, False
    at, s = min(hits, key=lambda h: (h[0], -len(h[1])))
    end = at + len(s)
    k = next((k for k in range(1, len(ids) + 1) if len(decode(ids[:k])) >= end), len(ids))
    kept = ids[:k]
    return kept, decode(kept) if include else text[:at], True


def deltas(decode: Callable[[list[int]], str], ids: Sequence[int], text: str) -> list[str]:
    """One piece of ``text`` per token of ``ids`` (the streamed chunks): token k's piece is the text its prefix
    ``ids[:k+1]`` adds, clipped to ``text``; the pieces join to ``text`` exactly (a token that completes no
    character, or falls after a stop, gets ``""``)."""
    out, at = [], 0
    for k in range(1, len(ids) + 1):
        upto = len(decode(list(ids[:k])))
        end = max(at, min(upto, len(text)))
        if k == len(ids):
            end = len(text)
        out.append(text[at:end])
        at = end
    if not ids and text:
        out.append(text)
    return out


def chat_messages(raw: object) -> list[dict[str, str]]:
    """``messages`` as ``[{"role", "content"}]`` with text content (a list of ``{"type": "text"}`` parts is
    joined); other content (images, audio) and unknown roles are a 400."""
    if not isinstance(raw, list) or not raw:
        raise RequestError(400, "messages: expected a non-empty list of {role, content}", param="messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise RequestError(400, f"messages[{i}]: expected role system, developer, user or assistant",
                               param="messages")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(400, f"messages[{i}].content: only text parts are supported", param="messages")
            content = "".join(p["text"] for p in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise RequestError(400, f"messages[{i}].content: expected text", param="messages")
        text(content, "messages")
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    return out


def sse(chunks: Sequence[dict]) -> bytes:
    """Server-sent events: one ``data: {json}`` event per chunk, then ``data: [DONE]``."""
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"
