"""The ``llm`` extractor: a model distils lessons from chat prompts; its answers are parsed defensively.

:class:`LLMExtractor` sends one chat prompt per selected trajectory (``extraction_prompts/extract_*.txt`` beside
this module, loaded by :func:`load_template`, the episode rendered by :func:`render_compact`) to ``generate_text``
(it never imports the policy; the trainer answers with the base model, LoRA off, multi-line, greedy) and keeps
several lessons per trajectory. :func:`parse_llm_list` never raises: bullets, numbering, level tags, think blocks,
echoes of the prompt, junk, too short or long lines are dropped; names are abstracted as in the rules
(:class:`Names`); a trajectory whose answer yields nothing falls back to :class:`RuleExtractor`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from importlib import resources
from string import Template

from slea.experience.calls import describe_call, is_tool_trajectory, step_error
from slea.experience.extraction import Candidate, GenerateText, register_extractor, step_clusters
from slea.experience.library import LEVELS, content_tokens, jaccard, sanitize
from slea.experience.placeholders import abstract
from slea.experience.rule_extractor import Names, RuleExtractor, summarize_goal, summarize_observation
from slea.types import Trajectory


def load_template(name: str) -> str:
    """The LLM extractor's prompt template ``name`` (``slea/experience/extraction_prompts/``)."""
    return resources.files("slea.experience").joinpath("extraction_prompts", name).read_text(encoding="utf-8")


def _short(text: str, n: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _tool_turn(t: Trajectory, i: int) -> str:
    """Step ``i`` of a tool episode as a call with its result (the next step's observation) or why it was
    rejected: ``multiply(a=8, b=8) → 64``, ``divide(a=1, b=2) (invalid: unknown tool 'divide'...)``."""
    s = t.steps[i]
    call = describe_call(s.action, 80)
    if not s.valid:
        why = step_error(s, 60)
        said = call or f"'{_short(s.response_text or '', 30)}'"
        return f"{said} (invalid{': ' + why if why else ''})"
    if call is None:
        return s.action
    return f"{call} → {_short(t.steps[i + 1].anchor, 40)}" if i + 1 < len(t.steps) else call


def render_compact(t: Trajectory, max_steps: int = 12, obs_chars: int = 100, *, roles: bool = False) -> str:
    """An episode in three lines (where it started, the commands typed, how it ended): the LLM extractor's
    ``$trajectory``. Short, and unlike a numbered step list it gives a small model no list to continue. A tool
    episode's middle line is its calls, each with its result (``Tool calls: multiply(a=8, b=8) → 64; ...``).
    With ``roles`` and a state key on the first step, a ``State:`` line gives that key (the kind of state, its
    entities as roles) after the start."""
    start = summarize_observation(t.steps[0].anchor, obs_chars) if t.steps else "(no observation)"
    if roles and t.steps and t.steps[0].state_key:
        start += f"\nState: {_short(t.steps[0].state_key, 160)}"
    tools = is_tool_trajectory(t)
    acts = []
    for i, s in enumerate(t.steps):
        if tools:
            a = _tool_turn(t, i)
        else:
            a = s.action if s.valid and s.action else f"'{_short(s.response_text or '', 30)}' (invalid)"
        if s.reward > 0:
            a += f" (reward {s.reward:g})"
        elif s.reward < 0 and s.valid:
            a += f" (penalty {s.reward:g})"
        acts.append(a)
    if len(acts) > max_steps:
        acts = acts[:4] + [f"… {len(acts) - max_steps + 1} more …"] + acts[-(max_steps - 5):]
    end = "won" if t.won else ("ran out of steps" if t.truncated else
                               f"the {'task' if tools else 'game'} ended without success")
    return f"Start: {start}\n{'Tool calls' if tools else 'Commands typed'}: {'; '.join(acts) or '(none)'}\nEnd: {end}."


_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r"</?(?!(?:object|place|tool|room|text|direction)>)[A-Za-z_|][^<>\n]{0,40}>")  # keeps placeholders
_FENCE = re.compile(r"```[a-zA-Z]*")
_BULLET = re.compile(r"^\s*(?:[-*•·+>]+|\(?\d{1,3}[.):]|\(?[a-hA-H][.)]|#+)\s*")
_LEVEL = re.compile(r"^[\[(*_\s]*(principle|pattern|example)s?[\])*_\s]*[:\-–—.]?\s*", re.IGNORECASE)
_PREFIX = re.compile(r"^(?:strategy|strategies|warning|warnings|tip|tips|lesson|lessons|rule|avoid|do)\s*"
                     r"(?:\d+)?\s*[:\-–—]\s*", re.IGNORECASE)
_JUNK = re.compile(r"^(?:here (?:are|is)|sure\b|okay\b|as an ai|i (?:cannot|can't)|note:|output:|answer:|"
                   r"in summary|to summarize|overall,? the agent|the agent (?:succeeded|failed)\b)", re.IGNORECASE)
# Lines that restate the episode or the prompt's own headings ("2. saw: ...", "did: take coin", "Goal: ...").
_META = re.compile(r"^(?:saw|did|reward|goal|episode|outcome|return|type of game|task type|step \d+|start|end|"
                   r"commands typed|tool calls)\b\s*[:=]|=-|-=|^(?:you are (?:in|now)|you see|there is|there are|you find|"
                   r"you arrive|you've entered|you're now|you take|you open|the agent (?:saw|did|typed|failed|"
                   r"succeeded))\b|\bthe agent (?:failed|succeeded)\b", re.IGNORECASE)
_NORM = re.compile(r"[^a-z0-9<>]+")
# A lesson gives advice: a condition or an imperative, not a description ("You see a bedchamber.")
_ADVICE = re.compile(
    r"\b(?:when|whenever|if|before|after|until|once|as soon as|always|never|avoid|don't|do not|should|must|need to|"
    r"try|instead|first|only|rather than|make sure|remember|prefer)\b|^(?:go|take|open|unlock|close|drop|put|"
    r"insert|eat|examine|look|check|read|use|explore|keep|pick|copy|choose|follow|find|move|stay|plan|head|"
    r"answer|reply|type|stop|repeat|leave|return|enter|search|get|call)\b", re.IGNORECASE)
# A sentence never ends on these words: the token budget cut the line ("If you are stuck, try the")
_CUT = re.compile(r"\b(?:the|a|an|to|and|or|of|with|for|in|on|at|from|by|is|are|your|if|then|that|before|"
                  r"after|than|into|not)\W*$", re.IGNORECASE)


def _norm(text: str) -> str:
    return _NORM.sub(" ", text.lower()).strip()


class _Echo:
    """Is a line a copy of the prompt? Contained in it (normalised), or word-Jaccard >= 0.6 with one of its lines."""

    def __init__(self, prompt: str) -> None:
        self.full = f" {_norm(prompt)} "
        self.lines = [tok for tok in (content_tokens(x) for x in prompt.splitlines()) if len(tok) >= 3]

    def __call__(self, line: str) -> bool:
        n = _norm(line)
        if len(n) >= 16 and f" {n} " in self.full:
            return True
        toks = content_tokens(line)
        return len(toks) >= 3 and any(jaccard(toks, x) >= 0.6 for x in self.lines)


def parse_llm_list(text: object, max_items: int = 10, default_level: str = "pattern", *, echo: str = "",
                   stats: Counter | None = None, max_chars: int = 300, min_words: int = 3
                   ) -> list[tuple[str, str]]:
    """(level, text) items from a model's free-form answer; never raises. Unusable lines are dropped: junk,
    headings, restated episode lines, copies of ``echo`` (the prompt), duplicates, lines under ``min_words``
    words or over ``max_chars`` characters, lines cut mid-sentence (ending on "the", "to", "and"...).
    ``stats`` (a Counter) counts ``lines`` seen and why lines were dropped (``drop_junk``, ``drop_cut``,
    ``drop_long``, ``drop_echo``, ``drop_dup``)."""
    if not isinstance(text, str):
        return []
    st = stats if stats is not None else Counter()
    is_echo = _Echo(echo) if echo else None
    text = _THINK.sub(" ", text)
    text = _FENCE.sub(" ", text)
    text = _TAG.sub(" ", text)
    items: list[tuple[str, str]] = []
    seen: set[str] = set()
    for raw in re.split(r"[\r\n]+|(?<=\S)\s+(?=\d{1,2}[.)]\s+[A-Z])", text):
        line = raw.strip()
        if not line:
            continue
        st["lines"] += 1
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
        if _META.search(line) or not _usable(line, min_words):
            st["drop_junk"] += 1
            continue
        if _CUT.search(line):
            st["drop_cut"] += 1
            continue
        line = sanitize(line, 100_000)
        if len(line) > max_chars:
            st["drop_long"] += 1
            continue
        if is_echo is not None and is_echo(line):
            st["drop_echo"] += 1
            continue
        key = _norm(line)
        if key in seen:
            st["drop_dup"] += 1
            continue
        seen.add(key)
        items.append((level if level in LEVELS else default_level, line))
        if len(items) >= max_items:
            break
    return items


def _usable(line: str, min_words: int = 3) -> bool:
    if len(line) < 12 or line.endswith(":") or _JUNK.match(line):
        return False
    letters = sum(c.isalpha() for c in line)
    if letters < 0.5 * len(line) or len(line.split()) < min_words:
        return False
    return max(Counter(line.lower()).values()) <= 0.5 * len(line)  # not "aaaaaaa", "!!!!!!"


class LLMExtractor:
    """Ask a model to distil lessons (several per trajectory); rules fill in wherever its answer is unusable.

    Each selected trajectory is one chat prompt: the system message ``extract_system.txt`` (what a lesson is,
    no names) and the user message ``extract_strategies.txt`` / ``extract_warnings.txt`` (goal, outcome, the
    episode). The answer is parsed by :func:`parse_llm_list` (echoes of the prompt dropped), at most
    ``max_items`` lessons are kept, and the game's names are replaced by placeholders (:class:`Names`). With
    ``prefill`` the prompt ends with an assistant turn opened by it (``"- "``: a small model then writes a
    list); a generator that cannot continue a message may ignore it. ``stats`` counts answers (``llm_answers``),
    answers that gave at least one lesson (``parsed``; the rest fell back to the rules, ``fallback``), parsed
    lines, kept lessons, drops (reported as ``library/extract_<key>``).
    """

    @property
    def roles(self) -> bool:
        """Lessons with the state key's roles as placeholders (``experience.cluster_on: state_key``): the prompt
        shows the first step's key, the answer's entity names become ``{role}``, and the rules it falls back on
        do the same."""
        return self.fallback.roles

    @roles.setter
    def roles(self, on: bool) -> None:
        self.fallback.roles = bool(on)

    def __init__(self, generate_text: GenerateText, *, fallback: RuleExtractor | None = None,
                 max_items: int = 3, max_chars: int = 200, min_words: int = 5, prefill: str = "- ") -> None:
        self.generate_text = generate_text
        self.fallback = fallback or RuleExtractor()
        self.max_items = max_items
        self.max_chars = max_chars
        self.min_words = min_words
        self.prefill = prefill
        self.system = load_template("extract_system.txt").strip()
        self.system_tools = load_template("extract_system_tools.txt").strip()
        self.templates = {"pos": Template(load_template("extract_strategies.txt")),
                          "neg": Template(load_template("extract_warnings.txt"))}
        self.stats: Counter = Counter()

    def system_for(self, t: Trajectory) -> str:
        """The system message: ``extract_system_tools.txt`` for a tool episode (lessons name calls), else
        ``extract_system.txt``."""
        return self.system_tools if is_tool_trajectory(t) else self.system

    def prompt(self, t: Trajectory, zone: str) -> str:
        """The user message for trajectory ``t`` (``zone``: ``pos`` strategies, ``neg`` warnings); a tool episode
        is a "task", not a "game"."""
        tools = is_tool_trajectory(t)
        return self.templates[zone].safe_substitute(
            kind="task" if tools else "game",
            goal=_short(summarize_goal(t.goal or "(no goal given)", 200), 200),
            task_type=t.task_type or ("tool task" if tools else "text game"),
            outcome="success" if t.won else "failure", ret=f"{t.episode_return:g}", steps=len(t.steps),
            trajectory=render_compact(t, roles=self.roles), k=self.max_items).strip()

    def messages(self, t: Trajectory, zone: str) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system_for(t)}, {"role": "user", "content": self.prompt(t, zone)}]
        if self.prefill:
            msgs.append({"role": "assistant", "content": self.prefill})
        return msgs

    def parse(self, answer: object, t: Trajectory, zone: str) -> list[tuple[str, str]]:
        """The lessons of one answer: parsed, echo-free, names abstracted, deduplicated."""
        if not isinstance(answer, str):
            return []
        names = Names(t)
        slots: dict[str, str] = {}
        for s in t.steps if self.roles else ():
            for role, name in s.state_slots.items():
                slots.setdefault(role, name)
        items = parse_llm_list(self.prefill + answer, self.max_items * 3, "principle",
                               echo=f"{self.system_for(t)}\n{self.prompt(t, zone)}", stats=self.stats,
                               max_chars=self.max_chars, min_words=self.min_words)
        out, seen = [], set()
        for level, text in items:
            if not _ADVICE.search(text):
                self.stats["drop_not_advice"] += 1
                continue
            text = names.abstract(abstract(text, slots) if slots else text)
            key = _norm(text)
            if key in seen:
                continue
            seen.add(key)
            out.append((level, text))
            if len(out) >= self.max_items:
                break
        return out

    def extract(self, pos: Sequence[Trajectory], neg: Sequence[Trajectory]) -> list[Candidate]:
        jobs = [(t, "pos") for t in pos] + [(t, "neg") for t in neg]
        if not jobs:
            return []
        answers: list[object] = []
        try:
            answers = list(self.generate_text([self.messages(t, z) for t, z in jobs]))
        except Exception:  # noqa: BLE001 - a failing generator must not stop training: use the rules
            self.stats["generate_errors"] += 1
        if len(answers) != len(jobs):
            answers = [None] * len(jobs)
        out: list[Candidate] = []
        for (t, zone), ans in zip(jobs, answers):
            self.stats["llm_answers"] += 1
            items = self.parse(ans, t, zone)
            if not items:
                self.stats["fallback"] += 1
                out += self.fallback.strategies(t) if zone == "pos" else self.fallback.warnings(t)
                continue
            self.stats["parsed"] += 1  # parse rate = parsed / llm_answers (the rest fell back to the rules)
            self.stats["llm_items"] += len(items)
            steps = t.steps if zone == "pos" else ([s for s in t.steps if not s.valid or s.reward < 0]
                                                    or t.steps[-1:])
            ctx = summarize_observation(t.steps[0].anchor) if t.steps else ""
            for level, text in items:
                out.append(Candidate(text, zone, level, t.episode_return, t.task_type, ctx, [t.traj_id],
                                     step_clusters(steps)))
        return out


@register_extractor("llm")
def llm_extractor(generate_text: GenerateText | None = None) -> LLMExtractor | RuleExtractor:
    """The model distils lessons (:class:`LLMExtractor`); the rules when no model is handed in."""
    return LLMExtractor(generate_text) if generate_text is not None else RuleExtractor()
