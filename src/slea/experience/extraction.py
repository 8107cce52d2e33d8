"""Library evolution input: split the batch at η, pick the trajectories to learn from, distil candidates.

SLEA-RL §3.4: ``T+ = {τ : R(τ) > η}``, ``T− = {τ : R(τ) <= η}`` with η the batch median by default (a fixed
threshold via ``ExperienceSection.eta``); the top-K_traj of T+ yield strategies (zone ``pos``), the bottom-K_traj
of T− warnings (zone ``neg``); every candidate is linked to the observation clusters of the steps it came from
(``Step.cluster_id``).

Two choices differ from the paper's letter, both configurable (docs/experience.md, "Extraction"):

* ``experience.eta_tie`` — ``"top"`` (default): when η equals the batch's best return (half the batch or more at
  the top) and the batch is not all-equal, T+ = {R >= η} (the trajectories at the top) and T− = {R < η};
  ``"strict"``: the paper's T+ = {R > η} as printed, under which T+ is empty as soon as half the batch wins.
* ``experience.warning_score`` — extractors report ``Candidate.score = R(τ_source)`` (the paper's
  ``z_e = R``); :func:`extract_candidates` keeps that for strategies and, with ``"neg_return"`` (default),
  stores ``z = −R`` for warnings, so the worst failure is tried first, kept over milder ones on admission and
  retrieved first (library and retrieval rank every zone by "higher z first"). ``"return"``: z = R, as printed.

Extractors are registered by name (``experience.extractor``; a user's own with :func:`register_extractor`, from a
plugin module): a factory ``f(generate_text) -> extractor`` whose result has ``extract(pos, neg) ->
list[Candidate]`` (``generate_text(prompts) -> texts`` is handed in by the trainer, ``None`` when there is no
model to ask; a prompt is a plain user message or a list of chat messages ``{"role", "content"}``). Built in:

* ``rule`` (:class:`RuleExtractor`) — deterministic lessons about the task *type* (verb patterns, preconditions,
  exploration, invalid commands, loops, running out of steps) from the goal, actions, observations and outcome;
  object and room names are replaced by placeholders (``<object>``, ``<place>``, ``<tool>``, ``<room>``), so a
  lesson applies to unseen games of the same kind. The fallback of ``llm``.
* ``llm`` (:class:`LLMExtractor`) — chat prompts (``slea/prompts/extract_*.txt``) answered by ``generate_text``
  (it never imports the policy; the trainer answers with the base model, LoRA off, multi-line, greedy); several
  lessons per trajectory, parsed defensively (bullets, numbering, level tags, think blocks, echoes of the prompt,
  junk, too short/long lines dropped), names abstracted as above; a trajectory whose answer yields nothing falls
  back to the rules.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from itertools import pairwise
from string import Template

from slea.experience.library import LEVELS, content_tokens, jaccard, sanitize
from slea.plugins import Registry
from slea.types import Trajectory

Prompt = str | list[dict[str, str]]  # a user message, or chat messages (system + user)
GenerateText = Callable[[list[Prompt]], list[str]]
EXTRACTORS: Registry[Callable] = Registry("experience extractor", ("slea.experience.extraction",))
ETA_TIES = ("top", "strict")
WARNING_SCORES = ("neg_return", "return")


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
    score: float  # as reported by an extractor: R(τ_source); extract_candidates maps warnings to their z
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


def split_outcomes(trajs: Sequence[Trajectory], eta: str | float = "median", tie: str = "top"
                   ) -> tuple[float, list[Trajectory], list[Trajectory]]:
    """(η, T+, T−): T+ = R > η and T− = R <= η; with ``tie="top"``, when nothing beats η because η is the
    batch's best return (and some trajectory is below it), T+ = R >= η and T− = R < η."""
    if tie not in ETA_TIES:
        raise ValueError(f"tie must be one of {ETA_TIES}, got {tie!r}")
    rets = [t.episode_return for t in trajs]
    e = eta_value(rets, eta)
    pos = [t for t, r in zip(trajs, rets) if r > e]
    if not pos and tie == "top" and rets and max(rets) == e and min(rets) < e:
        pos = [t for t, r in zip(trajs, rets) if r >= e]
        neg = [t for t, r in zip(trajs, rets) if r < e]
        return e, pos, neg
    neg = [t for t, r in zip(trajs, rets) if r <= e]
    return e, pos, neg


def select(trajs: Sequence[Trajectory], eta: str | float = "median", k_traj: int = 5, tie: str = "top"
           ) -> tuple[float, list[Trajectory], list[Trajectory]]:
    """η, the top-k of T+ (highest R first, shorter first) and the bottom-k of T− (lowest R first)."""
    e, pos, neg = split_outcomes(trajs, eta, tie)
    pos = sorted(pos, key=lambda t: (-t.episode_return, len(t.steps), t.traj_id))[:k_traj]
    neg = sorted(neg, key=lambda t: (t.episode_return, -len(t.steps), t.traj_id))[:k_traj]
    return e, pos, neg


def warning_z(ret: float, mode: str = "neg_return") -> float:
    """The library score of a warning distilled from a trajectory of return ``ret``: ``−R`` (``neg_return``:
    the clearest failure ranks first) or ``R`` (``return``, the paper as printed)."""
    if mode not in WARNING_SCORES:
        raise ValueError(f"warning_score must be one of {WARNING_SCORES}, got {mode!r}")
    r = float(ret)
    return (-r if r != 0 else 0.0) if mode == "neg_return" else r


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
# Abstraction: commands and texts without the names of one game
# ---------------------------------------------------------------------------------------------------------------
PLACEHOLDERS = ("<object>", "<place>", "<tool>", "<room>", "<text>", "<direction>")
_DIRECTIONS = frozenset({
    "north", "south", "east", "west", "up", "down", "northeast", "northwest", "southeast", "southwest",
    "left", "right", "forward", "back", "forwards", "backwards"})
_OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east", "up": "down", "down": "up",
             "left": "right", "right": "left", "northeast": "southwest", "southwest": "northeast",
             "northwest": "southeast", "southeast": "northwest"}
_PREP = re.compile(r"\b(in/on|with|from|into|onto|inside|in|on|to|under|at)\b")
_ARTICLE = re.compile(r"^(?:the|a|an|some|your|my)\s+", re.IGNORECASE)
_BRACKET = re.compile(r"^([a-z_]+)\[(.*)\]$")
NOOP_VERBS = frozenset({"look", "examine", "inventory", "l", "x", "i", "check", "read", "wait"})
# verbs of text-game commands (TextWorld, ALFWorld, ScienceWorld, WebShop, Sokoban): an invalid answer with
# another verb is a made-up command, one with these a real command used where it does not apply
GAME_VERBS = frozenset({
    "go", "take", "drop", "put", "insert", "open", "close", "unlock", "lock", "eat", "drink",
    "examine", "look", "inventory", "cook", "slice", "chop", "dice", "heat", "cool", "clean", "use",
    "toggle", "move", "pick", "focus", "pour", "mix", "connect", "disconnect", "activate",
    "deactivate", "wait", "read", "teleport", "search", "click", "push", "pull", "up", "down", "left",
    "right"})
# first words that start a sentence, not a command ("I want to find the key", "The door is locked")
_NOT_VERBS = frozenset({
    "i", "i'm", "i'll", "im", "you", "we", "the", "a", "an", "it", "it's", "my", "this", "that",
    "there", "these", "to", "should", "will", "would", "maybe", "ok", "okay", "sure", "yes", "no",
    "let", "let's", "lets", "first", "then", "so", "now", "because", "since", "if", "what", "why",
    "how", "answer", "command", "action"})
_MAX_COMMAND_WORDS = 7


def command_shape(action: str) -> tuple[str, str, dict[str, str]]:
    """``(verb, shape, names)`` of a command, the shape with its objects replaced by role placeholders:
    ``'take fondue from floor'`` → ``('take', 'take <object> from <place>', {'fondue': '<object>', 'floor':
    '<place>'})``; ``'unlock chest with key'`` → ``'unlock <object> with <tool>'``; ``'go to countertop 1'`` →
    ``'go to <place>'``; ``'go south'`` → ``'go <direction>'``; bare verbs stay (``'look'``, ``'up'``);
    ``search[...]`` → ``search[<text>]``; prose or a long free-text answer → ``'<first word> …'``."""
    low = " ".join(str(action).split()).strip().lower().lstrip("-*•>:.'\"` ").rstrip("'\"` ")
    if not low:
        return "", "", {}
    m = _BRACKET.match(low)
    if m:
        verb, arg = m.group(1), m.group(2).strip()
        if verb == "search" or len(arg.split()) > 3:
            return verb, f"{verb}[<text>]", ({arg: "<text>"} if arg else {})
        return verb, low, {}
    words = low.split()
    verb = re.sub(r"[^a-z_'-]", "", words[0]) or words[0][:12]
    if (len(words) > _MAX_COMMAND_WORDS or "<" in low or "\n" in str(action).strip() or verb in _NOT_VERBS
            or re.search(r"[,;:?!]|\.\s|\.$", low)):
        return verb, f"{verb} …", {}  # prose, not a command
    rest = " ".join(words[1:])
    if not rest:
        return verb, low, {}
    if all(w in _DIRECTIONS for w in rest.split()):
        return verb, f"{verb} <direction>", {}
    pieces = _PREP.split(rest)  # [arg, prep, arg, prep, arg...]
    shape, names = [verb], {}
    for i, piece in enumerate(pieces):
        piece = piece.strip()
        if not piece:
            continue
        if i % 2 == 1:  # a preposition
            shape.append(piece)
            continue
        if all(w in _DIRECTIONS for w in piece.split()):
            shape.append("<direction>")
            continue
        prev = pieces[i - 1].strip() if i > 0 else ""
        role = "<object>" if i == 0 else ("<tool>" if prev == "with" else "<place>")
        shape.append(role)
        name = _ARTICLE.sub("", piece).strip()
        if name:
            names.setdefault(name, role)
            bare = re.sub(r"\s+\d+$", "", name)  # ALFWorld's "apple 1" is also "apple"
            if bare != name:
                names.setdefault(bare, role)
    return verb, " ".join(shape), names


def _room(anchor: str) -> str:
    m = _ROOM.search(str(anchor))
    return m.group(1).strip().lower() if m else ""


def _mentions(text: str, name: str) -> bool:
    return bool(name) and re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", str(text), re.IGNORECASE) is not None


class Names:
    """The names of one trajectory's game (objects of its commands, rooms of its observations) and
    :meth:`abstract`, which writes a text without them."""

    def __init__(self, t: Trajectory) -> None:
        found: dict[str, str] = {}
        for s in t.steps:
            said = s.action if s.valid and s.action else (s.response_text or "").strip()
            for name, role in (command_shape(said)[2] if len(said.split()) <= 4 else {}).items():
                found.setdefault(name, role)
            room = _room(s.anchor)
            if room:
                found.setdefault(room, "<room>")
        self.names = {n: r for n, r in found.items()
                      if len(n) >= 3 and n not in _DIRECTIONS and n not in NOOP_VERBS}
        order = sorted(self.names, key=len, reverse=True)  # longest first: "red apple" before "apple"
        self._pattern = (re.compile(r"(?<![\w<-])(?:the |a |an |some )?(" + "|".join(map(re.escape, order))
                                    + r")(?![\w>-])", re.IGNORECASE) if order else None)
        self.goal_names = {n for n in self.names if _mentions(t.goal, n)}

    def abstract(self, text: str) -> str:
        """``text`` with every known name replaced by its placeholder (a leading article is dropped with it)."""
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self.names.get(m.group(1).lower(), "<object>"), text)


def _runs(shapes: list[tuple[str, str]]) -> list[str]:
    """A plan as runs of one verb: ``'go …' ×2 → 'take <object>'``."""
    out: list[tuple[str, str, int]] = []
    for verb, shape in shapes:
        if out and out[-1][0] == verb:
            v, s, n = out[-1]
            out[-1] = (v, s if s == shape else f"{verb} …", n + 1)
        else:
            out.append((verb, shape, 1))
    return [f"'{s}'" if n == 1 else f"'{s}' ×{n}" for _, s, n in out]


def _rooms_path(t: Trajectory) -> list[str]:
    """The rooms the agent went through, consecutive repeats merged (TextWorld room headers)."""
    path: list[str] = []
    for s in t.steps:
        r = _room(s.anchor)
        if r and (not path or path[-1] != r):
            path.append(r)
    return path


def _back_and_forth(t: Trajectory) -> int:
    """How many moves undid the previous one: A → B → A room bounces, or 'go x' right after 'go opposite(x)'."""
    path = _rooms_path(t)
    bounces = sum(1 for i in range(2, len(path)) if path[i] == path[i - 2])
    moves = [s.action.lower().split() for s in t.steps if s.valid and s.action]
    undo = sum(1 for a, b in pairwise(moves)
               if len(a) == 2 and len(b) == 2 and a[0] == b[0] == "go" and _OPPOSITE.get(a[1]) == b[1])
    return max(bounces, undo)


# ---------------------------------------------------------------------------------------------------------------
# Rule-based extractor
# ---------------------------------------------------------------------------------------------------------------
class RuleExtractor:
    """Deterministic lessons about the task type from a trajectory's goal, actions, observations and outcome.

    Strategies (a T+ trajectory): the move that earned the reward (example), the winning plan as verb runs
    (pattern), open/unlock before use, exploring unvisited rooms, the commands that did the work (principles).
    Warnings (a T− trajectory): invalid answers (examples and a principle), penalised moves, a command repeated
    without progress, going back and forth between two rooms, commands that change nothing, running out of
    steps, the move that lost the game. Commands appear as :func:`command_shape` shapes and no text names an
    object or room of the game, so the lessons apply to unseen games of the same type.
    """

    def __init__(self, max_examples: int = 2) -> None:
        self.max_examples = max_examples

    def extract(self, pos: Sequence[Trajectory], neg: Sequence[Trajectory]) -> list[Candidate]:
        """Strategies from each trajectory of ``pos``, warnings from each of ``neg``."""
        return [c for t in pos for c in self.strategies(t)] + [c for t in neg for c in self.warnings(t)]

    def strategies(self, t: Trajectory) -> list[Candidate]:
        valid = [s for s in t.steps if s.valid and s.action]
        if not valid:
            return []
        names = Names(t)
        base = {"zone": "pos", "score": t.episode_return, "task_type": t.task_type, "sources": [t.traj_id]}
        goal = summarize_goal(t.goal or "the task")
        out: list[Candidate] = []
        shapes = [command_shape(s.action) for s in valid]
        key = [s for s in valid if s.reward > 0] or [valid[-1]]
        for s in key[-self.max_examples:]:
            _, shape, nm = command_shape(s.action)
            named = [n for n in nm if n in names.goal_names]
            if named and any(_mentions(s.anchor, n) for n in named):
                text = f"When the object the goal names is in view, '{shape}' at once: that move earned the reward."
            elif named:
                text = f"'{shape}' on what the goal names earned the reward."
            else:
                text = f"'{shape}' earned the reward on this kind of task."
            out.append(Candidate(text, level="example", context=summarize_observation(s.anchor),
                                 clusters=_clusters([s]), **base))
        clean = not t.invalid_count and not any(n >= 2 for n in Counter(s.action for s in valid).values())
        if len(valid) >= 2:
            plan = _runs([(v, sh) for v, sh, _ in shapes])
            if len(plan) > 6:
                plan = plan[:2] + ["…"] + plan[-3:]
            out.append(Candidate(f"A winning plan: {' → '.join(plan)} ({_steps(len(valid))}"
                                 f"{', no step wasted' if clean else ''}).", level="pattern",
                                 context=summarize_observation(valid[0].anchor), clusters=_clusters(valid), **base))
        for i, (verb, shape, _) in enumerate(shapes):
            if verb in ("open", "unlock"):
                nxt = next(((v, sh) for v, sh, _ in shapes[i + 1:] if v not in ("open", "unlock")
                            and v not in NOOP_VERBS), None)
                if nxt is not None:
                    out.append(Candidate(f"Open or unlock what is closed before using what it holds or guards: "
                                         f"'{shape}' came before '{nxt[1]}'.", level="principle", context=goal,
                                         clusters=_clusters(valid[i:i + 1]), **base))
                    break
        path = _rooms_path(t)
        moves = sum(1 for v, sh, _ in shapes if v == "go")
        if moves >= 2 and len(path) == len(set(path)):
            out.append(Candidate("Explore by taking exits to rooms not visited yet ('go <direction>'), never back "
                                 "the way you came, until what the goal names is in view.", level="principle",
                                 context=goal, clusters=_clusters(valid[:1]), **base))
        verbs = list(dict.fromkeys(v for v, _, _ in shapes if v and v not in NOOP_VERBS))
        if verbs:
            used = ", ".join(f"'{v} …'" for v in verbs[:3])
            out.append(Candidate(f"On this kind of task the work is done by {used} commands on what the goal "
                                 f"names{'; looking around is not needed' if clean else ''}.", level="principle",
                                 context=goal, clusters=_clusters(valid[:1]), **base))
        return out

    def warnings(self, t: Trajectory) -> list[Candidate]:
        base = {"zone": "neg", "score": t.episode_return, "task_type": t.task_type, "sources": [t.traj_id]}
        goal = summarize_goal(t.goal or "the task")
        out: list[Candidate] = []
        n = len(t.steps)
        invalid = [s for s in t.steps if not s.valid]
        seen: set[str] = set()
        known = GAME_VERBS | {command_shape(s.action)[0] for s in t.steps if s.valid and s.action}
        for s in invalid:
            said = (s.action or s.response_text or "").strip()
            verb, shape, _ = command_shape(said.splitlines()[0] if said else "")
            if not shape:
                key, text = "", "An empty answer is an invalid step: always reply with one command from the list."
            elif shape.endswith("…"):
                key, text = "…", ("A free-form sentence instead of a command is rejected: reply with one command "
                                  "copied exactly from the list of valid commands.")
            elif verb not in known:
                key, text = "?", ("A made-up command whose verb is not in the list of valid commands is rejected: "
                                  "use only the commands listed.")
            else:
                key, text = shape, (f"'{shape}' was rejected: it was not in the list of valid commands at that "
                                    f"point, so check the list before acting.")
            if key in seen or len(seen) >= self.max_examples:
                continue
            seen.add(key)
            out.append(Candidate(text, level="example", context=summarize_observation(s.anchor),
                                 clusters=_clusters([s]), **base))
        if len(invalid) >= 2:
            out.append(Candidate(f"Invalid answers wasted {len(invalid)} of {_steps(n)}: answer with exactly one "
                                 f"command copied from the list of valid commands, nothing else.", level="principle",
                                 context=goal, clusters=_clusters(invalid), **base))
        penal = [s for s in t.steps if s.valid and s.action and s.reward < 0]
        for s in penal[: self.max_examples]:
            out.append(Candidate(f"'{command_shape(s.action)[1]}' was penalised: avoid it in this situation.",
                                 level="example", context=summarize_observation(s.anchor),
                                 clusters=_clusters([s]), **base))
        valid = [s for s in t.steps if s.valid and s.action]
        for act, k in Counter(s.action for s in valid).most_common(1):
            steps = [s for s in valid if s.action == act]
            if k >= 3 and not any(s.reward > 0 for s in steps):
                out.append(Candidate(f"Repeating '{command_shape(act)[1]}' ({k} times) brought nothing new: after "
                                     f"one try, choose a command you have not used yet.", level="pattern",
                                     context=summarize_observation(steps[0].anchor), clusters=_clusters(steps),
                                     **base))
        if _back_and_forth(t) >= 2:
            out.append(Candidate("Going back and forth between the same two rooms wastes steps: take an exit you "
                                 "have not tried yet.", level="pattern", context=goal, clusters=_clusters(valid),
                                 **base))
        noop = [s for s in valid if command_shape(s.action)[0] in NOOP_VERBS]
        if not t.won and len(noop) >= 2:
            out.append(Candidate(f"'look', 'examine' and 'inventory' change nothing: they took {len(noop)} of "
                                 f"{_steps(n)} of a failed episode.", level="pattern",
                                 context=summarize_observation(noop[0].anchor), clusters=_clusters(noop), **base))
        if t.steps and not t.won:
            last = t.steps[-1]
            if t.truncated:
                out.append(Candidate(f"Running out of steps ({n}) is how this task is lost: head for exits not "
                                     f"tried yet and act on what the goal names as soon as it is in view.",
                                     level="principle", context=goal, clusters=_clusters(t.steps[-1:]), **base))
            elif last.valid and last.action and last.done:
                out.append(Candidate(f"'{command_shape(last.action)[1]}' ended the episode in failure: check that a "
                                     f"move is what the goal asks before making it.", level="example",
                                     context=summarize_observation(last.anchor), clusters=_clusters([last]), **base))
        return out


# ---------------------------------------------------------------------------------------------------------------
# LLM extractor
# ---------------------------------------------------------------------------------------------------------------
def load_template(name: str) -> str:
    return resources.files("slea").joinpath("prompts", name).read_text(encoding="utf-8")


def render_trajectory(t: Trajectory, max_steps: int = 10, obs_chars: int = 140) -> str:
    steps = t.steps if len(t.steps) <= max_steps else t.steps[:4] + t.steps[-(max_steps - 4):]
    lines = []
    for s in steps:
        act = s.action if s.valid and s.action else f"{_short(s.response_text or s.action, 40)} (invalid)"
        lines.append(f"{s.step + 1}. saw: {_short(s.anchor, obs_chars)}\n   did: {act}   reward: {s.reward:g}")
    if len(steps) < len(t.steps):
        lines.insert(4, f"   … ({len(t.steps) - len(steps)} steps omitted) …")
    return "\n".join(lines)


def render_compact(t: Trajectory, max_steps: int = 12, obs_chars: int = 100) -> str:
    """An episode in three lines (where it started, the commands typed, how it ended): the LLM extractor's
    ``$trajectory``. Short, and unlike a numbered step list it gives a small model no list to continue."""
    start = summarize_observation(t.steps[0].anchor, obs_chars) if t.steps else "(no observation)"
    acts = []
    for s in t.steps:
        a = s.action if s.valid and s.action else f"'{_short(s.response_text or '', 30)}' (invalid)"
        if s.reward > 0:
            a += f" (reward {s.reward:g})"
        elif s.reward < 0 and s.valid:
            a += f" (penalty {s.reward:g})"
        acts.append(a)
    if len(acts) > max_steps:
        acts = acts[:4] + [f"… {len(acts) - max_steps + 1} more …"] + acts[-(max_steps - 5):]
    end = "won" if t.won else ("ran out of steps" if t.truncated else "the game ended without success")
    return f"Start: {start}\nCommands typed: {'; '.join(acts) or '(none)'}\nEnd: {end}."


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
                   r"commands typed)\b\s*[:=]|=-|-=|^(?:you are (?:in|now)|you see|there is|there are|you find|"
                   r"you arrive|you've entered|you're now|you take|you open|the agent (?:saw|did|typed|failed|"
                   r"succeeded))\b|\bthe agent (?:failed|succeeded)\b", re.IGNORECASE)
_NORM = re.compile(r"[^a-z0-9<>]+")
# A lesson gives advice: a condition or an imperative, not a description ("You see a bedchamber.")
_ADVICE = re.compile(
    r"\b(?:when|whenever|if|before|after|until|once|as soon as|always|never|avoid|don't|do not|should|must|need to|"
    r"try|instead|first|only|rather than|make sure|remember|prefer)\b|^(?:go|take|open|unlock|close|drop|put|"
    r"insert|eat|examine|look|check|read|use|explore|keep|pick|copy|choose|follow|find|move|stay|plan|head|"
    r"answer|reply|type|stop|repeat|leave|return|enter|search|get)\b", re.IGNORECASE)
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
    list); a generator that cannot continue a message may ignore it. ``stats`` counts answers, parsed lines,
    kept lessons, drops and fallbacks (reported as ``library/extract_<key>``).
    """

    def __init__(self, generate_text: GenerateText, *, fallback: RuleExtractor | None = None,
                 max_items: int = 3, max_chars: int = 200, min_words: int = 5, prefill: str = "- ") -> None:
        self.generate_text = generate_text
        self.fallback = fallback or RuleExtractor()
        self.max_items = max_items
        self.max_chars = max_chars
        self.min_words = min_words
        self.prefill = prefill
        self.system = load_template("extract_system.txt").strip()
        self.templates = {"pos": Template(load_template("extract_strategies.txt")),
                          "neg": Template(load_template("extract_warnings.txt"))}
        self.stats: Counter = Counter()

    def prompt(self, t: Trajectory, zone: str) -> str:
        """The user message for trajectory ``t`` (``zone``: ``pos`` strategies, ``neg`` warnings)."""
        return self.templates[zone].safe_substitute(
            goal=_short(summarize_goal(t.goal or "(no goal given)", 200), 200), task_type=t.task_type or "text game",
            outcome="success" if t.won else "failure", ret=f"{t.episode_return:g}", steps=len(t.steps),
            trajectory=render_compact(t), k=self.max_items).strip()

    def messages(self, t: Trajectory, zone: str) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system}, {"role": "user", "content": self.prompt(t, zone)}]
        if self.prefill:
            msgs.append({"role": "assistant", "content": self.prefill})
        return msgs

    def parse(self, answer: object, t: Trajectory, zone: str) -> list[tuple[str, str]]:
        """The lessons of one answer: parsed, echo-free, names abstracted, deduplicated."""
        if not isinstance(answer, str):
            return []
        names = Names(t)
        items = parse_llm_list(self.prefill + answer, self.max_items * 3, "principle",
                               echo=f"{self.system}\n{self.prompt(t, zone)}", stats=self.stats,
                               max_chars=self.max_chars, min_words=self.min_words)
        out, seen = [], set()
        for level, text in items:
            if not _ADVICE.search(text):
                self.stats["drop_not_advice"] += 1
                continue
            text = names.abstract(text)
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
                       extractor=None, eta_tie: str = "top", warning_score: str = "neg_return"
                       ) -> tuple[float, list[Candidate], dict[str, float]]:
    """η, strategy+warning candidates in the order admission tries them, and counts for the metrics.

    Candidates come from ``extractor`` (anything with ``extract(pos, neg)``; default: the rules) on the
    selected T+ / T− (``eta_tie``: :func:`split_outcomes`); warning scores become ``warning_z(R,
    warning_score)``. Order: strategies then warnings, each best z first (a warning's z = −R: the worst failure
    first; with ``warning_score="return"`` still the lowest R first, as the bottom-K selection), then principle,
    pattern, example. The extractor's ``stats`` counter, if any, is reported (``extract_<key>``) and cleared."""
    _, all_pos, all_neg = split_outcomes(trajs, eta, eta_tie)
    e, pos, neg = select(trajs, eta, k_traj, eta_tie)
    extractor = extractor if extractor is not None else RuleExtractor()
    cands = list(extractor.extract(pos, neg))
    for c in cands:
        if c.zone == "neg":
            c.score = warning_z(c.score, warning_score)
    stats = getattr(extractor, "stats", None)  # a counter of the extractor's own (e.g. the LLM's fallbacks)
    info = {f"extract_{k}": float(v) for k, v in (stats or {}).items()}
    if stats:
        stats.clear()
    order = {lv: i for i, lv in enumerate(("principle", "pattern", "example"))}
    flip = warning_score == "neg_return"
    cands.sort(key=lambda c: (c.zone != "pos", -c.score if c.zone == "pos" or flip else c.score,
                              order.get(c.level, 3)))
    info.update({"eta": e, "t_pos": float(len(all_pos)), "t_neg": float(len(all_neg)),
                 "selected_pos": float(len(pos)), "selected_neg": float(len(neg)), "candidates": float(len(cands))})
    return e, cands, info
