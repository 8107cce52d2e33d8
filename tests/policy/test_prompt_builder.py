from hypothesis import given, settings
from hypothesis import strategies as st

from slea.envs.base import DEFAULT_INSTRUCTIONS
from slea.policy.prompt_builder import PromptBuilder, clip_observation, parse_action
from slea.types import Instructions

ADM = ["go north", "take coin", "take red key", "open door"]


def test_exact_case_and_punctuation():
    assert parse_action("take coin", ADM) == ("take coin", "exact")
    assert parse_action("  Take Coin.\nmore text", ADM) == ("take coin", "exact")
    assert parse_action('"go north"', ADM) == ("go north", "exact")
    assert parse_action("Command: open door", ADM) == ("open door", "exact")


def test_contained_prefers_longest_command():
    assert parse_action("I will take red key now", ADM) == ("take red key", "contained")
    # "take coin" inside a word boundary only
    assert parse_action("retake coins", ADM)[1] != "contained"


def test_fuzzy_and_invalid():
    assert parse_action("go nort", ADM) == ("go north", "fuzzy")
    assert parse_action("dance wildly", ADM) == (None, "invalid")
    assert parse_action("", ADM) == (None, "invalid")
    assert parse_action("\n\n  \n", ADM) == (None, "invalid")
    assert parse_action(None, ADM) == (None, "invalid")


def test_open_action_space_takes_first_line():
    text = "<think>hmm</think>\n<search>Red Shoes</search>"
    assert parse_action(text, None) == (text, "free")  # the env parses tags; case is kept
    assert parse_action("  \n ", None) == (None, "invalid")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parse_never_raises(text):
    act, kind = parse_action(text, ADM)
    assert kind in {"exact", "contained", "fuzzy", "invalid"}
    assert act is None or act in ADM


def test_clip_observation():
    assert clip_observation("abc", 10) == "abc"
    out = clip_observation("x" * 50, 20)
    assert len(out) == 20 and out.endswith("...")


def test_prompt_contains_parts_and_one_shot(tiny_policy):
    _, tok = tiny_policy
    b = PromptBuilder(tok, history=1, obs_max_chars=200, one_shot=True)
    ins = DEFAULT_INSTRUCTIONS
    msgs = b.messages(ins, "find the coin", "You are in a room.", ["go north", "take coin"],
                      [("Old room.", "go east"), ("Older.", "go west")], experience="Tips: go north first")
    assert msgs[0] == {"role": "system", "content": ins.system + "\n\nTips: go north first"}
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert (msgs[1]["content"], msgs[2]["content"]) == ins.example[0]
    user = msgs[-1]["content"]
    assert "Goal: find the coin" in user and "- take coin" in user and "You are in a room." in user
    assert "> go west" in user and "> go east" not in user  # only the last k=1 pair
    assert user.endswith("\nYour command:")
    ids = b.encode(msgs)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert b.build(ins, "find the coin", "You are in a room.", ["take coin"], []) == b.encode(
        b.messages(ins, "find the coin", "You are in a room.", ["take coin"], []))
    no_shot = PromptBuilder(tok, one_shot=False).messages(ins, "g", "o", None, [])
    assert [m["role"] for m in no_shot] == ["system", "user"] and no_shot[0]["content"] == ins.system


FAMILY = Instructions(
    system="You are a tester. Reply with <answer> x </answer>. " + "Rules. " * 40,
    example=(("Goal: g1\nObservation: o1\nYour reply:", "<think> a </think>\n<answer> b </answer>"),
             ("Goal: g2\nObservation: o2\nYour reply:", "<answer> c </answer>")),
    answer_cue="Your reply:",
    multiline=True,
)


def test_the_family_renders_its_own_system_example_and_cue():
    msgs = PromptBuilder(None).messages(FAMILY, "the goal", "an observation", None, [])
    assert msgs[0] == {"role": "system", "content": FAMILY.system}
    assert [(m["role"], m["content"]) for m in msgs[1:5]] == [
        ("user", FAMILY.example[0][0]), ("assistant", FAMILY.example[0][1]),
        ("user", FAMILY.example[1][0]), ("assistant", FAMILY.example[1][1])]
    assert msgs[-1] == {"role": "user", "content": "Goal: the goal\nObservation: an observation\nYour reply:"}
    assert "Your command:" not in str(msgs)  # nothing of the text-game default leaks in


def test_a_tiny_obs_limit_clips_only_the_observation():
    obs = "You are in a long hall. " * 20
    past = [("An earlier room with many things in it. " * 5, "go east")]
    msgs = PromptBuilder(None, history=1, obs_max_chars=24).messages(FAMILY, "the goal", obs, ["a", "b"], past,
                                                                     experience="Lesson: look first.")
    assert msgs[0]["content"] == FAMILY.system + "\n\nLesson: look first."  # whole, never clipped
    assert [m["content"] for m in msgs[1:5]] == [t for pair in FAMILY.example for t in pair]
    user = msgs[-1]["content"]
    shown = user.split("Observation: ", 1)[1].split("\n", 1)[0]
    assert shown == clip_observation(obs, 24) and len(shown) == 24 and shown.endswith("...")
    assert obs.strip() not in user
    assert f"[{clip_observation(past[0][0], 12)}] > go east" in user  # past observations get half the limit
    assert user.endswith("- a\n- b\nYour reply:")


def test_summary_psi_lists_the_actions_before_the_window_and_only_those():
    past = [(f"room {i}", f"go  {d}") for i, d in enumerate(["north", "east", "south", "west"])]
    plain = PromptBuilder(None, history=2).messages(FAMILY, "g", "here", None, past)[-1]["content"]
    assert "Earlier actions" not in plain  # off by default: the turns before the window are dropped
    b = PromptBuilder(None, history=2, summary=True)
    user = b.messages(FAMILY, "g", "here", None, past)[-1]["content"]
    assert user.splitlines()[:4] == ["Goal: g", "Earlier actions: go north; go east (2 turns)", "Recent steps:",
                                     "[room 2] > go  south"]
    assert b.earlier(past[:2]) == ""  # nothing older than the window
    assert PromptBuilder(None, history=0, summary=True).earlier(past[:1]) == "go north (1 turn)"
    tight = PromptBuilder(None, history=0, summary=True, obs_max_chars=40)  # 20 characters for the summary
    assert tight.earlier(past) == "…; go south; go west (4 turns)"  # the latest actions that fit, oldest dropped


def test_from_rollout_carries_the_summary_setting():
    from slea.config import RolloutSection

    assert PromptBuilder.from_rollout(None, RolloutSection(history_summary=True, history=1)).summary
    assert not PromptBuilder.from_rollout(None, RolloutSection()).summary


def test_experience_in_user_puts_the_lessons_before_the_cue_and_shows_the_familys_lesson_example():
    lesson = "Lessons:\nDo:\n- 'b' earned the reward."
    shown = Instructions(system="S.", example=(("Goal: g\nObservation: o\nYour reply:", "x"),), answer_cue="Your reply:",
                         example_with_experience=(("Goal: g\nObservation: o\nLessons: y\nYour reply:", "y"),))
    at_system = PromptBuilder(None).messages(shown, "the goal", "obs", ["a", "b"], [], experience=lesson)
    at_user = PromptBuilder(None, experience_in="user").messages(shown, "the goal", "obs", ["a", "b"], [],
                                                                  experience=lesson)
    assert at_system[0]["content"] == "S.\n\n" + lesson and lesson not in at_system[-1]["content"]
    assert at_system[1:3] == [{"role": "user", "content": shown.example[0][0]},
                              {"role": "assistant", "content": "x"}]
    assert at_user[0]["content"] == "S."  # the system message stays the family's own
    assert at_user[1:3] == [{"role": "user", "content": shown.example_with_experience[0][0]},
                            {"role": "assistant", "content": "y"}]
    assert at_user[-1]["content"] == f"Goal: the goal\nObservation: obs\nValid commands:\n- a\n- b\n{lesson}\nYour reply:"
    # no lessons retrieved: the user turn is the plain one; a family without a lesson example keeps its example
    plain = PromptBuilder(None, experience_in="user").messages(FAMILY, "the goal", "obs", None, [])
    assert plain == PromptBuilder(None).messages(FAMILY, "the goal", "obs", None, [])


def test_the_run_config_sets_where_experiences_go():
    from slea.config import load_config

    cfg = load_config(None, ["rollout.experience_in=user"], check_unused=False)
    assert PromptBuilder.from_rollout(None, cfg.rollout).experience_in == "user"
    assert PromptBuilder.from_rollout(None, load_config(None, [], check_unused=False).rollout).experience_in == "system"
