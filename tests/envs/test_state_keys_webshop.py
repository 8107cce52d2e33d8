"""WebShop's state keys (the offline shop; the server client's are in test_webshop.py): pages of different goals
and products share a key, the goal's options and the budget split keys, slots come from the page, the instruction
and the clicks, and nothing is read from the goal's target product or options."""

from __future__ import annotations

import dataclasses
import re

import slea.envs  # noqa: F401  (registers slea/WebShop-v0)
from slea.envs import make
from slea.envs.webshop import WebShopEnv, page_key


def _item_page_of_the_target(env: WebShopEnv, goal: int) -> tuple[str, dict]:
    """The target product's item page, reached by the expert's search and clicks (no option picked yet)."""
    obs, info = env.reset(seed=goal)
    for action in info["walkthrough"]:
        obs, _, _, _, info = env.step(action)
        if info["page"] == "item":
            return obs, info
    raise AssertionError("the expert never opened an item page")


def test_item_pages_of_other_goals_and_products_share_a_key():
    env = make("slea/WebShop-v0")
    pages: dict[str, list[tuple[str, dict]]] = {}
    for goal in range(30):
        obs, info = _item_page_of_the_target(env, goal)
        pages.setdefault(info["state_key"], []).append((obs, info["state_slots"]))
    key, same = max(pages.items(), key=lambda kv: len(kv[1]))
    assert len(same) >= 5 and len({obs for obs, _ in same}) == len(same)  # other goals, other texts
    assert len({slots["title"] for _, slots in same}) == len(same)
    assert key.startswith("item page: ") and len(pages) < 30


def test_the_walk_of_one_goal_gives_the_keys_of_its_pages():
    env = make("slea/WebShop-v0")
    obs, info = env.reset(seed=3)
    walk = info["walkthrough"]
    assert (info["state_key"], info["state_slots"]) == (
        "search page", {"request": "bed sheets that are wrinkle resistant, size queen, in white"})
    seen = []
    for action in walk[:1] + ["click[next >]", "click[< prev]"] + walk[1:]:
        obs, _, _, _, info = env.step(action)
        seen.append(info["state_key"])
        for role, value in info["state_slots"].items():  # slots name what the page, goal or clicks show
            assert re.fullmatch(r"[a-z0-9 ]+", role)
            assert value.lower() in obs.lower() or value in info["goal"], (role, value)
    assert seen == [
        "results page 1, more pages: best title covers most of the request, within budget",
        "a later results page, more pages: best title covers most of the request, within budget",
        "results page 1, more pages: best title covers most of the request, within budget",
        "item page: size to pick, color to pick; title covers most of the request, within budget",
        "item page: size picked, color to pick; title covers most of the request, within budget",
        "item page: size picked, color picked; title covers most of the request, within budget",
        "purchase done",
    ]
    env.reset(seed=3)
    env.step(walk[0])
    _, _, _, _, info = env.step(walk[1])
    assert info["state_slots"] == {"goal size": "queen", "goal color": "white",
                                   "title": "Noququ Cooling Wrinkle Resistant Bed Sheets"}
    assert env.step("click[reviews]")[4]["state_key"] == "item detail tab"
    assert env.step("click[< prev]")[4]["state_key"] == seen[3]


def test_the_budget_and_the_goals_options_split_keys():
    item = ("Instruction: [SEP] {goal} [SEP] Back to Search [SEP] < Prev [SEP] size [SEP] small [SEP] large [SEP] "
            "color [SEP] red [SEP] blue [SEP] Acme Cotton Shirt [SEP] Price: $24.99 [SEP] Rating: N.A. [SEP] "
            "Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    clicks = [f"click[{c}]" for c in ("back to search", "< prev", "small", "large", "red", "blue", "description",
                                      "features", "reviews", "buy now")]
    goal = "i need a cotton shirt, size large, in blue, and price lower than {} dollars"

    def key(budget: str, goal_text: str = goal):
        return page_key(item.format(goal=goal_text.format(budget)), goal_text.format(budget), clicks)

    cheap, dear = key("30.00"), key("20.00")
    assert cheap.text.endswith("within budget") and dear.text.endswith("over budget")
    assert cheap.slots == {"goal size": "large", "goal color": "blue", "title": "Acme Cotton Shirt"}
    no_color = key("30.00", "i need a cotton shirt, size large, and price lower than {} dollars")
    assert no_color.text.startswith("item page: size to pick, color not asked;") and "goal color" not in no_color.slots
    assert len({cheap.text, dear.text, no_color.text}) == 3


def test_the_key_never_reads_the_target_product_or_the_goals_options():
    env = make("slea/WebShop-v0")
    obs, info = _item_page_of_the_target(env, 8)
    before = env.state_key(obs)
    assert before is not None and before.text == info["state_key"]
    other = env.catalog.goals[9]  # another target, other options and price, behind the same instruction
    env._task = dataclasses.replace(env._task, asin=other.asin, options=dict(other.options),
                                    attributes=other.attributes, price_upper=other.price_upper)
    assert env._goal == info["goal"] and env.state_key(obs) == before
