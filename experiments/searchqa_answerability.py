"""Which Search-QA questions a search can answer (docs/alignment.md, "Why searchqa_answer"): for each level of
``answerable`` and each split, how many questions there are and for how many a gold answer is in the documents a
BM25 search for the question itself returns (the expert's search; top 3, as the env); and, per alignment job, how
many of its committed expert episodes show the expert's answer verbatim in their last prompt. No model; about a
minute on one core. Writes ``experiments/results/searchqa_answerability.json``::

    python experiments/searchqa_answerability.py
"""

from __future__ import annotations

import json
from pathlib import Path

from slea.envs.qa_metrics import normalize_answer
from slea.envs.search_qa import SearchQAEnv

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "searchqa_answerability.json"
EXPERT = {job: ROOT / "experiments" / "results" / "align" / job / "runs" / "sft-s0" / "expert.jsonl"
          for job in ("searchqa", "searchqa_answer")}


def contains_answer(text: str, answers: list[str]) -> bool:
    """A normalised gold answer occurs as whole words in the normalised text."""
    t = f" {normalize_answer(text)} "
    return any(f" {a} " in t for a in map(normalize_answer, answers) if a)


def search_hits(answerable: str, split: str) -> dict[str, int]:
    env = SearchQAEnv(split=split, answerable=answerable)
    hits = sum(contains_answer(env.search(it.question)[0], list(it.answers)) for it in env.items)
    return {"questions": len(env.items), "answer_in_search_results": hits}


def expert_hits(path: Path) -> dict[str, int]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    shown = 0
    for r in rows:
        prompt = " ".join(m["content"] for m in r["turns"][-1]["messages"] if m["role"] != "system")
        shown += r["final_info"]["prediction"].lower() in prompt.lower()
    return {"episodes": len(rows), "answer_in_last_prompt": shown}


def main() -> None:
    res = {"search": {f"{level}/{split}": search_hits(level, split)
                      for level in ("evidence", "answer") for split in ("train", "heldout")},
           "expert": {job: expert_hits(p) for job, p in EXPERT.items() if p.is_file()}}
    OUT.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
