"""WebShop (Yao et al. 2022) for slea: an offline generated shop and a client for a running WebShop server.

``slea/WebShop-v0`` (:class:`WebShopEnv`) is a self-contained WebShop-style shop: a catalog generated from a
seed, goals and WebShop's reward (all in :mod:`slea.envs.webshop_catalog`), pages rendered like WebShop's
*simple text* observation mode (visible texts joined by ``[SEP]``). ``slea/WebShopServer-v0``
(:class:`WebShopServerEnv`) plays the official WebShop Flask site that a user runs (``WEBSHOP_URL``, default
``http://127.0.0.1:3000``) over HTTP with the standard library only.

Action space (both envs, as WebShop's text env): ``search[<query>]`` on the search page, ``click[<x>]`` where
``x`` is a button (``back to search``, ``next >``, ``< prev``, ``description``, ``features``, ``reviews``,
``buy now``), a product id on a results page (lowercased asin) or an option value on an item page. Case is
ignored. ``info["admissible_actions"]`` lists the ``click[...]`` actions of the page; it is ``None`` on the
search page, whose only action is the open ``search[<query>]``. ``info["available_actions"]`` is WebShop's
``{"has_search_bar", "clickables"}``. Anything else is an invalid step (same observation, reward 0,
``info["invalid"]``, a hint in ``info["error"]``).

Instructions (:data:`INSTRUCTIONS`, both envs): that action space in two sentences and one example turn, a
``search[...]`` on the search page.

Pages of the offline shop (observation texts)::

    search   WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search
    results  Instruction: [SEP] <instruction> [SEP] Back to Search [SEP] Page 1 (Total results: 50)
             [SEP] Next > [SEP] <ASIN> [SEP] <title> [SEP] $<price> [SEP] ...
    item     [You have clicked <value>. [SEP] ...] Instruction: [SEP] <instruction> [SEP] Back to Search
             [SEP] < Prev [SEP] <option name> [SEP] <value> ... [SEP] <title> [SEP] Price: $<price>
             [SEP] Rating: <r> [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now
    sub      Instruction: [SEP] <instruction> [SEP] Back to Search [SEP] < Prev [SEP] <tab content>
    done     Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] <reward>

``< prev`` goes from a results page to the previous page, from an item page back to its results page and from a
tab back to its item page. ``buy now`` ends the episode with WebShop's reward r in [0, 1];
``info["score"] = 100 r`` (the paper's Score) and ``info["won"]`` is r == 1 (the paper's success rate).

Splits and seeds: ``reset(seed=k)`` plays goal ``k % n`` of the split (``n`` = its size, or ``num_goals``);
``options={"goal": k}`` does the same. Offline: goals whose target product index is a multiple of 5 are
held out (200 of the 1,000 goals of the default catalog). Server: the official goal index ranges, ``heldout``
= 0-499 (WebShop's test goals), ``dev`` = 500-1499, ``train`` = 1500-12086, addressed through WebShop's
``fixed_<index>`` session ids.

State key (:func:`page_key`, both envs): the kind of page and what on it bears on the goal, read from the page
text, the instruction and the listed clicks: on a results page how well the best-matching title covers the
request and whether its price is within the budget, on an item page each option's state (the goal's value to
pick, picked, or not asked); product ids, titles, brands and values are slots (``results page 1, more pages:
best title covers most of the request, within budget`` with ``{"best product": "b008o34e03", ...}``).
"""

from __future__ import annotations

import os
import re
import string
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from typing import Any

from slea.envs.base import StepResult, TextEnv, register, user_turn
from slea.envs.webshop_catalog import Catalog, Goal, Product, build_catalog, expert_actions, get_reward
from slea.types import Instructions, StateKey

SEP = " [SEP] "
TABS = ("description", "features", "reviews")
_ACTION = re.compile(r"\s*(search|click)\s*\[(.*)\]\s*[.!]?\s*", re.IGNORECASE | re.DOTALL)
_ACTION_IN_TEXT = re.compile(r"(search|click)\s*\[([^\]\n]*)\]", re.IGNORECASE)
_HINT = "Actions are search[<query>] on the search page and click[<button>] with a button of the page."
_EXAMPLE_GOAL = "i need a blue cotton t-shirt, size large, and price lower than 30.00 dollars"
INSTRUCTIONS = Instructions(
    system="You are shopping on a website. Reply with exactly one action and nothing else: search[<query>] on "
    "the search page; elsewhere click[<item>] with a button, product id or option from the list of valid "
    "commands. Buy the product that matches the instruction.",
    example=((user_turn(_EXAMPLE_GOAL, SEP.join(["WebShop", "Instruction:", _EXAMPLE_GOAL, "Search"]),
                             cue="Your action:"), "search[blue cotton t-shirt]"),),
    answer_cue="Your action:",
)


def parse_action(action: str) -> tuple[str, str] | None:
    """``("search"|"click", argument)`` from ``search[...]`` / ``click[...]`` (lowercased), else ``None``."""
    m = _ACTION.fullmatch(str(action))
    if m is None:  # a model's answer may wrap the action in prose or reasoning: take the first one in it
        m = _ACTION_IN_TEXT.search(str(action))
    if m is None:
        return None
    return m.group(1).lower(), " ".join(m.group(2).split()).lower()


NAV_BUTTONS = frozenset({"back to search", "next >", "< prev", *TABS, "attributes", "buy now"})
_REQUEST_LEAD = re.compile(r"^(?:i need|i am looking for|i'm looking for|i want to buy|i want|i would like|find me|"
                           r"get me|buy me|show me)\s+(?:to buy\s+|to get\s+)?", re.IGNORECASE)
_PRICE_CLAUSE = re.compile(r",?\s*(?:and\s+)?price lower than\s+([\d,]+(?:\.\d+)?)\s*dollars", re.IGNORECASE)
_PAGE_NO = re.compile(r"Page (\d+) \(Total results: (\d+)\)")
_MONEY = re.compile(r"\$\s*([\d,]+(?:\.\d+)?)")
_WORDS = re.compile(r"[a-z0-9]+")
_CLICKED = re.compile(r"You have clicked (.+)\.$")
# words of a request that no title is expected to hold
_FILLER = frozenset(["a", "an", "the", "that", "is", "are", "for", "in", "of", "and", "with", "to", "i", "me", "my",
                     "it", "its", "size", "color"])


def _request(goal: str) -> str:
    """The goal without its lead-in (``i need``...) and its price clause: what the shopper asks for."""
    return _REQUEST_LEAD.sub("", _PRICE_CLAUSE.sub("", goal.strip())).strip(" ,.")


def _budget(goal: str) -> float | None:
    m = _PRICE_CLAUSE.search(goal)
    return float(m[1].replace(",", "")) if m else None


def _coverage(title: str, request_words: list[str]) -> tuple[int, str]:
    """How many of the request's words a title holds, and that as ``all``/``most``/``some``/``none`` of them."""
    words = set(_WORDS.findall(title.lower()))
    words |= {w[:-1] for w in words if w.endswith("s")}
    hits = sum(w in words or w.rstrip("s") in words for w in request_words)
    share = hits / len(request_words) if request_words else 0.0
    return hits, "all" if share >= 1.0 else "most" if share >= 0.5 else "some" if share > 0 else "none"


def _budget_word(price_text: str, budget: float | None) -> str:
    m = _MONEY.search(price_text)
    if budget is None or m is None:
        return "no budget" if budget is None else "no price"
    return "within budget" if float(m[1].replace(",", "")) < budget else "over budget"


def _role(name: str) -> str:
    return " ".join(_WORDS.findall(name.lower())) or "option"


def _phrase_in(value: str, text: str) -> bool:
    return re.search(rf"(?<![a-z0-9]){re.escape(value)}(?![a-z0-9])", text) is not None


def page_key(observation: str, goal: str, admissible: list[str] | None) -> StateKey | None:
    """WebShop's state key of a page (:meth:`WebShopEnv.state_key`, :meth:`WebShopServerEnv.state_key`), from the
    page text, the instruction and the listed ``click[...]`` actions only.

    * search page (no list: the open search): ``search page``, slot ``request`` (the instruction without its
      lead-in and price clause);
    * results page: which page, whether more follow, how much of the request the best-matching title holds
      (``all``/``most``/``some``/``none`` of its words) and whether its price is within the budget; slots ``best
      product`` (its id as clicked) and ``best title``;
    * item page: per option dimension, in page order, ``<name> to pick`` (the goal's value is listed, not picked),
      ``<name> picked`` (it is: the offline shop's ``You have clicked`` lines say so; a server page that shows no
      picks stays at ``to pick``), ``<name> not asked`` (the goal names none of its values); then the title's
      coverage and the budget; slots ``goal <name>`` for the goal's values and ``title``;
    * a detail tab (description, features, reviews) and the thank-you page: ``item detail tab`` / ``purchase
      done``, without the score.
    """
    parts = [p.strip() for p in observation.split("[SEP]") if p.strip()]
    if parts and parts[0].startswith("Thank you for shopping"):
        return StateKey("purchase done")
    request = _request(goal)
    if admissible is None:
        return StateKey("search page", {"request": request} if request else {})
    clicks = {a[len("click["):-1] for a in admissible if a.startswith("click[") and a.endswith("]")}
    words = [w for w in _WORDS.findall(request.lower()) if w not in _FILLER]
    budget = _budget(goal)
    lowered = [p.lower() for p in parts]
    if "buy now" in clicks:
        return _item_key(parts, lowered, clicks, request, words, budget)
    page_no = _PAGE_NO.search(observation)
    products = [(lowered[i], parts[i + 1], parts[i + 2]) for i in range(len(parts) - 2)
                if lowered[i] in clicks and lowered[i] not in NAV_BUTTONS and not lowered[i].startswith("<")]
    if page_no is None and not products:
        return StateKey("item detail tab")
    where = "results page 1" if page_no is None or page_no[1] == "1" else "a later results page"
    more = "more pages" if "next >" in clicks else "last page"
    if not products:
        return StateKey(f"{where}, {more}: no products")
    best = max(products, key=lambda p: _coverage(p[1], words)[0])  # the first of the best on ties
    cover = _coverage(best[1], words)[1]
    return StateKey(f"{where}, {more}: best title covers {cover} of the request, {_budget_word(best[2], budget)}",
                    {"best product": best[0], "best title": best[1]})


def _item_key(parts: list[str], lowered: list[str], clicks: set[str], request: str, words: list[str],
              budget: float | None) -> StateKey:
    """:func:`page_key` of an item page: its option dimensions (names, then their values) sit between the last
    ``<`` / ``back to search`` button and the title, the part before ``Price:``."""
    price_at = next((i for i, p in enumerate(parts) if p.startswith("Price:")), len(parts))
    title = parts[price_at - 1] if price_at > 0 else ""
    start = max((i + 1 for i, p in enumerate(lowered[:price_at]) if p == "back to search" or p.startswith("<")),
                default=0)
    picked = {m[1].lower() for p in parts if (m := _CLICKED.match(p))}
    dims: list[tuple[str, list[str]]] = []
    for part, low in zip(parts[start:price_at - 1], lowered[start:price_at - 1]):
        if low in clicks and dims:
            dims[-1][1].append(low)
        elif low not in clicks:
            dims.append((_role(part), []))
    states, slots = [], {}
    req = request.lower()
    for name, values in dims:
        wanted = max((v for v in values if _phrase_in(v, req)), key=len, default=None)
        if wanted is None:
            states.append(f"{name} not asked")
            continue
        states.append(f"{name} {'picked' if wanted in picked else 'to pick'}")
        slots[f"goal {name}"] = wanted
    cover = _coverage(title, words)[1]
    price = parts[price_at] if price_at < len(parts) else ""
    options = ", ".join(states) if states else "no options"
    text = f"item page: {options}; title covers {cover} of the request, {_budget_word(price, budget)}"
    return StateKey(text, {**slots, "title": title} if title else slots)


class WebShopEnv(TextEnv):
    """The offline WebShop-style shop (see the module docstring).

    Args:
        split: ``"train"`` or ``"heldout"`` goals.
        num_products: catalog size (default 1000; the generated catalog and its BM25 index are cached per process).
        catalog_seed: the catalog's seed (products, goals).
        num_goals: if set, only the first ``num_goals`` goals of the split are played.
        page_size: results per page (WebShop: 10).
        max_results: results a search returns (WebShop: 50).
    """

    snapshots = "exact"  # get_state/set_state: the state itself, copied

    task_type = "webshop"

    def __init__(
        self,
        split: str = "train",
        num_products: int = 1000,
        catalog_seed: int = 0,
        num_goals: int | None = None,
        page_size: int = 10,
        max_results: int = 50,
    ) -> None:
        super().__init__()
        self.catalog: Catalog = build_catalog(int(catalog_seed), int(num_products))
        self.goal_ids = self.catalog.split_goals(split)
        if num_goals is not None:
            if num_goals < 1:
                raise ValueError("num_goals must be >= 1")
            self.goal_ids = self.goal_ids[: int(num_goals)]
        self.split, self.page_size, self.max_results = split, int(page_size), int(max_results)
        self._task: Goal | None = None
        self._s: dict[str, Any] = {}

    instructions = INSTRUCTIONS
    expert_source = "goal_product"  # info["walkthrough"]: search, open the goal's product, pick options, buy

    # -- state --------------------------------------------------------------------------------------------
    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        k = self._pick(len(self.goal_ids), seed, options, key="goal")
        self._task = self.catalog.goals[self.goal_ids[k]]
        self._goal, self.task_type = self._task.instruction, self._task.category
        self._s = {
            "page": "search",
            "query": "",
            "results": [],
            "page_no": 1,
            "asin": None,
            "options": {},
            "tab": None,
            "done": False,
            "reward": 0.0,
            "reward_info": {},
        }
        return self._render(), {}

    def get_state(self) -> dict[str, Any]:
        if self._task is None:
            raise RuntimeError("get_state() before reset()")
        return {
            **self._s,
            "goal_index": self._task.index,
            "results": list(self._s["results"]),
            "options": dict(self._s["options"]),
            "reward_info": dict(self._s["reward_info"]),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._task = self.catalog.goals[int(state["goal_index"])]
        self._goal, self.task_type = self._task.instruction, self._task.category
        self._s = {k: v for k, v in state.items() if k != "goal_index"}
        self._s["results"], self._s["options"] = list(state["results"]), dict(state["options"])
        self._last_obs = self._render()

    @property
    def product(self) -> Product | None:
        return self.catalog.by_asin.get(self._s.get("asin") or "")

    def _page_items(self) -> list[Product]:
        start = (self._s["page_no"] - 1) * self.page_size
        return [self.catalog.by_asin[a] for a in self._s["results"][start : start + self.page_size]]

    def clickables(self) -> list[str]:
        """The clickable names of the current page (lowercase), WebShop's ``text_to_clickable`` keys."""
        page, s = self._s["page"], self._s
        if page == "search":
            return ["search"]
        if page == "results":
            out = ["back to search"]
            out += ["< prev"] if s["page_no"] > 1 else []
            out += ["next >"] if s["page_no"] * self.page_size < len(s["results"]) else []
            return out + [p.asin.lower() for p in self._page_items()]
        if page == "item":
            values = [v for vals in self.product.options.values() for v in vals]  # type: ignore[union-attr]
            return ["back to search", "< prev", *values, *TABS, "buy now"]
        if page == "sub":
            return ["back to search", "< prev"]
        return []

    # -- rendering ------------------------------------------------------------------------------------------
    def _render(self) -> str:
        s, goal = self._s, self._task
        assert goal is not None
        instr = ["Instruction:", goal.instruction]
        page = s["page"]
        if page == "search":
            parts = ["WebShop", *instr, "Search"]
        elif page == "results":
            parts = [*instr, "Back to Search", f"Page {s['page_no']} (Total results: {len(s['results'])})"]
            parts += ["< Prev"] if s["page_no"] > 1 else []
            parts += ["Next >"] if s["page_no"] * self.page_size < len(s["results"]) else []
            for p in self._page_items():
                parts += [p.asin, p.title, f"${p.price:.2f}"]
        elif page in ("item", "sub"):
            p = self.product
            assert p is not None
            parts = [*instr, "Back to Search", "< Prev"]
            if page == "item":
                parts = [f"You have clicked {v}." for v in s["options"].values()] + parts
                for name, values in p.options.items():
                    parts += [name, *values]
                parts += [
                    p.title,
                    f"Price: ${p.price:.2f}",
                    f"Rating: {p.rating}",
                    "Description",
                    "Features",
                    "Reviews",
                    "Buy Now",
                ]
            elif s["tab"] == "description":
                parts.append(p.description)
            elif s["tab"] == "features":
                parts += p.features
            else:
                parts += [f"{score} stars: {text}" for score, text in p.reviews] or ["No reviews yet."]
        else:
            parts = ["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{s['reward']:.4g}"]
        return SEP.join(parts)

    # -- acting ---------------------------------------------------------------------------------------------
    def _step(self, action: str) -> StepResult:
        if self._task is None:
            return self._reject("Call reset() before step().")
        s = self._s
        if s["done"]:
            return self._reject("The episode is over; call reset().")
        parsed = parse_action(action)
        if parsed is None:
            return self._reject(_HINT)
        kind, arg = parsed
        if kind == "search":
            if s["page"] != "search":
                return self._reject("There is no search bar on this page: click[back to search] first.")
            if not arg:
                return self._reject("Empty search: write search[<query>].")
            s.update(
                page="results",
                query=arg,
                page_no=1,
                asin=None,
                options={},
                tab=None,
                results=[p.asin for p in self.catalog.search(arg, self.max_results)],
            )
            return self._render(), 0.0, False, False, {}
        if arg not in self.clickables() or arg == "search":
            return self._reject(f"'{arg}' is not clickable on this page. " + _HINT)
        page, reward, done = s["page"], 0.0, False
        if arg == "back to search":
            s.update(page="search", query="", results=[], page_no=1, asin=None, options={}, tab=None)
        elif arg == "next >":
            s["page_no"] += 1
        elif arg == "< prev":
            if page == "results":
                s["page_no"] -= 1
            elif page == "item":
                s.update(page="results", asin=None, options={})
            else:
                s.update(page="item", tab=None)
        elif page == "results":
            s.update(page="item", asin=arg.upper(), options={})
        elif arg in TABS:
            s.update(page="sub", tab=arg)
        elif arg == "buy now":
            reward, info = get_reward(self.product, self._task, s["options"])  # type: ignore[arg-type]
            s.update(page="done", done=True, reward=reward, reward_info=info)
            done = True
        else:  # an option value
            name = next(n for n, vals in self.product.options.items() if arg in vals)  # type: ignore[union-attr]
            s["options"][name] = arg
        return self._render(), reward, done, False, {}

    def _fill(self, info: dict[str, Any]) -> dict[str, Any]:
        if self._task is not None:
            self._admissible = (
                None if self._s["page"] == "search" else [f"click[{c}]" for c in self.clickables()]
            )
        return super()._fill(info)

    def state_key(self, observation: str) -> StateKey | None:
        """The page's kind and what on it bears on the goal (:func:`page_key`): read from the page text, the
        instruction and the listed clicks, never from the goal's target product, options or the reward. Keeps
        the page kind, results paging, how much of the request the best title covers, the budget check and each
        option's state; drops ids, titles, brands and values (slots). Example: ``item page: size to pick, color
        to pick; title covers most of the request, within budget`` with ``{"goal size": "queen", "goal color":
        "white", "title": "Noququ Cooling Wrinkle Resistant Bed Sheets"}``."""
        return page_key(observation, self._goal, self._admissible)

    def _info_defaults(self) -> dict[str, Any]:
        g, s = self._task, self._s
        if g is None:
            return {}
        won = bool(s["done"] and s["reward"] >= 1.0 - 1e-9)
        return {
            "won": won,
            "score": 100.0 * s["reward"] if s["done"] else 0.0,
            "page": s["page"],
            "available_actions": {"has_search_bar": s["page"] == "search", "clickables": self.clickables()},
            "goal_index": g.index,
            "target_asin": g.asin,
            "goal_attributes": list(g.attributes),
            "goal_options": dict(g.options),
            "price_upper": g.price_upper,
            "purchased": {"asin": s["asin"], "options": dict(s["options"])} if s["done"] else None,
            "reward_info": dict(s["reward_info"]),
            "walkthrough": list(
                expert_actions(
                    self.catalog.seed, len(self.catalog.products), g.index, self.page_size, self.max_results
                )
            ),
        }

    def render(self) -> str:
        return self._last_obs


# ======================================================================================================
# Client for a running WebShop server (the official Flask app)
# ======================================================================================================
class _PageParser(HTMLParser):
    """Visible texts and clickables of a WebShop page (what BeautifulSoup gives WebShop's text env)."""

    VOID = frozenset(
        ["area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"]
    )
    SKIP = frozenset(["style", "script", "head", "title", "meta", "noscript", "template"])

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict[str, str], bool]] = []  # (tag, attrs, hidden)
        self.texts: list[str] = []
        self.clicks: dict[
            str, tuple[str, str, dict[str, str] | None]
        ] = {}  # name -> (method, url, form data)
        self.forms: list[dict[str, Any]] = []
        self.search: dict[str, Any] | None = None
        self.instruction: str | None = None
        self.reward_text: str | None = None
        self._open: list[dict[str, Any]] = []  # elements whose text is being collected

    def _hidden(self) -> bool:
        return any(h or t in self.SKIP for t, _, h in self.stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        hidden = "hidden" in a or "display:none" in a.get("style", "").replace(" ", "")
        classes = a.get("class", "").split()
        if tag == "form":
            self.forms.append(
                {"action": a.get("action", ""), "method": a.get("method", "get").upper(), "data": {}}
            )
        if tag == "input":
            form = self.forms[-1] if self.forms else None
            kind = a.get("type", "text").lower()
            if a.get("id") == "search_input" or a.get("name") == "search_query":
                self.search = {"form": form, "name": a.get("name", "search_query")}
            elif kind == "radio" and a.get("value"):
                url = (
                    a.get("data-url")
                    or (re.findall(r"href\s*=\s*['\"]([^'\"]+)", a.get("onclick", "")) or [""])[0]
                )
                if url:
                    self.clicks.setdefault(a["value"].strip().lower(), ("GET", url, None))
            elif kind == "hidden" and form is not None and a.get("name"):
                form["data"][a["name"]] = a.get("value", "")
            return
        if tag in self.VOID:
            return
        self.stack.append((tag, a, hidden))
        if a.get("id") == "instruction-text" or (
            tag == "h4" and self._open and self._open[-1]["kind"] == "instr"
        ):
            self._open.append({"kind": "instr", "depth": len(self.stack), "text": []})
        elif a.get("id") == "reward":
            self._open.append({"kind": "reward", "depth": len(self.stack), "text": []})
        elif "btn" in classes or "product-link" in classes:
            form = self.forms[-1] if self.forms else None
            if tag == "a" and a.get("href"):
                target = ("GET", a["href"], None)
            elif tag == "button" and a.get("type", "submit") == "submit" and form is not None:
                target = (form["method"], form["action"], form["data"])
            else:
                m = re.search(r"location(?:\.href)?\s*=\s*['\"]([^'\"]+)", a.get("onclick", ""))
                target = ("GET", m.group(1), None) if m else None
            self._open.append({"kind": "click", "depth": len(self.stack), "text": [], "target": target})

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self.forms:
            self.forms.pop()
        if tag in self.VOID or all(t != tag for t, _, _ in self.stack):
            return  # a stray end tag (WebShop's templates have some) is ignored, as browsers do
        while self.stack:
            depth = len(self.stack)
            while self._open and self._open[-1]["depth"] >= depth:
                self._close(self._open.pop())
            if self.stack.pop()[0] == tag:
                break

    def _close(self, el: dict[str, Any]) -> None:
        text = " ".join(" ".join(el["text"]).split())
        if el["kind"] == "click" and el["target"] is not None and text:
            self.clicks.setdefault(text.lower(), el["target"])
        elif el["kind"] == "instr" and self.instruction is None and text:
            self.instruction = re.sub(r"^instruction:\s*", "", text, flags=re.IGNORECASE)
        elif el["kind"] == "reward":
            self.reward_text = text

    def handle_data(self, data: str) -> None:
        if self._hidden():
            if self._open and self._open[-1]["kind"] == "reward":
                self._open[-1]["text"].append(data)
            return
        text = data.strip()
        if text:
            self.texts.append(text)
            for el in self._open:
                el["text"].append(text)

    def close(self) -> None:
        super().close()
        while self._open:
            self._close(self._open.pop())


SERVER_SPLITS = {"heldout": (0, 500), "dev": (500, 1500), "train": (1500, 12087)}


def _quote_url(url: str) -> str:
    return urllib.parse.quote(url, safe="/:?&=%#+,;@!$'()*[]~")


class WebShopServerEnv(TextEnv):
    """Plays a running WebShop server (the official ``web_agent_site`` Flask app) over HTTP.

    Args:
        base_url: the server's root URL (default ``$WEBSHOP_URL``, else ``http://127.0.0.1:3000``).
        split: ``train`` (goals 1500-12086), ``dev`` (500-1499) or ``heldout`` (0-499, WebShop's test goals).
        session_prefix: WebShop fixes a session's goal from ``fixed_<index>`` session ids.
        num_goals: if set, ``reset(seed=k)`` plays goal ``start + k % num_goals`` of the split.
        timeout: seconds per HTTP request.

    ``reset(options={"session": "abc"})`` opens a given session id (the server then draws its goal).
    A network error during a step is an invalid step (``info["error"]`` says why); at reset it raises
    ``ConnectionError``.
    """

    task_type = "webshop"

    def __init__(
        self,
        base_url: str | None = None,
        split: str = "train",
        session_prefix: str = "fixed_",
        num_goals: int | None = None,
        timeout: float = 10.0,
    ) -> None:
        super().__init__()
        if split not in SERVER_SPLITS:
            raise ValueError(f"split must be one of {sorted(SERVER_SPLITS)}, got {split!r}")
        self.base_url = (base_url or os.environ.get("WEBSHOP_URL") or "http://127.0.0.1:3000").rstrip("/")
        self.split, self.session_prefix, self.timeout = split, session_prefix, float(timeout)
        start, end = SERVER_SPLITS[split]
        self.goal_range = (start, end if num_goals is None else min(end, start + int(num_goals)))
        self._opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        self._page: _PageParser | None = None
        self.url = ""
        self.session = ""
        self._done, self._reward = False, 0.0

    instructions = INSTRUCTIONS

    def _fetch(self, method: str, url: str, data: dict[str, str] | None = None) -> None:
        url = _quote_url(urllib.parse.urljoin(self.url or self.base_url + "/", url or self.url))
        body = urllib.parse.urlencode(data or {}).encode() if method == "POST" else None
        req = urllib.request.Request(url, data=body, method=method)
        with self._opener.open(req, timeout=self.timeout) as resp:
            html = resp.read().decode(resp.headers.get_content_charset() or "utf-8", "replace")
            self.url = resp.geturl()
        page = _PageParser()
        page.feed(html)
        page.close()
        self._page = page

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if options.get("session"):
            self.session = str(options["session"])
        elif seed is not None or options.get("goal") is not None:
            k = int(options["goal"]) if options.get("goal") is not None else int(seed)  # type: ignore[arg-type]
            start, end = self.goal_range
            self.session = f"{self.session_prefix}{start + k % (end - start)}"
        else:
            self.session = "".join(self.np_random.choice(list(string.ascii_lowercase), 10))
        self.url, self._done, self._reward = "", False, 0.0
        try:
            self._fetch("GET", f"{self.base_url}/{urllib.parse.quote(self.session)}")
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectionError(f"no WebShop server at {self.base_url} ({exc}); set WEBSHOP_URL") from exc
        self._goal = (self._page.instruction or "") if self._page else ""
        return self.observation(), {}

    def observation(self) -> str:
        return SEP.join(self._page.texts) if self._page else ""

    def clickables(self) -> list[str]:
        return [c for c in (self._page.clicks if self._page else {}) if c != "search"]

    def _step(self, action: str) -> StepResult:
        if self._page is None:
            return self._reject("Call reset() before step().")
        if self._done:
            return self._reject("The episode is over; call reset().")
        parsed = parse_action(action)
        if parsed is None:
            return self._reject(_HINT)
        kind, arg = parsed
        page = self._page
        try:
            if kind == "search":
                if page.search is None or not arg:
                    return self._reject(
                        "There is no search bar on this page: click[back to search] first."
                        if page.search is None
                        else "Empty search: write search[<query>]."
                    )
                form = page.search["form"]
                self._fetch(form["method"], form["action"], {**form["data"], page.search["name"]: arg})
            else:
                if (
                    arg == "< prev" and arg not in page.clicks
                ):  # newer templates: "< back to results"/"...item page"
                    arg = next((c for c in page.clicks if c.startswith("<")), arg)
                if arg not in page.clicks or arg == "search":
                    return self._reject(f"'{arg}' is not clickable on this page. " + _HINT)
                method, url, data = page.clicks[arg]
                self._fetch(method, url, data)
        except (urllib.error.URLError, OSError) as exc:
            return self._reject(f"WebShop server error: {exc}")
        reward = 0.0
        if self._page is not None and self._page.reward_text is not None:
            nums = re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", self._page.reward_text)
            self._reward = reward = float(nums[-1]) if nums else 0.0
            self._done = True
        return self.observation(), reward, self._done, False, {}

    def _fill(self, info: dict[str, Any]) -> dict[str, Any]:
        if self._page is not None:
            self._admissible = (
                None if self._page.search is not None else [f"click[{c}]" for c in self.clickables()]
            )
        return super()._fill(info)

    def state_key(self, observation: str) -> StateKey | None:
        """As :meth:`WebShopEnv.state_key` (:func:`page_key`), on the server's page text, instruction and clicks."""
        return page_key(observation, self._goal, self._admissible)

    def _info_defaults(self) -> dict[str, Any]:
        page = self._page
        return {
            "won": bool(self._done and self._reward >= 1.0 - 1e-9),
            "score": 100.0 * self._reward if self._done else 0.0,
            "url": self.url,
            "session": self.session,
            "available_actions": {
                "has_search_bar": bool(page and page.search is not None),
                "clickables": list(page.clicks) if page else [],
            },
        }

    def render(self) -> str:
        return self._last_obs


register(
    "slea/WebShop-v0",
    "slea.envs.webshop:WebShopEnv",
    family="webshop",
    description="WebShop-style shop, offline: generated 1k-product catalog, BM25 search, WebShop reward",
)
register(
    "slea/WebShopServer-v0",
    "slea.envs.webshop:WebShopServerEnv",
    family="webshop",
    description="client for a running WebShop server ($WEBSHOP_URL, default http://127.0.0.1:3000)",
)
