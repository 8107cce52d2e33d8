"""Library evolution input: split the batch at η, pick the trajectories to learn from, distil candidates.

SLEA-RL §3.4: ``T+ = {τ : R(τ) > η}``, ``T− = {τ : R(τ) <= η}`` with η the batch median by default (a fixed
threshold via ``ExperienceSection.eta``); the top-K_traj of T+ yield strategies (zone ``pos``), the bottom-K_traj
of T− warnings (zone ``neg``); every candidate scores ``z_e = R(τ_source)`` and is linked to the observation
clusters of the steps it came from (``Step.cluster_id``).

Extractors are registered by name (``experience.extractor``; a user's own with :func:`register_extractor`, from a
plugin module): a factory ``f(generate_text) -> extractor`` whose result has ``extract(pos, neg) ->
list[Candidate]`` (``generate_text(prompts) -> texts`` is handed in by the trainer, ``None`` when there is no
model to ask). Built in:

* ``rule`` (:class:`RuleExtractor`) — deterministic, from the goal, actions, observations and outcome; the
  fallback and what the tests use.
* ``llm`` (:class:`LLMExtractor`) — prompts (``slea/prompts/extract_*.txt``) answered by ``generate_text`` (it
  never imports the policy); messy answers are parsed defensively and anything unusable is dropped; a trajectory
  whose answer yields nothing falls back to the rules.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from string import Template

from slea.experience.library import LEVELS, sanitize
from slea.plugins import Registry
from slea.types import Trajectory

GenerateText = Callable[[list[str]], list[str]]
EXTRACTORS: Registry[Callable] = Registry("experience extractor", ("slea.experience.extraction",))


def register_extractor(name: str, *, replace: bool = False):
    """Decorator: register ``factory(generate_text) -> extractor`` (``extract(pos, neg) -> list[Candidate]``)."""
    return EXTRACTORS.decorator(name, replace=replace)


def get_extractor(name: str) -> Callable:
    """The extractor factory registered as ``name`` (or ``"module:function"``)."""
    return EXTRACTORS.get(name)


@dataclass
class Candidate:
    text: str
    zone: str  # "pos" | "neg"
    level: str
    score: float
    task_type: str = ""
    context: str = ""
    sources: list[int] = field(default_factory=list)
    clusters: list[int] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------
# Outcome split
# ---------------------------------------------------------------------------------------------------------------
def eta_value(returns: Sequence[float], eta: str | float = "median") -> float:
    if isinstance(eta, str):
        if eta != "median":
            raise ValueError(f"eta must be 'median' or a number, got {eta!r}")
        return float(statistics.median(returns)) if returns else 0.0
    return float(eta)


def split_outcomes(trajs: Sequence[Trajectory], eta: str | float = "median"
                   ) -> tuple[float, list[Trajectory], list[Trajectory]]:
    """(η, T+, T−) with T+ = R > η and T− = R <= η."""
    rets = [t.episode_return for t in trajs]
    e = eta_value(rets, eta)
    pos = [t for t, r in zip(trajs, rets) if r > e]
    neg = [t for t, r in zip(trajs, rets) if r <= e]
    return e, pos, neg


def select(trajs: Sequence[Trajectory], eta: str | float = "median", k_traj: int = 5
           ) -> tuple[float, list[Trajectory], list[Trajectory]]:
    """η, the top-k of T+ (highest R first, shorter first) and the bottom-k of T− (lowest R first)."""
    e, pos, neg = split_outcomes(trajs, eta)
    pos = sorted(pos, key=lambda t: (-t.episode_return, len(t.steps), t.traj_id))[:k_traj]
    neg = sorted(neg, key=lambda t: (t.episode_return, -len(t.steps), t.traj_id))[:k_traj]
    return e, pos, neg


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------
_ROOM = re.compile(r"-=\s*(.+?)\s*=-")
_SENT = re.compile(r"(?<=[.!?])\s+")


def summarize_observation(obs: str, max_chars: int = 90) -> str:
    """A short, stable description of an observation: the room (TextWorld header) and its first sentence."""
    text = " ".join(str(obs).split())
    room = ""
    m = _ROOM.search(text)
    if m:
        room = m.group(1).strip()
        text = (text[: m.start()] + text[m.end():]).strip()
    first = _SENT.split(text, maxsplit=1)[0] if text else ""
    if not room and len(first) > 1 and first[0].isupper() and first[1].islower():
        first = first[0].lower() + first[1:]  # reads as "When you take the apple."
    out = f"in the {room.lower()}: {first}" if room else first
    return sanitize(_clip_words(out, max_chars), max_chars + 1)


def _clip_words(text: str, max_chars: int) -> str:
    """``text`` cut at a word boundary within ``max_chars``, with an ellipsis when cut."""
    if len(text) <= max_chars:
        return text
    return (text[:max_chars].rsplit(" ", 1)[0] or text[:max_chars]).rstrip(",;: ") + "…"


# Framing around a task statement (TextWorld's goals open with a greeting and hedge every step): sentences made
# only of it are dropped, and it is cut from the head of what remains, so summaries start with the task itself.
_FILLER_SENTENCE = re.compile(
    r"^(?:hey|hi|hello|welcome|thanks|thank you|alright|okay|ok|that's it|that's all|good luck|it's time to|"
    r"get ready|are you ready|i hope you're ready|here is how to play|here is your task|you are now playing|"
    r"this is)\b", re.IGNORECASE)
_FILLER_HEAD = re.compile(
    r"^(?:(?:your|the|today's) (?:(?:first|next|final) )?(?:task|objective|goal|mission|step)(?: for today)? is to|"
    r"first(?: off| of all| step| stop)?|then|and then|and|okay|ok|after that|next|once you've done that|"
    r"once you manage that|if you can succeed at that|with that (?:done|accomplished)|that done|please|you could,? like|"
    r"if it's not too much trouble|i need you to|you need to|you have to|you should|make sure to|"
    r"make an effort to|make an attempt to|try to|attempt to|you'll have to|i want you to)\b,?\s*", re.IGNORECASE)


def summarize_goal(goal: str, max_chars: int = 70) -> str:
    """The task in a goal text, short: filler sentences dropped, leading framing cut ("Your task is to", "First
    off, if it's not too much trouble, I need you to"), shortened at a word boundary."""
    sents = [x.strip() for x in _SENT.split(" ".join(str(goal).split())) if x.strip()]
    kept = [x for x in sents if not _FILLER_SENTENCE.match(x)] or sents
    parts = []
    for x in kept:
        prev = None
        while prev != x:
            prev, x = x, _FILLER_HEAD.sub("", x, count=1)
        x = x.rstrip(".!")
        if x:
            parts.append(x[0].lower() + x[1:] if len(x) > 1 and x[1].islower() else x)
    return _clip_words("; ".join(parts) or "the task", max_chars)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _short(text: str, n: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _clusters(steps, cap: int = 12) -> list[int]:
    return list(dict.fromkeys(s.cluster_id for s in steps if s.cluster_id >= 0))[:cap]


# ---------------------------------------------------------------------------------------------------------------
# Rule-based extractor
# ---------------------------------------------------------------------------------------------------------------
class RuleExtractor:
    """Deterministic strategies/warnings from a trajectory's goal, actions, observations and outcome."""

    def __init__(self, max_examples: int = 2) -> None:
        self.max_examples = max_examples

    def extract(self, pos: Sequence[Trajectory], neg: Sequence[Trajectory]) -> list[Candidate]:
        """Strategies from each trajectory of ``pos``, warnings from each of ``neg``."""
        return [c for t in pos for c in self.strategies(t)] + [c for t in neg for c in self.warnings(t)]

    def strategies(self, t: Trajectory) -> list[Candidate]:
        R = t.episode_return
        valid = [s for s in t.steps if s.valid and s.action]
        if not valid:
            return []
        goal = summarize_goal(t.goal or "the task")
        base = {"zone": "pos", "score": R, "task_type": t.task_type, "sources": [t.traj_id]}
        out: list[Candidate] = []
        key = [s for s in valid if s.reward > 0] or [valid[-1]]
        for s in key[-self.max_examples:]:
            summ = summarize_observation(s.anchor)
            out.append(Candidate(f"When {summ} — '{s.action}' moved you toward the goal ({goal}).",
                                 level="example", context=summ, clusters=_clusters([s]), **base))
        acts = [s.action for s in valid]
        seq = acts if len(acts) <= 8 else acts[:3] + ["…"] + acts[-4:]
        out.append(Candidate(f"For '{goal}', a winning sequence was: {' > '.join(seq)} ({_steps(len(acts))}).",
                             level="pattern", context=summarize_observation(valid[0].anchor),
                             clusters=_clusters(valid), **base))
        verbs = Counter(a.split()[0].lower() for a in acts if a.split())
        if verbs:
            top = ", ".join(f"'{v}'" for v, _ in verbs.most_common(2))
            out.append(Candidate(f"To {goal}, act on the objects the goal names: {top} commands did the "
                                 f"work, in {_steps(len(acts))}.",
                                 level="principle", context=goal, clusters=_clusters(valid[:1]), **base))
        return out

    def warnings(self, t: Trajectory) -> list[Candidate]:
        R = t.episode_return
        goal = summarize_goal(t.goal or "the task")
        base = {"zone": "neg", "score": R, "task_type": t.task_type, "sources": [t.traj_id]}
        out: list[Candidate] = []
        seen: set[str] = set()
        for s in t.steps:
            if not s.valid:
                said = _short(s.action or s.response_text or "(empty)", 40)
                if said in seen:
                    continue
                seen.add(said)
                summ = summarize_observation(s.anchor)
                out.append(Candidate(f"When {summ} — '{said}' was not a valid command; copy one command "
                                     f"exactly from the list.", level="example", context=summ,
                                     clusters=_clusters([s]), **base))
            elif s.reward < 0 and s.action not in seen:
                seen.add(s.action)
                summ = summarize_observation(s.anchor)
                out.append(Candidate(f"When {summ} — '{s.action}' was penalised.", level="example",
                                     context=summ, clusters=_clusters([s]), **base))
        valid = [s for s in t.steps if s.valid and s.action]
        reps = Counter(s.action for s in valid)
        for act, n in reps.most_common(1):
            if n >= 3 and not any(s.reward > 0 for s in valid if s.action == act):
                steps = [s for s in valid if s.action == act]
                out.append(Candidate(f"Repeating '{act}' ({n} times) made no progress on '{goal}'; try "
                                     f"something else.", level="pattern",
                                     context=summarize_observation(steps[0].anchor), clusters=_clusters(steps),
                                     **base))
        if t.steps and not t.won:
            last = t.steps[-1]
            if t.truncated:
                out.append(Candidate(f"On '{goal}' the episode ran out of steps ({len(t.steps)}): do not "
                                     f"wander; go for what the goal names.", level="principle", context=goal,
                                     clusters=_clusters(t.steps[-1:]), **base))
            elif last.valid and last.action and last.done:
                summ = summarize_observation(last.anchor)
                out.append(Candidate(f"When {summ} — '{last.action}' ended the episode without success.",
                                     level="example", context=summ, clusters=_clusters([last]), **base))
        return out


# ---------------------------------------------------------------------------------------------------------------
# LLM extractor
# ---------------------------------------------------------------------------------------------------------------
def load_template(name: str) -> str:
    return resources.files("slea").joinpath("prompts", name).read_text(encoding="utf-8")


def render_trajectory(t: Trajectory, max_steps: int = 12, obs_chars: int = 160) -> str:
    steps = t.steps if len(t.steps) <= max_steps else t.steps[:4] + t.steps[-(max_steps - 4):]
    lines = []
    for s in steps:
        act = s.action if s.valid and s.action else f"{_short(s.response_text or s.action, 40)} (invalid)"
        lines.append(f"{s.step + 1}. saw: {_short(s.anchor, obs_chars)}\n   did: {act}   reward: {s.reward:g}")
    if len(steps) < len(t.steps):
        lines.insert(4, f"   … ({len(t.steps) - len(steps)} steps omitted) …")
    return "\n".join(lines)


_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r"</?[A-Za-z_|][^<>\n]{0,40}>")
_FENCE = re.compile(r"```[a-zA-Z]*")
_BULLET = re.compile(r"^\s*(?:[-*•·+>]+|\(?\d{1,3}[.):]|\(?[a-hA-H][.)]|#+)\s*")
_LEVEL = re.compile(r"^[\[(*_\s]*(principle|pattern|example)s?[\])*_\s]*[:\-–—.]?\s*", re.IGNORECASE)
_PREFIX = re.compile(r"^(?:strategy|strategies|warning|warnings|tip|tips|lesson|lessons|rule|avoid|do)\s*"
                     r"(?:\d+)?\s*[:\-–—]\s*", re.IGNORECASE)
_JUNK = re.compile(r"^(?:here (?:are|is)|sure\b|okay\b|as an ai|i (?:cannot|can't)|note:|output:|answer:)", re.IGNORECASE)


def parse_llm_list(text: object, max_items: int = 10, default_level: str = "pattern"
                   ) -> list[tuple[str, str]]:
    """(level, text) items from a model's free-form answer; never raises. Unusable lines are dropped."""
    if not isinstance(text, str):
        return []
    text = _THINK.sub(" ", text)
    text = _FENCE.sub(" ", text)
    text = _TAG.sub(" ", text)
    items: list[tuple[str, str]] = []
    seen: set[str] = set()
    for raw in re.split(r"[\r\n]+|(?<=\S)\s+(?=\d{1,2}[.)]\s+[A-Z])", text):
        line = raw.strip()
        for _ in range(3):
            line = _BULLET.sub("", line).strip()
        level = default_level
        m = _LEVEL.match(line)
        if m:
            level = m.group(1).lower()
            line = line[m.end():]
        line = _PREFIX.sub("", line).strip().strip("\"'`*_ ").strip()
        if m is None:
            m2 = re.search(r"[\[(](principle|pattern|example)s?[\])]\s*$", line, re.IGNORECASE)
            if m2:
                level = m2.group(1).lower()
                line = line[: m2.start()].strip()
        if not _usable(line):
            continue
        line = sanitize(line, 300)
        key = line.lower()
        if key in seen:
            continue
        seen.add(key)
        items.append((level if level in LEVELS else default_level, line))
        if len(items) >= max_items:
            break
    return items


def _usable(line: str) -> bool:
    if len(line) < 12 or line.endswith(":") or _JUNK.match(line):
        return False
    letters = sum(c.isalpha() for c in line)
    if letters < 0.5 * len(line) or len(line.split()) < 3:
        return False
    return max(Counter(line.lower()).values()) <= 0.5 * len(line)  # not "aaaaaaa", "!!!!!!"


class LLMExtractor:
    """Ask the (same) model to distil lessons; rules fill in wherever its answer is unusable."""

    def __init__(self, generate_text: GenerateText, *, fallback: RuleExtractor | None = None,
                 max_items: int = 5) -> None:
        self.generate_text = generate_text
        self.fallback = fallback or RuleExtractor()
        self.max_items = max_items
        self.templates = {"pos": Template(load_template("extract_strategies.txt")),
                          "neg": Template(load_template("extract_warnings.txt"))}
        self.stats: Counter = Counter()

    def prompt(self, t: Trajectory, zone: str) -> str:
        return self.templates[zone].safe_substitute(
            goal=_short(t.goal or "(no goal given)", 200), task_type=t.task_type or "text game",
            outcome="success" if t.won else "failure", ret=f"{t.episode_return:g}", steps=len(t.steps),
            trajectory=render_trajectory(t), k=self.max_items)

    def extract(self, pos: Sequence[Trajectory], neg: Sequence[Trajectory]) -> list[Candidate]:
        jobs = [(t, "pos") for t in pos] + [(t, "neg") for t in neg]
        if not jobs:
            return []
        answers: list[object] = []
        try:
            answers = list(self.generate_text([self.prompt(t, z) for t, z in jobs]))
        except Exception:  # noqa: BLE001 - a failing generator must not stop training: use the rules
            self.stats["generate_errors"] += 1
        if len(answers) != len(jobs):
            answers = [None] * len(jobs)
        out: list[Candidate] = []
        for (t, zone), ans in zip(jobs, answers):
            items = parse_llm_list(ans, self.max_items)
            if not items:
                self.stats["fallback"] += 1
                out += self.fallback.strategies(t) if zone == "pos" else self.fallback.warnings(t)
                continue
            self.stats["llm_items"] += len(items)
            steps = t.steps if zone == "pos" else ([s for s in t.steps if not s.valid or s.reward < 0]
                                                    or t.steps[-1:])
            ctx = summarize_observation(t.steps[0].anchor) if t.steps else ""
            for level, text in items:
                out.append(Candidate(text, zone, level, t.episode_return, t.task_type, ctx, [t.traj_id],
                                     _clusters(steps)))
        return out


@register_extractor("rule")
def rule_extractor(generate_text: GenerateText | None = None) -> RuleExtractor:
    """The deterministic rules (:class:`RuleExtractor`); ``generate_text`` is not used."""
    return RuleExtractor()


@register_extractor("llm")
def llm_extractor(generate_text: GenerateText | None = None) -> LLMExtractor | RuleExtractor:
    """The model distils lessons (:class:`LLMExtractor`); the rules when no model is handed in."""
    return LLMExtractor(generate_text) if generate_text is not None else RuleExtractor()


def extract_candidates(trajs: Sequence[Trajectory], *, eta: str | float = "median", k_traj: int = 5,
                       extractor=None) -> tuple[float, list[Candidate], dict[str, float]]:
    """η, strategy+warning candidates (best score first within each zone) and counts for the metrics, from
    ``extractor`` (anything with ``extract(pos, neg)``; default: the rules). Its ``stats`` counter, if any,
    is reported (``extract_<key>``) and cleared."""
    _, all_pos, all_neg = split_outcomes(trajs, eta)
    e, pos, neg = select(trajs, eta, k_traj)
    extractor = extractor if extractor is not None else RuleExtractor()
    cands = list(extractor.extract(pos, neg))
    stats = getattr(extractor, "stats", None)  # a counter of the extractor's own (e.g. the LLM's fallbacks)
    info = {f"extract_{k}": float(v) for k, v in (stats or {}).items()}
    if stats:
        stats.clear()
    order = {lv: i for i, lv in enumerate(("example", "pattern", "principle"))}
    cands.sort(key=lambda c: (c.zone != "pos", -c.score if c.zone == "pos" else c.score, order.get(c.level, 3)))
    info.update({"eta": e, "t_pos": float(len(all_pos)), "t_neg": float(len(all_neg)),
                 "selected_pos": float(len(pos)), "selected_neg": float(len(neg)), "candidates": float(len(cands))})
    return e, cands, info
