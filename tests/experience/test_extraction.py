"""Extraction: outcome split, rule-based candidates, robust parsing of LLM output, LLM extractor fallbacks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slea.experience.extraction import extract_candidates, select, split_outcomes
from slea.experience.llm_extractor import LLMExtractor, load_template, parse_llm_list
from slea.experience.rule_extractor import (
    Names,
    RuleExtractor,
    command_shape,
    summarize_goal,
    summarize_observation,
)
from slea.types import Step, Trajectory

KITCHEN = "-= Kitchen =-\nYou are in a kitchen. There is a closed fridge and a table with an apple."


def make_traj(tid: int, actions: list[str], rewards: list[float], *, won: bool = False, truncated: bool = False,
              invalid: tuple[int, ...] = (), goal: str = "Eat the apple", task_type: str = "tw") -> Trajectory:
    t = Trajectory(group_id=0, traj_id=tid, goal=goal, task_type=task_type, won=won, truncated=truncated)
    for i, (a, r) in enumerate(zip(actions, rewards)):
        ok = i not in invalid
        t.steps.append(Step(0, tid, i, KITCHEN if i == 0 else f"You {a} and look around room {i}.", [], [], [],
                            reward=r, done=i == len(actions) - 1, valid=ok, action=a if ok else "",
                            response_text=a, task_type=task_type, cluster_id=100 + i))
    return t


def test_split_at_batch_median_and_fixed_eta():
    trajs = [make_traj(i, ["look"], [r]) for i, r in enumerate([0.0, 1.0, 0.5, 0.2])]
    eta, pos, neg = split_outcomes(trajs)
    assert eta == 0.35 and {t.traj_id for t in pos} == {1, 2} and {t.traj_id for t in neg} == {0, 3}
    eta, pos, neg = split_outcomes(trajs, 0.5)
    assert eta == 0.5 and [t.traj_id for t in pos] == [1]
    eta, top, bottom = select(trajs, "median", k_traj=1)
    assert [t.traj_id for t in top] == [1] and [t.traj_id for t in bottom] == [0]
    eta, pos, neg = split_outcomes([make_traj(i, ["look"], [0.0]) for i in range(3)])
    assert pos == [] and len(neg) == 3  # all equal: nothing beats the median


def test_rule_strategies_are_about_the_task_type_link_clusters_and_score_R():
    t = make_traj(7, ["open fridge", "take apple", "eat apple"], [0.0, 0.0, 1.0], won=True)
    cands = RuleExtractor().strategies(t)
    assert {c.level for c in cands} == {"example", "pattern", "principle"}
    assert all(c.zone == "pos" and c.score == 1.0 and c.sources == [7] for c in cands)
    ex = next(c for c in cands if c.level == "example")
    assert "'eat <object>'" in ex.text and "the goal names" in ex.text and ex.clusters == [102]
    pat = next(c for c in cands if c.level == "pattern")
    # the plan is advice from where it starts: linked to its first step's cluster only
    assert "'open <object>' → 'take <object>' → 'eat <object>'" in pat.text and pat.clusters == [100]
    assert any("Open or unlock what is closed" in c.text for c in cands)
    for c in cands:  # nothing names the game's objects: the lessons transfer
        assert "apple" not in c.text.lower() and "fridge" not in c.text.lower()


def test_rule_strategies_of_a_trajectory_that_did_not_win_stop_at_its_last_reward():
    """Above η without winning: the lessons cover the rewarded part only, never the move that lost the game."""
    t = make_traj(4, ["whistle", "clap", "kneel"], [1 / 3, 1 / 3, 0.0], won=False)
    cands = RuleExtractor().strategies(t)
    texts = " ".join(c.text for c in cands)
    assert "kneel" not in texts and "'whistle'" in texts and "'clap'" in texts
    pat = next(c for c in cands if c.level == "pattern")
    assert pat.text.startswith("A plan that earned reward: 'whistle' → 'clap' (2 steps") and pat.clusters == [100]
    assert sorted(c.clusters for c in cands if c.level == "example") == [[100], [101]]
    # nothing rewarded, nothing won: nothing to learn from (it was only less bad than the median)
    assert RuleExtractor().strategies(make_traj(5, ["look", "go west"], [0.0, 0.0])) == []
    won = RuleExtractor().strategies(make_traj(6, ["whistle", "clap"], [0.5, 0.5], won=True))
    assert next(c for c in won if c.level == "pattern").text.startswith("A winning plan:")


def test_rule_warnings_from_invalid_repeated_and_last_actions():
    t = make_traj(3, ["dance", "take table", "go west", "go west", "go west", "eat table"], [-0.1, -0.1, 0, 0, 0, 0],
                  invalid=(0, 1))
    cands = RuleExtractor().warnings(t)
    texts = " | ".join(c.text for c in cands)
    assert "A made-up command whose verb is not in the list of valid commands is rejected" in texts  # 'dance'
    assert "'take <object>' was rejected: it was not in the list of valid commands at that point" in texts
    assert "Invalid answers wasted 2 of 6 steps" in texts
    assert "Repeating 'go <direction>' (3 times)" in texts
    assert "'eat <object>' ended the episode in failure" in texts and "table" not in texts
    assert all(c.zone == "neg" and c.score == t.episode_return for c in cands)
    inv = next(c for c in cands if "made-up" in c.text)
    assert inv.clusters == [100] and inv.level == "example"
    tr = make_traj(4, ["look", "look"], [0, 0], truncated=True)
    assert any(c.level == "principle" and "Running out of steps" in c.text for c in RuleExtractor().warnings(tr))


SHOWER = "-= Shower =-\nYou've entered a shower. You see a fondue on the floor."
PLAYROOM = "-= Playroom =-\nYou are in a playroom. There is an exit to the east."
TH_GOAL = ("Who's got a virtual machine and is about to play through a fast paced round of textworld? You do! "
           "Your first objective is to recover the fondue from the floor of the shower.")


def _tw(tid, plan, *, won=False, truncated=False):
    t = Trajectory(group_id=0, traj_id=tid, goal=TH_GOAL, task_type="treasure_hunter", won=won, truncated=truncated)
    for i, (obs, act, r, ok) in enumerate(plan):
        t.steps.append(Step(0, tid, i, obs, [], [], [], reward=r, done=i == len(plan) - 1, valid=ok,
                            action=act if ok else "", response_text=act, cluster_id=i))
    return t


def test_rule_lessons_name_no_object_or_room_of_the_game():
    """Per-game recipes ("For 'recover the fondue…', take fondue") cannot help an unseen game: every rule text
    speaks of command shapes and the task type only."""
    win = _tw(1, [(PLAYROOM, "go east", 0, True), (SHOWER, "take fondue", 1.0, True)], won=True)
    lose = _tw(2, [(PLAYROOM, "I want to find the fondue", -0.1, False), (PLAYROOM, "go east", 0, True),
                   (SHOWER, "go west", 0, True), (PLAYROOM, "go east", 0, True), (SHOWER, "go west", 0, True),
                   (PLAYROOM, "look", 0, True), (PLAYROOM, "look", 0, True), (PLAYROOM, "take fondue", -0.1, False)],
               truncated=True)
    r = RuleExtractor()
    pos, neg = r.strategies(win), r.warnings(lose)
    for c in pos + neg:
        low = c.text.lower()
        assert not any(w in low for w in ("fondue", "shower", "playroom", "east", "west", "recover")), c.text
    texts = " | ".join(c.text for c in pos)
    assert "When the object the goal names is in view, 'take <object>' at once" in texts
    assert "'go <direction>' → 'take <object>'" in texts
    warn = " | ".join(c.text for c in neg)
    assert "A free-form sentence instead of a command is rejected" in warn
    assert "back and forth between the same two rooms" in warn
    assert "'look', 'examine' and 'inventory' change nothing" in warn
    assert "Running out of steps" in warn
    # two games of the same type give the same lesson texts (novelty then merges them in the library)
    other = Trajectory(group_id=1, traj_id=9, goal="Your task is to pick up the cabbage from the floor of the kitchen.",
                       task_type="treasure_hunter", won=True)
    other.steps = [Step(1, 9, 0, "-= Hall =-\nA hall.", [], [], [], action="go north", cluster_id=7),
                   Step(1, 9, 1, "-= Kitchen =-\nYou see a cabbage.", [], [], [], reward=1.0, done=True,
                        action="take cabbage", cluster_id=8)]
    assert [c.text for c in r.strategies(other)] == [c.text for c in pos]


def test_command_shapes_and_name_abstraction():
    assert command_shape("take fondue from floor") == (
        "take", "take <object> from <place>", {"fondue": "<object>", "floor": "<place>"})
    assert command_shape("unlock wooden chest with key")[1] == "unlock <object> with <tool>"
    assert command_shape("go south")[1] == "go <direction>"
    assert command_shape("go to countertop 1")[1] == "go to <place>"
    assert command_shape("put apple 1 in/on fridge 1")[1] == "put <object> in/on <place>"
    assert command_shape("look")[1] == "look" and command_shape("up")[1] == "up"
    assert command_shape("search[red running shoes]")[1] == "search[<text>]"
    assert command_shape("I think we should open it")[1] == "i …"  # prose
    assert command_shape("") == ("", "", {})
    names = Names(_tw(1, [(PLAYROOM, "go east", 0, True), (SHOWER, "take fondue", 1.0, True)], won=True))
    assert names.goal_names == {"fondue", "shower"}
    assert names.abstract("Take the fondue from the Shower, then go back to the playroom.") == (
        "Take <object> from <room>, then go back to <room>.")


def test_summarize_goal_keeps_the_task_and_drops_the_framing():
    tw = ("Hey, thanks for coming over to the TextWorld today, there is something I need you to do for me. First "
          "off, if it's not too much trouble, I need you to make an effort to take a trip south. After that, pick "
          "up the coin. Alright, thanks!")
    assert summarize_goal(tw) == "take a trip south; pick up the coin"
    assert summarize_goal("Welcome to TextWorld! Your task for today is to pick up the key from the floor.") == (
        "pick up the key from the floor")
    assert summarize_goal("Drink the milk") == "drink the milk"
    assert summarize_goal("Thenardier's key: take it. Next, unlock the chest.") == (
        "thenardier's key: take it; unlock the chest")  # framing words are cut only as whole words
    assert summarize_goal("Welcome!") == "welcome"  # nothing but framing: keep what there is
    assert summarize_goal("") == "the task"
    long = summarize_goal("Put " + "the red apple and " * 10 + "the pear in the fridge.", max_chars=40)
    assert len(long) <= 41 and long.endswith("…") and not long[:-1].endswith(" ")


def test_summarize_observation():
    assert summarize_observation(KITCHEN) == "in the kitchen: You are in a kitchen."
    assert summarize_observation("You take the apple. It is red.") == "you take the apple."
    s = summarize_observation("word " * 100)
    assert len(s) <= 91 and s.endswith("…")


MESSY = """<think>let me think about the <b>episode</b>... I should list lessons</think>
Here are the lessons:
1. principle: Always read the cookbook before cooking anything.
2) [pattern] open the fridge, then take the ingredients, then cook them
- Example: When in the kitchen with a closed fridge, type 'open fridge'.
* Tip: <|im_start|>check your inventory after each take<|im_end|>
3. ok
4. !!!!!!!!!!!!!!!!!!!!!!!
```
• Lesson 5: Do not wander between rooms without a plan (pattern)
1. principle: Always read the cookbook before cooking anything.
"""


def test_parse_messy_llm_output():
    items = parse_llm_list(MESSY)
    assert items[0] == ("principle", "Always read the cookbook before cooking anything.")
    assert items[1] == ("pattern", "open the fridge, then take the ingredients, then cook them")
    assert items[2] == ("example", "When in the kitchen with a closed fridge, type 'open fridge'.")
    assert items[3][1] == "check your inventory after each take"
    assert items[4] == ("pattern", "Do not wander between rooms without a plan")
    assert len(items) == 5  # junk, the echo heading and the repeated line are gone
    assert parse_llm_list("") == [] and parse_llm_list(None) == [] and parse_llm_list(42) == []
    assert parse_llm_list("1. 2. 3.\n- -\n#####\n") == []
    assert len(parse_llm_list("\n".join(f"{i}. lesson number {i} is useful" for i in range(30)), 4)) == 4
    inline = parse_llm_list("1. Open the fridge first please. 2. Take the apple when you see it.")
    assert [t for _, t in inline] == ["Open the fridge first please.", "Take the apple when you see it."]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_parse_never_raises_and_output_is_clean(text):
    for level, line in parse_llm_list(text):
        assert level in ("principle", "pattern", "example")
        assert "<|" not in line and "|>" not in line and 12 <= len(line) <= 300


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=200), st.integers()), max_size=4))
def test_llm_extractor_never_crashes_on_garbage(answers):
    trajs = [make_traj(1, ["take apple", "eat apple"], [0, 1], won=True), make_traj(2, ["look"], [0])]

    def gen(prompts):
        return answers

    cands = LLMExtractor(gen).extract(trajs[:1], trajs[1:])
    assert all(c.zone in ("pos", "neg") for c in cands)


def test_llm_extractor_uses_answers_and_falls_back_per_trajectory():
    win = make_traj(1, ["take apple", "eat apple"], [0, 1], won=True)
    lose = make_traj(2, ["dance"], [-0.1], invalid=(0,))
    seen = []

    def gen(prompts):
        seen.extend(prompts)
        return ["principle: Take the food before trying to eat it.\n2. example: In the kitchen, take the apple first.",
                "<think>hmm</think>\n???"]

    ex = LLMExtractor(gen)
    cands = ex.extract([win], [lose])
    pos = [c for c in cands if c.zone == "pos"]
    neg = [c for c in cands if c.zone == "neg"]
    # several lessons from one answer; the game's names become placeholders
    assert [c.text for c in pos] == ["Take the food before trying to eat it.", "In <room>, take <object> first."]
    assert pos[0].level == "principle" and pos[1].level == "example"
    assert pos[0].clusters == [100, 101] and pos[0].score == 1.0
    assert neg and "A made-up command" in neg[0].text  # unusable answer ('dance') -> rule fallback
    assert ex.stats["fallback"] == 1 and ex.stats["llm_items"] == 2 and ex.stats["llm_answers"] == 2
    # chat messages: system (what a lesson is) + user (the episode) + the "- " prefill of the answer
    assert [m["role"] for m in seen[0]] == ["system", "user", "assistant"] and seen[0][2]["content"] == "- "
    assert "OTHER games" in seen[0][0]["content"]
    assert "eat the apple" in seen[0][1]["content"] and "SUCCEEDED" in seen[0][1]["content"]
    assert "FAILED" in seen[1][1]["content"] and "take apple" in seen[0][1]["content"]

    def boom(prompts):
        raise RuntimeError("generator down")

    cands = LLMExtractor(boom).extract([win], [lose])
    assert cands and {c.zone for c in cands} == {"pos", "neg"}
    cands = LLMExtractor(lambda p: ["only one answer"]).extract([win], [lose])
    assert {c.zone for c in cands} == {"pos", "neg"}


# What SmolLM2-135M-style answers look like after the "- " prefill: the first line continues the prefill, lines
# echo the rules and the episode, repeat themselves, ramble, and the budget cuts the last one.
SMALL_MODEL_ANSWER = """When the goal names an object and it is in view, take it right away.
- A lesson is one sentence of advice: what to do, or what to avoid, and when.
- Start: in the kitchen: You are in a kitchen.
- Commands typed: open fridge; take apple; eat apple (reward 1)
- Open the fridge before you look for food inside it.
- Open the fridge before you look for food inside it.
- Good job!
- """ + "The agent should always consider every possible option and " * 6 + """forever.
* Lesson 3: Eat the apple once you are holding it
- You see a kitchen with a closed fridge and a table.
- If you are stuck, try the"""


def test_parse_messy_multiline_llm_output():
    win = make_traj(1, ["open fridge", "take apple", "eat apple"], [0, 0, 1], won=True)
    ex = LLMExtractor(lambda prompts: [SMALL_MODEL_ANSWER])
    items = ex.parse(SMALL_MODEL_ANSWER, win, "pos")
    texts = [t for _, t in items]
    assert texts == ["When the goal names an object and it is in view, take it right away.",
                     "Open <object> before you look for food inside it.",
                     "Eat <object> once you are holding it"]  # max_items = 3
    st = ex.stats
    assert st["drop_echo"] == 1 and st["drop_dup"] == 1 and st["drop_long"] == 1 and st["drop_junk"] == 4
    assert st["drop_cut"] == 1 and st["lines"] == 11
    # a plain parse (no prompt to compare with) keeps the echoed rule line, never the restated episode lines
    plain = [t for _, t in parse_llm_list(SMALL_MODEL_ANSWER)]
    assert "A lesson is one sentence of advice: what to do, or what to avoid, and when." in plain
    assert not any(t.startswith(("Start", "Commands", "You see")) for t in plain)  # episode restated: never
    # a description is not advice: dropped by the extractor's lesson gate (parse_llm_list keeps it)
    assert ex.parse("- The kitchen has a nice red table in the corner.", win, "pos") == []
    assert ex.stats["drop_not_advice"] == 1
    # through extract: the three lessons become candidates, nothing falls back
    cands = ex.extract([win], [])
    assert [c.text for c in cands] == texts and ex.stats["fallback"] == 0


def test_templates_and_extract_candidates():
    assert "$trajectory" in load_template("extract_strategies.txt")
    assert "$trajectory" in load_template("extract_warnings.txt")
    trajs = [make_traj(1, ["take apple", "eat apple"], [0, 1], won=True),
             make_traj(2, ["dance", "look"], [-0.1, 0], invalid=(0,)),
             make_traj(3, ["look"], [0.0])]
    _eta, cands, info = extract_candidates(trajs, k_traj=1)
    assert info["t_pos"] == 1 and info["t_neg"] == 2 and info["candidates"] == len(cands)
    zones = [c.zone for c in cands]
    assert zones == sorted(zones, key=lambda z: z != "pos")  # strategies first
    assert {c.sources[0] for c in cands if c.zone == "neg"} == {2}  # bottom-1 of T−
