"""experiments/searchqa_answerability.py's two counts on hand-made cases (no corpus, no model)."""

from __future__ import annotations

import json
from pathlib import Path

from slea.testing.bench import load_script

S = load_script(Path(__file__).resolve().parents[2] / "experiments" / "searchqa_answerability.py")


def test_an_answer_counts_only_as_whole_normalised_words():
    assert S.contains_answer("<information>Doc 1(Title: Apple) Its HQ is in Cupertino, California.", ["cupertino"])
    assert S.contains_answer("It was THE Beatles.", ["Beatles"])  # case, articles and punctuation normalised
    assert not S.contains_answer("Cupertinos are many.", ["Cupertino"])  # part of a word
    assert not S.contains_answer("anything", ["", "the"])  # nothing left after normalising


def test_expert_episodes_are_counted_by_their_last_prompt(tmp_path):
    def episode(last_user: str, answer: str) -> dict:
        msgs = [{"role": "system", "content": f"e.g. <answer> {answer} </answer>"}, {"role": "user", "content": last_user}]
        return {"turns": [{"messages": [{"role": "user", "content": "Question"}]}, {"messages": msgs}],
                "final_info": {"prediction": answer}}

    p = tmp_path / "expert.jsonl"
    p.write_text("\n".join(json.dumps(e) for e in (episode("Doc: Paris is the capital", "Paris"),
                                                   episode("Doc: nothing useful", "Rome"))) + "\n")
    assert S.expert_hits(p) == {"episodes": 2, "answer_in_last_prompt": 1}  # the system prompt does not count
