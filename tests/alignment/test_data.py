"""Expert data: replayed in the real envs, rendered with the rollout's own prompts (token-equal), saved as JSONL."""

import json

import pytest

from slea.alignment.data import (
    EpisodeRecord,
    Turn,
    encode_turn,
    expert_source,
    expert_trajectories,
    load_jsonl,
    replay_expert,
    save_jsonl,
)
from slea.config import RolloutSection
from slea.envs import make
from slea.envs.pool import EnvPool
from slea.policy.prompt_builder import PromptBuilder
from slea.rollout.collector import RolloutCollector
from slea.testing.scripted import ExpertGenerator

TW = "slea/TextWorld-v0"
TW_KW = {"tasks": ["coin_collector:3", "treasure_hunter:1"], "num_games": 2, "split": "train"}


@pytest.fixture(scope="module")
def tw_rollout_and_expert(tiny_policy):
    """The same two TextWorld tasks played by the rollout collector answering the expert's actions, and replayed
    as expert data, with a short history window and tight observation clipping (both exercised)."""
    pytest.importorskip("textworld")
    _, tok = tiny_policy
    rollout = RolloutSection(history=1, obs_max_chars=120)
    builder = PromptBuilder.from_rollout(tok, rollout)
    seeds = [0, 1]
    with EnvPool(TW, len(seeds), 1, TW_KW) as pool:
        walks = {s: info["walkthrough"] for s, (_, info) in zip(seeds, pool.reset(seeds))}
        collector = RolloutCollector(ExpertGenerator(tok, walks), builder, rollout, max_steps=30)
        rollouts, _ = collector.collect(pool, seeds)
    expert, dropped = expert_trajectories(TW, TW_KW, seeds, builder, max_steps=30)
    return tok, builder, rollouts, expert, dropped


def test_expert_turns_are_token_equal_to_the_rollouts_prompts(tw_rollout_and_expert):
    _, builder, rollouts, expert, dropped = tw_rollout_and_expert
    assert not dropped and len(expert) == len(rollouts) == 2
    assert max(len(t.turns) for t in expert) >= 3  # the history window (1) and clipping both come into play
    for roll, exp in zip(rollouts, expert):
        assert roll.won and exp.success and exp.source == "walkthrough"
        assert len(roll.steps) == len(exp.turns)
        for step, turn in zip(roll.steps, exp.turns):
            prompt, response = encode_turn(builder, turn)
            assert prompt == step.prompt_ids
            assert response == step.response_ids
            assert turn.action == step.action
        assert exp.ret == pytest.approx(roll.episode_return)
        assert exp.goal == roll.goal and exp.seed == roll.seed and exp.split == "train"
        assert exp.task == f"train:{roll.seed}"
    clipped = [t for e in expert for t in e.turns if "..." in t.messages[-1]["content"]]
    assert clipped, "obs_max_chars=120 should clip some observation"


def test_response_ids_are_what_the_chat_template_puts_after_the_prompt(tw_rollout_and_expert):
    """An independent reference: the model's own chat template rendering the finished assistant turn starts with
    prompt ids + response ids (the action's tokens, then the end-of-turn token)."""
    tok, builder, _, expert, _ = tw_rollout_and_expert
    for turn in (t for e in expert for t in e.turns):
        prompt, response = encode_turn(builder, turn)
        full = tok.apply_chat_template([*turn.messages, {"role": "assistant", "content": turn.action}],
                                       tokenize=False)
        ids = tok(full, add_special_tokens=False).input_ids
        assert ids[: len(prompt) + len(response)] == prompt + response
        assert response[-1] == tok.eos_token_id
        assert tok.decode(response, skip_special_tokens=True) == turn.action


def test_sampled_turns_keep_their_own_response_ids(tiny_policy):
    _, tok = tiny_policy
    builder = PromptBuilder(tok)
    turn = Turn([{"role": "user", "content": "hi"}], "go north", response_ids=[5, 6, 7])
    assert encode_turn(builder, turn)[1] == [5, 6, 7]


def _traj(**kw):
    turns = [Turn([{"role": "system", "content": "s"}, {"role": "user", "content": "Observation: é ✓"}], "take coin")]
    base = {"env": "slea/TextWorld-v0", "task": "train:3", "split": "train", "seed": 3, "goal": "find the coin",
            "source": "walkthrough", "success": True, "ret": 1.0, "turns": turns}
    return EpisodeRecord(**{**base, **kw})


def test_jsonl_round_trip(tmp_path):
    trajs = [_traj(), _traj(source="sampled", success=False, ret=-0.1, seed=4, task_type="coin",
                            turns=[Turn([{"role": "user", "content": "x"}], "blah", response_ids=[1, 2])],
                            final_info={"score": 0.0})]
    path = save_jsonl(tmp_path / "d" / "expert.jsonl", trajs)
    assert load_jsonl(path) == trajs
    assert len(path.read_text().splitlines()) == 2
    assert "response_ids" not in json.loads(path.read_text().splitlines()[0])["turns"][0]  # expert: derived
    assert [p.name for p in path.parent.iterdir()] == ["expert.jsonl"]  # no temporary file left behind


@pytest.mark.parametrize(("line", "needle"), [
    ("{not json", "expert.jsonl:2"),
    ('{"env": "x"}', "missing field 'task'"),
    ('{"a": 1, "env": "x"}', "unknown field 'a'"),
])
def test_malformed_lines_name_file_and_line(tmp_path, line, needle):
    path = save_jsonl(tmp_path / "expert.jsonl", [_traj()])
    path.write_text(path.read_text() + line + "\n")
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        load_jsonl(path)


def test_unknown_source_and_bad_turns_are_refused(tmp_path):
    row = json.loads(json.dumps({**_traj().__dict__, "turns": []}))
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({**row, "source": "oracle"}) + "\n")
    with pytest.raises(ValueError, match="x.jsonl:1: source 'oracle'"):
        load_jsonl(path)
    path.write_text(json.dumps({**row, "turns": [{"action": 3}]}) + "\n")
    with pytest.raises(ValueError, match=r"turns\[0\]"):
        load_jsonl(path)


def test_webshop_goal_product_replays_win():
    builder = PromptBuilder(None)
    trajs, dropped = expert_trajectories("slea/WebShop-v0", {"split": "train"}, [0, 1, 2], builder, max_steps=15)
    assert not dropped and len(trajs) == 3
    for t in trajs:
        assert t.source == "goal_product" and t.success and t.ret == pytest.approx(1.0)
        assert t.final_info["score"] == 100.0
        assert t.turns[0].action.startswith("search[") and t.turns[-1].action == "click[buy now]"
        # the first prompt is the one a rollout shows: the family's system prompt, its example, then the turn
        msgs = t.turns[0].messages
        assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
        assert msgs[-1]["content"].startswith(f"Goal: {t.goal}") and msgs[-1]["content"].endswith("Your action:")


def test_search_qa_gold_answer_searches_then_answers():
    pytest.importorskip("fanoutqa")
    trajs, dropped = expert_trajectories("slea/SearchQA-v0", {"split": "train"}, [0, 1], PromptBuilder(None),
                                         max_steps=4)
    assert not dropped and len(trajs) == 2
    for t in trajs:
        assert t.source == "gold_answer" and t.success and t.final_info["em"] == 1.0
        assert [turn.action[:8] for turn in t.turns] == ["<search>", "<answer>"]
        assert "<information>" in t.turns[1].messages[-1]["content"]  # the retrieval result is in the prompt


def test_search_qa_tools_expert_answers_in_the_models_tool_syntax_token_equal_to_a_rollout(tiny_policy, qa_files):
    """The tools version's expert (search the question, answer the gold answer) is written as the rollout's own
    tool calls (the tiny model's template renders no tools: the fallback's <tool_call> blocks): a rollout whose
    model answers that text has the expert turns' prompt and response ids, step for step."""
    env_id, kw = "slea/SearchQA-tools-file-v0", qa_files
    _, tok = tiny_policy
    rollout = RolloutSection(history=1, max_new_tokens=64)
    builder = PromptBuilder.from_rollout(tok, rollout)
    assert expert_source(env_id) == "gold_answer"
    expert, dropped = expert_trajectories(env_id, kw, [0, 1], builder, max_steps=4)
    assert not dropped and len(expert) == 2
    for t in expert:
        assert t.success and t.skipped == 0 and t.final_info["em"] == 1.0 and len(t.turns) == 2
        search, answer = (json.loads(x.action.split("\n")[1]) for x in t.turns)
        assert t.turns[0].action.startswith("<tool_call>\n") and t.turns[0].action.endswith("\n</tool_call>")
        assert search == {"name": "search", "arguments": {"query": t.goal}}
        assert answer["name"] == "answer" and answer["arguments"]["text"] in ("Paris", "Berlin")
        assert "<tool_response>" in t.turns[1].messages[-1]["content"]  # the search result is in the prompt
    with EnvPool(env_id, 2, 1, kw) as pool:
        walks = {s: [t.action for t in e.turns] for s, e in zip([0, 1], expert)}
        rollouts, _ = RolloutCollector(ExpertGenerator(tok, walks), builder, rollout, max_steps=4).collect(pool,
                                                                                                           [0, 1])
    for roll, exp in zip(rollouts, expert):
        assert roll.won and len(roll.steps) == len(exp.turns)
        for step, turn in zip(roll.steps, exp.turns):
            assert step.valid and step.response_text == turn.action
            assert encode_turn(builder, turn) == (step.prompt_ids, step.response_ids)
    # without a tokenizer (slea data expert, slea align's expert stage) the messages are the same
    plain, _ = expert_trajectories(env_id, kw, [0, 1], PromptBuilder.from_rollout(None, rollout), max_steps=4)
    assert [[(x.messages, x.action) for x in t.turns] for t in plain] == \
        [[(x.messages, x.action) for x in t.turns] for t in expert]


def test_replays_that_do_not_fit_are_dropped_and_counted():
    env = make("slea/WebShop-v0", split="train")
    traj, why = replay_expert(env, "slea/WebShop-v0", 0, PromptBuilder(None), max_steps=2)
    assert traj is None and why == "too many steps"
    trajs, dropped = expert_trajectories("slea/WebShop-v0", {"split": "train"}, [0, 1], PromptBuilder(None),
                                         max_steps=2)
    assert trajs == [] and dropped == {"too many steps": 2}


def test_expert_sources_are_declared_by_the_families():
    assert expert_source("slea/TextWorld-v0") == "walkthrough"
    assert expert_source("slea/WebShop-v0") == "goal_product"
    assert expert_source("slea/ALFWorld-Gen-v0") == "expert_plan"
    assert expert_source("slea/ScienceWorld-v0") == "gold_path"
    assert expert_source("slea/SearchQA-v0") == "gold_answer"
    assert expert_source("slea/WebShopServer-v0") is None  # the server's goals are the server's
    with pytest.raises(ValueError, match="no expert source"):
        expert_trajectories("slea/WebShopServer-v0", {}, [0], PromptBuilder(None))


class WithExtraExpertActions:
    """A real WebShop env whose expert plays two extra actions a rollout would not play: on the search page (free
    text) ``click[buy now]``, which the env refuses, and on the results page ``click[next >>]``, which is not in
    the valid-command list (the rollout's parser would step its fuzzy match ``click[next >]`` instead)."""

    def __init__(self, env):
        self.env = env
        self.instructions, self.expert_source = env.instructions, env.expert_source

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        walk = info["walkthrough"]
        return obs, {**info, "walkthrough": ["click[buy now]", walk[0], "click[next >>]", *walk[1:]]}

    def step(self, action):
        return self.env.step(action)


def test_actions_the_rollout_would_not_play_are_skipped_and_counted():
    env = make("slea/WebShop-v0", split="train")
    plain, _ = replay_expert(env, "slea/WebShop-v0", 0, PromptBuilder(None))
    traj, why = replay_expert(WithExtraExpertActions(env), "slea/WebShop-v0", 0, PromptBuilder(None))
    assert why == "" and traj.skipped == 2 and plain.skipped == 0
    assert [t.action for t in traj.turns] == [t.action for t in plain.turns]
    assert [t.messages for t in traj.turns] == [t.messages for t in plain.turns]


def test_turns_over_the_token_budget_are_counted(tiny_policy):
    from slea.alignment.data import turns_over_budget

    _, tok = tiny_policy
    n = len(tok("take coin", add_special_tokens=False).input_ids) + 1  # the action's tokens, then EOS
    trajs = [_traj(), _traj(source="sampled", turns=[Turn([], "take coin", response_ids=[1] * 50)])]
    assert turns_over_budget(trajs, tok, n) == 0
    assert turns_over_budget(trajs, tok, n - 1) == 1  # the sampled turn's own ids are what they are
