"""Each env family owns its instructions (system prompt, example exchange, answer cue), and no observation
carries them (so clipping an observation can never cut them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import slea.envs
from slea.envs import make, registered
from slea.envs.base import DEFAULT_INSTRUCTIONS, TextEnv, env_class, user_turn
from slea.envs.pool import EnvPool
from slea.types import Instructions

FAMILIES = {"textworld", "alfworld", "scienceworld", "webshop", "search_qa", "sokoban", "recall", "ballot", "tools"}
# Tool envs (``tool_env``) are prompted in the model's own tool-call syntax (slea.policy.tool_calls), not with a
# text example.
# The ids whose constructor needs data of the user's: built with a tiny file instead, or skipped.
_NEEDS_OFFICIAL_DATA = {"slea/ALFWorld-Official-v0"}


def _commands(user: str) -> list[str]:
    """The ``- command`` lines of an example's user text."""
    return [line[2:] for line in user.splitlines() if line.startswith("- ")]


@pytest.fixture(scope="module")
def qa_file(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("qa")
    (root / "corpus.jsonl").write_text(json.dumps({"title": "Paris", "text": "Paris is the capital of France."}))
    (root / "q.jsonl").write_text(json.dumps({"question": "What is the capital of France?", "answer": "Paris"}))
    return {"dataset_path": str(root / "q.jsonl"), "corpus": str(root / "corpus.jsonl")}


def _build(env_id: str, qa_file: dict[str, str]) -> TextEnv:
    spec = registered()[env_id]
    if spec.missing():
        pytest.skip(f"{env_id} needs {spec.missing()}")
    if env_id in _NEEDS_OFFICIAL_DATA:
        pytest.skip("the official ALFWorld set is a download (same class as slea/ALFWorld-v0)")
    kwargs = dict(qa_file) if env_id == "slea/SearchQA-file-v0" else {}
    return make(env_id, **kwargs)


def test_every_family_is_covered():
    assert {s.family for s in registered().values() if s.family != "test"} == FAMILIES


@pytest.mark.parametrize("env_id", sorted(i for i, s in registered().items()
                                          if s.family != "test" and not getattr(env_class(i), "tool_env", False)))
def test_every_registered_env_has_its_own_instructions(env_id, qa_file):
    env = _build(env_id, qa_file)
    try:
        ins = env.instructions
        assert isinstance(ins, Instructions)
        assert ins != DEFAULT_INSTRUCTIONS
        assert ins.system != DEFAULT_INSTRUCTIONS.system and ins.example != DEFAULT_INSTRUCTIONS.example
        assert ins.system.strip() and ins.answer_cue.strip()
        assert len(ins.example) >= 1  # a 135M model needs a concrete example to answer in the right form
        for user, assistant in ins.example:
            assert user.startswith("Goal: ") and "\nObservation: " in user
            assert user.endswith("\n" + ins.answer_cue) and assistant.strip()
        # short: the system prompt and the example are re-encoded every turn
        assert len(ins.system) <= 700 and sum(len(u) + len(a) for u, a in ins.example) <= 700
    finally:
        env.close()


def test_list_picking_games_answer_from_their_example_list():
    pytest.importorskip("textworld")
    from slea.envs import alfworld, textworld

    assert textworld.INSTRUCTIONS.example != alfworld.INSTRUCTIONS.example
    for ins in (textworld.INSTRUCTIONS, alfworld.INSTRUCTIONS):
        assert "list of valid commands" in ins.system and not ins.multiline
        assert ins.answer_cue == "Your command:"
        (user, answer), = ins.example
        assert answer in _commands(user)
    (user, answer), = alfworld.INSTRUCTIONS.example
    assert answer.startswith("take ") and " from " in answer  # ALFWorld's own command form


def test_scienceworld_states_its_grammar_and_the_list_as_a_help():
    from slea.envs import scienceworld

    ins = scienceworld.INSTRUCTIONS
    for form in ("look around", "open X", "go to LOC", "pick up X", "move X to Y", "focus on X", "use X on Y",
                 "wait"):
        assert form in ins.system
    assert "copied from the list" not in ins.system  # free text: the list helps, it does not filter
    (user, answer), = ins.example
    assert answer in _commands(user) and user.endswith("Your action:")


def test_webshop_example_is_a_search_the_shop_accepts():
    from slea.envs.webshop import INSTRUCTIONS, WebShopEnv, parse_action

    assert "search[<query>]" in INSTRUCTIONS.system and "click[" in INSTRUCTIONS.system
    (user, answer), = INSTRUCTIONS.example
    assert parse_action(answer) == ("search", "blue cotton t-shirt")
    assert "Valid commands" not in user  # the search page has no list
    env = WebShopEnv(num_products=200)
    env.reset(seed=0)
    _obs, _, _, _, info = env.step(answer)
    assert not info["invalid"] and info["page"] == "results"
    assert all(a.startswith("click[") for a in info["admissible_actions"])


def test_sokoban_example_is_a_real_board_and_its_move_solves_it():
    from slea.envs.sokoban import INSTRUCTIONS, LEGEND, SokobanEnv

    assert LEGEND in INSTRUCTIONS.system and "up, down, left or right" in INSTRUCTIONS.system
    (user, answer), = INSTRUCTIONS.example
    env = SokobanEnv()
    obs, info = env.reset(options={"level": "#####\n#@$.#\n#####"})
    assert user == user_turn(info["goal"], obs, info["admissible_actions"], INSTRUCTIONS.answer_cue)
    _, reward, terminated, _, info = env.step(answer)
    assert terminated and info["won"] and reward == 1.0


def test_search_qa_instructions_leave_the_observation(qa_file):
    from slea.envs.search_qa import INSTRUCTIONS, SEARCH_R1_INSTRUCTION, SearchQAEnv, parse_action

    assert INSTRUCTIONS.multiline and INSTRUCTIONS.system == SEARCH_R1_INSTRUCTION
    for tag in ("<think>", "<search> query </search>", "<answer>"):
        assert tag in INSTRUCTIONS.system
    assert "<search>" in INSTRUCTIONS.answer_cue and "<answer>" in INSTRUCTIONS.answer_cue
    (_user, answer), = INSTRUCTIONS.example
    assert "<think>" in answer and parse_action(answer) == ("search", "Dracula novel author")

    env = SearchQAEnv(dataset="file", split="all", **qa_file)
    obs, _info = env.reset(seed=0)
    assert obs == "Question: What is the capital of France?"
    assert "<search>" not in obs and "Answer the given question" not in obs
    assert env.instructions is INSTRUCTIONS
    # Search-R1's own layout, on request: the instruction in front of the question too.
    raw = SearchQAEnv(dataset="file", split="all", instructions=True, **qa_file)
    assert raw.reset(seed=0)[0].startswith(SEARCH_R1_INSTRUCTION)
    assert raw.instructions is INSTRUCTIONS


def test_observations_do_not_repeat_the_instructions(tw_env):
    from slea.envs.sokoban import SokobanEnv
    from slea.envs.webshop import WebShopEnv

    for env in (SokobanEnv(), WebShopEnv(num_products=200), tw_env):
        ins = env.instructions
        obs, info = env.reset(seed=1)
        texts = [obs]
        for action in info["walkthrough"][:3]:
            texts.append(env.step(action)[0])
        for text in texts:
            assert ins.system not in text
            for user, _ in ins.example:
                assert user not in text


def test_pool_instructions_are_its_envs():
    from slea.envs.sokoban import INSTRUCTIONS

    pool = EnvPool("slea/Sokoban-v0", num_groups=1, group_size=2)
    assert pool.instructions is INSTRUCTIONS
    pool.envs[0] = None  # a failed rebuild: the next env answers
    assert pool.instructions is INSTRUCTIONS


def test_faulty_env_lives_in_slea_testing_and_forwards_instructions():
    src = str(Path(slea.envs.__file__).parents[2])
    code = ("import slea.envs, sys; from slea.envs import registered; "
            "print('slea/test-Faulty-v0' in registered(), 'slea.testing.faulty_env' in sys.modules); "
            "import slea.testing.faulty_env; print('slea/test-Faulty-v0' in registered())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": src})
    assert out.stdout.split() == ["False", "False", "True"]
    assert not (Path(slea.envs.__file__).parent / "faulty.py").exists()

    from slea.envs.sokoban import INSTRUCTIONS
    from slea.testing.faulty_env import FAULTY_ID

    assert make(FAULTY_ID, inner="slea/Sokoban-v0").instructions is INSTRUCTIONS
