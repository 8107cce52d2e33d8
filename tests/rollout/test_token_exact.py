"""Token in, token out: the ids trained on are exactly the ids the engine was given and generated.

Every env family plays multi-turn episodes through the real :class:`RolloutCollector` with the tiny model; the
engine is wrapped to record every prompt it was given and every answer it returned, and the training rows
(:func:`slea.trainer.update.to_samples` over the step rows, what the trainer builds) must be exactly those ids,
prompt and response, on every turn: the last one, invalid answers, and answers whose ids are not the
tokenizer's own encoding of their text (a decode and re-encode anywhere would change them). The same holds for
the rollouts a trainer iteration plays (GRPO, RTPO's siblings forked from snapshots), the team rollout, alignment
data made from sampled rollouts, and the openai engine (the ids a served model consumed, seen server-side);
``rollout/retokenized`` is 0 on all of them and counts the rows that were tampered with or re-tokenized.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections import Counter

import numpy as np
import pytest
import torch

from slea.alignment.data import encode_turn, from_dict, sampled_trajectory, to_dict
from slea.config import ModelSection, RolloutSection, build_config
from slea.envs import registered
from slea.envs.pool import EnvPool
from slea.policy.generation import Generation, HFGenerator
from slea.policy.prompt_builder import PromptBuilder
from slea.rollout.collector import (
    ENGINE_IDS,
    RolloutCollector,
    RolloutStats,
    engine_prompt_ids,
    retokenized,
)
from slea.trainer.metrics import Phases, iteration_metrics
from slea.trainer.update import to_samples
from slea.types import flatten

INVALID = "xyzzy plugh"  # no family's valid action


class Recording:
    """The engine the collector talks to: rows of copy 0 are the wrapped tiny model's; rows of other copies
    (``walks``: the env's walkthrough by (seed, copy)) answer ``INVALID`` at turn 0, then the walkthrough, as
    one token per character plus EOS: ids that are not the tokenizer's encoding of their text. Every call's
    prompts and answers are recorded (copies)."""

    def __init__(self, inner, tok, walks: dict[tuple[int, int], list[str]] | None = None):
        self.inner, self.tok, self.walks = inner, tok, walks or {}
        self.given: list[list[int]] = []
        self.returned: list[tuple[list[int], list[float]]] = []

    def __getattr__(self, name):  # calls, sync_weights, cfg, tok...: the wrapped engine's
        return getattr(self.inner, name)

    def _scripted(self, key) -> Generation:
        seed, copy, turn = int(key[1]), int(key[2]), int(key[-1])
        walk = self.walks[(seed, copy)]
        text = INVALID if turn == 0 else walk[min(turn - 1, len(walk) - 1)]
        ids = [i for ch in text for i in self.tok(ch, add_special_tokens=False).input_ids] + [self.tok.eos_token_id]
        return Generation(ids, [-0.01 * (k + 1) for k in range(len(ids))], self.tok.decode(ids, skip_special_tokens=True))

    def generate(self, prompts, *, rng_keys=None, **kw):
        scripted = [rng_keys is not None and (int(rng_keys[j][1]), int(rng_keys[j][2])) in self.walks
                    for j in range(len(prompts))]
        model_rows = [j for j, s in enumerate(scripted) if not s]
        outs: list = [None] * len(prompts)
        if model_rows:
            got = self.inner.generate([prompts[j] for j in model_rows], **kw,
                                      rng_keys=None if rng_keys is None else [rng_keys[j] for j in model_rows])
            for j, g in zip(model_rows, got):
                outs[j] = g
        for j, s in enumerate(scripted):
            if s:
                outs[j] = self._scripted(rng_keys[j])
        self.given += [list(p) for p in prompts]
        self.returned += [(list(o.ids), list(o.logprobs)) for o in outs]
        return outs

    def generated(self) -> Counter:
        """(prompt, response, log-probs) of every row generated, as a multiset."""
        return Counter((tuple(p), tuple(ids), tuple(lp)) for p, (ids, lp) in zip(self.given, self.returned))


def trained(rows) -> list:
    """The training rows the trainer builds from step rows: every row with a response, advantage 1 per token."""
    return to_samples(rows, [np.ones(len(r.response_ids)) for r in rows], False)


def assert_token_exact(rows, engine: Recording, stats) -> None:
    samples = trained(rows)
    assert len(samples) == len(rows) == len(engine.given)  # no row dropped, none added
    assert Counter((tuple(s.prompt_ids), tuple(s.response_ids), tuple(s.old_logprobs)) for s in samples) \
        == engine.generated()
    assert retokenized(rows) == 0 and stats.retokenized == 0
    assert all(ENGINE_IDS in r.info for r in rows)


# -- every env family ----------------------------------------------------------------------------------------
QA_DOCS = [{"title": "Paris", "text": "Paris is the capital of France."},
           {"title": "Berlin", "text": "Berlin is the capital of Germany."}]
QA = [{"question": "What is the capital of France?", "answers": ["Paris"]},
      {"question": "What is the capital of Germany?", "answers": ["Berlin"]}]


def _qa_files(tmp_path) -> dict:
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in QA_DOCS))
    (tmp_path / "nq_dev.jsonl").write_text("\n".join(json.dumps(q) for q in QA))
    return {"dataset_path": str(tmp_path / "nq_dev.jsonl"), "corpus": str(tmp_path / "corpus.jsonl"), "split": "all"}


FAMILIES = {  # family: (env id, env kwargs, needs Java)
    "textworld": ("slea/TextWorld-v0", {"tasks": ["treasure_hunter:1"], "num_games": 2}, False),
    "alfworld": ("slea/ALFWorld-Gen-v0", {"tasks": ["pick", "clean"], "num_games": 2}, False),
    "scienceworld": ("slea/ScienceWorld-v0", {"tasks": ["find-living-thing"], "split": "dev", "admissible": False},
                     True),
    "searchqa": ("slea/SearchQA-file-v0", None, False),
    "webshop": ("slea/WebShop-v0", {}, False),
    "sokoban": ("slea/Sokoban-v0", {}, False),
}


def _pool(family: str, groups: int, copies: int, tmp_path) -> tuple[str, dict, EnvPool]:
    env_id, kwargs, java = FAMILIES[family]
    missing = registered()[env_id].missing()
    if missing:
        pytest.skip(f"{env_id} needs {', '.join(missing)}")
    if java and shutil.which("java") is None:
        pytest.skip(f"{env_id} needs Java >= 11")
    kwargs = _qa_files(tmp_path) if kwargs is None else kwargs
    return env_id, kwargs, EnvPool(env_id, groups, copies, kwargs)


def _play_scripted(model, tok, pool, script, *, history: int, seed: int = 3):
    """One task group of two copies: copy 0 the tiny model, copy 1 answering ``script(walkthrough)`` of the game
    seed ``seed`` resets to; the pool is closed after. Returns ``(trajectories, stats, recording engine, builder)``."""
    builder = PromptBuilder(tok, history=history)
    try:
        first = pool.reset([seed])
        walks = {(seed, 1): script(first[1][1]["walkthrough"])}
        engine = Recording(HFGenerator(model, tok, dtype="float32"), tok, walks)
        col = RolloutCollector(engine, builder, RolloutSection(max_new_tokens=8), max_steps=4, keep_messages=True)
        trajs, stats = col.collect(pool, [seed])
    finally:
        pool.close()
    return trajs, stats, engine, builder


def _tool_script(tok):
    """A tool env's walkthrough (JSON calls) written in the tokenizer's own tool-call syntax."""
    from slea.policy.tool_calls import parser_for

    return lambda walk: [parser_for(tok).format(json.loads(a)) for a in walk]


@pytest.mark.parametrize("family", [
    "textworld", "alfworld", pytest.param("scienceworld", marks=pytest.mark.slow), "searchqa", "webshop", "sokoban"])
def test_every_family_trains_on_exactly_the_generated_ids(family, tiny_policy, tmp_path):
    model, tok = tiny_policy
    env_id, kwargs, pool = _pool(family, 1, 2, tmp_path)
    trajs, stats, engine, builder = _play_scripted(model, tok, pool, list, history=2)
    rows = flatten(trajs)
    assert_token_exact(rows, engine, stats)
    model_traj, scripted = trajs
    assert len(model_traj.steps) >= 2 and all(t.steps[-1].done for t in trajs)  # multi-turn, to the last turn
    assert not scripted.steps[0].valid and scripted.steps[1].valid  # an invalid answer, then a valid one
    # the scripted answers' ids are not their text's encoding: re-encoding the text would have changed them
    assert any(r.response_ids != tok(r.response_text, add_special_tokens=False).input_ids + [tok.eos_token_id]
               for r in scripted.steps)
    # alignment data made from these rollouts (stored as messages and text, re-encoded when trained on)
    for traj in trajs:
        data = from_dict(json.loads(json.dumps(to_dict(sampled_trajectory(traj, env_id, "train", builder, kwargs)))))
        assert [encode_turn(builder, turn) for turn in data.turns] == [(r.prompt_ids, r.response_ids)
                                                                        for r in traj.steps]


def test_a_row_changed_after_generation_is_counted(tiny_policy):
    """The counter can fail: rows whose ids no longer match what the engine consumed or produced are counted
    (and reach ``rollout/retokenized``)."""
    model, tok = tiny_policy
    engine = Recording(HFGenerator(model, tok, dtype="float32"), tok)
    col = RolloutCollector(engine, PromptBuilder(tok), RolloutSection(max_new_tokens=4), max_steps=2)
    trajs, stats = col.collect(EnvPool("slea/Sokoban-v0", 2, 1), [0, 1])
    rows = flatten(trajs)
    assert len(rows) >= 3 and retokenized(rows) == 0 == stats.retokenized
    a, b, c = rows[:3]
    before = list(c.response_ids)
    a.response_ids = a.response_ids + [tok.eos_token_id]  # a stop token appended
    b.prompt_ids = tok(tok.decode(b.prompt_ids).replace("<|im_start|>", "<|im_start|> "),
                       add_special_tokens=False).input_ids  # a prompt rebuilt from (slightly different) text
    c.response_ids = tok(c.response_text, add_special_tokens=False).input_ids  # the answer re-encoded
    expect = 2 + (c.response_ids != before)  # c's re-encoding may happen to give the same ids
    assert retokenized(rows) == expect
    assert len(trained(rows)) == len(rows)
    m = iteration_metrics(Phases(played=trajs, clean=len(trajs), rollout=RolloutStats(retokenized=expect),
                                 sampling={}, faults={}, advantages=np.zeros(0), nonfinite_rewards=0,
                                 nonfinite_advantages=0, bad_update_streak=0), 2, len(rows))
    assert m["rollout/retokenized"] == float(expect)


def test_engine_prompt_ids_of_text_prompts_are_the_re_encoding(tiny_policy):
    _, tok = tiny_policy
    ids = [i for ch in "go north" for i in tok(ch, add_special_tokens=False).input_ids]  # not the canonical ids

    class TextEngine:
        cfg = ModelSection(name_or_path="tiny", generator="openai", openai={"prompt_format": "text"}).openai
        tok = tiny_policy[1]

    out = Generation([1], [0.0], "")
    assert engine_prompt_ids(TextEngine(), ids, out) == tok("go north", add_special_tokens=False).input_ids != ids
    assert engine_prompt_ids(object(), ids, out) == ids  # an ids engine feeds them verbatim
    out.prompt_ids = [5, 6]  # an engine that reports what it consumed is believed
    assert engine_prompt_ids(TextEngine(), ids, out) == [5, 6]


# -- a trainer's iterations: GRPO, and RTPO's siblings forked from snapshots --------------------------------
def _trainer(tmp_path, algorithm: str):
    from slea.trainer.rl import Trainer

    cfg = build_config({
        "run": {"dir": str(tmp_path / "run"), "seed": 1},
        "model": {"name_or_path": "tiny", "lora": True, "lora_r": 4, "dtype": "float32"},
        "env": {"id": "slea/Sokoban-v0", "max_steps": 3},
        "rollout": {"groups": 2, "group_size": 3, "max_new_tokens": 4, "history": 1},
        "algorithm": {"name": algorithm, "skip_zero_advantage": False},
        "train": {"iterations": 1, "updates_per_iter": 1},
        "eval": {"before": False, "games": 1, "episodes_per_game": 1, "greedy": False}})
    tr = Trainer(cfg)
    engine = Recording(tr.generator, tr.tok)
    tr.collector.gen = engine
    samples = []
    real = tr.advantages
    tr.advantages = lambda trajs: (est := real(trajs), samples.extend(est.samples))[0]
    return tr, engine, samples


@pytest.mark.slow  # a trainer, its iteration and (GRPO) the held-out evaluation: ~10-15 s on 2 cores
@pytest.mark.parametrize("algorithm", ["grpo", "rtpo"])
def test_a_trainer_iteration_trains_on_generated_ids_and_logs_zero(algorithm, tmp_path):
    tr, engine, samples = _trainer(tmp_path, algorithm)
    try:
        if algorithm == "grpo":  # the whole run: metrics.jsonl gets the count
            tr.fit()
            lines = [json.loads(line) for line in (tr.dir / "metrics.jsonl").read_text().splitlines()]
            assert lines and all(row["rollout/retokenized"] == 0 for row in lines)
        else:  # trunks, then siblings forked at every boundary (their first turn from the recorded c_k)
            m = tr.iteration(0)
            assert m["rollout/retokenized"] == 0 and m["rollout/sibling_rollouts"] > 0
    finally:
        tr.close()
        tr.log.close()
    generated = {(tuple(p), tuple(ids)) for p, (ids, _) in zip(engine.given, engine.returned)}
    assert samples and all((tuple(s.prompt_ids), tuple(s.response_ids)) in generated for s in samples)


# -- the team rollout -----------------------------------------------------------------------------------------
def test_team_rollout_trains_on_generated_ids(tiny_policy):
    pytest.importorskip("textworld")
    from slea.algorithms import get_algorithm
    from slea.team import get_router, get_team_task
    from slea.team.policy import build_team_policy
    from slea.team.prompt_builder import TeamPromptBuilder
    from slea.team.rollout import TeamCollector
    from slea.trainer.team import agent_samples

    torch.manual_seed(0)
    team = build_team_policy(ModelSection(name_or_path="tiny", dtype="float32", lora_r=4), ["planner", "actor"])
    engine = Recording(HFGenerator(team.model, team.tok, dtype="float32"), team.tok)
    task = get_team_task("textworld_planner_actor")
    col = TeamCollector(team, engine, TeamPromptBuilder(team.tok, context_messages=6, message_max_chars=120), task,
                        get_router("round_robin"), RolloutSection(max_new_tokens=6), max_turns=4)
    pool = EnvPool("slea/TextWorld-v0", 1, 2, {"tasks": ["coin_collector:1"], "num_games": 2})
    episodes, stats = col.collect(pool, [0])
    pool.close()
    rows = [s for e in episodes for s in e.trajectory.steps]
    assert len(rows) >= 4 and stats.retokenized == 0 == retokenized(rows)
    spec = get_algorithm("teamtr")
    samples = [s for agent in (0, 1)
               for s in agent_samples(episodes, agent, spec, {}, penalty_at="step", skip_zero=False)]
    assert len(samples) == len(rows)
    assert Counter((tuple(s.prompt_ids), tuple(s.response_ids), tuple(s.old_logprobs)) for s in samples) \
        == engine.generated()


# -- the openai engine: what a served model consumed, seen by the server ------------------------------------
@pytest.fixture(scope="module")
def served():
    pytest.importorskip("httpx")
    from slea.policy.server import load_engine, make_server

    engine = load_engine("tiny", dtype="float32")
    consumed: list[list[int]] = []
    real = engine._tokens  # one prompt's ids, as the engine will consume them
    engine._tokens = lambda prompt: (out := real(prompt), consumed.append(list(out)))[0]
    server = make_server(engine, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield consumed, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


class PiecewiseBuilder(PromptBuilder):
    """Prompts whose goal line is one token per character: not the tokenizer's encoding of their own text (as a
    prompt assembled from token pieces can be), so a server that re-tokenizes the text consumes other ids."""

    def encode(self, messages):
        ids = super().encode(messages)
        goal = self.tokenizer("Goal:", add_special_tokens=False).input_ids
        at = next(i for i in range(len(ids)) if ids[i:i + len(goal)] == goal)
        pieces = [i for ch in "Goal:" for i in self.tokenizer(ch, add_special_tokens=False).input_ids]
        return ids[:at] + pieces + ids[at + len(goal):]


@pytest.mark.parametrize(("fmt", "piecewise"), [("ids", True), ("text", False), ("text", True)])
def test_openai_engine_prompts_as_ids_are_exact_and_text_re_tokenization_is_counted(fmt, piecewise, served,
                                                                                     tiny_policy):
    from slea.policy.engines import make_generator

    consumed, url = served
    consumed.clear()
    model, tok = tiny_policy
    gen = make_generator(ModelSection(name_or_path="tiny", dtype="float32", generator="openai",
                                      openai={"base_url": url, "timeout_s": 30, "prompt_format": fmt}), model, tok)
    builder = (PiecewiseBuilder if piecewise else PromptBuilder)(tok, history=1)
    col = RolloutCollector(gen, builder, RolloutSection(max_new_tokens=4), max_steps=2)
    try:
        trajs, stats = col.collect(EnvPool("slea/Sokoban-v0", 2, 1), [0, 1])
    finally:
        gen.close()
    rows = flatten(trajs)
    assert len(consumed) == len(rows) >= 2
    differ = sum(list(r.prompt_ids) != c for r, c in zip(rows_in_call_order(trajs), consumed))
    assert stats.retokenized == retokenized(rows) == differ
    # as ids the server consumes the trained ids; as text, the prompts the round trip changes: all piecewise ones,
    # none of the builder's own (its prompts are the tokenizer's encoding of their text)
    assert differ == (len(rows) if fmt == "text" and piecewise else 0)


def rows_in_call_order(trajs):
    """Step rows in the order the engine saw them: by turn, then by env."""
    return [r for _, r in sorted(((r.step, i), r) for i, t in enumerate(trajs) for r in t.steps)]


# -- tool envs: the model's own tool-call syntax -----------------------------------------------------------------
@pytest.mark.parametrize("template", ["fallback", "native"])
def test_tool_turns_train_on_exactly_the_generated_ids(template, tiny_policy):
    """A tool env (slea/ToolCalc-v0) played through the collector, in the fallback rendering (the tiny model's
    template has no tools) and in a Qwen-like template's own (tools, ``tool_calls``, ``role: "tool"``): the rows
    are the generated ids, and each prompt is the chat template's rendering of the calls and tool results so far."""
    from slea.testing.chat_templates import QWEN_TEMPLATE, with_template

    model, tok = tiny_policy
    tok = tok if template == "fallback" else with_template(tok, QWEN_TEMPLATE)
    pool = EnvPool("slea/ToolCalc-v0", 1, 2)
    trajs, stats, engine, builder = _play_scripted(model, tok, pool, _tool_script(tok), history=4)
    rows = flatten(trajs)
    assert_token_exact(rows, engine, stats)
    _, scripted = trajs
    assert [s.valid for s in scripted.steps] == [False, True, True, True] and scripted.won
    assert scripted.steps[-1].reward == 1.0 and stats.parse_kinds["tool"] == 3
    # the prompts render the turns so far in the template's own syntax: the invalid answer and why, the calls
    # (as the model wrote them) and their results
    last = tok.decode(scripted.steps[-1].prompt_ids)
    assert "Your last answer was invalid: no tool call" in last
    walk = engine.walks[(3, 1)]  # the scripted calls, in the template's syntax
    assert walk[0].strip() in last and walk[1].strip() in last
    assert "<tool_response>\n77\n</tool_response>" in last and "<tool_response>\n106\n</tool_response>" in last
    msgs = scripted.steps[-1].info["messages"]
    assert [m["role"] for m in msgs][-2:] == (["assistant", "tool"] if template == "native" else ["assistant", "user"])
    assert ("tools" in msgs[0]) == (template == "native")
    # alignment data made from these rollouts re-encodes the stored messages to the same prompt ids
    for traj in trajs:
        data = from_dict(json.loads(json.dumps(to_dict(sampled_trajectory(traj, "slea/ToolCalc-v0", "train",
                                                                          builder, {})))))
        assert [encode_turn(builder, turn) for turn in data.turns] == [(r.prompt_ids, r.response_ids)
                                                                        for r in traj.steps]


def test_search_qa_tool_turns_train_on_exactly_the_generated_ids(tiny_policy, tmp_path):
    """Search-QA as tools (slea/SearchQA-tools-file-v0) in the fallback rendering: search results come back as
    tool responses, and the rows are the generated ids."""

    model, tok = tiny_policy
    pool = EnvPool("slea/SearchQA-tools-file-v0", 1, 2, _qa_files(tmp_path))
    trajs, stats, engine, _ = _play_scripted(model, tok, pool, _tool_script(tok), history=4, seed=0)
    assert_token_exact(flatten(trajs), engine, stats)
    _, scripted = trajs
    assert [s.valid for s in scripted.steps] == [False, True, True] and scripted.won
    assert "<tool_response>\nDoc 1(Title: Paris) Paris is the capital" in tok.decode(scripted.steps[-1].prompt_ids)
