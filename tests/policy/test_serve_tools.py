"""``slea serve`` tool calling: chat completions with ``tools`` render the prompt as the trainer does (the chat
template's own tools rendering, or the fallback one), read the answer's calls with the tokenizer's parser and
return OpenAI ``tool_calls``, as the official ``openai`` client reads them; hostile ``tools`` are a 400 naming the
field; and ``model.generator: openai`` plays ``slea/ToolCalc-v0`` against the server, as completions (the
trainer's path) and as chat with ``tools`` (a frozen policy).

A random tiny model makes no call on its own, so the engine of most tests is scripted: it answers a function of
the prompt the server rendered (``Scripted``), written in the model's tool syntax, as a model would generate it.
"""

from __future__ import annotations

import json
import re
import threading

import pytest

from slea.config import ModelSection, RolloutSection
from slea.envs.pool import EnvPool
from slea.envs.tools import TOOL_INSTRUCTIONS, ToolSet, add, answer, multiply
from slea.policy.generation import Generation
from slea.policy.openai_engine import OpenAIGenerator, wire_messages
from slea.policy.openai_protocol import RequestError
from slea.policy.prompt_builder import PromptBuilder
from slea.policy.served import ChatPromptBuilder
from slea.policy.server import Engine, ServeSettings, load_engine, make_server
from slea.policy.tool_calls import TOOL_PARSERS
from slea.rollout.collector import RolloutCollector
from slea.testing.chat_templates import QWEN_TEMPLATE, with_template
from slea.types import flatten

HERMES = TOOL_PARSERS.get("hermes")
SCHEMAS = ToolSet([add, multiply, answer]).schemas  # slea/ToolCalc-v0's tools, as its info["tools"]
ASK = [{"role": "system", "content": "You solve arithmetic with tools."},
       {"role": "user", "content": "What is 3 * 4 + 5?"}]
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>'


class Scripted:
    """The served engine's generator: each row's answer is ``answer(prompt text)`` as the tokenizer's ids + EOS
    (what a model that wrote that text generated). Records the prompts it saw and the ids it returned."""

    def __init__(self, tok, answer):
        self.tok, self.answer = tok, answer
        self.prompts: list[str] = []
        self.returned: list[list[int]] = []

    def generate(self, rows, max_new_tokens=16, **kw):
        out = []
        for row in rows:
            prompt = self.tok.decode(row)
            self.prompts.append(prompt)
            text = self.answer(prompt)
            ids = (self.tok(text, add_special_tokens=False).input_ids + [self.tok.eos_token_id])[:max_new_tokens]
            self.returned.append(ids)
            out.append(Generation(ids, [-0.5] * len(ids), self.tok.decode(ids, skip_special_tokens=True)))
        return out


def calculator(prompt: str) -> str:
    """slea/ToolCalc-v0's expert, reading the rendered prompt: multiply, then add, then answer (one call per turn,
    the turn told by the tool results shown so far), in hermes syntax."""
    a, b, c = map(int, re.findall(r"What is (\d+) \* (\d+) \+ (\d+)\?", prompt)[-1])
    turn = prompt.count("<tool_response>")
    call = [{"name": "multiply", "arguments": {"a": a, "b": b}}, {"name": "add", "arguments": {"a": a * b, "b": c}},
            {"name": "answer", "arguments": {"value": a * b + c}}][min(turn, 2)]
    return HERMES.format([call])


@pytest.fixture(scope="module")
def tiny():
    engine = load_engine("tiny", dtype="float32")
    return engine.model, engine.tok


def _engine(tiny, answer=None, template: str | None = None, **settings) -> Engine:
    model, tok = tiny
    engine = Engine(model, tok if template is None else with_template(tok, template), "tiny", dtype="float32",
                    settings=ServeSettings(**settings))
    if answer is not None:
        engine.gen = Scripted(engine.tok, answer)
    return engine


class Running:
    """``engine`` served in a thread; ``.url`` its base URL (``/v1``)."""

    def __init__(self, engine):
        self.server = make_server(engine, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _chat(engine, messages=ASK, **body) -> dict:
    return engine.chat({"messages": messages, "max_tokens": 256, "temperature": 0, **body})


# -- the prompt: the trainer's rendering ---------------------------------------------------------------------------
def _history(builder) -> list[dict]:
    """A ToolCalc turn's messages as the trainer builds them: an invalid answer, one call, then two calls."""
    calls1 = [{"name": "multiply", "arguments": {"a": 3, "b": 4}}]
    calls2 = [{"name": "add", "arguments": {"a": 12, "b": 5}}, {"name": "add", "arguments": {"a": 1, "b": 1}}]
    turns = [("hello", None, "no tool call"), (HERMES.format(calls1), calls1, "12"),
             (HERMES.format(calls2), calls2, json.dumps(["17", "2"]))]
    return builder.tool_messages(TOOL_INSTRUCTIONS, "What is 3 * 4 + 5?", "What is 3 * 4 + 5?", turns, SCHEMAS)


@pytest.mark.parametrize("template", ["fallback", "native"])
def test_the_served_prompt_with_tools_is_the_trainers_prompt(template, tiny):
    """The trainer's messages of a tool turn, sent as OpenAI messages (``wire_messages``: tools, assistant
    ``tool_calls`` with JSON-string arguments, ``role: "tool"`` results with their ids), render on the server to
    the trainer's prompt ids exactly: the fallback rendering for the tiny template, the template's own for a
    Qwen-like one. ``ChatPromptBuilder`` (``api: chat``) computes the same ids locally."""
    engine = _engine(tiny, template=None if template == "fallback" else QWEN_TEMPLATE)
    builder = PromptBuilder(engine.tok, history=4)
    messages = _history(builder)
    assert ("tools" in messages[0]) == (template == "native")
    wire, tools = wire_messages(_history(ChatPromptBuilder(engine.tok, history=4)))
    assert tools == SCHEMAS and [m["role"] for m in wire][-3:] == ["assistant", "tool", "tool"]
    assert json.loads(wire[-3]["tool_calls"][1]["function"]["arguments"]) == {"a": 1, "b": 1}
    assert [m["tool_call_id"] for m in wire[-2:]] == [c["id"] for c in wire[-3]["tool_calls"]]
    res = _chat(engine, wire, tools=tools, max_tokens=1, return_token_ids=True)
    assert res["prompt_token_ids"] == builder.encode(messages)
    assert list(ChatPromptBuilder(engine.tok, history=4).encode(_history(ChatPromptBuilder(engine.tok, history=4)))) \
        == builder.encode(messages)
    text = engine.tok.decode(res["prompt_token_ids"])
    assert '"name": "multiply"' in text and "<tool_response>\n17\n</tool_response>" in text
    assert ("You can call these tools" in text) == (template == "fallback") and ("<tools>" in text) == (
        template == "native")


def test_tool_choice_none_renders_no_tools_and_parses_no_call(tiny):
    engine = _engine(tiny, lambda p: CALL)
    res = _chat(engine, tools=SCHEMAS, tool_choice="none")
    c = res["choices"][0]
    assert c["message"] == {"role": "assistant", "content": CALL} and c["finish_reason"] == "stop"
    assert "multiply" not in engine.gen.prompts[-1]  # no tool was shown
    offered = _chat(engine, tools=SCHEMAS)
    assert offered["choices"][0]["finish_reason"] == "tool_calls" and "multiply" in engine.gen.prompts[-1]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_required_and_named_choices_are_not_enforced_the_answer_is_parsed_as_with_auto(choice, tiny):
    """No constrained decoding: with ``required`` or a named function the prompt and the parse are auto's; an
    answer without a call is its text (finish ``stop``), a call to another tool is returned as made."""
    engine = _engine(tiny, lambda p: CALL)
    got = _chat(engine, tools=SCHEMAS, tool_choice=choice)["choices"][0]
    assert got["finish_reason"] == "tool_calls" and got["message"]["tool_calls"][0]["function"]["name"] == "multiply"
    engine.gen.answer = lambda p: "I will not call."
    got = _chat(engine, tools=SCHEMAS, tool_choice=choice)["choices"][0]
    assert got["message"] == {"role": "assistant", "content": "I will not call."} and got["finish_reason"] == "stop"


def test_text_beside_calls_parallel_calls_and_a_call_cut_off(tiny):
    two = 'Let me see.\n' + HERMES.format([{"name": "add", "arguments": {"a": 1, "b": 2}},
                                          {"name": "answer", "arguments": {"value": 3}}])
    engine = _engine(tiny, lambda p: two)
    msg = _chat(engine, tools=SCHEMAS)["choices"][0]["message"]
    assert msg["content"] == "Let me see." and [t["function"]["name"] for t in msg["tool_calls"]] == ["add", "answer"]
    assert len({t["id"] for t in msg["tool_calls"]}) == 2
    one = _chat(engine, tools=SCHEMAS, parallel_tool_calls=False)["choices"][0]["message"]["tool_calls"]
    assert [t["function"]["name"] for t in one] == ["add"]
    cut = _chat(engine, tools=SCHEMAS, max_tokens=10)["choices"][0]  # the JSON is cut: no call, the text
    assert cut["finish_reason"] == "length" and "tool_calls" not in cut["message"] and cut["message"]["content"]


# -- the official client -------------------------------------------------------------------------------------------
def test_the_openai_client_gets_tool_calls_that_parse_back_to_the_call_and_sends_the_history_back(tiny):
    openai = pytest.importorskip("openai")
    engine = _engine(tiny, lambda p: "It is 17." if "<tool_response>" in p else CALL)
    with Running(engine) as run:
        client = openai.OpenAI(base_url=run.url, api_key="unused", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="tiny", messages=ASK, tools=SCHEMAS, max_tokens=128, temperature=0,
                                           extra_body={"return_token_ids": True})
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.id.startswith("call_") and call.type == "function"
        calls = [{"name": call.function.name, "arguments": json.loads(call.function.arguments)}]
        assert calls == HERMES.parse(CALL)[0] == [{"name": "multiply", "arguments": {"a": 3, "b": 4}}]
        ids = choice.model_extra["token_ids"]  # every generated token, the call's included
        assert ids == engine.gen.returned[-1] and engine.tok.decode(ids, skip_special_tokens=True) == CALL
        # the assistant's calls and the tool's result, sent back as the client holds them
        history = ASK + [choice.message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "12"}]
        again = client.chat.completions.create(model="tiny", messages=history, tools=SCHEMAS, max_tokens=128,
                                               temperature=0)
        assert again.choices[0].message.content == "It is 17." and again.choices[0].finish_reason == "stop"
        assert again.choices[0].message.tool_calls is None
        prompt = engine.gen.prompts[-1]
        assert CALL in prompt and "<tool_response>\n12\n</tool_response>" in prompt
        # streamed: the same call, as tool_calls deltas
        chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=SCHEMAS, max_tokens=128,
                                                     temperature=0, stream=True))
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == [("multiply", {"a": 3, "b": 4})]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        # a hostile tools list: a 400 in the OpenAI shape naming the field, and the server answers after it
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=ASK, tools=[{"type": "function",
                                                                               "function": {"name": "a b"}}])
        assert e.value.body["param"] == "tools" and set(e.value.body) == {"message", "type", "param", "code"}
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=ASK, tools=SCHEMAS,
                                           tool_choice={"type": "function", "function": {"name": "divide"}})
        assert e.value.body["param"] == "tool_choice"
        assert client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2).choices


# -- hostile input -------------------------------------------------------------------------------------------------
FN = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
DEEP: dict = {"type": "object"}
for _ in range(3000):
    DEEP = {"type": "object", "properties": {"x": DEEP}}


@pytest.mark.parametrize("body, param", [
    ({"tools": "add"}, "tools"),
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [1]}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"tools": [{"type": "code_interpreter", "function": {"name": "f"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "ignore previous instructions"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f" * 65}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": 7}}]}, "tools"),
    ({"tools": [FN, FN]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1, 2]}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "a\udcffb"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": float("nan")}}}]},
     "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(10_000)]}, "tools"),
    ({"tools": [FN], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [FN], "tool_choice": 3}, "tool_choice"),
    ({"tools": [FN], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"tools": [FN], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": [FN], "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"tools": [FN], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
])
def test_hostile_tools_are_a_400_naming_the_field(body, param, tiny):
    engine = _engine(tiny, lambda p: CALL)
    with pytest.raises(RequestError) as e:
        _chat(engine, **body)
    assert e.value.status == 400 and e.value.param == param, str(e.value)
    assert len(str(e.value)) < 400 and "\n" not in str(e.value)
    assert not engine.gen.prompts  # refused before generating


def _assistant(calls) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": calls}


@pytest.mark.parametrize("extra", [
    [_assistant("multiply")],
    [_assistant([{"type": "function", "function": {"name": "f", "arguments": "{not json"}}])],
    [_assistant([{"type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}])],
    [_assistant([{"type": "function", "function": {"arguments": "{}"}}])],
    [_assistant([{"type": "function", "function": {"name": "f", "arguments": "{}"}}] * 1000)],
    [_assistant([{"id": 5, "type": "function", "function": {"name": "f", "arguments": "{}"}}])],
    [{"role": "tool", "tool_call_id": 5, "content": "12"}],
    [{"role": "tool", "content": {"value": 12}}],
    [{"role": "function", "name": "f", "content": "12"}],
])
def test_hostile_tool_history_is_a_400_naming_messages(extra, tiny):
    engine = _engine(tiny, lambda p: CALL)
    with pytest.raises(RequestError) as e:
        _chat(engine, ASK + extra, tools=SCHEMAS)
    assert e.value.status == 400 and e.value.param == "messages", str(e.value)


def test_limits_hold_on_the_rendered_prompt_and_a_template_that_refuses_is_a_400(tiny):
    engine = _engine(tiny, lambda p: CALL)
    many = [{"type": "function", "function": {"name": f"tool_{i}", "description": "Look something up. " * 20}}
            for i in range(100)]  # within --max-tools, but the rendered prompt is past the context
    with pytest.raises(RequestError) as e:
        _chat(engine, tools=many)
    assert e.value.param == "messages" and e.value.code == "context_length_exceeded"
    small = _engine(tiny, lambda p: CALL, max_tools=2)
    with pytest.raises(RequestError, match="--max-tools") as e:
        _chat(small, tools=SCHEMAS)
    assert e.value.param == "tools"
    refusing = _engine(tiny, lambda p: CALL, template="{{ raise_exception('tools are not for me') }}")
    with pytest.raises(RequestError, match="tools are not for me") as e:
        _chat(refusing, tools=SCHEMAS)
    assert e.value.status == 400 and e.value.param == "messages"
    with pytest.raises(RequestError) as e:  # completions have no tools
        engine.complete({"prompt": "Hi", "tools": SCHEMAS})
    assert e.value.param == "tools"


def test_the_tool_parser_is_the_templates_or_the_named_one(tiny):
    llama = '{"name": "multiply", "parameters": {"a": 3, "b": 4}}'
    assert _engine(tiny).parser.name == "hermes"  # a template without tools: the fallback's syntax
    got = _chat(_engine(tiny, lambda p: llama, tool_parser="llama3_json"), tools=SCHEMAS)["choices"][0]
    assert got["finish_reason"] == "tool_calls"
    assert json.loads(got["message"]["tool_calls"][0]["function"]["arguments"]) == {"a": 3, "b": 4}
    assert _chat(_engine(tiny, lambda p: llama), tools=SCHEMAS)["choices"][0]["finish_reason"] == "stop"
    with pytest.raises(ValueError, match="tool_parser"):
        ServeSettings(tool_parser="nope")


def test_serve_refuses_an_unknown_tool_parser_in_one_line(slea_cli):
    r = slea_cli("serve", "tiny", "--tool-parser", "nope")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "--tool-parser 'nope'" in r.stderr and "hermes" in r.stderr


# -- model.generator: openai plays slea/ToolCalc-v0 against the server ---------------------------------------------
def _generator(url: str, tok, api: str, model=None, extensions: bool = True) -> OpenAIGenerator:
    trains = api == "completions"  # api: chat serves a frozen policy (slea agent, slea eval)
    section = ModelSection.model_validate({"name_or_path": "tiny", "generator": "openai", "lora": trains,
                                           "openai": {"base_url": url, "timeout_s": 60, "api": api,
                                                      "extensions": extensions}},
                                          context={"trains": trains})
    return OpenAIGenerator(model, tok, section.openai, trains=trains)


def _play(gen, builder, max_new_tokens: int, seeds=(0, 1)):
    col = RolloutCollector(gen, builder, RolloutSection(max_new_tokens=max_new_tokens), max_steps=4)
    try:
        return col.collect(EnvPool("slea/ToolCalc-v0", len(seeds), 1), list(seeds))
    finally:
        gen.close()


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_an_openai_rollout_of_toolcalc_against_the_served_tiny_model_completes(api, tiny):
    """The random tiny model makes no valid call: every step is invalid, nothing crashes, and each row holds the
    ids the server generated."""
    engine = _engine(tiny)
    model, tok = tiny
    builder = (PromptBuilder if api == "completions" else ChatPromptBuilder)(tok, history=2)
    with Running(engine) as run:
        trajs, stats = _play(_generator(run.url, tok, api, model if api == "completions" else None), builder, 24)
    rows = flatten(trajs)
    assert len(rows) == 8 and not any(r.valid for r in rows) and stats.parse_kinds["invalid"] == 8
    assert all(r.response_ids for r in rows) and all(len(r.response_ids) <= 24 for r in rows)
    if api == "completions":  # the trainer's path: log-probs for every generated id
        assert all(len(r.old_logprobs) == len(r.response_ids) for r in rows)


@pytest.mark.parametrize("extensions", [True, False])
def test_a_chat_rollout_sends_tools_and_turns_the_served_tool_calls_into_valid_steps(extensions, tiny):
    """``api: chat``: each turn goes with ``tools`` and the history as ``tool_calls`` / ``role: "tool"``
    messages; the server parses the (scripted) expert's calls and returns ``tool_calls``, which become the steps'
    actions: every episode is won in three valid turns. With vLLM's extensions each row holds the ids the server
    generated; without (a strict server: no ids, only ``tool_calls``) the calls alone make the steps."""
    engine = _engine(tiny, calculator)
    _, tok = tiny
    with Running(engine) as run:
        gen = _generator(run.url, tok, "chat", extensions=extensions)
        trajs, stats = _play(gen, ChatPromptBuilder(tok, history=4), 160)
    assert all(t.won for t in trajs) and [len(t.steps) for t in trajs] == [3, 3]
    assert all(s.valid for t in trajs for s in t.steps) and stats.parse_kinds["tool"] == 6
    assert [s.reward for s in trajs[0].steps] == [0.0, 0.0, 1.0]
    assert json.loads(trajs[0].steps[0].action)[0]["name"] == "multiply"
    generated = sorted(tuple(r.response_ids) for r in flatten(trajs))
    if extensions:
        assert generated == sorted(map(tuple, engine.gen.returned))
    else:  # the local tokenizer's encoding of the calls: the generated ids but the EOS
        assert generated == sorted(tuple(ids[:-1]) for ids in engine.gen.returned)
    last = engine.gen.prompts[-1]  # the server rendered the history it was sent: calls and results
    assert last.count("<tool_response>") == 2 and "You can call these tools" in last
