"""Tool envs' state keys: the tools called so far and the kind of the last result, with argument values and short
results as slots; tasks that differ only in their values share keys, and the task's hidden fields are never read."""

from __future__ import annotations

import json

from slea.envs import make
from slea.envs.tools import ToolEnv, call_history, result_kind

CAPITALS = {"France": "Paris", "Germany": "Berlin"}


def lookup(country: str) -> str:
    """Look a country's capital up.

    Args:
        country: The country.
    """
    return CAPITALS.get(country, "not found")


def answer(text: str) -> str:
    """Give the answer; this ends the task.

    Args:
        text: The answer.
    """
    return "ok"


TASKS = [{"goal": "What is the capital of France?", "gold": "Paris"},
         {"goal": "What is the capital of Germany?", "gold": "Berlin"}]


def _capitals() -> ToolEnv:
    return ToolEnv([lookup, answer], TASKS, lambda task, calls: float(calls[-1]["arguments"]["text"] == task["gold"]))


def _call(name: str, **args) -> str:
    return json.dumps([{"name": name, "arguments": args}])


def test_result_kinds_by_hand():
    cases = {"": "an empty result", "12": "a number", "-0.5": "a number", "true": "a boolean", "null": "null",
             "[]": "an empty list", "[3]": "a list of 1", '["a", "b"]': "a list of several",
             '{"Name": 1, "id": 2}': "an object with keys id, name",
             '{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}': "an object with keys a, b, c, d, ...",
             "not found": "a not-found or error text", "Error: no such key": "a not-found or error text",
             "Paris": "a short text", "x" * 61: "a long text"}
    assert {text: result_kind(text) for text in cases} == cases
    assert call_history(["search", "search", "search", "answer"]) == "search x3, answer"
    assert call_history(list("abababab")) == "..., a, b, a, b, a, b"


def test_tasks_that_differ_only_in_values_share_keys():
    env = _capitals()
    keys = []
    for seed, country in ((0, "France"), (1, "Germany")):
        obs, info = env.reset(seed=seed)
        assert info["state_key"] == "no tool called yet" and info["state_slots"] == {}
        obs, _, _, _, info = env.step(_call("lookup", country=country))
        keys.append((info["state_key"], info["state_slots"]))
        for value in info["state_slots"].values():  # what the agent wrote or was shown
            assert value in obs or value in info["goal"]
    assert keys[0][0] == keys[1][0] == "called lookup; last result: a short text"
    assert keys[0][1] == {"lookup country": "France", "result": "Paris"}
    assert keys[1][1] == {"lookup country": "Germany", "result": "Berlin"}


def test_a_miss_another_tool_order_and_the_end_split_keys():
    env = _capitals()
    env.reset(seed=0)
    assert env.step(_call("lookup", country="Atlantis"))[4]["state_key"] == (
        "called lookup; last result: a not-found or error text")
    info = env.step(_call("lookup", country="France"))[4]
    assert info["state_key"] == "called lookup x2; last result: a short text"
    assert env.step("not json")[4]["state_key"] == info["state_key"]  # an invalid step: the same state
    info = env.step(_call("answer", text="Paris"))[4]
    assert info["state_key"] == "done: called lookup x2, answer; last result: a short text"
    calc = make("slea/ToolCalc-v0")
    calc.reset(seed=0)
    both = json.dumps([{"name": "multiply", "arguments": {"a": 8, "b": 8}}, {"name": "add", "arguments": {"a": 64,
                                                                                                      "b": 2}}])
    info = calc.step(both)[4]
    assert info["state_key"] == "called multiply, add; last results: a number"
    assert info["state_slots"] == {"multiply a 1": "8", "multiply b 1": "8", "add a 2": "64", "add b 2": "2",
                                   "result 1": "64", "result 2": "66", "goal a": "8", "goal b": "8", "goal c": "2"}


def test_toolcalc_keys_follow_the_expert_and_name_the_questions_numbers():
    env = make("slea/ToolCalc-v0")
    seen = {}
    for seed in range(3):
        _, info = env.reset(seed=seed)
        keys = [info["state_key"]]
        for action in info["walkthrough"]:
            info = env.step(action)[4]
            keys.append(info["state_key"])
        seen[seed] = keys
        a, b, c = (info["state_slots"][f"goal {x}"] for x in "abc")
        assert info["goal"] == f"What is {a} * {b} + {c}?"
    assert seen[0] == seen[1] == seen[2] == [
        "no tool called yet", "called multiply; last result: a number", "called multiply, add; last result: a number",
        "done: called multiply, add, answer; last result: a short text"]


def test_the_key_never_reads_the_tasks_hidden_fields():
    env = make("slea/ToolCalc-v0")
    _, info = env.reset(seed=4)
    obs, _, _, _, info = env.step(info["walkthrough"][0])
    before = env.state_key(obs)
    assert before is not None and before.text == info["state_key"]
    env._task = {**env._task, "answer": -1, "walkthrough": []}
    assert env.state_key(obs) == before
