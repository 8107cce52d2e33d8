from hypothesis import given, settings
from hypothesis import strategies as st

from slea.policy.prompts import PromptBuilder, clip_observation, parse_action

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
    msgs = b.messages("find the coin", "You are in a room.", ["go north", "take coin"],
                      [("Old room.", "go east"), ("Older.", "go west")], experience="Tips: go north first")
    assert msgs[0]["role"] == "system" and "Tips: go north first" in msgs[0]["content"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    user = msgs[-1]["content"]
    assert "Goal: find the coin" in user and "- take coin" in user and "You are in a room." in user
    assert "> go west" in user and "> go east" not in user  # only the last k=1 pair
    ids = b.encode(msgs)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    no_shot = PromptBuilder(tok, one_shot=False).messages("g", "o", None, [])
    assert [m["role"] for m in no_shot] == ["system", "user"]
