"""Tool-call syntax (slea.policy.tool_calls): each parser on well-formed, truncated and hostile answers (never
raises), the parser and rendering chosen per tokenizer, a user's parser registered as a plugin."""

from __future__ import annotations

import pytest

from slea.policy.prompt_builder import PromptBuilder
from slea.policy.tool_calls import TOOL_PARSERS, ToolParser, parser_for, supports_tools
from slea.testing.chat_templates import LLAMA_TEMPLATE, QWEN_TEMPLATE, with_template
from slea.types import Instructions

HERMES = TOOL_PARSERS.get("hermes")
LLAMA = TOOL_PARSERS.get("llama3_json")


@pytest.mark.parametrize("text, calls", [
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', [("add", {"a": 1, "b": 2})]),
    ('I will add.\n<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>', [("add", {"a": 1})]),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b"}</tool_call>',
     [("a", {}), ("b", {})]),
    ('<tool_call>{"name": "add", "arguments": {"a": 1}}', [("add", {"a": 1})]),  # cut before the closing tag
])
def test_hermes_reads_well_formed_calls(text, calls):
    got, why = HERMES.parse(text)
    assert why == "" and [(c["name"], c["arguments"]) for c in got] == calls
    assert HERMES.parse(HERMES.format(got))[0] == got  # format and parse round-trip


@pytest.mark.parametrize("text, calls", [
    ('{"name": "add", "parameters": {"a": 1, "b": 2}}', [("add", {"a": 1, "b": 2})]),
    ('<|python_tag|>{"name": "add", "arguments": {"a": 1}}', [("add", {"a": 1})]),
    ('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": "y"}}', [("a", {}), ("b", {"x": "y"})]),
])
def test_llama3_json_reads_well_formed_calls(text, calls):
    got, why = LLAMA.parse(text)
    assert why == "" and [(c["name"], c["arguments"]) for c in got] == calls
    assert LLAMA.parse(LLAMA.format(got))[0] == got


SEARCH = '<tool_call>\n{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>'


@pytest.mark.parametrize("text, calls", [
    # a complete call, then a second block cut off by the token limit: the complete call is the answer
    (SEARCH + '\n<tool_call>\n{"name": "answer", "argum', [("search", {"query": "capital of France"})]),
    (SEARCH + "\n<tool_call>", [("search", {"query": "capital of France"})]),
    (SEARCH + '<tool_call>{"name": "answer", "arguments": {"text": "Paris"}}',  # an open last block read whole
     [("search", {"query": "capital of France"}), ("answer", {"text": "Paris"})]),
    (SEARCH + "<tool_call>[1, 2]", [("search", {"query": "capital of France"})]),  # open and not a call: dropped
])
def test_hermes_keeps_the_complete_calls_before_a_cut_off_last_block(text, calls):
    got, why = HERMES.parse(text)
    assert why == "" and [(c["name"], c["arguments"]) for c in got] == calls


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "search", "argum',  # the only block, cut off
    SEARCH + '\n<tool_call>{"name": "answer"]</tool_call>',  # a closed block that is not JSON: refused whole
    SEARCH + '\n<tool_call>{"arguments": {}}</tool_call>',  # a closed block that is not a call
    '<tool_call>{"name": "search", "arguments": {"query": "a"}}\n<tool_call>{"name": "answer"',  # never closed
    '<tool_call>{"name": "a", "arguments": {}}}</tool_call>',  # a stray brace
])
def test_hermes_refuses_an_answer_whose_closed_or_only_block_is_not_a_call(text):
    calls, why = HERMES.parse(text)
    assert calls == [] and why


def test_hermes_marks_the_end_of_a_call_and_llama3_json_does_not():
    assert HERMES.call_end == "</tool_call>" and HERMES.format([{"name": "a", "arguments": {}}]).endswith(
        HERMES.call_end)
    assert LLAMA.call_end == ""


HOSTILE = [
    "", "take apple", None, 12, "<tool_call>", "<tool_call>{\"name\": \"add\", \"argu", "{\"name\": \"add\", \"param",
    "<tool_call>[1, 2]</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>", "{\"name\": \"\"}",
    "<tool_call>{\"name\": \"a\", \"arguments\": 3}</tool_call>", "{\"name\": \"a\", \"parameters\": \"{bad\"}",
    "<tool_call>" + "[" * 100000 + "</tool_call>", "{" * 100000, "{\"name\": " + "[" * 50000,
    "\ud800<tool_call>\x00</tool_call>", "<tool_call>" * 5000,
]


@pytest.mark.parametrize("parser", [HERMES, LLAMA], ids=["hermes", "llama3_json"])
@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_parsers_never_raise_on_truncated_or_hostile_answers(parser, text):
    calls, why = parser.parse(text)
    assert calls == [] and isinstance(why, str) and why


def test_the_parser_and_the_rendering_are_chosen_per_tokenizer(tiny_policy):
    _, tok = tiny_policy
    assert not supports_tools(tok) and parser_for(tok).name == "hermes"  # the fallback
    qwen, llama = with_template(tok, QWEN_TEMPLATE), with_template(tok, LLAMA_TEMPLATE)
    assert supports_tools(qwen) and parser_for(qwen).name == "hermes"
    assert supports_tools(llama) and parser_for(llama).name == "llama3_json"
    assert parser_for(qwen, "llama3_json").name == "llama3_json"  # forced by name


class Angle(ToolParser):
    name = "angle"

    def matches(self, template):
        return "<<call>>" in template

    def parse(self, text):
        return ([{"name": text.split("<<call>>")[-1].strip(), "arguments": {}}], "") if "<<call>>" in text \
            else ([], "no call")

    def format(self, calls):
        return "".join(f"<<call>>{c['name']}" for c in calls)


def test_a_users_parser_registers_as_a_plugin(tiny_policy):
    _, tok = tiny_policy
    TOOL_PARSERS.add("angle", Angle())
    try:
        mine = with_template(tok, QWEN_TEMPLATE.replace("<tool_call></tool_call>", "<<call>>"))
        assert parser_for(mine).name == "angle" and "angle" in TOOL_PARSERS.names()
        assert parser_for(mine).parse("<<call>>look") == ([{"name": "look", "arguments": {}}], "")
    finally:
        TOOL_PARSERS.remove("angle")


SCHEMAS = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
TURNS = [("xyzzy", None, "no tool call"),
         ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', [{"name": "add", "arguments": {"a": 1}}],
          "41")]


def test_native_rendering_uses_the_template_tools_and_tool_messages(tiny_policy):
    _, tok = tiny_policy
    builder = PromptBuilder(with_template(tok, QWEN_TEMPLATE), history=4)
    msgs = builder.tool_messages(Instructions(system="Solve it."), "What is 40 + 1?", "What is 40 + 1?", TURNS,
                                 SCHEMAS)
    assert msgs[0]["tools"] == SCHEMAS and [m["role"] for m in msgs] == [
        "system", "user", "assistant", "user", "assistant", "tool"]
    assert msgs[4]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 1}}
    text = builder.tokenizer.decode(builder.encode(msgs))
    assert '<tools>{"type": "function"' in text and "Your last answer was invalid: no tool call" in text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>' in text
    assert text.endswith("<tool_response>\n41\n</tool_response><|im_end|><|im_start|>assistant")


def test_fallback_rendering_for_a_template_without_tools(tiny_policy):
    _, tok = tiny_policy
    builder = PromptBuilder(tok, history=4)
    msgs = builder.tool_messages(Instructions(system="Solve it."), "What is 40 + 1?", "What is 40 + 1?", TURNS,
                                 SCHEMAS)
    assert "tools" not in msgs[0] and '"name": "add"' in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]
    assert msgs[-2] == {"role": "assistant", "content": HERMES.format(TURNS[1][1])}
    assert msgs[-1] == {"role": "user", "content": "<tool_response>\n41\n</tool_response>"}
    assert builder.tokenizer.decode(builder.encode(msgs)).endswith("<|im_start|>assistant\n")


def test_the_config_names_the_parser(tiny_policy):
    from slea.config import RolloutSection

    _, tok = tiny_policy
    assert PromptBuilder.from_rollout(tok, RolloutSection()).tool_syntax() == (HERMES, False)
    assert PromptBuilder.from_rollout(tok, RolloutSection(tool_parser="llama3_json")).tool_syntax()[0] is LLAMA


def test_a_template_with_one_call_per_turn_gets_each_call_as_its_own_exchange(tiny_policy):
    _, tok = tiny_policy
    builder = PromptBuilder(with_template(tok, LLAMA_TEMPLATE), history=4)
    calls = [{"name": "add", "arguments": {"a": 1}}, {"name": "add", "arguments": {"a": 2}}]
    msgs = builder.tool_messages(Instructions(system="Solve it."), "Add.", "Add.", [("x", calls, '["1", "2"]')],
                                 SCHEMAS)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert [m["content"] for m in msgs if m["role"] == "tool"] == ["1", "2"]
    assert builder.encode(msgs)
    qwen = PromptBuilder(with_template(tok, QWEN_TEMPLATE), history=4)
    msgs = qwen.tool_messages(Instructions(system="Solve it."), "Add.", "Add.", [("x", calls, '["1", "2"]')], SCHEMAS)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool"]
