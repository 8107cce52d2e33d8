"""The multi-turn rollout loop: N task groups x G copies stepped in lockstep, one generation call per turn.

One episode per env, read top to bottom in :meth:`RolloutCollector.collect`:

1. ``_start``: reset every env (the G copies of a group with the group's seed) and open a trajectory each;
2. per turn, for every live env:
   ``_prompts`` (retrieve experiences for the observation when a library is handed in; render the env's own
   instructions, goal, recent steps, observation and valid commands) → ``_generate`` (one batched call) →
   ``_parse`` (model text → an admissible action, or invalid) → ``_step_envs`` (only the valid actions step
   their env) → ``_record`` (one :class:`slea.types.Step` row each; the next observation; finished episodes);
3. ``_finish``: episodes that ran out of steps are truncated.

Turn boundaries (RTPO, slea/algorithms/rtpo.py). ``collect(..., boundaries=True)`` records, before each turn's
generation, a :class:`Boundary` per live env on its trajectory: the env snapshot (``pool.get_state``), what the
agent has seen (observation, history, feedback) and the exact prompt ids ``c_k = ψ(S_k)`` (ψ: the prompt
builder, the last ``history`` turns; ``history ≥ max_steps`` is the identity). :meth:`RolloutCollector.fork`
restores boundaries into the envs of another pool and plays them on from turn ``k`` through the same per-turn
phases; the forked turn is generated from the recorded ``c_k`` itself, not a rebuilt prompt.

A tool env (``info["tools"]``, :mod:`slea.envs.tools`) is prompted and parsed in the model's own tool-call syntax
(:meth:`PromptBuilder.tool_messages`, :mod:`slea.policy.tool_calls`); its action is the canonical JSON of the calls.
Its rows record the env's tool names (``Step.info["tools"]``) and an invalid row why it was rejected
(``Step.info["error"]``), from which the library writes its lessons as calls (:mod:`slea.experience.calls`).

An unparseable or inadmissible answer does not step the env: it is an invalid step with a penalty, and the agent
sees the same observation again, after a line saying why (:func:`slea.rollout.view.invalid_feedback`: the env's
own words when it gave any, such as Search-R1's format hint). What the agent sees and how a turn changes it is
:class:`slea.rollout.view.AgentView`, shared with expert data (:mod:`slea.alignment.data`). Sampling is keyed
per row by (purpose, env seed, copy, turn) (``HFGenerator.generate(rng_keys=...)``): an episode's tokens do not
depend on what else ran in the process.

Token in, token out: a row's ``prompt_ids`` are the ids the engine was given and its ``response_ids`` the ids the
engine returned, stop token included; nothing is decoded and re-encoded on the way to the trainer. Every row
records, at generation time, a fingerprint of the ids the engine consumed (:func:`engine_prompt_ids`: an engine
sent text re-tokenizes it) and produced (``Step.info["engine_ids"]``); :func:`retokenized` counts the rows whose
trained ids differ from them (``rollout/retokenized`` in metrics.jsonl; 0 on every built-in path but the openai
engine's ``prompt_format: text``, where it counts the prompts the re-tokenization changes).

The experience source is duck-typed (``cluster(obs, task_type) -> int`` and
``retrieve(obs, task_type=, goal=, iteration=) -> obj with cluster_id, entry_ids, text``), so rollouts run
the same with or without a library and this module imports nothing of ``slea.experience``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from slea.policy.prompt_builder import PromptBuilder, parse_action
from slea.rollout.view import AgentView
from slea.types import Instructions, Step, Trajectory

if TYPE_CHECKING:
    from slea.config import RolloutSection

# rng_salt of the two purposes: training rollouts and held-out evaluation draw from disjoint streams
TRAIN_SALT = 0
EVAL_SALT = 1


def _tool_names(schemas: Any) -> list[str]:
    """The names in a tool env's schemas (OpenAI ``tools`` format: ``{"type": "function", "function": {...}}``)."""
    fns = [s.get("function", s) for s in schemas if isinstance(s, dict)] if isinstance(schemas, list) else []
    return [str(f["name"]) for f in fns if isinstance(f, dict) and f.get("name")]


def final_info(info: dict[str, Any], max_chars: int = 200) -> dict[str, Any]:
    """The numbers, flags and short strings of an env's last info (``score``, ``em``, ``split``...): what a
    trajectory keeps for evaluation tables (lists such as admissible actions and long texts are dropped)."""
    return {k: v for k, v in info.items()
            if isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= max_chars)}


_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_ANSWER_CHARS = 4000  # an answer is one command or one tagged call; degenerate outputs ("!!!!...") get cut


def state_key_of(info: dict[str, Any]) -> str:
    """The env's state key of the observation ``info`` came with ('' when its family has none)."""
    key = info.get("state_key")
    return key if isinstance(key, str) else ""


def clean_text(text: object) -> str:
    """Model output as safe text: non-strings become ``''``, lone surrogates (possible from JSON-speaking remote
    generators) become U+FFFD, and the length is capped (the parsers' regexes are not linear on long runs)."""
    return _SURROGATE.sub("\ufffd", text[:MAX_ANSWER_CHARS]) if isinstance(text, str) else ""


ENGINE_IDS = "engine_ids"  # Step.info key: fingerprints of the ids the engine consumed and produced for the row


def ids_digest(ids: Sequence[int]) -> str:
    """A 64-bit fingerprint of a token-id sequence (BLAKE2b over the ids as 64-bit integers)."""
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=8).hexdigest()


def engine_prompt_ids(generator, prompt: list[int], generation) -> list[int]:
    """The prompt ids the engine consumed for ``prompt``: those the generation reports (``prompt_ids``, when an
    engine fills it), else, for an engine sent the prompt as text (``model.openai.prompt_format: text``), the
    local tokenizer's encoding of the decoded text (what ``slea serve`` does; a server with another tokenizer or
    settings may differ further), else ``prompt`` itself (every engine sent token ids feeds them verbatim)."""
    reported = getattr(generation, "prompt_ids", None)
    if reported is not None:
        return [int(t) for t in reported]
    settings = getattr(generator, "cfg", None)
    if getattr(settings, "prompt_format", "ids") == "text":
        tok = generator.tok
        return list(tok(tok.decode(prompt), add_special_tokens=False).input_ids)
    return list(prompt)


def engine_record(consumed: Sequence[int], produced: Sequence[int]) -> dict[str, str]:
    """What a step row records of its generation (``Step.info["engine_ids"]``): fingerprints of the prompt ids
    the engine consumed and of the ids it returned."""
    return {"prompt": ids_digest(consumed), "response": ids_digest(produced)}


def retokenized(rows: Iterable[Step]) -> int:
    """How many generated rows would be trained on other ids than the engine consumed or produced: the row's
    ``prompt_ids``/``response_ids`` against the fingerprints recorded at generation time. Rows without a record
    (expert data, hand-made rows) were never generated and are not counted."""
    n = 0
    for s in rows:
        rec = s.info.get(ENGINE_IDS)
        if rec is not None and rec != engine_record(s.prompt_ids, s.response_ids):
            n += 1
    return n


class ExperienceSource(Protocol):
    """What the collector asks of a library (:class:`slea.experience.manager.ExperienceManager`): each step's
    cluster, and its lessons. ``state_key``/``slots``: the env's structural key of the observation and the
    entities that fill its roles ('' / {} when the family has none)."""

    def cluster(self, observation: str, task_type: str = "", *, state_key: str = "") -> int: ...

    def retrieve(self, observation: str, *, task_type: str = "", goal: str = "", iteration: int,
                 state_key: str = "", slots: dict[str, str] | None = None) -> Any: ...


@dataclass
class RolloutStats:
    gen_s: float = 0.0
    env_s: float = 0.0
    retrieval_s: float = 0.0
    prompt_tokens: int = 0
    gen_tokens: int = 0
    gen_calls: int = 0
    entropy_sum: float = 0.0  # Σ over generated tokens of the sampling distribution's entropy (engines that report it)
    entropy_tokens: int = 0  # the tokens that sum covers
    parse_kinds: dict[str, int] = field(default_factory=dict)
    retokenized: int = 0  # rows whose trained ids differ from the engine's (:func:`retokenized`)


@dataclass
class _Live(AgentView):
    """An env whose episode is running: what the agent sees next (:class:`AgentView`), and its sampling key."""

    key: tuple[int, ...] = ()  # (rng salt, env seed, copy): the row's sampling stream, with the turn appended
    task_exp: Any = None  # held retrieval for mode "task"
    forked: Boundary | None = None  # a fork's first turn: generate from the boundary's recorded prompt


@dataclass
class Boundary:
    """A trunk's turn boundary ``k``: everything a sibling forked there starts from (RTPO Alg.1 phase 1)."""

    turn: int
    env_state: Any  # the env's get_state() before the turn's action
    obs: str
    info: dict[str, Any]
    past: list[tuple[str, str]]
    feedback: str
    task_exp: Any
    prompt_ids: list[int]  # c_k = ψ(S_k), exactly as the trunk generated from it
    exp: Any
    cluster_id: int
    context: str  # ψ, in words ("last 2 turns")
    turns: list = field(default_factory=list)  # a tool env's turns so far (AgentView.turns)


@dataclass
class _Pending:
    """One live env's decision in the current turn, from prompt to recorded row."""

    env: int
    prompt: list[int]
    exp: Any
    cluster_id: int
    messages: list[dict[str, str]] | None = None  # kept when the collector keeps messages
    text: str = ""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    action: str | None = None
    parse: str = "invalid"
    error: str = ""  # why an answer that never reached the env is invalid (a tool call that does not parse)
    engine: dict[str, str] = field(default_factory=dict)  # engine_record of the generation


@dataclass
class _Episode:
    """The state of one ``collect`` call."""

    trajs: dict[int, Trajectory]  # by pool env index
    live: dict[int, _Live]
    instructions: Instructions


class RolloutCollector:
    def __init__(self, generator, builder: PromptBuilder, rollout_cfg: RolloutSection, max_steps: int,
                 experience: ExperienceSource | None = None, experience_mode: str = "off",
                 keep_messages: bool = False):
        """``keep_messages``: also record each step's prompt as chat messages, ``Step.info["messages"]`` (what
        alignment data stores: slea.alignment.data)."""
        self.gen = generator
        self.keep_messages = keep_messages
        self.builder = builder
        self.cfg = rollout_cfg
        self.max_steps = max_steps
        self.experience = experience
        self.mode = experience_mode if experience is not None else "off"

    def collect(self, pool, seeds: list[int], *, iteration: int = 0, temperature: float | None = None,
                traj_offset: int = 0, rng_salt: int = TRAIN_SALT, boundaries: bool = False, progress=None
                ) -> tuple[list[Trajectory], RolloutStats]:
        """Play one episode on every env of ``pool`` (group g reset with ``seeds[g]``); with ``boundaries``
        each trajectory records a :class:`Boundary` per turn (``Trajectory.boundaries``)."""
        stats = RolloutStats()
        ep = self._start(pool, seeds, iteration, traj_offset, rng_salt, stats)
        self._play(ep, pool, 0, iteration, temperature, stats, boundaries, progress)
        return list(ep.trajs.values()), stats

    def fork(self, pool, starts: dict[int, tuple[Trajectory, Boundary]], *, iteration: int = 0,
             temperature: float | None = None, traj_offset: int = 0, rng_salt: int = TRAIN_SALT, progress=None
             ) -> tuple[list[Trajectory], RolloutStats]:
        """Continue from recorded boundaries: env ``i`` of ``pool`` is restored to ``starts[i]``'s boundary
        (``(trunk, boundary)``; every start shares the boundary's turn ``k``) and plays on from turn ``k`` to
        the end. Returns one trajectory per start (its rows from turn ``k``, group ``pool.group_of(i)``); an
        env whose restore faulted returns an empty truncated trajectory."""
        stats = RolloutStats()
        turns = {b.turn for _, b in starts.values()}
        if len(turns) != 1:
            raise ValueError(f"fork: the starts must share one boundary turn, got {sorted(turns)}")
        ep = self._restore(pool, starts, traj_offset, rng_salt, stats)
        self._play(ep, pool, turns.pop(), iteration, temperature, stats, False, progress)
        return list(ep.trajs.values()), stats

    def _play(self, ep: _Episode, pool, first_turn: int, iteration: int, temperature: float | None,
              stats: RolloutStats, boundaries: bool, progress) -> None:
        """The per-turn loop, from ``first_turn`` until every episode ended or ``max_steps`` turns."""
        temp = self.cfg.temperature if temperature is None else temperature
        for turn in range(first_turn, self.max_steps):
            if not ep.live:
                break
            pending = self._prompts(ep, iteration, stats)
            if boundaries:
                self._mark_boundaries(ep, pool, turn, pending)
            self._generate(pending, ep, turn, temp, stats)
            self._parse(pending, ep, stats)
            results = self._step_envs(pool, pending, stats)
            self._record(ep, turn, pending, results)
            if progress is not None:  # (turns played, episodes still running: none after the last turn)
                progress(turn + 1, len(ep.live) if turn + 1 < self.max_steps else 0)
        self._finish(ep)
        stats.retokenized += retokenized(s for tr in ep.trajs.values() for s in tr.steps)

    # -- the phases -------------------------------------------------------------------------------------------
    def _start(self, pool, seeds, iteration, traj_offset, rng_salt, stats) -> _Episode:
        t0 = time.perf_counter()
        first = pool.reset(seeds)
        stats.env_s += time.perf_counter() - t0
        trajs: dict[int, Trajectory] = {}
        live: dict[int, _Live] = {}
        copies: dict[int, int] = {}
        for i, (obs, info) in enumerate(first):
            g = pool.group_of(i)
            copy = copies[g] = copies.get(g, -1) + 1
            trajs[i] = Trajectory(group_id=g, traj_id=traj_offset + i, seed=seeds[g],
                                  goal=str(info.get("goal", "")), task_type=str(info.get("task_type", "")))
            if "fault" in info:  # the env could not be reset (EnvPool rebuilt it): it sits this episode out
                trajs[i].truncated = True
            else:
                live[i] = _Live(obs, info, goal=trajs[i].goal, key=(int(rng_salt), int(seeds[g]) % 2**63, copy))
        if self.mode == "task":  # retrieve once per episode, from the first observation
            for i, st in live.items():
                st.task_exp = self._retrieve(st, trajs[i], iteration, stats)
        return _Episode(trajs, live, pool.instructions)

    def _restore(self, pool, starts: dict[int, tuple[Trajectory, Boundary]], traj_offset: int, rng_salt: int,
                 stats: RolloutStats) -> _Episode:
        """A fork's start: each env restored to its boundary; what the agent had seen, restored with it."""
        trajs: dict[int, Trajectory] = {}
        live = {}
        t0 = time.perf_counter()
        pool.mark_done(range(len(pool)))  # only the restored envs play
        for n, i in enumerate(sorted(starts)):
            trunk, b = starts[i]
            g = pool.group_of(i)
            trajs[i] = Trajectory(group_id=g, traj_id=traj_offset + n, seed=trunk.seed, goal=trunk.goal,
                                  task_type=trunk.task_type)
            if not pool.set_state(i, b.env_state, last=(b.obs, dict(b.info))):
                trajs[i].truncated = True  # the restore faulted: this sibling sits the round out
                continue
            copy = i - pool.members(g).start
            key = (int(rng_salt), int(trunk.seed or 0) % 2**63, int(trunk.traj_id), b.turn, copy)
            live[i] = _Live(b.obs, dict(b.info), goal=trunk.goal, key=key, past=list(b.past), task_exp=b.task_exp,
                            feedback=b.feedback, forked=b, turns=list(b.turns))
        stats.env_s += time.perf_counter() - t0
        return _Episode(trajs, live, pool.instructions)

    def _mark_boundaries(self, ep: _Episode, pool, turn: int, pending: list[_Pending]) -> None:
        n = self.builder.history
        context = "identity: every turn" if n >= self.max_steps else f"last {n} turns"
        if self.builder.summary and n < self.max_steps:
            context += " + a summary of the earlier actions"
        for p in pending:
            st = ep.live[p.env]
            ep.trajs[p.env].boundaries.append(Boundary(
                turn, pool.get_state(p.env), st.obs, dict(st.info), list(st.past),
                st.feedback, st.task_exp, list(p.prompt), p.exp, p.cluster_id, context, list(st.turns)))

    def _prompts(self, ep: _Episode, iteration: int, stats: RolloutStats) -> list[_Pending]:
        out = []
        for i in sorted(ep.live):
            st, tr = ep.live[i], ep.trajs[i]
            if st.forked is not None:  # a fork's first turn: c_k exactly as recorded (RTPO: reused verbatim)
                b, st.forked = st.forked, None
                out.append(_Pending(i, list(b.prompt_ids), b.exp, int(b.cluster_id)))
                continue
            if self.mode == "step":  # retrieval assigns this observation's cluster
                exp = self._retrieve(st, tr, iteration, stats)
                cid = exp.cluster_id
            else:  # task mode holds the episode's first retrieval; the cluster is still per step
                exp = st.task_exp
                cid = (self.experience.cluster(st.obs, tr.task_type, state_key=state_key_of(st.info))
                       if self.experience is not None else -1)
            messages = st.messages(self.builder, ep.instructions, exp.text if exp is not None else "")
            out.append(_Pending(i, self.builder.encode(messages), exp, int(cid),
                                messages if self.keep_messages else None))
        return out

    def _generate(self, pending: list[_Pending], ep: _Episode, turn: int, temperature: float,
                  stats: RolloutStats) -> None:
        stop = self.cfg.stop_at_newline
        t0 = time.perf_counter()
        outs = self.gen.generate([p.prompt for p in pending], max_new_tokens=self.cfg.max_new_tokens,
                                 temperature=temperature, top_p=self.cfg.top_p, top_k=self.cfg.top_k,
                                 rng_keys=[(*ep.live[p.env].key, turn) for p in pending],
                                 stop_at_newline=not ep.instructions.multiline if stop is None else stop,
                                 stop=self._stop_strings(ep))
        stats.gen_s += time.perf_counter() - t0
        stats.gen_calls += 1
        for p, o in zip(pending, outs):
            # model text is data: a bounded str without lone surrogates (SQLite/UTF-8 reject them)
            p.text, p.ids, p.logprobs = clean_text(o.text), o.ids, o.logprobs
            p.engine = engine_record(engine_prompt_ids(self.gen, p.prompt, o), o.ids)
            stats.prompt_tokens += len(p.prompt)
            stats.gen_tokens += len(o.ids)
            stats.entropy_sum += float(sum(o.entropy))
            stats.entropy_tokens += len(o.entropy)

    def _stop_strings(self, ep: _Episode) -> tuple[str, ...]:
        """Where this turn's answers end besides EOS: at the end of the first tool call, for a tool env that takes
        one call per turn and a tool-call syntax that marks the end of a call."""
        if not ep.instructions.one_call_per_turn:
            return ()
        end = self.builder.tool_syntax()[0].call_end
        return (end,) if end else ()

    def _parse(self, pending: list[_Pending], ep: _Episode, stats: RolloutStats) -> None:
        for p in pending:
            if ep.live[p.env].info.get("tools"):  # a tool env: the model's own tool-call syntax -> canonical calls
                calls, p.error = self.builder.tool_syntax()[0].parse(p.text)
                p.action, p.parse = (json.dumps(calls), "tool") if calls else (None, "invalid")
                stats.parse_kinds[p.parse] = stats.parse_kinds.get(p.parse, 0) + 1
                continue
            p.action, p.parse = parse_action(p.text, ep.live[p.env].info.get("admissible_actions"),
                                             self.cfg.fuzzy_cutoff)
            stats.parse_kinds[p.parse] = stats.parse_kinds.get(p.parse, 0) + 1

    def _step_envs(self, pool, pending: list[_Pending], stats: RolloutStats) -> dict[int, tuple]:
        actions = {p.env: p.action for p in pending if p.action is not None}
        t0 = time.perf_counter()
        results = pool.step(actions) if actions else {}
        stats.env_s += time.perf_counter() - t0
        return results

    def _record(self, ep: _Episode, turn: int, pending: list[_Pending], results: dict[int, tuple]) -> None:
        for p in pending:
            st, tr = ep.live[p.env], ep.trajs[p.env]
            if p.action is None:
                obs, reward, term, trunc, info = st.obs, 0.0, False, False, dict(st.info, invalid=True)
                if p.error:
                    info["error"] = p.error
            else:
                obs, reward, term, trunc, info = results[p.env]
            valid = p.action is not None and not info.get("invalid", False)
            penalty = 0.0 if valid else float(self.cfg.invalid_penalty)
            tr.steps.append(Step(
                group_id=tr.group_id, traj_id=tr.traj_id, step=turn, anchor=st.obs,
                prompt_ids=p.prompt, response_ids=p.ids, old_logprobs=p.logprobs,
                reward=float(reward) - penalty, penalty=penalty,
                done=bool(term or trunc or turn == self.max_steps - 1), valid=valid,
                action=p.action or "", response_text=p.text, task_type=tr.task_type, cluster_id=p.cluster_id,
                experience_ids=list(p.exp.entry_ids) if p.exp is not None else [],
                info=self._step_info(p, info), state_key=state_key_of(st.info),
                state_slots=dict(st.info.get("state_slots") or {}),
            ))
            st.advance(p.text, p.action, obs, info)
            if term or trunc:
                tr.won = bool(info.get("won", False))
                tr.final_info = final_info(info)
                tr.truncated = bool(trunc and not term)
                del ep.live[p.env]

    @staticmethod
    def _step_info(p: _Pending, info: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"parse": p.parse}
        if "fault" in info:
            out["fault"] = info["fault"]
        if info.get("invalid") and info.get("error"):  # why it was rejected: the library's warnings name it
            out["error"] = str(info["error"])[:300]
        if info.get("tools"):  # a tool env's step: its tool names (the library writes its lessons as calls)
            out["tools"] = _tool_names(info["tools"])
        if p.messages is not None:
            out["messages"] = p.messages
        if p.exp is not None and getattr(p.exp, "entry_ids", None):  # what the lessons shown here said
            out["right_state"] = getattr(p.exp, "right_state", None)
            out["lesson_actions"] = list(getattr(p.exp, "lesson_actions", ()))
        out[ENGINE_IDS] = p.engine
        return out

    def _finish(self, ep: _Episode) -> None:
        for i, st in ep.live.items():  # ran out of steps
            ep.trajs[i].truncated = True
            ep.trajs[i].final_info = final_info(st.info)

    def _retrieve(self, st: _Live, tr: Trajectory, iteration: int, stats: RolloutStats):
        t0 = time.perf_counter()
        experience = cast(ExperienceSource, self.experience)  # called only with a library
        res = experience.retrieve(st.obs, task_type=tr.task_type, goal=tr.goal, iteration=iteration,
                                       state_key=state_key_of(st.info), slots=dict(st.info.get("state_slots") or {}))
        stats.retrieval_s += time.perf_counter() - t0
        return res
