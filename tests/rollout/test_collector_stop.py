"""A tool env that takes one call per turn (``Instructions.one_call_per_turn``) has its answers stop at the end of
the first call: the collector asks the generator to stop at the tool-call syntax's ``call_end``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slea.config import RolloutSection
from slea.envs.pool import EnvPool
from slea.envs.tools import ToolCalcEnv
from slea.policy.generation import Generation
from slea.policy.prompt_builder import PromptBuilder
from slea.policy.tool_calls import parser_for
from slea.rollout.collector import RolloutCollector

pytest.importorskip("transformers")  # the tools' schemas come from transformers' get_json_schema


class Recording:
    """Answers every prompt with the first walkthrough call of ToolCalc's task 0 and keeps each call's kwargs."""

    def __init__(self, text: str):
        self.text, self.kwargs = text, []

    def generate(self, prompts, **kw):
        self.kwargs.append(kw)
        return [Generation([7, 8], [-0.5, -0.5], self.text) for _ in prompts]


def stops(tok, one_call: bool, monkeypatch) -> list:
    inst = dataclasses.replace(ToolCalcEnv.instructions, one_call_per_turn=one_call)
    monkeypatch.setattr(ToolCalcEnv, "instructions", inst)
    pool = EnvPool("slea/ToolCalc-v0", 1, 2, {})
    try:
        walk = json.loads(pool.reset([0])[0][1]["walkthrough"][0])
        gen = Recording(parser_for(tok).format(walk))
        col = RolloutCollector(gen, PromptBuilder(tok), RolloutSection(), max_steps=2)
        trajs, _ = col.collect(pool, [0])
    finally:
        pool.close()
    assert all(s.valid for t in trajs for s in t.steps)  # the calls were read and played
    return [kw["stop"] for kw in gen.kwargs]


def test_one_call_per_turn_stops_generation_at_the_end_of_a_call(tiny_policy, monkeypatch):
    _, tok = tiny_policy
    assert parser_for(tok).call_end == "</tool_call>"  # the tiny template has no tools: the fallback's hermes
    assert stops(tok, True, monkeypatch) == [("</tool_call>",)] * 2
    assert stops(tok, False, monkeypatch) == [()] * 2
