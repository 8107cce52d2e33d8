"""The OpenAI wire format ``slea serve`` speaks: typed request models of the OpenAI schema (pydantic; a body that
does not fit is a 400 naming the field), and small pure functions: request fields read and checked, an answer cut
at its stop strings, chat messages read, errors shaped (streamed chunks: slea/policy/serve_stream.py). The engine
that generates is :mod:`slea.policy.server`; nothing here touches a model (``decode`` is handed in)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Request fields that change what an answer means and that slea serve cannot honour: refused with a 400 naming
# them, never silently ignored (fields that change nothing, such as `user` or `metadata`, are accepted).
UNSUPPORTED = {
    "suffix": "suffix (insertion) is not supported",
    "best_of": "best_of is not supported",
    "logit_bias": "logit_bias is not supported",
    "tools": "tools (function calling) are served by /v1/chat/completions only",
    "tool_choice": "tool_choice (function calling) is served by /v1/chat/completions only",
    "functions": "functions (the legacy function calling) are not supported: send tools",
    "function_call": "function_call (the legacy function calling) is not supported: send tool_choice",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
}
MAX_STOPS = 4  # as the OpenAI API
MAX_TOOL_CALLS = 128  # tool calls in one assistant message of a request's history
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # the OpenAI API's rule for a function's name
TOOL_CHOICES = ("none", "auto", "required")


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
    tools: list[Any] | None = None  # checked by tool_request
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


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


def refuse_unsupported(body: dict, allow: Sequence[str] = ()) -> None:
    """A 400 for the first field of :data:`UNSUPPORTED` that is set (but those in ``allow``: the chat endpoint's
    ``tools`` and ``tool_choice``), or a penalty / echo / non-text response format (settings that would change the
    answer)."""
    for key, why in UNSUPPORTED.items():
        if key not in allow and body.get(key) not in (None, [], {}):
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


def chat_messages(raw: object) -> list[dict[str, Any]]:
    """``messages`` as ``[{"role", "content"}]`` with text content (a list of ``{"type": "text"}`` parts is
    joined), in transformers' tool format where they carry tool calls: an assistant message's ``tool_calls`` as
    ``[{"id", "type": "function", "function": {"name", "arguments": {...}}}]`` (the OpenAI API's arguments are a
    JSON string; here the object it holds), a ``role: "tool"`` message as ``{"role", "content",
    "tool_call_id", "name"}`` (the name of the call it answers). Other content (images, audio), unknown roles,
    and tool calls that are not functions with a name and JSON-object arguments are a 400."""
    if not isinstance(raw, list) or not raw:
        raise RequestError(400, "messages: expected a non-empty list of {role, content}", param="messages")
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name, for the tool messages that answer them
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(400, f"messages[{i}]: expected role system, developer, user, assistant or tool",
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
        msg: dict[str, Any] = {"role": "system" if m["role"] == "developer" else m["role"], "content": content}
        if m["role"] == "assistant" and m.get("tool_calls") not in (None, []):
            msg["tool_calls"] = _history_calls(m["tool_calls"], i)
            names.update((c["id"], c["function"]["name"]) for c in msg["tool_calls"] if c["id"])
        elif m["role"] == "tool":
            cid = m.get("tool_call_id")
            if cid is not None and not isinstance(cid, str):
                raise RequestError(400, f"messages[{i}].tool_call_id: expected a string", param="messages")
            name = names.get(cid or "", m.get("name"))
            msg.update(tool_call_id=text(cid or "", "messages"),
                       name=text(name, "messages") if isinstance(name, str) else "")
        out.append(msg)
    return out


def _history_calls(raw: object, i: int) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` (OpenAI's shape) as transformers' (arguments as an object)."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(raw, list) or len(raw) > MAX_TOOL_CALLS:
        raise RequestError(400, f"{where}: expected a list of at most {MAX_TOOL_CALLS} tool calls", param="messages")
    calls = []
    for k, tc in enumerate(raw):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or tc.get("type", "function") != "function" or \
                not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(400, f"{where}[{k}]: expected {{\"type\": \"function\", \"function\": {{\"name\", "
                                    f"\"arguments\"}}}}", param="messages")
        cid, args = tc.get("id", ""), fn.get("arguments", "{}")
        if not isinstance(cid, str):
            raise RequestError(400, f"{where}[{k}].id: expected a string", param="messages")
        if isinstance(args, str):
            try:
                args = json.loads(text(args, "messages")) if args.strip() else {}
            except (ValueError, RecursionError):
                raise RequestError(400, f"{where}[{k}].function.arguments: not JSON", param="messages") from None
        if not isinstance(args, dict):
            raise RequestError(400, f"{where}[{k}].function.arguments: expected a JSON object", param="messages")
        calls.append({"id": text(cid, "messages"), "type": "function",
                      "function": {"name": text(fn["name"], "messages"), "arguments": args}})
    return calls


def tool_request(tools: object, choice: object, max_tools: int) -> tuple[list[dict[str, Any]] | None, str | None]:
    """A chat request's ``tools`` and ``tool_choice`` checked: ``(tools or None, choice)`` where ``choice`` is
    ``"none"``, ``"auto"``, ``"required"`` or the name of the function a named choice asks for (``tool_choice``
    defaults to ``"auto"`` with tools, ``"none"`` without). Each tool is ``{"type": "function", "function":
    {"name", "description"?, "parameters"?, "strict"?}}`` as sent: a name of 1-64 letters, digits, ``_`` or ``-``
    (the OpenAI API's rule), unique; ``parameters`` a JSON-Schema object. At most ``max_tools``. Anything else is
    a 400 naming ``tools`` or ``tool_choice``."""
    if tools is not None and not isinstance(tools, list):
        raise RequestError(400, "tools: expected a list of {\"type\": \"function\", \"function\": {...}}",
                           param="tools")
    schemas = list(tools or []) or None
    if schemas is not None and len(schemas) > max_tools:
        raise RequestError(400, f"tools: {len(schemas)} tools, more than this server takes ({max_tools}: "
                                f"--max-tools)", param="tools")
    names: set[str] = set()
    for k, tool in enumerate(schemas or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function":
            raise RequestError(400, f"tools[{k}]: expected {{\"type\": \"function\", \"function\": {{\"name\", "
                                    f"\"description\", \"parameters\"}}}}", param="tools")
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise RequestError(400, f"tools[{k}].function.name: expected 1 to 64 letters, digits, _ or -",
                               param="tools")
        if name in names:
            raise RequestError(400, f"tools[{k}].function.name: {name!r} is named twice", param="tools")
        names.add(name)
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise RequestError(400, f"tools[{k}].function.description: expected a string", param="tools")
        params = fn.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise RequestError(400, f"tools[{k}].function.parameters: expected a JSON Schema object "
                                    f"({{\"type\": \"object\", \"properties\": {{...}}}})", param="tools")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise RequestError(400, f"tools[{k}].function.strict: expected true or false", param="tools")
        try:
            json.dumps(tool, allow_nan=False, ensure_ascii=False).encode("utf-8")
        except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
            raise RequestError(400, f"tools[{k}]: not JSON text (a lone surrogate, NaN, or nesting too deep)",
                               param="tools") from None
    if choice is None:
        return schemas, "auto" if schemas else "none"
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise RequestError(400, f"tool_choice: expected none, auto, required or {{\"type\": \"function\", "
                                    f"\"function\": {{\"name\"}}}}, got {choice[:40]!r}", param="tool_choice")
        if choice == "required" and not schemas:
            raise RequestError(400, "tool_choice: required needs tools", param="tool_choice")
        return schemas, choice
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(fn, dict) or choice.get("type") != "function" or not isinstance(fn.get("name"), str):
        raise RequestError(400, "tool_choice: expected none, auto, required or {\"type\": \"function\", "
                                "\"function\": {\"name\"}}", param="tool_choice")
    if fn["name"] not in names:
        raise RequestError(400, f"tool_choice: no tool named {fn['name'][:64]!r} in tools", param="tool_choice")
    return schemas, fn["name"]
