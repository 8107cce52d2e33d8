"""A user's demonstrations of a tool env (slea data demos): replayed in the real env, rendered as the rollout renders
its prompts (token-equal), kept only when every call is taken and the episode is won; slea align reads them."""

import contextlib
import json
import re
import sys
from pathlib import Path

import pytest

from slea.alignment.data import (
    Demonstration,
    calls_play,
    demonstration_trajectories,
    encode_turn,
    load_jsonl,
    parse_demonstrations,
    save_jsonl,
)
from slea.alignment.pipeline import expert_file
from slea.config import ConfigError, RolloutSection
from slea.envs.pool import EnvPool
from slea.envs.tools import calc_tasks
from slea.policy.prompt_builder import PromptBuilder
from slea.rollout.collector import RolloutCollector
from slea.testing.scripted import ExpertGenerator

ROOT = Path(__file__).resolve().parents[2]
CALC = "slea/ToolCalc-v0"
KW = {"split": "train"}


@pytest.fixture(autouse=True)
def _forget_the_howto_env():
    """The CLI tests import docs/howto/my_units.py in this process, which registers howto/Units-v0: forgotten after
    each test (and the module with it, so a later import registers it again), as other tests list the registry."""
    yield
    import gymnasium as gym

    from slea.envs import base

    base._REGISTRY.pop("howto/Units-v0", None)
    gym.registry.pop("howto/Units-v0", None)
    sys.modules.pop("docs.howto.my_units", None)


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


def play_calc(task, call):
    """A scripted play that reads the tools' results: ``What is a * b + c?`` -> multiply, add, answer."""
    a, b, c = (int(x) for x in re.findall(r"\d+", task["goal"]))
    product = call("multiply", a=a, b=b)
    total = call("add", a=int(product), b=c)
    call("answer", value=int(total))


def test_a_played_demonstration_is_token_equal_to_the_collectors_rollout(tiny_policy):
    """The collector, its model answering each demonstration turn's text, builds exactly the demonstration's prompt
    and response ids at every step (history 1 of 3 turns: the window comes into play)."""
    _, tok = tiny_policy
    rollout = RolloutSection(history=1, max_new_tokens=64)
    builder = PromptBuilder.from_rollout(tok, rollout)
    seeds = [0, 1]
    demos, dropped = demonstration_trajectories(CALC, KW, [(s, play_calc) for s in seeds], builder, max_steps=4)
    assert dropped == [] and [d.seed for d in demos] == seeds
    with EnvPool(CALC, len(seeds), 1, KW) as pool:
        answers = {d.seed: [t.action for t in d.turns] for d in demos}
        rollouts, _ = RolloutCollector(ExpertGenerator(tok, answers), builder, rollout, max_steps=4).collect(pool,
                                                                                                              seeds)
    for roll, demo in zip(rollouts, demos):
        assert roll.won and demo.success and demo.source == "demonstration" and demo.task == f"train:{demo.seed}"
        assert len(roll.steps) == len(demo.turns) == 3 and demo.ret == pytest.approx(roll.episode_return) == 1.0
        for step, turn in zip(roll.steps, demo.turns):
            assert step.valid and step.response_text == turn.action
            assert encode_turn(builder, turn) == (step.prompt_ids, step.response_ids)
        assert demo.turns[0].action.startswith("<tool_call>\n{\"name\": \"multiply\"")
        assert "<tool_response>" in demo.turns[2].messages[-1]["content"]  # the add result is in the last prompt
    # without a tokenizer (the CLI) the messages are the same
    plain, _ = demonstration_trajectories(CALC, KW, [(s, play_calc) for s in seeds],
                                          PromptBuilder.from_rollout(None, rollout), max_steps=4)
    assert [[(t.messages, t.action) for t in d.turns] for d in plain] == \
        [[(t.messages, t.action) for t in d.turns] for d in demos]


def test_a_list_of_calls_gives_the_same_data_as_a_play_function():
    task = calc_tasks("train")[5]
    a, b, c = (int(x) for x in re.findall(r"\d+", task["goal"]))
    demo = Demonstration(5, [[call("multiply", a=a, b=b)], [call("add", a=a * b, b=c)], [call("answer", value=a * b + c)]])
    builder = PromptBuilder(None, history=2)
    listed, _ = demonstration_trajectories(CALC, KW, [(5, calls_play(demo))], builder)
    played, _ = demonstration_trajectories(CALC, KW, [(5, play_calc)], builder)
    assert len(listed) == len(played) == 1
    assert [(t.messages, t.action) for t in listed[0].turns] == [(t.messages, t.action) for t in played[0].turns]


def test_several_calls_in_one_turn_are_one_turn():
    task = calc_tasks("train")[0]
    a, b, c = (int(x) for x in re.findall(r"\d+", task["goal"]))
    demo = Demonstration(0, [[call("multiply", a=a, b=b), call("add", a=a * b, b=c)], [call("answer", value=a * b + c)]])
    [kept], dropped = demonstration_trajectories(CALC, KW, [(0, calls_play(demo))], PromptBuilder(None))
    assert dropped == [] and len(kept.turns) == 2
    assert kept.turns[0].action.count("<tool_call>") == 2
    shown = kept.turns[1].messages[-1]["content"]  # one result per call, in order
    assert shown == f"<tool_response>\n{a * b}\n</tool_response>\n<tool_response>\n{a * b + c}\n</tool_response>"


def test_failing_demonstrations_are_dropped_with_the_reason():
    task = calc_tasks("train")[0]
    a, b, c = (int(x) for x in re.findall(r"\d+", task["goal"]))
    right = [[call("multiply", a=a, b=b)], [call("add", a=a * b, b=c)], [call("answer", value=a * b + c)]]

    def raises(task, call):
        call("multiply", a=a, b=b)
        raise KeyError("value")

    def swallows(task, call):  # catches the refused call's exception and plays on to a win
        with contextlib.suppress(Exception):
            call("divide", a=a, b=b)
        for calls in right:
            call.turn(calls)

    plays = [
        (0, calls_play(Demonstration(0, right))),                                        # kept
        (0, calls_play(Demonstration(0, [*right[:2], [call("answer", value=a * b + c + 1)]]))),  # wrong answer
        (0, calls_play(Demonstration(0, [[call("divide", a=a, b=b)], *right[1:]]))),      # unknown tool
        (0, calls_play(Demonstration(0, [[call("add", a="x", b=c)], *right[1:]]))),       # wrong argument type
        (0, calls_play(Demonstration(0, [*right, [call("answer", value=1)]]))),           # a call after the end
        (0, calls_play(Demonstration(0, right[:2]))),                                     # stops before the end
        (0, raises),                                                                       # the play fails
        (0, calls_play(Demonstration(0, [right[0], *right]))),                            # past max_steps=3
        (0, swallows),                                                                     # still dropped
    ]
    kept, dropped = demonstration_trajectories(CALC, KW, plays, PromptBuilder(None), max_steps=3)
    assert len(kept) == 1 and kept[0].success and kept[0].ret == 1.0
    assert [why for _, why in dropped] == [
        "not won (return 0)",
        "a call was refused: unknown tool 'divide'; the tools are: add, multiply, answer",
        "a call was refused: wrong arguments for add: a must be integer",
        "a call after the episode ended",
        "not finished (no final tool was called)",
        "the play function raised KeyError: 'value'",
        "too many steps (more than 3)",
        "a call was refused: unknown tool 'divide'; the tools are: add, multiply, answer",
    ]


def test_the_play_function_gets_the_task_the_env_picked():
    seen = []

    def play(task, call):
        seen.append(task)
        call("answer", value=task["answer"])

    kept, _ = demonstration_trajectories(CALC, KW, [(3, play), (203, play)], PromptBuilder(None))
    tasks = calc_tasks("train")
    assert seen == [tasks[3], tasks[3]]  # seed modulo the 200 tasks, as the env's reset picks
    assert [t.goal for t in kept] == [tasks[3]["goal"]] * 2 and len(kept[0].turns) == 1


def test_malformed_demonstrations_are_refused_naming_the_entry():
    assert parse_demonstrations([{"seed": 2, "calls": [call("answer", value=1)]}]) == \
        [Demonstration(2, [[call("answer", value=1)]])]
    assert parse_demonstrations([{"seed": 0, "calls": [{"name": "answer"}]}])[0].turns == [[{"name": "answer"}]]
    for rows, needle in [
        ([{"seed": -1, "calls": [call("a")]}], "demonstration 0: seed"),
        ([{"seed": 0, "calls": [call("a")]}, {"seed": True, "calls": [call("a")]}], "demonstration 1: seed"),
        ([{"seed": 0, "calls": []}], "calls must be a non-empty list"),
        ([{"seed": 0, "calls": [{"arguments": {}}]}], "every call is an object"),
        ([{"seed": 0, "calls": [{"name": "a", "arguments": [1]}]}], "every call is an object"),
        ([{"seed": 0, "calls": [[]]}], "every call is an object"),
        ([{"seed": 0, "calls": [call("a")], "extra": 1}], "expected {'seed': int, 'calls': [...]}"),
    ]:
        with pytest.raises(ValueError, match=re.escape(needle)):
            parse_demonstrations(rows)
    with pytest.raises(TypeError, match="expected a JSON list"):
        parse_demonstrations({"seed": 0})


def test_a_text_env_is_refused():
    with pytest.raises(ValueError, match="not a tool env"):
        demonstration_trajectories("slea/WebShop-v0", KW, [(0, play_calc)], PromptBuilder(None))


def test_the_expert_file_is_checked_against_the_run(tmp_path):
    """align.expert_file: read when made for the run's env, env kwargs, prompt settings and step budget."""
    builder = PromptBuilder(None, history=2)
    kept, _ = demonstration_trajectories(CALC, KW, [(0, play_calc), (1, play_calc)], builder)
    path = save_jsonl(tmp_path / "demos.jsonl", kept)
    prompt = {"history": 2, "obs_max_chars": builder.obs_max_chars, "one_shot": builder.one_shot}
    assert [t.seed for t in expert_file(str(path), CALC, KW, prompt, 3)] == [0, 1]
    for args, needle in [
        (("slea/SearchQA-tools-v0", KW, prompt, 3), "env slea/ToolCalc-v0 (the run plays slea/SearchQA-tools-v0)"),
        ((CALC, {"split": "heldout"}, prompt, 3), "env kwargs {'split': 'train'}"),
        ((CALC, KW, {**prompt, "history": 1}, 3), "prompt settings"),
        ((CALC, KW, prompt, 2), "3 turns (env.max_steps is 2)"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(f"{path}:1 was made with {needle}")):
            expert_file(str(path), *args)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError, match="holds no episode"):
        expert_file(str(tmp_path / "empty.jsonl"), CALC, KW, prompt, 3)
    with pytest.raises(ConfigError, match="align.expert_file: .*No such file"):
        expert_file(str(tmp_path / "none.jsonl"), CALC, KW, prompt, 3)


def test_slea_data_demos_on_the_howto_files(slea_cli, tmp_path):
    """The page's demonstrations file: 3 of 5 kept, the wrong answer and the refused call dropped with why; the
    play function on 4 tasks keeps them all, in the format slea align reads."""
    cfg = ["--config", "docs/howto/my_units.yaml", "--no-tokens"]
    r = slea_cli("data", "demos", *cfg, "--demos", "docs/howto/my_units_demos.json", "--out", tmp_path / "l.jsonl",
                 cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[:3] == [
        "kept 3 of 5 demonstrations (6 turns, 2.0 per episode)",
        "dropped seed 3: not won (return 0)",
        "dropped seed 4: a call was refused: wrong arguments for convert: missing a required argument: 'value'"]
    assert [t.seed for t in load_jsonl(tmp_path / "l.jsonl")] == [0, 1, 2]
    r = slea_cli("data", "demos", *cfg, "--play", "docs.howto.my_units:play", "-n", 4, "--out", tmp_path / "p.jsonl",
                 cwd=ROOT)
    assert r.returncode == 0 and "kept 4 of 4 demonstrations (8 turns" in r.stdout, r.stdout + r.stderr
    played = load_jsonl(tmp_path / "p.jsonl")
    assert all(t.source == "demonstration" and t.env == "howto/Units-v0" for t in played)
    listed = load_jsonl(tmp_path / "l.jsonl")
    assert [t.turns for t in played[:3]] == [t.turns for t in listed]  # the function plays what the list says


def test_slea_data_demos_lists_at_most_20_dropped(slea_cli, tmp_path):
    """The units play function on ToolCalc's tasks (no 'value' key): every one dropped, 20 listed with why."""
    r = slea_cli("data", "demos", "--env", CALC, "--play", "docs.howto.my_units:play", "-n", 22, "--no-tokens",
                 "--out", tmp_path / "none.jsonl", cwd=ROOT)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[0] == "kept 0 of 22 demonstrations (0 turns, 0.0 per episode)", r.stdout
    assert lines[1:21] == [f"dropped seed {k}: the play function raised KeyError: 'value'" for k in range(20)]
    assert lines[21:] == ["and 2 more dropped", f"wrote {tmp_path / 'none.jsonl'}"]
    assert load_jsonl(tmp_path / "none.jsonl") == []


@pytest.mark.parametrize(("args", "needle"), [
    (["--play", "docs.howto.my_units:play"], "--play needs -n"),
    (["--demos", "docs/howto/my_units_demos.json", "-n", "2"], "-n goes with --play"),
    ([], "give either --demos FILE or --play MODULE:FUNCTION"),
    (["--play", "docs.howto.my_units:nope", "-n", "1"], "has no function 'nope'"),
    (["--play", "nope_module:play", "-n", "1"], "cannot import plugin module 'nope_module'"),
    (["--demos", "nope.json"], "No such file"),
    (["--play", "docs.howto.my_units:play", "-n", "1", "--first", "-1"], "--first must be at least 0"),
    (["--play", "docs.howto.my_units:play", "-n", "1", "--env", "slea/WebShop-v0"], "not a tool env"),
])
def test_slea_data_demos_refuses_bad_input_in_one_line(slea_cli, args, needle):
    r = slea_cli("data", "demos", "--config", "docs/howto/my_units.yaml", "--no-tokens", *args, cwd=ROOT)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_align_without_an_expert_or_a_file_says_what_to_do(slea_cli, tmp_path):
    r = slea_cli("align", "docs/howto/my_units.yaml", "--set", "align.expert_file=null", "--set",
                 f"run.dir={tmp_path / 'run'}", "--set", "model.name_or_path=tiny", "--set", "model.lora_layers=null",
                 cwd=ROOT)
    assert r.returncode == 2 and "howto/Units-v0 has no expert of its own" in r.stderr, r.stdout + r.stderr
    assert "align.expert_file" in r.stderr


TINY = ["--set", "model.name_or_path=tiny", "--set", "model.dtype=float32", "--set", "model.lora_r=4", "--set",
        "model.lora_alpha=8", "--set", "model.lora_layers=null", "--set", "eval.games=2", "--set",
        "rollout.groups=1", "--set", "rollout.group_size=2", "--set", "train.iterations=1"]


@pytest.mark.slow
def test_demonstrations_then_sft_then_grpo_on_the_tiny_model(slea_cli, tmp_path):
    """The page's three commands with the tiny model: demonstrations -> slea align --method sft (the file named in
    align.expert_file) -> slea train from the SFT run (model.init_from)."""
    data, sft, grpo = tmp_path / "demos.jsonl", tmp_path / "sft", tmp_path / "grpo"
    r = slea_cli("data", "demos", "--config", "docs/howto/my_units.yaml", "--play", "docs.howto.my_units:play", "-n",
                 4, "--out", data, "--no-tokens", *TINY, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    r = slea_cli("align", "docs/howto/my_units.yaml", "--set", f"align.expert_file={data}", "--set",
                 f"run.dir={sft}", "--set", "align.sft_epochs=1", *TINY, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"read 4 expert episodes from {data}" in r.stdout
    assert json.loads((sft / "sft.json").read_text())["trajectories"] == 4
    assert load_jsonl(sft / "expert.jsonl") == load_jsonl(data)
    assert (sft / "eval" / "eval-heldout.json").is_file()
    r = slea_cli("train", "docs/howto/my_units.yaml", "--set", f"model.init_from={sft}", "--set", f"run.dir={grpo}",
                 "--set", f"align.expert_file={data}", *TINY, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"init_from: {sft}" in (grpo / "config.yaml").read_text()
    assert (grpo / "eval" / "summary.json").is_file()
