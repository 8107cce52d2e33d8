"""The offline WebShop-style shop: a catalog generated from a seed, goals (instructions) and WebShop's reward.

Catalog
-------
:data:`PRODUCT_TYPES` holds 25 product types in 5 categories (``fashion``, ``beauty``, ``electronics``,
``grocery``, ``home``; the category is the env's ``task_type``). Each type has a query key (WebShop's
``query``), a category path (WebShop's ``product_category``, parts joined by ``›``), its type nouns, a pool
of attributes, option dimensions with their values, and a price range. :func:`build_catalog` makes
``num_products`` products (types round-robin, then shuffled) from ``random.Random(seed)``: a brand, 2-4
attributes, 2-5 values per option dimension, a price ending in .99, a title (brand + attributes + type), bullet
points (one per attribute), a description, a rating and some reviews. The search engine is BM25 over title,
bullet points and description (options are not indexed, as in WebShop); a search returns the top 50.

Goals
-----
Goal ``i`` targets product ``i``: 1-3 of its attributes, one value per option dimension, and a price bound
drawn as in WebShop (``PRICE_RANGE`` multiples of 10: two of the four above the price, the larger kept), phrased
by one of a few templates, e.g. ``i need a long sleeve slim fit men's shirt, navy blue, size large, and price
lower than 40.00 dollars``. Products whose index is a multiple of 5 are the held-out targets, the rest train.

Reward (Yao et al. 2022, ``web_agent_site/engine/goal.py``)
-----------------------------------------------------------
``r = r_type * (n_att + n_opt + 1[price <= price_upper]) / (|U_att| + |U_opt| + 1)``.
``r_type`` as in WebShop's ``get_type_reward``: ``title_score`` = share of the goal's name nouns found in the
purchased product's name nouns (nouns here are the brand and the type nouns, standing in for spaCy's noun
tags); ``r_type`` = 1, or 0.5 when neither the query, nor >= 2 category-path parts, nor title_score > 0.2
match; 0.1 when title_score < 0.1; 0 when title_score == 0. An attribute matches when a product attribute has
``token_set_ratio > 85`` with it or it occurs in the title, bullet points or description. Options are matched
per goal option *name* (the paper's ``|U_opt ∩ Y_opt|``): exact for size-like dimensions
(:data:`EXACT_MATCH_OPTS`), ``token_set_ratio > 85`` otherwise. (The released code instead matches every
purchased value against any goal value and also credits a purchased value found in the product's text; with
chosen options from a closed list the two agree except for those loopholes.) ``token_set_ratio`` is
fuzzywuzzy's, on :mod:`difflib` (its pure-Python fallback).
"""

from __future__ import annotations

import difflib
import functools
import random
import re
from dataclasses import dataclass, field
from typing import Any

from slea.envs.qa_corpus import BM25

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
EXACT_MATCH_OPTS = ("size", "length", "capacity", "model", "pack")
SEARCH_RETURN_N = 50
HELDOUT_EVERY = 5

SIZES = ("small", "medium", "large", "x-large", "xx-large")
COLORS = ("black", "white", "navy blue", "grey", "red", "olive green", "pink", "beige")

# key, category, path, nouns, title noun phrase, singular?, attributes, options, price range
# fmt: off
_TYPES: tuple[tuple[Any, ...], ...] = (
    ("men's shirt", "fashion", "clothing › men › shirts", ("shirt",), "Men's Shirt", True,
     ("long sleeve", "short sleeve", "button down", "slim fit", "wrinkle free", "machine wash", "cotton"),
     (("size", SIZES), ("color", COLORS)), (14, 55)),
    ("women's dress", "fashion", "clothing › women › dresses", ("dress",), "Women's Dress", True,
     ("sleeveless", "v neck", "floral print", "knee length", "pockets", "polyester", "hand wash"),
     (("size", ("x-small",) + SIZES[:4]), ("color", COLORS)), (20, 70)),
    ("running shoes", "fashion", "clothing › shoes › athletic", ("shoes",), "Running Shoes", False,
     ("lightweight", "breathable mesh", "non slip", "arch support", "rubber sole", "memory foam"),
     (("size", ("6", "7", "8", "9", "10", "11", "12")), ("color", COLORS[:5])), (30, 120)),
    ("hoodie", "fashion", "clothing › unisex › hoodies", ("hoodie",), "Hoodie", True,
     ("pullover", "zip up", "fleece lined", "drawstring", "kangaroo pocket", "relaxed fit"),
     (("size", SIZES), ("color", COLORS)), (18, 60)),
    ("women's jeans", "fashion", "clothing › women › jeans", ("jeans",), "Women's Jeans", False,
     ("high waist", "skinny", "stretch denim", "bootcut", "distressed", "button closure"),
     (("size", ("2", "4", "6", "8", "10", "12", "14")), ("color", ("light wash", "dark wash", "black", "medium blue"))),
     (20, 80)),
    ("shampoo", "beauty", "beauty › hair care › shampoo", ("shampoo",), "Shampoo", True,
     ("sulfate free", "paraben free", "argan oil", "tea tree", "color safe", "for curly hair"),
     (("size", ("8.4 fl oz", "12 fl oz", "16.9 fl oz", "33.8 fl oz")), ("scent", ("coconut", "lavender", "eucalyptus", "unscented"))),
     (6, 35)),
    ("lipstick", "beauty", "beauty › makeup › lips", ("lipstick",), "Lipstick", True,
     ("long lasting", "matte finish", "cruelty free", "vegan", "moisturizing", "waterproof"),
     (("color", ("ruby red", "nude", "berry", "coral", "mauve", "plum")),), (5, 30)),
    ("face moisturizer", "beauty", "beauty › skin care › face", ("moisturizer",), "Face Moisturizer", True,
     ("sensitive skin", "oil free", "hyaluronic acid", "spf 30", "fragrance free", "non comedogenic"),
     (("size", ("1.7 oz", "2.5 oz", "3.4 oz")),), (8, 45)),
    ("hair extensions", "beauty", "beauty › hair care › extensions", ("hair", "extensions"), "Hair Extensions", False,
     ("clip in", "human hair", "natural looking", "heat resistant", "straight", "wavy"),
     (("color", ("jet black", "dark brown", "light brown", "blonde", "auburn")), ("length", ("14 inch", "18 inch", "22 inch"))),
     (15, 90)),
    ("nail polish", "beauty", "beauty › makeup › nails", ("nail", "polish"), "Nail Polish", True,
     ("quick dry", "chip resistant", "non toxic", "gel effect", "glossy"),
     (("color", ("cherry", "nude", "lilac", "navy", "gold glitter", "white")),), (4, 20)),
    ("wireless earbuds", "electronics", "electronics › audio › headphones", ("earbuds",), "Wireless Earbuds", False,
     ("bluetooth", "noise cancelling", "water resistant", "charging case", "touch control", "built-in microphone"),
     (("color", ("black", "white", "navy blue", "pink")),), (20, 150)),
    ("phone case", "electronics", "electronics › phones › cases", ("phone", "case"), "Phone Case", True,
     ("shockproof", "slim design", "clear", "kickstand", "wireless charging compatible", "raised edges"),
     (("model", ("iphone 14", "iphone 15", "galaxy s23", "pixel 8")), ("color", ("black", "clear", "blue", "purple", "red"))),
     (8, 40)),
    ("usb c cable", "electronics", "electronics › accessories › cables", ("usb", "cable"), "USB C Cable", True,
     ("fast charging", "braided nylon", "data transfer", "tangle free", "right angle"),
     (("length", ("3 ft", "6 ft", "10 ft")), ("color", ("black", "white", "grey", "red"))), (6, 25)),
    ("bluetooth speaker", "electronics", "electronics › audio › speakers", ("speaker",), "Bluetooth Speaker", True,
     ("waterproof", "portable", "deep bass", "long battery life", "stereo pairing"),
     (("color", ("black", "blue", "red", "teal", "camo")),), (20, 130)),
    ("power bank", "electronics", "electronics › accessories › batteries", ("power", "bank"), "Power Bank", True,
     ("fast charging", "usb c", "led display", "compact", "dual output"),
     (("capacity", ("5000mah", "10000mah", "20000mah")), ("color", ("black", "white", "blue"))), (15, 60)),
    ("coffee", "grocery", "grocery › beverages › coffee", ("coffee",), "Coffee", False,
     ("whole bean", "ground", "medium roast", "dark roast", "organic", "fair trade", "decaf"),
     (("flavor", ("original", "vanilla", "hazelnut", "mocha")), ("size", ("12 ounce", "2 pound", "32 ounce"))), (8, 40)),
    ("green tea", "grocery", "grocery › beverages › tea", ("tea",), "Green Tea", False,
     ("organic", "loose leaf", "tea bags", "caffeine free", "non gmo"),
     (("flavor", ("jasmine", "mint", "lemon", "matcha")), ("pack", ("pack of 1", "pack of 3", "pack of 6"))), (5, 30)),
    ("protein bars", "grocery", "grocery › snacks › bars", ("protein", "bars"), "Protein Bars", False,
     ("gluten free", "low sugar", "keto friendly", "plant based", "non gmo"),
     (("flavor", ("chocolate chip", "peanut butter", "cookie dough", "salted caramel")), ("pack", ("pack of 12", "pack of 24"))),
     (12, 45)),
    ("potato chips", "grocery", "grocery › snacks › chips", ("chips",), "Potato Chips", False,
     ("kettle cooked", "gluten free", "non gmo", "low sodium", "vegan"),
     (("flavor", ("sea salt", "sour cream and onion", "barbecue", "jalapeno")), ("pack", ("pack of 6", "pack of 12", "pack of 24"))),
     (6, 30)),
    ("olive oil", "grocery", "grocery › pantry › oils", ("olive", "oil"), "Olive Oil", False,
     ("extra virgin", "cold pressed", "organic", "non gmo", "glass bottle"),
     (("size", ("16.9 fl oz", "25.5 fl oz", "33.8 fl oz")),), (8, 40)),
    ("office chair", "home", "home › furniture › chairs", ("office", "chair"), "Office Chair", True,
     ("ergonomic", "lumbar support", "adjustable height", "mesh back", "swivel", "padded armrests"),
     (("color", ("black", "grey", "white", "blue")),), (60, 250)),
    ("bookshelf", "home", "home › furniture › shelves", ("bookshelf",), "Bookshelf", True,
     ("easy assembly", "solid wood", "5 tier", "industrial style", "anti tip"),
     (("color", ("walnut", "white", "black", "oak")),), (40, 180)),
    ("bed sheets", "home", "home › bedding › sheets", ("sheets",), "Bed Sheets", False,
     ("deep pocket", "microfiber", "cooling", "wrinkle resistant", "egyptian cotton"),
     (("size", ("twin", "full", "queen", "king")), ("color", ("white", "grey", "navy blue", "sage green", "ivory"))), (20, 90)),
    ("table lamp", "home", "home › lighting › lamps", ("lamp",), "Table Lamp", True,
     ("dimmable", "usb port", "touch control", "linen shade", "ceramic base"),
     (("color", ("white", "black", "brass", "blue")),), (15, 80)),
    ("curtains", "home", "home › decor › curtains", ("curtains",), "Curtains", False,
     ("blackout", "thermal insulated", "grommet top", "noise reducing", "machine washable"),
     (("size", ("52 x 63 inch", "52 x 84 inch", "52 x 95 inch")), ("color", ("grey", "navy", "beige", "black", "white"))),
     (15, 70)),
)
# fmt: on


@dataclass(frozen=True)
class ProductType:
    key: str
    category: str
    path: str
    nouns: tuple[str, ...]
    title: str
    singular: bool
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]


PRODUCT_TYPES: tuple[ProductType, ...] = tuple(ProductType(*row) for row in _TYPES)
CATEGORIES: tuple[str, ...] = tuple(dict.fromkeys(t.category for t in PRODUCT_TYPES))


@dataclass
class Product:
    asin: str
    title: str
    query: str  # the product type key (WebShop's ``query``)
    category: str
    product_category: str  # "a › b › c"
    nouns: tuple[str, ...]  # name nouns: brand + type nouns (stand-in for spaCy's noun tags)
    attributes: list[str]
    options: dict[str, list[str]]
    price: float
    features: list[str] = field(default_factory=list)  # WebShop's BulletPoints
    description: str = ""
    rating: str = "N.A."
    reviews: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class Goal:
    asin: str  # the target product
    instruction: str
    query: str
    category: str
    product_category: str
    nouns: tuple[str, ...]
    attributes: list[str]
    options: dict[str, str]
    price_upper: float
    index: int = -1


# ------------------------------------------------------------------------------------------------------
# Fuzzy matching and the reward
# ------------------------------------------------------------------------------------------------------
def _process(text: str) -> str:
    return " ".join(re.sub(r"\W", " ", str(text).lower()).split())


def _ratio(a: str, b: str) -> int:
    if not a or not b:
        return 0
    return round(100 * difflib.SequenceMatcher(None, a, b).ratio())


def token_set_ratio(s1: str, s2: str) -> int:
    """fuzzywuzzy's ``token_set_ratio`` (0-100) with difflib's ratio."""
    p1, p2 = _process(s1), _process(s2)
    if not p1 or not p2:
        return 0
    t1, t2 = set(p1.split()), set(p2.split())
    inter = " ".join(sorted(t1 & t2))
    c1 = (inter + " " + " ".join(sorted(t1 - t2))).strip()
    c2 = (inter + " " + " ".join(sorted(t2 - t1))).strip()
    return max(_ratio(inter, c1), _ratio(inter, c2), _ratio(c1, c2))


def type_reward(product: Product, goal: Goal) -> dict[str, Any]:
    """WebShop's ``get_type_reward`` (see the module docstring)."""
    query_match = product.query == goal.query
    parts_p = {x.strip() for x in product.product_category.split("›")}
    parts_g = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(parts_p & parts_g) >= 2
    desired = [n.lower() for n in goal.nouns]
    if not desired:
        title_score = 0.2
    else:
        title_score = len({n.lower() for n in product.nouns} & set(desired)) / len(desired)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def _in_text(phrase: str, product: Product) -> bool:
    phrase = phrase.lower()
    return (
        phrase in product.title.lower()
        or phrase in " ".join(product.features).lower()
        or phrase in product.description.lower()
    )


def attribute_matches(product: Product, goal: Goal) -> int:
    n = 0
    for g_attr in goal.attributes:
        if any(token_set_ratio(p_attr, g_attr) > 85 for p_attr in product.attributes) or _in_text(
            g_attr, product
        ):
            n += 1
    return n


def option_matches(goal: Goal, chosen: dict[str, str]) -> int:
    n = 0
    for name, want in goal.options.items():
        got = chosen.get(name)
        if got is None:
            continue
        if name.lower() in EXACT_MATCH_OPTS:
            n += int(_process(got) == _process(want))
        else:
            n += int(token_set_ratio(got, want) > 85)
    return n


def get_reward(
    product: Product, goal: Goal, chosen: dict[str, str], price: float | None = None
) -> tuple[float, dict]:
    """WebShop's reward in [0, 1] for buying ``product`` with options ``chosen`` against ``goal``."""
    rt = type_reward(product, goal)
    price = product.price if price is None else price
    r_price = price <= goal.price_upper
    n_att = attribute_matches(product, goal)
    n_opt = option_matches(goal, chosen)
    denom = len(goal.attributes) + len(goal.options) + 1
    reward = rt["r_type"] * (n_att + n_opt + int(r_price)) / denom
    info = {
        **rt,
        "r_att": n_att / len(goal.attributes) if goal.attributes else None,
        "r_option": n_opt / len(goal.options) if goal.options else None,
        "r_price": r_price,
        "n_att": n_att,
        "n_opt": n_opt,
        "denominator": denom,
    }
    return reward, info


# ------------------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------------------
_SYLL = (
    "ka",
    "lo",
    "mi",
    "ra",
    "ven",
    "zo",
    "tri",
    "no",
    "sa",
    "bel",
    "qu",
    "ix",
    "dor",
    "fi",
    "len",
    "po",
    "ta",
    "vy",
)
_FEATURE = (
    "{A}: a customer favourite",
    "{A}, quality checked before shipping",
    "Product feature: {a}",
    "{A} - see the description for details",
)
# Attributes that no product has together.
EXCLUSIVE = (
    frozenset({"long sleeve", "short sleeve"}),
    frozenset({"dark roast", "medium roast"}),
    frozenset({"whole bean", "ground"}),
    frozenset({"skinny", "bootcut"}),
    frozenset({"straight", "wavy"}),
    frozenset({"pullover", "zip up"}),
    frozenset({"loose leaf", "tea bags"}),
)
_REVIEWS = (
    (5, "Exactly as described, would buy again."),
    (4, "Good value for the price."),
    (3, "It is okay, nothing special."),
    (2, "Quality could be better."),
    (5, "Love it!"),
)


def _brand(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLL) for _ in range(rng.choice((2, 3)))).capitalize()


def _asin(rng: random.Random) -> str:
    return "B0" + "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(8))


def _product(rng: random.Random, ptype: ProductType, brands: list[str], asins: set[str]) -> Product:
    asin = _asin(rng)
    while asin in asins:
        asin = _asin(rng)
    asins.add(asin)
    brand = rng.choice(brands)
    want = rng.randint(2, min(4, len(ptype.attributes)))
    attrs: list[str] = []
    for attr in rng.sample(ptype.attributes, len(ptype.attributes)):
        if len(attrs) < want and not any(attr in ex and ex & set(attrs) for ex in EXCLUSIVE):
            attrs.append(attr)
    options = {}
    for name, values in ptype.options:
        keep = sorted(rng.sample(range(len(values)), rng.randint(2, min(5, len(values)))))
        options[name] = [values[i] for i in keep]
    price = int(rng.uniform(*ptype.price)) + 0.99
    title = f"{brand} {' '.join(a.title() for a in attrs)} {ptype.title}"
    features = [rng.choice(_FEATURE).format(A=a.capitalize(), a=a) for a in attrs]
    description = (
        f"This {ptype.key} by {brand} is {', '.join(attrs[:-1])} and {attrs[-1]}. "
        f"A great choice in {ptype.path.split(' › ')[-1]}."
    )
    rating = rng.choice(("N.A.", "3.5", "4.0", "4.5", "5.0"))
    reviews = [rng.choice(_REVIEWS) for _ in range(rng.randint(0, 2))]
    return Product(
        asin,
        title,
        ptype.key,
        ptype.category,
        ptype.path,
        (brand.lower(),) + ptype.nouns,
        attrs,
        options,
        price,
        features,
        description,
        rating,
        reviews,
    )


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _option_phrase(name: str, value: str, rng: random.Random) -> str:
    if name == "size":
        return f"size {value}" if rng.random() < 0.6 else f"in size {value}"
    if name == "color":
        return rng.choice((f"{value}", f"in {value}", f"{value} color"))
    if name in ("flavor", "scent"):
        return f"{value} {name}"
    if name in ("length", "capacity"):
        return f"{value} {name}" if rng.random() < 0.5 else f"{name}: {value}"
    if name == "model":
        return f"for {value}"
    return value  # "pack of 6"


def _goal(rng: random.Random, product: Product, ptype: ProductType, index: int) -> Goal:
    attrs = rng.sample(product.attributes, rng.randint(1, min(3, len(product.attributes))))
    options = {name: rng.choice(values) for name, values in product.options.items()}
    above = [p for p in PRICE_RANGE if p > product.price][:4]
    price_upper = max(rng.sample(above, 2)) if len(above) >= 2 else 1_000_000.0
    noun = ("a " if ptype.singular else "") + ptype.key
    opts = ", ".join(_option_phrase(n, v, rng) for n, v in options.items())
    price_text = f"price lower than {price_upper:.2f} dollars" if price_upper < 1_000_000 else ""
    a = _join(attrs)
    template = rng.randrange(4)
    if template == 0:
        text = f"i need {('a ' if ptype.singular else '')}{a} {ptype.key}, {opts}"
    elif template == 1:
        text = f"i am looking for {noun} that {'is' if ptype.singular else 'are'} {a}, {opts}"
    elif template == 2:
        text = f"find me {a} {ptype.key} {opts}"
    else:
        text = f"i want to buy {noun}, {a}, {opts}"
    if price_text:
        text += f", and {price_text}"
    return Goal(
        product.asin,
        text,
        product.query,
        product.category,
        product.product_category,
        product.nouns,
        attrs,
        options,
        price_upper,
        index,
    )


@dataclass
class Catalog:
    """A generated shop: products, one goal per product, a BM25 index over the products' text."""

    seed: int
    products: list[Product]
    goals: list[Goal]
    by_asin: dict[str, Product]
    index: BM25

    def search(self, query: str, n: int = SEARCH_RETURN_N) -> list[Product]:
        return [self.products[i] for i, _ in self.index.search(query, n)]

    def split_goals(self, split: str) -> list[int]:
        """Goal indices of a split: held-out = targets whose product index is a multiple of 5."""
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        held = split == "heldout"
        return [i for i in range(len(self.goals)) if (i % HELDOUT_EVERY == 0) == held]


@functools.lru_cache(maxsize=8)
def build_catalog(seed: int = 0, num_products: int = 1000) -> Catalog:
    """The catalog of ``seed`` (deterministic; cached per process)."""
    if num_products < len(PRODUCT_TYPES):
        raise ValueError(f"num_products must be >= {len(PRODUCT_TYPES)}")
    rng = random.Random(f"slea-webshop-{seed}")
    brands = sorted({_brand(rng) for _ in range(60)})
    asins: set[str] = set()
    types = [PRODUCT_TYPES[i % len(PRODUCT_TYPES)] for i in range(num_products)]
    rng.shuffle(types)
    products = [_product(rng, t, brands, asins) for t in types]
    goals = [_goal(rng, p, t, i) for i, (p, t) in enumerate(zip(products, types, strict=True))]
    docs = [f"{p.title} {' '.join(p.features)} {p.description}" for p in products]
    return Catalog(seed, products, goals, {p.asin: p for p in products}, BM25(docs))


_PRICE_CLAUSE = re.compile(r",?\s*and price lower than [\d.]+ dollars\s*$")


@functools.lru_cache(maxsize=20_000)
def expert_actions(
    seed: int, num_products: int, goal_index: int, page_size: int, max_results: int
) -> tuple[str, ...]:
    """The expert demonstration of a goal: search with the instruction (without its price clause), page to
    the first result that earns reward 1 with the goal's options, click it, choose the options, buy."""
    cat = build_catalog(seed, num_products)
    goal = cat.goals[goal_index]
    for query in (_PRICE_CLAUSE.sub("", goal.instruction), cat.by_asin[goal.asin].title.lower()):
        results = cat.search(query, max_results)
        for pos, product in enumerate(results):
            chosen = _goal_options_of(product, goal)
            if get_reward(product, goal, chosen)[0] >= 1.0 - 1e-9:
                return (
                    f"search[{query}]",
                    *["click[next >]"] * (pos // page_size),
                    f"click[{product.asin.lower()}]",
                    *[f"click[{v}]" for v in chosen.values()],
                    "click[buy now]",
                )
    raise RuntimeError(f"goal {goal_index} has no expert demonstration")  # the target always qualifies


def _goal_options_of(product: Product, goal: Goal) -> dict[str, str]:
    return {n: v for n, v in goal.options.items() if v in product.options.get(n, [])}
