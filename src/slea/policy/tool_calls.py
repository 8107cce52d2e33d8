"""Tool-call syntax: parsing a model's answer into calls, in the format its chat template speaks.

A parser turns model text into the canonical calls a :class:`slea.envs.tools.ToolEnv` steps on (a list of
``{"name": ..., "arguments": {...}}``) and back (:meth:`ToolParser.format`, the text of an assistant turn making
those calls). ``parse`` never raises: a truncated, malformed or hostile answer gives ``([], why)``, and ``why``
is what the agent is told.

Built in: ``hermes`` (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, one block per call: Qwen2.5/3,
Hermes) and ``llama3_json`` (a bare JSON object ``{"name": ..., "parameters": ...}``, optionally after
``<|python_tag|>``, several separated by ``;``: Llama-3.1/3.2/3.3). :func:`parser_for` picks the parser per
tokenizer: the first registered parser (by name) whose ``matches(chat_template)`` is true, else ``hermes``. A user adds
one as any other plugin: ``TOOL_PARSERS.add("mine", MyParser())`` (a :class:`ToolParser` subclass) in a module
named in the config's ``plugins``; ``PromptBuilder(tool_parser="mine")`` forces one.

Whether the template renders tools itself is :func:`supports_tools` (it reads a ``tools`` variable). Where it
does, prompts are ``apply_chat_template(messages, tools=schemas)`` and tool results are ``role: "tool"``
messages. Where it does not (SmolLM2's template, the tiny test model's) the *fallback rendering* is used: the
schemas and the call syntax (:data:`FALLBACK_SYSTEM`) go at the end of the system message, the assistant's
calls are written in ``hermes`` syntax and each tool result is a user message
``<tool_response>\\n{result}\\n</tool_response>``; answers are parsed with ``hermes``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from slea.plugins import Registry

MAX_TEXT = 8000
Call = dict[str, Any]  # {"name": str, "arguments": dict}

FALLBACK_SYSTEM = ("You can call these tools (JSON schemas):\n{tools}\n"
                   'To call a tool, reply with <tool_call>{{"name": <tool name>, "arguments": <the arguments as a '
                   "JSON object>}}</tool_call>.")


class ToolParser:
    """One tool-call syntax: ``parse`` (text -> calls, never raises), ``format`` (calls -> text) and ``matches``
    (whether a chat template speaks it)."""

    name = "base"
    # the text that ends one call ("" where a call has no end marker of its own): generation stops there when
    # the env takes one call per turn (``Instructions.one_call_per_turn``)
    call_end = ""
    # whether the template renders several calls in one assistant turn (else each call is its own turn)
    multi_call = True

    def matches(self, template: str) -> bool:
        return False

    def parse(self, text: str) -> tuple[list[Call], str]:
        raise NotImplementedError

    def format(self, calls: list[Call]) -> str:
        raise NotImplementedError

    def content(self, text: str) -> str:
        """The text of an answer outside its calls (what a served answer returns as ``content`` beside its
        ``tool_calls``); ``""`` unless the parser says otherwise."""
        return ""


TOOL_PARSERS: Registry[ToolParser] = Registry("tool parser", ("slea.policy.tool_calls",))


def _call(obj: Any, args_key: str) -> tuple[Call | None, str]:
    """A decoded JSON value as a canonical call, or ``(None, why)``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        return None, 'a tool call is a JSON object {"name": ..., "' + args_key + '": {...}}'
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return None, f"the arguments of {obj['name'][:40]} are not JSON"
    if not isinstance(args, dict):
        return None, f"the arguments of {obj['name'][:40]} must be a JSON object"
    return {"name": obj["name"].strip(), "arguments": args}, ""


def _loads(text: str) -> tuple[Any, str]:
    try:
        return json.loads(text), ""
    except RecursionError:
        return None, "the tool call is nested too deeply"
    except ValueError as exc:
        return None, f"bad JSON in the tool call ({str(exc)[:80]})"


class HermesParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call (Qwen, Hermes).

    Every closed block must hold a call, else the answer is refused as a whole (as vLLM's ``hermes`` parser does).
    A last block left open (no ``</tool_call>``: the answer was cut by the token limit, or ended) is read when its
    JSON is whole (vLLM reads it too); when it is not, it is dropped if closed blocks come before it, which are
    then the answer's calls (the answer was cut while starting one more call: verl's agent loop reads closed
    blocks only, and vLLM's streaming has sent the closed ones by then), and refused if it is the only block."""

    name = "hermes"
    call_end = "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.DOTALL)

    def matches(self, template: str) -> bool:
        return "<tool_call>" in template

    def parse(self, text: str) -> tuple[list[Call], str]:
        if not isinstance(text, str):
            return [], "no tool call"
        blocks = self._BLOCK.findall(text[:MAX_TEXT])
        if not blocks:
            return [], 'no tool call: call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>'
        calls = []
        for i, (body, end) in enumerate(blocks):
            obj, why = _loads(body.strip())
            if not why:
                call, why = _call(obj, "arguments")
            if why:
                if not end and i == len(blocks) - 1 and calls:  # an open last block after closed calls: cut off
                    break
                return [], why
            calls.append(call)
        return calls, ""

    def content(self, text: str) -> str:
        return self._BLOCK.sub("", text[:MAX_TEXT]).strip() if isinstance(text, str) else ""

    def format(self, calls: list[Call]) -> str:
        return "\n".join(f"<tool_call>\n{json.dumps({'name': c['name'], 'arguments': c['arguments']})}\n</tool_call>"
                         for c in calls)


class Llama3JsonParser(ToolParser):
    """Llama-3.x JSON tool calls: ``{"name": ..., "parameters": {...}}`` (``arguments`` is accepted too),
    optionally after ``<|python_tag|>``; several calls separated by ``;`` or whitespace."""

    name = "llama3_json"
    multi_call = False  # Llama-3.1's template raises on an assistant turn with several tool calls

    def matches(self, template: str) -> bool:
        return "<|python_tag|>" in template or ("<|eot_id|>" in template and "tools" in template)

    def parse(self, text: str) -> tuple[list[Call], str]:
        if not isinstance(text, str):
            return [], "no tool call"
        text = text[:MAX_TEXT].replace("<|python_tag|>", " ").strip()
        start = text.find("{")
        if start < 0:
            return [], 'no tool call: answer with a JSON object {"name": ..., "parameters": {...}}'
        decoder, calls, pos = json.JSONDecoder(), [], start
        while pos < len(text):
            try:
                obj, end = decoder.raw_decode(text, pos)
            except RecursionError:
                return [], "the tool call is nested too deeply"
            except ValueError as exc:
                return [], f"bad JSON in the tool call ({str(exc)[:80]})"
            call, why = _call(obj, "parameters")
            if call is None:
                return [], why
            calls.append(call)
            rest = text[end:].lstrip(" \t\r\n;")
            if not rest.startswith("{"):
                break
            pos = len(text) - len(rest)
        return calls, ""

    def content(self, text: str) -> str:
        if not isinstance(text, str):
            return ""
        head = text[:MAX_TEXT].split("{", 1)[0]  # what comes before the first call
        return head.replace("<|python_tag|>", " ").strip()

    def format(self, calls: list[Call]) -> str:
        return "; ".join(json.dumps({"name": c["name"], "parameters": c["arguments"]}) for c in calls)


TOOL_PARSERS.add("hermes", HermesParser())
TOOL_PARSERS.add("llama3_json", Llama3JsonParser())


def _template(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one, else the tool_use one
        template = template.get("tool_use") or template.get("default") or ""
    return template if isinstance(template, str) else ""


def supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` list and tool messages itself."""
    template = _template(tokenizer)
    return bool(re.search(r"\btools\b", template)) and "tool" in template.replace("tools", "")


def parser_for(tokenizer: Any, name: str | None = None) -> ToolParser:
    """The parser named ``name``, else, for a template that renders tools, the first registered one (by name)
    that ``matches`` the tokenizer's chat template, else ``hermes`` (the fallback rendering's syntax)."""
    if name:
        return TOOL_PARSERS.get(name)
    template = _template(tokenizer)
    if supports_tools(tokenizer):
        for key in TOOL_PARSERS.names():
            parser = TOOL_PARSERS.get(key)
            if parser.matches(template):
                return parser
    return TOOL_PARSERS.get("hermes")


def assistant_message(calls: list[Call], native: bool, parser: ToolParser) -> dict[str, Any]:
    """The assistant turn making ``calls``: OpenAI ``tool_calls`` for a template that renders them, else the
    calls written in the parser's syntax."""
    if native:
        return {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                               for c in calls]}
    return {"role": "assistant", "content": parser.format(calls)}


def result_messages(calls: list[Call], results: list[str], native: bool) -> list[dict[str, Any]]:
    """The tool results of one turn: a ``role: "tool"`` message per call, else (fallback) one user message of
    ``<tool_response>`` blocks."""
    if native:
        return [{"role": "tool", "name": c["name"], "content": r} for c, r in zip(calls, results)]
    return [{"role": "user", "content": "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)}]


def fallback_system(schemas: list[dict[str, Any]]) -> str:
    """The fallback rendering's tool text, appended to the system message."""
    return FALLBACK_SYSTEM.format(tools="\n".join(json.dumps(s) for s in schemas))


def fallback_messages(messages: list[dict[str, Any]], schemas: list[dict[str, Any]] | None,
                      parser: ToolParser) -> list[dict[str, Any]]:
    """Chat messages in transformers' tool format (an assistant message's ``tool_calls``, ``role: "tool"``
    results: what a template that renders tools takes) in the fallback rendering, for a template that does not:
    the schemas (when given) and the call syntax appended to the system message (one is added when there is
    none), each assistant's calls written in ``parser``'s syntax after its text, and each run of tool results one
    user message of ``<tool_response>`` blocks. :meth:`slea.policy.prompt_builder.PromptBuilder.tool_messages` writes
    the same rendering (``slea serve`` renders a client's history with this; a test checks they agree)."""
    out: list[dict[str, Any]] = []
    results: list[str] = []

    def flush() -> None:
        if results:
            out.extend(result_messages([], results, native=False))
            results.clear()

    for m in messages:
        if m.get("role") == "tool":
            results.append(str(m.get("content") or ""))
            continue
        flush()
        content = m.get("content") or ""
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [{"name": tc.get("function", tc).get("name", ""), "arguments": tc.get("function", tc).get(
                "arguments", {})} for tc in m["tool_calls"]]
            written = assistant_message(calls, False, parser)["content"]
            content = f"{content}\n{written}" if content else written
        out.append({"role": m.get("role"), "content": content})
    flush()
    if schemas:
        text = fallback_system(schemas)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def render(tokenizer: Any, messages: list[dict[str, Any]], schemas: list[dict[str, Any]] | None, parser: ToolParser,
           *, add_generation_prompt: bool = True, continue_final_message: bool = False) -> str:
    """The prompt text of chat messages in transformers' tool format, ``schemas`` offered (None: no tools): the
    chat template's own tools rendering where it has one (:func:`supports_tools`), else the fallback rendering
    (:func:`fallback_messages`). Without tools or tool messages, the template's plain rendering of the messages."""
    if supports_tools(tokenizer):
        kw: dict[str, Any] = {"tools": schemas} if schemas else {}
    else:
        messages, kw = fallback_messages(messages, schemas, parser), {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         continue_final_message=continue_final_message, **kw)
