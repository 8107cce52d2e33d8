"""The experience library on tool steps: scripted tool episodes (slea/ToolCalc-v0, slea/SearchQA-tools-file-v0)
played through the real collector into a real library. Observations are the tool results and clusters form over
them; lessons name the calls (``answer(value=66)``, ``search(query="...")``) and what was wrong with a rejected
one; a later episode retrieves them at the tool result they were distilled at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slea.config import ExperienceSection, RolloutSection
from slea.envs.pool import EnvPool
from slea.experience.calls import describe_call, parse_calls
from slea.experience.llm_extractor import LLMExtractor, render_compact
from slea.experience.manager import ExperienceManager
from slea.policy.generation import Generation
from slea.policy.prompt_builder import PromptBuilder
from slea.policy.tool_calls import parser_for
from slea.rollout.collector import RolloutCollector

pytest.importorskip("transformers")  # the tools' schemas come from transformers' get_json_schema


def calls(name: str, **arguments) -> list[dict]:
    return [{"name": name, "arguments": arguments}]


def test_describe_call_writes_a_call_and_knows_what_is_not_one():
    assert describe_call(json.dumps(calls("search", query="capital of France"))) == 'search(query="capital of France")'
    two = json.dumps(calls("multiply", a=8, b=8) + calls("answer", value=66))
    assert describe_call(two) == "multiply(a=8, b=8); answer(value=66)"
    assert describe_call(json.dumps({"name": "answer", "arguments": '{"text": "Paris"}'})) == 'answer(text="Paris")'
    long = describe_call(json.dumps(calls("search", query="x" * 200)))
    assert long.startswith('search(query="xxx') and long.endswith('…")') and len(long) < 60
    assert "\n" not in describe_call(json.dumps(calls("answer", text="two\nlines")))
    for text in ("go north", "<search>capital</search>", '{"a": 1}', "[]", "[1, 2]", "not json", "", None):
        assert parse_calls(text) is None and describe_call(text) is None, text


class Scripted:
    """A generator that answers each live env copy from its script (``scripts[copy][turn]``) and keeps the
    prompts it got."""

    def __init__(self, scripts: list[list[str]]):
        self.scripts, self.prompts, self.turn = scripts, [], 0

    def generate(self, prompts, **kw):
        live = [i for i, s in enumerate(self.scripts) if len(s) > self.turn]  # copies still playing, in order
        out = [Generation([7, 8], [-0.5, -0.5], self.scripts[i][self.turn]) for i in live[:len(prompts)]]
        self.prompts.append(prompts)
        self.turn += 1
        return out


def play(tok, manager, env_id, kwargs, seed, script, *, iteration=0, max_steps=8):
    """One task group of ``len(script(walk))`` copies, each answering its script in the tokenizer's tool syntax."""
    pool = EnvPool(env_id, 1, 2, kwargs)
    try:
        walk = [json.loads(a) for a in pool.reset([seed])[0][1]["walkthrough"]]
        fmt = parser_for(tok).format
        scripts = [[a if isinstance(a, str) else fmt(a) for a in copy] for copy in script(walk)]
        gen = Scripted(scripts)
        col = RolloutCollector(gen, PromptBuilder(tok), RolloutSection(), max_steps=max_steps, experience=manager,
                               experience_mode="step")
        trajs, _ = col.collect(pool, [seed], iteration=iteration)
    finally:
        pool.close()
    return trajs, gen


def lib(tmp_path, **kw) -> ExperienceManager:
    cfg = {"mode": "step", "warmup_iters": 1, "min_entries": 1, "k_strat": 10, "k_warn": 10, "k_traj": 5, **kw}
    return ExperienceManager(ExperienceSection(**cfg), tmp_path / "lib.sqlite")


def test_toolcalc_clusters_form_over_tool_results_and_lessons_name_the_calls(tiny_policy, tmp_path):
    _, tok = tiny_policy
    m = lib(tmp_path)

    def script(walk):  # copy 0 plays the expert's calls; copy 1 makes bad calls, repeats one, answers wrong
        (mul,), _, (ans,) = walk
        a, b = mul["arguments"]["a"], mul["arguments"]["b"]
        return [walk, [calls("divide", a=a, b=b), calls("add", a="x", b=2), "The answer is 66.", [mul], [mul], [mul],
                       calls("answer", value=ans["arguments"]["value"] + 1)]]

    (good, bad), _ = play(tok, m, "slea/ToolCalc-v0", {}, 3, script)
    walk = [parse_calls(s.action)[0] for s in good.steps]
    a, b = walk[0]["arguments"]["a"], walk[0]["arguments"]["b"]
    c, result = walk[1]["arguments"]["b"], walk[2]["arguments"]["value"]
    assert good.won and not bad.won and [s.valid for s in bad.steps] == [False, False, False, True, True, True, True]

    # observations are the tool results, and the clusters form over them (a prototype is the result's text)
    assert [s.anchor for s in good.steps] == [f"What is {a} * {b} + {c}?", str(a * b), str(a * b + c)]
    for s in good.steps + bad.steps:
        assert s.cluster_id >= 0 and m.index.prototype(s.cluster_id) == s.anchor
    assert good.steps[1].cluster_id == bad.steps[4].cluster_id != good.steps[2].cluster_id  # one result, one cluster
    assert bad.steps[0].info["tools"] == ["add", "multiply", "answer"]
    assert "unknown tool 'divide'" in bad.steps[0].info["error"]

    m.evolve([good, bad], 0)
    entries = {e.text: e for e in m.library.entries()}
    texts = " | ".join(entries)
    assert '{"name"' not in texts and "'name" not in texts  # no raw JSON, no command shape of it
    win = next(e for t, e in entries.items() if t.startswith("Calling "))
    assert win.text == f"Calling answer(value={result}) earned the reward on this kind of task."
    assert win.clusters == [good.steps[2].cluster_id]  # linked to the tool result it was made at
    assert f"A winning plan: call multiply(a={a}, b={b}) → add(a={a * b}, b={c}) → answer(value={result})" in texts
    assert "the work is done by calling multiply, then add, then answer" in texts
    # warnings name the call and what was wrong with it
    assert f"The call divide(a={a}, b={b}) was rejected: unknown tool 'divide'; the tools are: add, multiply" in texts
    assert 'The call add(a="x", b=2) was rejected: wrong arguments for add: a must be integer.' in texts
    assert "Invalid tool calls wasted 3 of 7 steps: call only the tools given (add, multiply, answer)" in texts
    assert f"Repeating the call multiply(a={a}, b={b}) (3 times)" in texts
    assert f"The call answer(value={result + 1}) ended the episode in failure" in texts
    shown = (Path(__file__).resolve().parents[2] / "docs/envs/tools.md").read_text()
    assert all(f"| {t} |" in shown for t in entries), "docs/envs/tools.md shows these lessons as they are"

    # the next episode retrieves the lesson at the tool result it was distilled at (Eq.1, no fallback)
    (again, _), gen = play(tok, m, "slea/ToolCalc-v0", {}, 3, lambda walk: [walk, walk], iteration=1)
    assert again.won and win.id in again.steps[2].experience_ids
    assert f"answer(value={result}) earned the reward" in tok.decode(gen.prompts[2][0])
    assert m.stats["fallbacks"] == 0 and m.stats["task_fallbacks"] == 0
    m.close()


def test_search_qa_tools_lessons_name_the_search_and_the_answer(tiny_policy, tmp_path):
    _, tok = tiny_policy
    docs = [{"title": "Paris", "text": "Paris is the capital of France."},
            {"title": "Berlin", "text": "Berlin is the capital of Germany."}]
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs))
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "What is the capital of France?", "answers": ["Paris"]}))
    kw = {"dataset_path": str(tmp_path / "q.jsonl"), "corpus": str(tmp_path / "corpus.jsonl"), "split": "all"}
    m = lib(tmp_path)

    def script(walk):
        return [[calls("search", query="capital of France"), calls("answer", text="Paris")],
                [calls("search", q="France"), calls("search", query="capital of France"), calls("answer", text="Lyon")]]

    (good, bad), _ = play(tok, m, "slea/SearchQA-tools-file-v0", kw, 0, script)
    assert good.won and not bad.won
    found = good.steps[1].anchor  # the search result is the observation, and a cluster's prototype
    assert found.startswith("Doc 1(Title: Paris)") and m.index.prototype(good.steps[1].cluster_id) == found
    assert bad.steps[2].cluster_id == good.steps[1].cluster_id  # the same search, the same result, one cluster
    m.evolve([good, bad], 0)
    texts = " | ".join(e.text for e in m.library.entries())
    assert 'Calling answer(text="Paris") earned the reward' in texts
    assert 'A winning plan: call search(query="capital of France") → answer(text="Paris")' in texts
    assert 'The call search(q="France") was rejected: wrong arguments for search' in texts
    assert 'The call answer(text="Lyon") ended the episode in failure' in texts
    m.close()

    # the LLM extractor is shown the calls with their results, and asked for lessons about tool tasks
    ex = LLMExtractor(lambda prompts: [])
    line = render_compact(good).splitlines()[1]
    assert line.startswith('Tool calls: search(query="capital of France") → Doc 1(Title: Paris)')
    assert line.endswith('…; answer(text="Paris") (reward 1)')
    assert "(invalid: wrong arguments for search" in render_compact(bad)
    system, user = (x["content"] for x in ex.messages(bad, "neg")[:2])
    assert "calling tools" in system and user.startswith("Type of task: ") and "another " in user
    assert "text games" not in system and "game" not in user
