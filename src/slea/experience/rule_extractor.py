"""The ``rule`` extractor: deterministic lessons about the task *type*, and the text helpers it shares.

:class:`RuleExtractor` reads a trajectory's goal, actions, observations and outcome (verb patterns,
preconditions, exploration, invalid commands, loops, running out of steps). Commands appear as
:func:`command_shape` shapes and :class:`Names` replaces the game's object and room names by placeholders
(``<object>``, ``<place>``, ``<tool>``, ``<room>``), so a lesson applies to unseen games of the same kind.
:func:`summarize_observation` and :func:`summarize_goal` give the short contexts of the candidates. It is the
default extractor and the fallback of ``llm`` (:mod:`slea.experience.llm_extractor`).

With ``roles`` (set by the library when it clusters on state keys, ``experience.cluster_on: state_key``) a step
whose env gave a state key quotes its command with the key's roles as placeholders (:func:`slotted`: ``take coin``
→ ``take {goal object}``), filled from the slots of the step that retrieves the lesson
(:mod:`slea.experience.placeholders`), so one lesson names ``coin`` in one game and ``sock`` in another.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise

from slea.experience.calls import (
    call_names,
    describe_call,
    is_tool_step,
    is_tool_trajectory,
    step_error,
    tool_names,
)
from slea.experience.extraction import Candidate, GenerateText, register_extractor, step_clusters
from slea.experience.library import sanitize
from slea.experience.placeholders import abstract
from slea.types import Trajectory

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
            if is_tool_step(s):  # a tool call names no object or room (its lessons are calls)
                continue
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


def slotted(step, roles: bool) -> str | None:
    """``step``'s command with its state key's roles as placeholders (``take {goal object}``), or None: ``roles``
    is off, the step has no slots, or no slot's entity is in the command."""
    if not roles or not step.state_slots or not step.action:
        return None
    said = abstract(step.action, step.state_slots)
    return said if said != step.action else None


def _runs(shapes: list[tuple[str, str]], *, calls: bool = False) -> list[str]:
    """A plan as runs of one verb: ``'go …' ×2 → 'take <object>'``; with ``calls`` (a tool episode's, the shapes
    are :func:`describe_call` calls, the verbs tool names) runs of one tool, unquoted: ``search(…) ×2``."""
    out: list[tuple[str, str, int]] = []
    for verb, shape in shapes:
        if out and out[-1][0] == verb:
            v, s, n = out[-1]
            out[-1] = (v, s if s == shape else (f"{verb}(…)" if calls else f"{verb} …"), n + 1)
        else:
            out.append((verb, shape, 1))
    quote = "" if calls else "'"
    return [f"{quote}{s}{quote}" if n == 1 else f"{quote}{s}{quote} ×{n}" for _, s, n in out]


def _plan(runs: list[str]) -> list[str]:
    return runs[:2] + ["…"] + runs[-3:] if len(runs) > 6 else runs


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


def _taught(t: Trajectory):
    """The valid steps a T+ trajectory teaches: all of a won one's, else those up to its last rewarded step."""
    valid = [s for s in t.steps if s.valid and s.action]
    if not t.won:
        last = max((i for i, s in enumerate(valid) if s.reward > 0), default=-1)
        valid = valid[:last + 1]
    return valid


def _call(action: str, max_chars: int = 120) -> str:
    """A tool step's action as a call (:func:`describe_call`), or the raw text cut short when it is none."""
    return describe_call(action, max_chars) or " ".join(str(action).split())[:max_chars]


def _tool(action: str) -> str:
    return "; ".join(call_names(action)) or "?"


# ---------------------------------------------------------------------------------------------------------------
# Rule-based extractor
# ---------------------------------------------------------------------------------------------------------------
class RuleExtractor:
    """Deterministic lessons about the task type from a trajectory's goal, actions, observations and outcome.

    Strategies (a T+ trajectory): every move that earned reward (an example each, linked to its step's cluster:
    the lesson per-step retrieval finds at that observation), the winning plan as verb runs
    (pattern, linked to the cluster where it starts: at a later step its first moves are done already, and in a
    game whose states need different moves it would name another state's), open/unlock before use, exploring
    unvisited rooms, the commands that did the work (principles).
    Warnings (a T− trajectory): invalid answers (examples and a principle), penalised moves, a command repeated
    without progress, going back and forth between two rooms, commands that change nothing, running out of
    steps, the move that lost the game. Commands appear as :func:`command_shape` shapes and no text names an
    object or room of the game, so the lessons apply to unseen games of the same type.
    """

    roles = False  # quote commands with the state key's roles as placeholders (module docstring)

    def __init__(self, max_examples: int = 2) -> None:
        self.max_examples = max_examples  # warnings: invalid answers of distinct kinds, penalised moves

    def extract(self, pos: Sequence[Trajectory], neg: Sequence[Trajectory]) -> list[Candidate]:
        """Strategies from each trajectory of ``pos``, warnings from each of ``neg``."""
        return [c for t in pos for c in self.strategies(t)] + [c for t in neg for c in self.warnings(t)]

    def strategies(self, t: Trajectory) -> list[Candidate]:
        """Lessons from a T+ trajectory. One that did not win (above η without winning) teaches only the part
        that earned reward: its steps up to its last rewarded one (a pattern "A plan that earned reward"),
        never the move that lost it; with no rewarded step it teaches nothing. A tool episode's lessons name its
        calls (:meth:`tool_strategies`)."""
        valid = _taught(t)
        if not valid:
            return []
        if is_tool_trajectory(t):
            return self.tool_strategies(t, valid)
        names = Names(t)
        base = {"zone": "pos", "score": t.episode_return, "task_type": t.task_type, "sources": [t.traj_id]}
        goal = summarize_goal(t.goal or "the task")
        out: list[Candidate] = []
        shapes = [command_shape(s.action) for s in valid]
        key = [s for s in valid if s.reward > 0] or [valid[-1]]
        for s in key:
            _, shape, nm = command_shape(s.action)
            named = [n for n in nm if n in names.goal_names]
            said = slotted(s, self.roles)
            if said is not None:
                text = (f"When the goal's object is in view, '{said}' at once: that move earned the reward."
                        if "{goal object}" in said else f"In this kind of state, '{said}' earned the reward.")
            elif named and any(_mentions(s.anchor, n) for n in named):
                text = f"When the object the goal names is in view, '{shape}' at once: that move earned the reward."
            elif named:
                text = f"'{shape}' on what the goal names earned the reward."
            else:
                text = f"'{shape}' earned the reward on this kind of task."
            out.append(Candidate(text, level="example", context=summarize_observation(s.anchor),
                                 clusters=step_clusters([s]), **base))
        played = t.steps[:next(i for i, s in enumerate(t.steps) if s is valid[-1]) + 1]  # up to the plan's end
        clean = all(s.valid for s in played) and not any(n >= 2 for n in Counter(s.action for s in valid).values())
        if len(valid) >= 2:
            plan = _plan(_runs([(v, sh) for v, sh, _ in shapes]))
            head = "A winning plan" if t.won else "A plan that earned reward"
            out.append(Candidate(f"{head}: {' → '.join(plan)} ({_steps(len(valid))}"
                                 f"{', no step wasted' if clean else ''}).", level="pattern",
                                 context=summarize_observation(valid[0].anchor), clusters=step_clusters(valid[:1]),
                                 **base))
        for i, (verb, shape, _) in enumerate(shapes):
            if verb in ("open", "unlock"):
                nxt = next(((v, sh) for v, sh, _ in shapes[i + 1:] if v not in ("open", "unlock")
                            and v not in NOOP_VERBS), None)
                if nxt is not None:
                    out.append(Candidate(f"Open or unlock what is closed before using what it holds or guards: "
                                         f"'{shape}' came before '{nxt[1]}'.", level="principle", context=goal,
                                         clusters=step_clusters(valid[i:i + 1]), **base))
                    break
        path = _rooms_path(t)
        moves = sum(1 for v, sh, _ in shapes if v == "go")
        if moves >= 2 and len(path) == len(set(path)):
            out.append(Candidate("Explore by taking exits to rooms not visited yet ('go <direction>'), never back "
                                 "the way you came, until what the goal names is in view.", level="principle",
                                 context=goal, clusters=step_clusters(valid[:1]), **base))
        verbs = list(dict.fromkeys(v for v, _, _ in shapes if v and v not in NOOP_VERBS))
        if verbs:
            used = ", ".join(f"'{v} …'" for v in verbs[:3])
            out.append(Candidate(f"On this kind of task the work is done by {used} commands on what the goal "
                                 f"names{'; looking around is not needed' if clean else ''}.", level="principle",
                                 context=goal, clusters=step_clusters(valid[:1]), **base))
        return out

    def warnings(self, t: Trajectory) -> list[Candidate]:
        """Lessons from a T− trajectory (class docstring); a tool episode's name its calls
        (:meth:`tool_warnings`)."""
        if is_tool_trajectory(t):
            return self.tool_warnings(t)
        base = {"zone": "neg", "score": t.episode_return, "task_type": t.task_type, "sources": [t.traj_id]}
        goal = summarize_goal(t.goal or "the task")
        n = len(t.steps)
        invalid = [s for s in t.steps if not s.valid]
        known = GAME_VERBS | {command_shape(s.action)[0] for s in t.steps if s.valid and s.action}

        def why(s) -> tuple[str, str]:
            said = (s.action or s.response_text or "").strip()
            verb, shape, _ = command_shape(said.splitlines()[0] if said else "")
            if not shape:
                return "", "An empty answer is an invalid step: always reply with one command from the list."
            if shape.endswith("…"):
                return "…", ("A free-form sentence instead of a command is rejected: reply with one command "
                             "copied exactly from the list of valid commands.")
            if verb not in known:
                return "?", ("A made-up command whose verb is not in the list of valid commands is rejected: "
                             "use only the commands listed.")
            return shape, (f"'{shape}' was rejected: it was not in the list of valid commands at that point, so "
                           f"check the list before acting.")

        out = self._invalid_examples(invalid, why, base)
        if len(invalid) >= 2:
            out.append(Candidate(f"Invalid answers wasted {len(invalid)} of {_steps(n)}: answer with exactly one "
                                 f"command copied from the list of valid commands, nothing else.", level="principle",
                                 context=goal, clusters=step_clusters(invalid), **base))
        penal = [s for s in t.steps if s.valid and s.action and s.reward < 0]
        for s in penal[: self.max_examples]:
            out.append(Candidate(f"'{slotted(s, self.roles) or command_shape(s.action)[1]}' was penalised: avoid "
                                 f"it in this situation.",
                                 level="example", context=summarize_observation(s.anchor),
                                 clusters=step_clusters([s]), **base))
        valid = [s for s in t.steps if s.valid and s.action]
        for act, k in Counter(s.action for s in valid).most_common(1):
            steps = [s for s in valid if s.action == act]
            if k >= 3 and not any(s.reward > 0 for s in steps):
                out.append(Candidate(f"Repeating '{command_shape(act)[1]}' ({k} times) brought nothing new: after "
                                     f"one try, choose a command you have not used yet.", level="pattern",
                                     context=summarize_observation(steps[0].anchor), clusters=step_clusters(steps),
                                     **base))
        if _back_and_forth(t) >= 2:
            out.append(Candidate("Going back and forth between the same two rooms wastes steps: take an exit you "
                                 "have not tried yet.", level="pattern", context=goal, clusters=step_clusters(valid),
                                 **base))
        noop = [s for s in valid if command_shape(s.action)[0] in NOOP_VERBS]
        if not t.won and len(noop) >= 2:
            out.append(Candidate(f"'look', 'examine' and 'inventory' change nothing: they took {len(noop)} of "
                                 f"{_steps(n)} of a failed episode.", level="pattern",
                                 context=summarize_observation(noop[0].anchor), clusters=step_clusters(noop), **base))
        if t.steps and not t.won:
            last = t.steps[-1]
            if t.truncated:
                out.append(Candidate(f"Running out of steps ({n}) is how this task is lost: head for exits not "
                                     f"tried yet and act on what the goal names as soon as it is in view.",
                                     level="principle", context=goal, clusters=step_clusters(t.steps[-1:]), **base))
            elif last.valid and last.action and last.done:
                said = slotted(last, self.roles) or command_shape(last.action)[1]
                out.append(Candidate(f"'{said}' ended the episode in failure: check that a "
                                     f"move is what the goal asks before making it.", level="example",
                                     context=summarize_observation(last.anchor), clusters=step_clusters([last]), **base))
        return out


    def _invalid_examples(self, invalid, describe, base) -> list[Candidate]:
        """An example lesson per kind of invalid step, at most ``max_examples`` kinds (``describe(step) -> (kind,
        text)``), linked to the step's cluster."""
        out: list[Candidate] = []
        seen: set[str] = set()
        for s in invalid:
            key, text = describe(s)
            if key in seen or len(seen) >= self.max_examples:
                continue
            seen.add(key)
            out.append(Candidate(text, level="example", context=summarize_observation(s.anchor),
                                 clusters=step_clusters([s]), **base))
        return out

    # -- tool episodes: the same lessons, written as the calls made -------------------------------------------
    def tool_strategies(self, t: Trajectory, valid=None) -> list[Candidate]:
        """A T+ tool episode's lessons: the call that earned the reward (an example, linked to the cluster of
        the tool result it was made after), the plan as calls (runs of one tool merged), the tools that did the
        work in their order. Calls keep their arguments (``answer(value=66)``, ``search(query="...")``)."""
        valid = _taught(t) if valid is None else valid
        if not valid:
            return []
        base = {"zone": "pos", "score": t.episode_return, "task_type": t.task_type, "sources": [t.traj_id]}
        out: list[Candidate] = []
        for s in [s for s in valid if s.reward > 0] or [valid[-1]]:
            out.append(Candidate(f"Calling {_call(s.action)} earned the reward on this kind of task.",
                                 level="example", context=summarize_observation(s.anchor),
                                 clusters=step_clusters([s]), **base))
        played = t.steps[:next(i for i, s in enumerate(t.steps) if s is valid[-1]) + 1]
        clean = all(s.valid for s in played) and not any(n >= 2 for n in Counter(s.action for s in valid).values())
        if len(valid) >= 2:
            plan = _plan(_runs([(_tool(s.action), _call(s.action, 60)) for s in valid], calls=True))
            head = "A winning plan" if t.won else "A plan that earned reward"
            out.append(Candidate(f"{head}: call {' → '.join(plan)} ({_steps(len(valid))}"
                                 f"{', no step wasted' if clean else ''}).", level="pattern",
                                 context=summarize_observation(valid[0].anchor), clusters=step_clusters(valid[:1]),
                                 **base))
        order = list(dict.fromkeys(n for s in valid for n in call_names(s.action)))
        if order:
            out.append(Candidate(f"On this kind of task the work is done by calling {', then '.join(order[:4])}"
                                 f"{'; no call was wasted' if clean else ''}.", level="principle",
                                 context=summarize_goal(t.goal or "the task"), clusters=step_clusters(valid[:1]),
                                 **base))
        return out

    def tool_warnings(self, t: Trajectory) -> list[Candidate]:
        """A T− tool episode's lessons: rejected calls with what was wrong (an unknown tool, bad arguments, no
        call at all: the env's or the parser's reason, ``Step.info["error"]``), invalid steps wasted, penalised
        calls, a call repeated without progress, running out of steps, the call that lost the task."""
        base = {"zone": "neg", "score": t.episode_return, "task_type": t.task_type, "sources": [t.traj_id]}
        goal = summarize_goal(t.goal or "the task")
        n = len(t.steps)
        tools = ", ".join(tool_names(t.steps)[:8])
        given = f"the tools given ({tools})" if tools else "the tools given"
        invalid = [s for s in t.steps if not s.valid]

        def rejected(s) -> tuple[str, str]:  # (kind, lesson): the reason's head is the kind
            why, call = step_error(s), describe_call(s.action)
            if call is None:
                return "no call", (f"An answer without a valid tool call is rejected{f' ({why})' if why else ''}: "
                                   f"reply with a call to one of {given}.")
            if why:
                return why.split(";")[0].split(":")[0], f"The call {call} was rejected: {why}."
            return _tool(s.action), f"The call {call} was rejected: call only {given}, with the arguments they take."

        out = self._invalid_examples(invalid, rejected, base)
        if len(invalid) >= 2:
            out.append(Candidate(f"Invalid tool calls wasted {len(invalid)} of {_steps(n)}: call only {given}, "
                                 f"with exactly the arguments each one takes.", level="principle", context=goal,
                                 clusters=step_clusters(invalid), **base))
        valid = [s for s in t.steps if s.valid and s.action]
        for s in [s for s in valid if s.reward < 0][: self.max_examples]:
            out.append(Candidate(f"The call {_call(s.action)} was penalised: avoid it in this situation.",
                                 level="example", context=summarize_observation(s.anchor),
                                 clusters=step_clusters([s]), **base))
        for act, k in Counter(s.action for s in valid).most_common(1):
            steps = [s for s in valid if s.action == act]
            if k >= 3 and not any(s.reward > 0 for s in steps):
                out.append(Candidate(f"Repeating the call {_call(act)} ({k} times) brought nothing new: the same "
                                     f"call gives the same result, so use it and make the next call.",
                                     level="pattern", context=summarize_observation(steps[0].anchor),
                                     clusters=step_clusters(steps), **base))
        if t.steps and not t.won:
            last = t.steps[-1]
            if t.truncated:
                out.append(Candidate(f"Running out of steps ({n}) is how this task is lost: make the final call as "
                                     f"soon as the tool results hold what the goal asks.", level="principle",
                                     context=goal, clusters=step_clusters(t.steps[-1:]), **base))
            elif last.valid and last.action and last.done:
                out.append(Candidate(f"The call {_call(last.action)} ended the episode in failure: check it against "
                                     f"the tool results and the goal before making it.", level="example",
                                     context=summarize_observation(last.anchor), clusters=step_clusters([last]),
                                     **base))
        return out


@register_extractor("rule")
def rule_extractor(generate_text: GenerateText | None = None) -> RuleExtractor:
    """The deterministic rules (:class:`RuleExtractor`); ``generate_text`` is not used."""
    return RuleExtractor()
