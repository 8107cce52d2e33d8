"""WebShop: the offline generated shop (catalog, pages, reward) and the client of a running WebShop server."""

from __future__ import annotations

import itertools
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import gymnasium as gym
import pytest

import slea.envs  # noqa: F401  (registers the ids)
from slea.envs import make, registered
from slea.envs.webshop import WebShopEnv, WebShopServerEnv, parse_action
from slea.envs.webshop_catalog import (
    EXACT_MATCH_OPTS,
    PRODUCT_TYPES,
    Goal,
    Product,
    build_catalog,
    get_reward,
    token_set_ratio,
    type_reward,
)


# ------------------------------------------------------------------------------------------------------
# Offline shop
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_walkthrough_buys_with_score_100(split):
    env = WebShopEnv(split=split)
    for seed in range(25):
        obs, info = env.reset(seed=seed)
        assert obs.startswith("WebShop [SEP] Instruction:") and info["goal"] in obs
        walk = info["walkthrough"]
        assert walk[0].startswith("search[") and walk[-1] == "click[buy now]"
        for i, action in enumerate(walk):
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["invalid"] is False, (action, info.get("error"))
            assert terminated == (i == len(walk) - 1) and not truncated
        assert reward == 1.0 and info["score"] == 100.0 and info["won"] is True
        assert info["task_type"] in {"fashion", "beauty", "electronics", "grocery", "home"}
        assert "Your score (min 0.0, max 1.0) [SEP] 1" in obs


def test_determinism_and_catalog_seeds():
    a, b = WebShopEnv(), WebShopEnv()
    for seed in (0, 7, 123):
        oa, ia = a.reset(seed=seed)
        ob, ib = b.reset(seed=seed)
        assert oa == ob and ia == ib
        for action in ia["walkthrough"][:2] + ["click[< prev]", "click[next >]", "click[back to search]"]:
            assert a.step(action) == b.step(action)
    goals = {WebShopEnv().reset(seed=s)[1]["goal"] for s in range(30)}
    assert len(goals) > 25
    c0, c0b, c1 = build_catalog(0, 100), build_catalog(0, 100), build_catalog(1, 100)
    assert c0 is c0b  # cached
    assert [p.title for p in c0.products] != [p.title for p in c1.products]
    fresh = build_catalog.__wrapped__(0, 100)
    assert [(p.asin, p.title, p.price, p.options) for p in fresh.products] == [
        (p.asin, p.title, p.price, p.options) for p in c0.products
    ]


def test_splits_are_disjoint_and_num_goals_wraps():
    train, held = WebShopEnv(split="train"), WebShopEnv(split="heldout")
    assert len(train.goal_ids) == 800 and len(held.goal_ids) == 200
    cat = train.catalog
    assert {cat.goals[i].asin for i in train.goal_ids}.isdisjoint(cat.goals[i].asin for i in held.goal_ids)
    env = WebShopEnv(num_goals=3)
    assert env.reset(seed=1)[0] == env.reset(seed=4)[0] == env.reset(options={"goal": 7})[0]
    with pytest.raises(ValueError):
        WebShopEnv(split="test")


def _page_admissible_all_valid(env: WebShopEnv) -> None:
    """Every admissible action of the current page is accepted (tried on a snapshot copy)."""
    snap = env.get_state()
    for action in [f"click[{c}]" for c in env.clickables() if c != "search"]:
        env.set_state(snap)
        _o, _r, _t, _tr, info = env.step(action)
        assert info["invalid"] is False, action
    env.set_state(snap)


def test_admissible_actions_per_page():
    env = WebShopEnv()
    obs, info = env.reset(seed=2)
    assert info["admissible_actions"] is None  # the search page: open search[<query>]
    assert info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    walk = info["walkthrough"]
    obs, _, _, _, info = env.step(walk[0])
    adm = info["admissible_actions"]
    assert adm[0] == "click[back to search]" and "click[next >]" in adm and "click[< prev]" not in adm
    asins = re.findall(r"\[SEP\] (B0[A-Z0-9]{8}) \[SEP\]", obs)
    assert len(asins) == 10 and [f"click[{a.lower()}]" for a in asins] == adm[2:]
    _page_admissible_all_valid(env)
    obs, _, _, _, info = env.step("click[next >]")
    assert "Page 2 (Total results: 50)" in obs and "click[< prev]" in info["admissible_actions"]
    obs, _, _, _, info = env.step("click[< prev]")
    assert "Page 1 (Total results: 50)" in obs
    for action in walk[1:-1]:
        obs, _, _, _, info = env.step(action)
    adm = info["admissible_actions"]
    assert {
        "click[back to search]",
        "click[< prev]",
        "click[description]",
        "click[features]",
        "click[reviews]",
        "click[buy now]",
    } <= set(adm)
    product = env.product
    assert product is not None
    assert {f"click[{v}]" for vals in product.options.values() for v in vals} <= set(adm)
    assert all(f"You have clicked {v}." in obs for v in env.get_state()["options"].values())
    _page_admissible_all_valid(env)
    obs, _, _, _, info = env.step("click[features]")
    assert info["admissible_actions"] == ["click[back to search]", "click[< prev]"]
    assert product.features[0] in obs
    obs, _, _, _, info = env.step("click[< prev]")
    assert info["page"] == "item" and "Buy Now" in obs
    obs, _, _, _, info = env.step("click[< prev]")
    assert info["page"] == "results"
    obs, _, _, _, info = env.step("click[back to search]")
    assert info["page"] == "search" and info["admissible_actions"] is None


@pytest.mark.parametrize(
    "bad",
    ["", "buy it", "search[]", "click[nothing here]", "click[buy now]", "x" * 5000, "search blue shirt"],
)
def test_bad_actions_are_invalid_not_crashes(bad):
    env = WebShopEnv()
    obs, _ = env.reset(seed=5)
    obs2, reward, terminated, truncated, info = env.step(bad)
    assert info["invalid"] is True and obs2 == obs and reward == 0.0 and not terminated and not truncated
    assert info["goal"] and "error" in info


def test_search_only_on_search_page_and_episode_end():
    env = WebShopEnv()
    _, info = env.reset(seed=9)
    obs, *_ = env.step("search[coffee]")
    obs2, _, _, _, info = env.step("search[tea]")
    assert info["invalid"] and "back to search" in info["error"] and obs2 == obs
    env.step(f"click[{env.clickables()[-1]}]")  # an item
    _, reward, terminated, _, info = env.step("click[buy now]")  # no options chosen: partial score
    assert terminated and 0.0 <= reward < 1.0 and info["score"] == pytest.approx(100 * reward)
    assert info["purchased"]["options"] == {} and info["reward_info"]["denominator"] >= 2
    _, reward, terminated, _, info = env.step("click[back to search]")
    assert info["invalid"] and reward == 0.0 and not terminated
    assert parse_action("  CLICK[ Buy  Now ]. ") == ("click", "buy now")
    assert parse_action("Search[Blue Shirt]") == ("search", "blue shirt")
    assert parse_action("click buy now") is None


def test_get_state_set_state_round_trip():
    env = WebShopEnv()
    _, info = env.reset(seed=11)
    walk = info["walkthrough"]
    env.step(walk[0])
    env.step(walk[1])
    snap, obs = env.get_state(), env.render()
    for action in walk[2:]:
        env.step(action)
    other = WebShopEnv()
    other.reset(seed=0)
    other.set_state(snap)
    assert other.render() == obs
    for action in walk[2:]:
        result = other.step(action)
    assert result[4]["won"] and result[1] == 1.0


def test_gymnasium_make_and_registry():
    env = gym.make("slea/WebShop-v0", num_goals=5)
    _, info = env.reset(seed=0)
    for action in info["walkthrough"]:
        *_, info = env.step(action)
    assert info["won"]
    for id_ in ("slea/WebShop-v0", "slea/WebShopServer-v0"):
        spec = registered()[id_]
        assert spec.family == "webshop" and spec.requires == () and spec.missing() == []


# ------------------------------------------------------------------------------------------------------
# Reward formula (Yao et al. 2022) against hand cases
# ------------------------------------------------------------------------------------------------------
def _product(**kw) -> Product:
    base = {
        "asin": "B000000001",
        "title": "Acme Long Sleeve Cotton Men's Shirt",
        "query": "men's shirt",
        "category": "fashion",
        "product_category": "clothing › men › shirts",
        "nouns": ("acme", "shirt"),
        "attributes": ["long sleeve", "cotton"],
        "options": {"size": ["large", "x-large"], "color": ["navy blue", "grey"]},
        "price": 29.99,
        "features": ["Long sleeve", "Cotton"],
        "description": "A shirt.",
    }
    base.update(kw)
    return Product(**base)


def _goal(**kw) -> Goal:
    base = {
        "asin": "B000000001",
        "instruction": "i need a long sleeve cotton men's shirt",
        "query": "men's shirt",
        "category": "fashion",
        "product_category": "clothing › men › shirts",
        "nouns": ("acme", "shirt"),
        "attributes": ["long sleeve", "cotton"],
        "options": {"size": "large", "color": "navy blue"},
        "price_upper": 40.0,
    }
    base.update(kw)
    return Goal(**base)


def test_reward_full_and_partial_matches():
    p, g = _product(), _goal()
    assert get_reward(p, g, {"size": "large", "color": "navy blue"})[0] == 1.0
    # 2 attributes + 2 options + price = 5 parts
    r, info = get_reward(p, g, {"size": "x-large", "color": "navy blue"})
    assert r == pytest.approx(4 / 5) and info["n_opt"] == 1 and info["r_price"]
    r, _ = get_reward(p, g, {})  # no option chosen
    assert r == pytest.approx(3 / 5)
    r, info = get_reward(_product(price=45.99), g, {"size": "large", "color": "navy blue"})
    assert r == pytest.approx(4 / 5) and info["r_price"] is False
    other = _product(
        attributes=["short sleeve", "polyester"], title="Acme Short Sleeve Shirt", features=[], description=""
    )
    r, info = get_reward(other, g, {"size": "large", "color": "grey"})
    assert info["n_att"] == 0 and r == pytest.approx(2 / 5)
    # an attribute found in the title (not in the attribute list) still counts, as in WebShop
    r, info = get_reward(_product(attributes=["cotton"]), g, {"size": "large", "color": "navy blue"})
    assert info["n_att"] == 2 and r == 1.0
    # fuzzy attribute (token_set_ratio > 85): "machine washable" ~ "machine wash"
    g2 = _goal(attributes=["machine wash"])
    r, info = get_reward(
        _product(attributes=["machine washable"]), g2, {"size": "large", "color": "navy blue"}
    )
    assert info["n_att"] == 1 and r == 1.0
    # size is matched exactly, colour fuzzily
    assert "size" in EXACT_MATCH_OPTS
    r, info = get_reward(
        p, _goal(options={"size": "x-large", "color": "blue navy"}), {"size": "large", "color": "navy blue"}
    )
    assert info["n_opt"] == 1 and r == pytest.approx(4 / 5)


def test_reward_type_factor():
    g = _goal()
    wrong = _product(
        query="coffee", product_category="grocery › beverages › coffee", nouns=("dorbel", "coffee")
    )
    assert type_reward(wrong, g)["r_type"] == 0.0 and get_reward(wrong, g, g.options)[0] == 0.0
    same_type_other_brand = _product(nouns=("zentrix", "shirt"))
    rt = type_reward(same_type_other_brand, g)
    assert rt["title_score"] == 0.5 and rt["r_type"] == 1.0
    # title_score in [0.1, 0.2] and no query / category match -> 0.5
    g6 = _goal(nouns=("a", "b", "c", "d", "e", "shirt"))
    far = _product(query="x", product_category="p › q › r")
    assert type_reward(far, g6)["r_type"] == 0.5
    assert get_reward(far, g6, g6.options)[0] == pytest.approx(0.5)
    # ... but a query match or >= 2 shared category parts keep 1.0
    assert type_reward(_product(product_category="p › q › r"), g6)["r_type"] == 1.0
    assert type_reward(_product(query="x", product_category="clothing › men › tops"), g6)["r_type"] == 1.0
    # title_score < 0.1 -> 0.1
    g11 = _goal(nouns=tuple("abcdefghij") + ("shirt",))
    assert type_reward(_product(), g11)["r_type"] == 0.1


def test_token_set_ratio_matches_fuzzywuzzy_semantics():
    assert token_set_ratio("fuzzy was a bear", "fuzzy fuzzy was a bear") == 100
    assert token_set_ratio("new york mets", "new york mets vs atlanta braves") == 100  # subset
    assert token_set_ratio("Navy-Blue", "blue navy") == 100
    assert token_set_ratio("long sleeve", "short sleeve") < 85
    assert token_set_ratio("", "x") == 0


def test_vocabulary_has_no_ambiguous_values():
    buttons = {
        "back to search",
        "< prev",
        "next >",
        "description",
        "features",
        "reviews",
        "buy now",
        "search",
    }
    for t in PRODUCT_TYPES:
        for a, b in itertools.combinations(t.attributes, 2):
            assert token_set_ratio(a, b) <= 85, (t.key, a, b)
        values = [v for _, vals in t.options for v in vals]
        assert len(values) == len(set(values)) and not set(values) & buttons, t.key
        for name, vals in t.options:
            if name not in EXACT_MATCH_OPTS:
                for a, b in itertools.combinations(vals, 2):
                    assert token_set_ratio(a, b) <= 85, (t.key, name, a, b)


# ------------------------------------------------------------------------------------------------------
# Client of a WebShop server, against a loopback server with canned pages in WebShop's template shapes
# ------------------------------------------------------------------------------------------------------
INSTR = "i need a blue shirt, size large, and price lower than 40.00 dollars"
HEAD = '<head><title>WebShop</title><style>.x{}</style><script>var a = "<b>no</b>";</script></head>'


def _search_page(sid: str) -> str:
    return f"""<!DOCTYPE html><html>{HEAD}<body><!-- a comment -->
<div id="logo"><h2>WebShop</h2></div>
<div id="instruction-text" class="text-center"><h4>Instruction: <br>{INSTR}</h4></div>
<form role="form" method="post" action="/{sid}"><input id="search_input" type="text" name="search_query"
 placeholder="Search..." required/><button class="btn btn-success" type="submit">Search</button></form>
</body></html>"""


def _results_page(sid: str, kw: str, page: int) -> str:
    nxt = (
        f'<form method="post" action="/search_results/{sid}/{kw}/{page + 1}"><button type="submit" '
        f'class="btn btn-primary">Next &gt;</button></form>'
    )
    items = "".join(
        f'<div class="grid-item"><h4 class="product-asin"><a class="product-link" '
        f'href="/item_page/{sid}/{asin}/{kw}/{page}/%7B%7D">{asin}</a></h4>'
        f'<h4 class="product-title">{title}</h5><h5 class="product-price">{price}</h6></div>'
        for asin, title, price in [
            ("B0AAAAAAA1", "Blue Cotton Shirt", "$19.99"),
            ("B0AAAAAAA2", "Red Shirt", "$59.00"),
        ]
    )
    return f"""<html>{HEAD}<body><div id="instruction-text"><h4>Instruction: {INSTR}</h4>
<h4>Current Query: {kw}</h4></div><h1>Results</h1><p>Page {page} (Total results: 2)</p>
<form method="post" action="/{sid}"><button type="submit" class="btn btn-success">Back to Search</button></form>
{nxt}<div class="grid-container">{items}</div></body></html>"""


def _item_page(sid: str, asin: str, opts: str) -> str:
    radios = "".join(
        f'<input type="radio" id="radio_size{i}" name="size" value="{v}" '
        f'data-url="/item_page/{sid}/{asin}/kw/1/%7B%22size%22:%20%22{v}%22%7D">'
        f'<label for="radio_size{i}">{v}</label>'
        for i, v in enumerate(["medium", "large"])
    )
    return f"""<html>{HEAD}<body><div id="instruction-text"><h4>Instruction: {INSTR}</h4></div>
<form method="post" action="/{sid}"><button type="submit" class="btn btn-success">Back to Search</button></form>
<form method="post" action="/search_results/{sid}/kw/1"><button type="submit" class="btn btn-primary">&lt; Back to
 Results</button></form><h4>size</h4><div class="radio-toolbar">{radios}</div>
<h2>Blue Cotton Shirt</h2><h4>Price: $19.99</h4>
<form method="post" action="/item_sub_page/{sid}/{asin}/kw/1/Description/{opts}">
<button class="btn btn-primary" type="submit">Description</button></form>
<form method="post" action="/done/{sid}/{asin}/{opts}"><button type="submit" class="btn btn-lg purchase">Buy Now
</button></form></body></html>"""


def _done_page(reward: float) -> str:
    return f"""<html>{HEAD}<body><div id="thankyou"><h1>Thank you for shopping with us!</h1></div>
<div style="display:none"><h4 id="goal-asin">asin<pre>B0SECRET01</pre></h4></div>
<h3 id="reward">Your score (min 0.0, max 1.0)<pre>{reward}</pre></h3>
<h4 hidden>Reward Details <div id="reward_info"><pre>{{'r_type': 1.0}}</pre></div></h4></body></html>"""


class _Handler(BaseHTTPRequestHandler):
    log: ClassVar[list[tuple[str, str, str]]] = []

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _send(self, code: int, body: str = "", location: str | None = None) -> None:
        data = body.encode()
        self.send_response(code)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str, form: dict[str, str]) -> None:
        path = urllib.parse.unquote(self.path)
        self.log.append((method, path, form.get("search_query", "")))
        parts = path.strip("/").split("/")
        if len(parts) == 1:
            if method == "POST" and "search_query" in form:
                kw = urllib.parse.quote(str(form["search_query"].lower().split(" ")))
                return self._send(302, location=f"/search_results/{parts[0]}/{kw}/1")
            return self._send(200, _search_page(parts[0]))
        if parts[0] == "search_results":
            return self._send(200, _results_page(parts[1], urllib.parse.quote(parts[2]), int(parts[3])))
        if parts[0] == "item_page":
            return self._send(200, _item_page(parts[1], parts[2], urllib.parse.quote(parts[5])))
        if parts[0] == "done":
            reward = 1.0 if "large" in parts[3] and parts[2] == "B0AAAAAAA1" else 0.5
            return self._send(200, _done_page(reward))
        return self._send(404, "not found")

    def do_GET(self) -> None:
        self._route("GET", {})

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        form = dict(urllib.parse.parse_qsl(self.rfile.read(n).decode()))
        self._route("POST", form)


@pytest.fixture(scope="module")
def shop_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_server_client_plays_an_episode(shop_server, monkeypatch):
    monkeypatch.setenv("WEBSHOP_URL", shop_server)
    env = make("slea/WebShopServer-v0", split="heldout")
    assert env.base_url == shop_server
    obs, info = env.reset(seed=7)
    assert obs == f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"  # no head/script/comment text
    assert info["goal"] == INSTR and info["session"] == "fixed_7" and info["admissible_actions"] is None
    assert info["available_actions"]["has_search_bar"] is True

    obs, reward, term, _, info = env.step("search[Blue Shirt]")
    assert not info["invalid"] and reward == 0.0 and not term
    assert ("POST", "/fixed_7", "blue shirt") in _Handler.log and "/search_results/fixed_7/" in info["url"]
    assert "Page 1 (Total results: 2) [SEP] Back to Search [SEP] Next > [SEP] B0AAAAAAA1" in obs
    assert info["admissible_actions"] == [
        "click[back to search]",
        "click[next >]",
        "click[b0aaaaaaa1]",
        "click[b0aaaaaaa2]",
    ]
    bad = env.step("search[again]")  # no search bar on a results page
    assert bad[4]["invalid"] and bad[0] == obs

    obs, _, _, _, info = env.step("click[B0AAAAAAA1]")
    assert "Blue Cotton Shirt [SEP] Price: $19.99" in obs
    assert {"click[medium]", "click[large]", "click[buy now]", "click[< back to results]"} <= set(
        info["admissible_actions"]
    )
    obs, _, _, _, info = env.step("click[large]")
    assert not info["invalid"] and '"size": "large"' in urllib.parse.unquote(info["url"])
    assert env.step("click[no such button]")[4]["invalid"]

    obs, reward, term, _, info = env.step("click[buy now]")
    assert term and reward == 1.0 and info["won"] and info["score"] == 100.0
    assert "B0SECRET01" not in obs and "Thank you for shopping with us!" in obs
    assert env.step("click[back to search]")[4]["invalid"]  # the episode is over

    env.reset(seed=7)  # "< prev" is accepted for newer templates' "< back to results"
    env.step("search[red shirt]")
    env.step("click[b0aaaaaaa2]")
    obs, _, _, _, info = env.step("click[< prev]")
    assert not info["invalid"] and "Page 1 (Total results: 2)" in obs
    env.step("click[b0aaaaaaa2]")
    _, reward, term, _, info = env.step("click[buy now]")
    assert term and reward == 0.5 and info["score"] == 50.0 and not info["won"]


def test_server_client_connection_errors():
    env = WebShopServerEnv(base_url="http://127.0.0.1:9", timeout=2)  # nothing listens on port 9
    with pytest.raises(ConnectionError, match="WEBSHOP_URL"):
        env.reset(seed=0)
    _obs, reward, term, _trunc, info = env.step("search[x]")
    assert info["invalid"] and reward == 0.0 and not term


def test_server_client_network_error_mid_episode_is_invalid(shop_server):
    env = WebShopServerEnv(base_url=shop_server)
    obs, _ = env.reset(seed=1)
    env.base_url = "http://127.0.0.1:9"
    env.url = "http://127.0.0.1:9/fixed_1501"
    obs2, _reward, term, _, info = env.step("search[shirt]")
    assert info["invalid"] and "server error" in info["error"] and obs2 == obs and not term


def test_catalog_is_identical_across_processes():
    import hashlib
    import os
    import subprocess
    import sys

    code = (
        "import hashlib; from slea.envs.webshop_catalog import build_catalog; c = build_catalog(0, 200);"
        "print(hashlib.sha1(repr([(p.asin, p.title, p.price, p.options, g.instruction)"
        " for p, g in zip(c.products, c.goals)]).encode()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    c = build_catalog(0, 200)
    mine = repr([(p.asin, p.title, p.price, p.options, g.instruction) for p, g in zip(c.products, c.goals)])
    assert out.stdout.strip() == hashlib.sha1(mine.encode()).hexdigest()


def test_server_client_pages_have_the_offline_shops_state_keys(shop_server):
    """The server's pages (its own texts: ``Current Query``, ``< Back to Results``) get the keys of
    :func:`slea.envs.webshop.page_key`, with slots from the page and the instruction."""
    env = make("slea/WebShopServer-v0", base_url=shop_server, split="heldout")
    _, info = env.reset(seed=7)
    assert (info["state_key"], info["state_slots"]) == ("search page", {"request": "a blue shirt, size large"})
    _, _, _, _, info = env.step("search[blue shirt]")
    assert info["state_key"] == "results page 1, more pages: best title covers most of the request, within budget"
    assert info["state_slots"] == {"best product": "b0aaaaaaa1", "best title": "Blue Cotton Shirt"}
    _, _, _, _, info = env.step("click[b0aaaaaaa1]")
    assert info["state_key"] == "item page: size to pick; title covers most of the request, within budget"
    assert info["state_slots"] == {"goal size": "large", "title": "Blue Cotton Shirt"}
    _, _, _, _, info = env.step("click[buy now]")
    assert info["state_key"] == "purchase done" and info["state_slots"] == {}
