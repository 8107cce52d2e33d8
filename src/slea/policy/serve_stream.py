"""``stream: true`` in ``slea serve``: the server-sent-event chunks of an answer, made as its tokens are decoded.

The engine calls :meth:`Streamer.step` after each decode step with the tokens the live rows drew; each row's text
grows by what its new token adds (:class:`Detokenizer`), and what can no longer change is sent at once: all of it
but a tail that could still turn out to begin a stop string (the answer ends before a stop, unless
``include_stop_str_in_output``). :meth:`Streamer.finish` then sends the rest of each answer, as its non-streamed
text, and its finish reason, so the chunks join to exactly the answer the same request gets unstreamed.

A chat answer with tools offered is sent when whole (its tool calls are read from the whole text): the text outside
the calls, then one ``tool_calls`` chunk per call, as before; an answer that makes no call is sent token by token
then. A generator that calls no ``step`` (a scripted one in tests) gets every chunk at ``finish``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

Decode = Callable[[list[int]], str]


def sse_event(chunk: dict) -> bytes:
    """One server-sent event: ``data: {json}``."""
    return f"data: {json.dumps(chunk)}\n\n".encode()


class Detokenizer:
    """One answer's text as its tokens arrive, decoding only the newest few (vLLM's prefix and read offsets): a
    token that completes no character (part of a UTF-8 sequence) adds nothing until one that does."""

    def __init__(self, decode: Decode):
        self.decode, self.ids, self.text = decode, [], ""
        self.prefix = self.read = 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self.decode(self.ids[self.prefix:self.read])
        after = self.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before):]
            self.prefix, self.read = self.read, len(self.ids)
        return self.text


class _Row:
    def __init__(self, decode: Decode):
        self.text = Detokenizer(decode)
        self.sent = 0  # characters of the text sent
        self.tokens = 0  # tokens whose chunk was sent


class Streamer:
    """The chunks of one streamed request (``job``: :class:`slea.policy.server.Job`), each passed to ``emit`` as it
    is made (module docstring; :func:`sse_event` encodes one). ``decode`` is the answer's text of ids, ``piece`` one
    token's."""

    def __init__(self, job, head: dict, decode: Decode, piece: Callable[[int], str], emit: Callable[[bytes], None]):
        self.chat, self.body, self.piece, self.emit = job.kind == "chat", job.body, piece, emit
        self.head = {**head, "object": "chat.completion.chunk"} if self.chat else head
        self.live = not job.tools  # with tools, an answer is sent whole (its calls are read from all of it)
        self.stops = job.plan.stops
        self.hold = max((len(s) for s in self.stops), default=1) - 1  # a tail that may begin a stop
        self.rows = [_Row(decode) for _ in job.rows]
        if self.chat:
            for i in range(len(self.rows)):
                self._send(i, {"delta": {"role": "assistant", "content": ""}})

    def step(self, rows: list[int], tokens: list[int], logprobs: list[float]) -> None:
        """The engine's callback after a decode step: row ``rows[k]`` drew ``tokens[k]``."""
        if self.live:
            for i, t, lp in zip(rows, tokens, logprobs):
                self._token(i, int(t), lp)

    def finish(self, answers: list, replies: list | None = None, usage: dict | None = None) -> None:
        """Each answer's rest and finish reason (``replies``: a chat's messages, with their tool calls), then the
        usage when ``stream_options.include_usage``."""
        for i, a in enumerate(answers):
            reply = replies[i] if replies is not None else None
            if reply is not None and reply.calls:
                self._calls(i, a, reply)
            else:
                self._rest(i, a)
            finish = reply.finish if reply is not None else a.finish
            self._send(i, {"delta": {}} if self.chat else {"text": ""}, finish=finish)
        if usage is not None and (self.body.get("stream_options") or {}).get("include_usage"):
            self.emit({**self.head, "choices": [], "usage": usage})

    def _token(self, i: int, token: int, logprob: float) -> None:
        row = self.rows[i]
        text = row.text.add(token)
        hits = [text.find(s) for s in self.stops if s in text]
        end = min(hits) if hits else len(text) - self.hold  # past a stop: sent (or cut) at finish
        delta = text[row.sent:end] if end > row.sent else ""
        row.sent += len(delta)
        row.tokens += 1
        self._send(i, self._text(delta), self._logprob(token, logprob))

    def _rest(self, i: int, a) -> None:
        """The tokens no step sent, then the answer's text past what was sent."""
        row = self.rows[i]
        for k in range(row.tokens, len(a.ids)):
            self._token(i, a.ids[k], a.logprobs[k])
        if len(a.text) > row.sent:
            self._send(i, self._text(a.text[row.sent:]))
            row.sent = len(a.text)

    def _calls(self, i: int, a, reply) -> None:
        """A whole answer that makes tool calls: the text outside the calls (with every token's log-prob), then
        one chunk per call."""
        entries = [self._logprob(t, lp)["content"][0] for t, lp in zip(a.ids, a.logprobs)] \
            if self.body.get("logprobs") else []
        deltas = ([{"content": reply.content}] if reply.content else []) + \
            [{"tool_calls": [{"index": k, **call}]} for k, call in enumerate(reply.calls)]
        for k, delta in enumerate(deltas):
            self._send(i, {"delta": delta}, {"content": entries} if k == 0 and entries else None)

    def _text(self, delta: str) -> dict:
        return {"delta": {"content": delta}} if self.chat else {"text": delta}

    def _logprob(self, token: int, logprob: float) -> dict | None:
        """A token's log-prob in the chunk's shape, or None when the request asked for none."""
        if self.chat:
            if not self.body.get("logprobs"):
                return None
            p = self.piece(token)
            return {"content": [{"token": p, "logprob": logprob, "bytes": list(p.encode()), "top_logprobs": []}]}
        if self.body.get("logprobs") is None:
            return None
        return {"tokens": [self.piece(token)], "token_logprobs": [logprob], "top_logprobs": None, "text_offset": [0]}

    def _send(self, i: int, part: dict, logprobs: dict | None = None, finish: str | None = None) -> None:
        self.emit({**self.head, "choices": [{"index": i, **part, "logprobs": logprobs, "finish_reason": finish}]})
