"""Answer metrics for search-QA: SQuAD exact match and token F1, plus gold-answer aliases.

Normalisation is SQuAD v1.1's ``normalize_answer`` (the one Search-R1's ``em_check`` uses): lowercase, drop
every ASCII punctuation character, drop the articles ``a``/``an``/``the`` as whole words, collapse whitespace.
``exact_match`` and ``f1`` take the maximum over the gold aliases. ``loose_recall`` is FanOutQA's loose
accuracy idea for list / dict answers: the fraction of gold items whose normalised text occurs inside the
normalised prediction.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower, remove punctuation, remove articles, fix whitespace."""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: str | Iterable[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


def exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 when the normalised prediction equals some normalised gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(golds)))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:  # SQuAD v2: both empty counts as a match
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: str | Iterable[str]) -> float:
    """SQuAD token F1 between the normalised prediction and the best gold answer."""
    pred = normalize_answer(prediction).split()
    return max((_f1(pred, normalize_answer(g).split()) for g in _golds(golds)), default=0.0)


def loose_recall(prediction: str, items: Sequence[str]) -> float:
    """Fraction of gold ``items`` whose normalised text appears in the normalised prediction (0 if none)."""
    if not items:
        return 0.0
    pred = f" {normalize_answer(prediction)} "
    hits = sum(1 for it in items if (n := normalize_answer(it)) and f" {n} " in pred)
    return hits / len(items)


def _scalar_text(value: Any) -> list[str]:
    if isinstance(value, bool):
        return ["yes", "true"] if value else ["no", "false"]
    if isinstance(value, int):
        return [str(value), f"{value:,}"]
    if isinstance(value, float):
        text = f"{value:.6f}".rstrip("0").rstrip(".")
        return [text, str(value)] if str(value) != text else [text]
    return [str(value).strip()]


def answer_aliases(answer: Any) -> tuple[list[str], list[str]]:
    """Gold answer strings and gold *items* of a raw answer value (FanOutQA answers are str / int / float /
    bool / list / dict).

    Scalars give their text forms (ints also with thousands separators, bools ``yes``/``true`` or
    ``no``/``false``) and themselves as the single item. A list gives ``"a, b, c"`` as the alias and its
    elements as items; a dict gives ``"k1: v1, k2: v2"`` and its values (stringified) as items.
    """
    if isinstance(answer, dict):
        items = [_scalar_text(v)[0] for v in answer.values()]
        return [", ".join(f"{k}: {_scalar_text(v)[0]}" for k, v in answer.items())], items
    if isinstance(answer, (list, tuple)):
        items = [_scalar_text(v)[0] for v in answer]
        return [", ".join(items)], items
    aliases = list(dict.fromkeys(a for a in _scalar_text(answer) if a))
    return aliases, aliases[:1]
