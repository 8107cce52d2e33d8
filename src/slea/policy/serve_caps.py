"""Cheap caps on a ``slea serve`` request, checked before the expensive work (rendering a chat template,
tokenizing): the number of messages and tools, each tool's JSON and the prompt's characters. Each refusal is a 400
naming the field and the limit; the prompt-token cap (``--max-prompt-tokens``) stays the exact check, after
tokenizing.

The character cap's default never refuses a prompt the token cap would take: a prompt of ``c`` characters has at
least ``c / L`` tokens when no token decodes to more than ``L`` characters, so past ``max_prompt_tokens x L``
characters it is over the token cap too (:func:`longest_token_chars`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from slea.policy.openai_protocol import RequestError


@dataclass(frozen=True)
class SizeCaps:
    """What one request may hold before it is rendered or tokenized."""

    prompt_chars: int  # characters of a prompt (a chat's: its messages' text and its tools' JSON)
    messages: int  # messages of a chat request
    tools: int  # tools of a chat request
    tool_chars: int  # characters of one tool's JSON


def longest_token_chars(tok) -> int:
    """The most characters one token of ``tok`` stands for: its longest token string (a byte-level BPE's token
    strings have a character per byte, so at least as many as the text it decodes to; special tokens are their
    text)."""
    return max((len(t) for t in tok.convert_ids_to_tokens(list(range(len(tok)))) if t), default=1)


def check_text(value: str, caps: SizeCaps, param: str) -> None:
    """A 400 naming ``param`` for a text past ``caps.prompt_chars`` characters."""
    if len(value) > caps.prompt_chars:
        raise _too_many(param, f"{len(value)} characters", caps.prompt_chars, "--max-prompt-chars")


def check_chat(body: dict, caps: SizeCaps) -> None:
    """A chat request's size, from its raw fields and in this order: the number of messages, the number of tools,
    each tool's JSON, then the characters of the messages' text and the tools' JSON together."""
    messages, tools = body.get("messages"), body.get("tools")
    messages = messages if isinstance(messages, list) else []
    tools = tools if isinstance(tools, list) else []
    if len(messages) > caps.messages:
        raise _too_many("messages", f"{len(messages)} messages", caps.messages, "--max-messages")
    if len(tools) > caps.tools:
        raise _too_many("tools", f"{len(tools)} tools", caps.tools, "--max-tools")
    sizes = [_json_chars(t, "tools") for t in tools]
    for k, size in enumerate(sizes):
        if size > caps.tool_chars:
            raise _too_many("tools", f"tools[{k}] has {size} characters of JSON", caps.tool_chars,
                            "--max-tool-chars")
    total = sum(_message_chars(m) for m in messages) + sum(sizes)
    if total > caps.prompt_chars:
        raise _too_many("messages", f"{total} characters in the messages" + (" and tools" if tools else ""),
                        caps.prompt_chars, "--max-prompt-chars")


def _message_chars(message) -> int:
    """The characters a message brings to the prompt: its text (or text parts) and its tool calls' JSON."""
    if not isinstance(message, dict):
        return 0
    content = message.get("content")
    if isinstance(content, list):
        size = sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    else:
        size = len(content) if isinstance(content, str) else 0
    return size + (_json_chars(message["tool_calls"], "messages") if message.get("tool_calls") else 0)


def _json_chars(value, param: str) -> int:
    try:
        return len(json.dumps(value, ensure_ascii=False))
    except (ValueError, TypeError, RecursionError):
        raise RequestError(400, f"{param}: not JSON text", param=param) from None


def _too_many(param: str, what: str, cap: int, option: str) -> RequestError:
    return RequestError(400, f"{param}: {what}, more than this server takes ({cap}: {option})", param=param,
                        code="request_too_large")
