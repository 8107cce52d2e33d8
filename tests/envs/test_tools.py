"""Tool environments from Python functions (slea.envs.tools): schemas generated from the functions, a step is
one or several calls, bad calls are invalid steps with the reason, failing tools are env faults."""

from __future__ import annotations

import json
import time

import pytest

from slea.envs import make, registered
from slea.envs.pool import EnvPool
from slea.envs.tools import ToolEnv, tool_schema


def lookup(key: str, limit: int = 3) -> str:
    """Look a key up.

    Args:
        key: What to look up.
        limit: How many entries to return.
    """
    return f"{key}:{limit}"


def answer(text: str) -> str:
    """Answer the question.

    Args:
        text: The answer.
    """
    return "ok"


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: Anything.
    """
    raise ValueError("disk on fire")


def slow(x: int) -> int:
    """Sleeps.

    Args:
        x: Anything.
    """
    time.sleep(2)
    return x


TASKS = [{"goal": "Find the capital.", "gold": "Paris"}, {"goal": "Find the river.", "gold": "Seine"}]


def reward(task, calls) -> float:
    return float(calls[-1]["arguments"]["text"] == task["gold"])


def env(**kw) -> ToolEnv:
    e = ToolEnv([lookup, answer, broken, slow], TASKS, reward, timeout_s=0.2, **kw)
    e.reset(seed=0)
    return e


def call(name, **args) -> str:
    return json.dumps({"name": name, "arguments": args})


def test_schemas_are_generated_from_the_functions():
    schema = tool_schema(lookup)
    assert schema["function"]["name"] == "lookup"
    assert schema["function"]["description"] == "Look a key up."
    params = schema["function"]["parameters"]
    assert params["properties"]["key"] == {"type": "string", "description": "What to look up."}
    assert params["properties"]["limit"]["type"] == "integer"
    assert params["required"] == ["key"]
    e = env()
    obs, info = e.reset(seed=1)
    assert obs == "Find the river." and info["goal"] == obs and info["admissible_actions"] is None
    assert [s["function"]["name"] for s in info["tools"]] == ["lookup", "answer", "broken", "slow"]


def test_a_call_returns_the_tool_result_and_a_final_tool_ends_with_the_reward():
    e = env()
    obs, r, term, trunc, info = e.step(call("lookup", key="capital"))
    assert (obs, r, term, trunc, info["invalid"]) == ("capital:3", 0.0, False, False, False)
    obs, r, term, trunc, info = e.step(json.dumps([call_dict("lookup", key="a", limit=1), call_dict("lookup", key="b")]))
    assert json.loads(obs) == ["a:1", "b:3"] and info["tool_calls"] == 2
    obs, r, term, trunc, info = e.step(call("answer", text="Paris"))
    assert (obs, r, term, info["won"]) == ("ok", 1.0, True, True)
    assert e.step(call("lookup", key="x"))[4]["invalid"]  # the episode is over


def call_dict(name, **args) -> dict:
    return {"name": name, "arguments": args}


@pytest.mark.parametrize("action, why", [
    ("not json", "bad JSON"),
    ('{"name": "lookup", "arguments": {"key": "x"', "bad JSON"),
    (call("search", q="x"), "unknown tool"),
    (call("lookup"), "wrong arguments"),
    (call("lookup", key="x", colour="red"), "wrong arguments"),
    (call("lookup", key=3), "key must be string"),
    (call("lookup", key="x", limit=True), "limit must be integer"),
    ('{"name": "lookup", "arguments": [1]}', "JSON object"),
    ('[]', "tool call"),
    ('"lookup"', "tool call"),
    ("[" * 5000 + "]" * 5000, ""),
])
def test_a_bad_call_is_an_invalid_step_with_the_reason(action, why):
    e = env()
    obs, r, term, trunc, info = e.step(action)
    assert info["invalid"] and not term and not trunc and r == 0.0 and obs == "Find the capital."
    assert why in info["error"] and "fault" not in info


@pytest.mark.parametrize("name, message", [("broken", "disk on fire"), ("slow", "ran past 0.2 s")])
def test_a_tool_that_raises_or_times_out_is_a_fault(name, message):
    e = env()
    _, _, _, trunc, info = e.step(call(name, x=1))
    assert info["fault"] == "error" and message in info["error"] and trunc and not info["invalid"]


def test_the_pool_steps_calls_and_refuses_bad_ones():
    pool = EnvPool("slea/ToolCalc-v0", 1, 2)
    try:
        first = pool.reset([0])
        walk = first[0][1]["walkthrough"]
        out = pool.step({0: walk[0], 1: call("nope")})
        assert out[0][0].isdigit() and not out[0][4]["invalid"] and out[1][4]["invalid"]
    finally:
        pool.close()


def test_the_calc_env_is_registered_and_passes_gymnasium_check_env():
    from gymnasium.utils.env_checker import check_env

    assert "slea/ToolCalc-v0" in registered()
    e = make("slea/ToolCalc-v0")
    check_env(e, skip_render_check=True)
    _, info = e.reset(seed=5)
    for action in info["walkthrough"]:
        _, r, term, _, step_info = e.step(action)
    assert term and r == 1.0 and step_info["won"]
    assert make("slea/ToolCalc-v0", split="heldout").reset(seed=5)[0] != make("slea/ToolCalc-v0").reset(seed=5)[0]


# -- Search-QA as tools ------------------------------------------------------------------------------------------


def test_search_qa_tools_plays_the_tag_versions_questions_with_the_same_corpus_and_metrics(qa_files):
    kw = qa_files
    tools, tags = make("slea/SearchQA-tools-file-v0", **kw), make("slea/SearchQA-file-v0", **kw)
    obs, info = tools.reset(seed=0)
    tag_obs, tag_info = tags.reset(seed=0)
    assert (obs, info["goal"]) == (tag_obs, tag_info["goal"]) == ("Question: What is the capital of France?",
                                                                   "What is the capital of France?")
    assert [s["function"]["name"] for s in info["tools"]] == ["search", "answer"]
    assert registered()["slea/SearchQA-tools-file-v0"].family == registered()["slea/SearchQA-file-v0"].family
    found, r, term, _, step = tools.step(call("search", query="capital of France"))
    tag_obs = tags.step("<search>capital of France</search>")[0]
    assert not step["invalid"] and r == 0.0 and not term and found in tag_obs and "Paris is the capital" in found
    assert step["num_searches"] == 1 and step["retrieved"][0] == "Paris"
    bad = tools.step(call("search", q="x"))[4]
    assert bad["invalid"] and "wrong arguments" in bad["error"]
    assert tools.step(call("search", query="  "))[4]["invalid"]
    obs, r, term, _, step = tools.step(call("answer", text="paris"))
    tag_r = tags.step("<answer>paris</answer>")[1]  # the same metric
    assert term and r == 1.0 == tag_r and step["won"] and step["em"] == 1.0 and step["prediction"] == "paris"
    # several calls in one turn run in order, up to the answer; snapshots are the tag version's (exact)
    tools.reset(seed=1)
    state = tools.get_state()
    obs, r, term, _, step = tools.step(json.dumps([call_dict("search", query="Germany"),
                                                   call_dict("answer", text="Munich")]))
    assert term and r == 0.0 and json.loads(obs)[1] == "Answer submitted: Munich" and step["f1"] == 0.0
    tools.set_state(state)
    assert tools.step(json.dumps(json.loads(tools.reset(seed=1)[1]["walkthrough"][1])))[1] == 1.0
