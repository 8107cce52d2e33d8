"""Team rollouts: N task groups × G copies, one shared context per episode, the router's agent speaks each turn.

One episode per env of the pool, read top to bottom in :meth:`TeamCollector.collect`:

1. reset every env (the G copies of a group with the group's seed); each context starts with the observation;
2. per turn: the router picks the active agent of every live episode; for each agent chosen, its adapter is
   activated and one batched generation call answers all its episodes (prompt: its role's system message and
   example, the goal, the last k messages of the shared context; for an acting role also the valid commands);
3. a *talking* agent's message is appended to the context (reward 0); an *acting* agent's message is appended
   and parsed into the environment action (:func:`slea.policy.prompt_builder.parse_action`: never raises); a valid
   action steps the env, whose answer is appended; an invalid one is penalised (``rollout.invalid_penalty``)
   and the env's refusal (or "not a valid command") is appended instead;
4. an episode ends when its env terminates, or, truncated, after ``max_turns`` agent messages.

Every agent message is one :class:`slea.types.Step` row (``step`` = its index in the episode, ``anchor`` = the
raw observation it answered, ``old_logprobs`` under its own adapter); :attr:`TeamEpisode.agents` says whose.
Sampling is keyed per row by (salt, env seed, copy, draw, turn): ``draw`` tells the collections of a stage apart.
A row's ids are exactly the ids its agent's engine call consumed and produced; each row records their fingerprints
(``Step.info["engine_ids"]``, as the single-agent collector's) and :attr:`TeamRolloutStats.retokenized` counts the
rows whose trained ids differ from them (:func:`slea.rollout.collector.retokenized`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from slea.policy.prompt_builder import parse_action
from slea.rollout.collector import (
    ENGINE_IDS,
    TRAIN_SALT,
    clean_text,
    engine_prompt_ids,
    engine_record,
    final_info,
    retokenized,
)
from slea.rollout.view import invalid_feedback
from slea.team.context import ENV, INVALID, Message, SharedContext
from slea.team.prompt_builder import TeamPromptBuilder
from slea.team.routers import Router, route
from slea.team.tasks import TeamTask
from slea.types import Step, Trajectory


@dataclass
class TeamEpisode:
    """One team episode: its step rows (one per agent message), whose they are, and the shared context."""

    trajectory: Trajectory
    agents: list[int]
    context: SharedContext

    def rows_of(self, agent: int) -> list[Step]:
        return [s for s, a in zip(self.trajectory.steps, self.agents) if a == agent]

    @property
    def team_return(self) -> float:
        return self.trajectory.episode_return


def episode_state(ep: TeamEpisode) -> dict[str, Any]:
    """A team episode as JSON-able data (a checkpoint keeps the rollouts a resumed stage learns from next)."""
    return {"trajectory": asdict(ep.trajectory), "agents": list(ep.agents),
            "context": [asdict(m) for m in ep.context.messages]}


def episode_from_state(d: dict[str, Any]) -> TeamEpisode:
    """The :class:`TeamEpisode` written by :func:`episode_state` (its step rows, agents and context)."""
    tr = dict(d["trajectory"])
    tr["steps"] = [Step(**s) for s in tr["steps"]]
    return TeamEpisode(Trajectory(**tr), [int(a) for a in d["agents"]],
                       SharedContext([Message(**m) for m in d["context"]]))


@dataclass
class TeamRolloutStats:
    gen_calls: int = 0
    gen_s: float = 0.0
    env_s: float = 0.0
    messages: Counter = field(default_factory=Counter)  # per agent index
    parse_kinds: Counter = field(default_factory=Counter)  # acting messages only
    retokenized: int = 0  # rows whose trained ids differ from the engine's (slea.rollout.collector.retokenized)


@dataclass
class _Live:
    obs: str
    info: dict[str, Any]
    key: tuple[int, ...]


@dataclass
class _Turn:
    """One live episode's message in the current turn."""

    env: int
    agent: int
    prompt: list[int]
    text: str = ""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    action: str | None = None
    parse: str = "talk"
    engine: dict[str, str] = field(default_factory=dict)  # engine_record of the generation


class TeamCollector:
    """Plays team episodes. ``team``: an object with ``activate(agent)`` (a :class:`slea.team.policy.TeamPolicy`);
    ``generator``: an engine over the team's model (``HFGenerator``); ``calls`` counts :meth:`collect` calls."""

    def __init__(self, team, generator, builder: TeamPromptBuilder, task: TeamTask, router: Router, rollout_cfg,
                 max_turns: int):
        self.team = team
        self.gen = generator
        self.builder = builder
        self.task = task
        self.router = router
        self.cfg = rollout_cfg
        self.max_turns = max_turns
        self.calls = 0

    def collect(self, pool, seeds: list[int], *, draw: int = 0, rng_salt: int = TRAIN_SALT,
                temperature: float | None = None, traj_offset: int = 0, progress=None
                ) -> tuple[list[TeamEpisode], TeamRolloutStats]:
        """One team episode on every env of ``pool`` (group g reset with ``seeds[g]``); ``progress(turn, live)``
        is called after every turn (as :meth:`slea.rollout.collector.RolloutCollector.collect`'s)."""
        self.calls += 1
        stats = TeamRolloutStats()
        temp = self.cfg.temperature if temperature is None else temperature
        episodes, live = self._start(pool, seeds, rng_salt, traj_offset, stats)
        for turn in range(self.max_turns):
            if not live:
                break
            turns = self._speak(episodes, live, turn, draw, temp, pool.instructions.multiline, stats)
            results = self._step_envs(pool, turns, stats)
            self._record(episodes, live, turns, results, turn)
            if progress is not None:
                progress(turn + 1, len(live) if turn + 1 < self.max_turns else 0)  # the last turn ends them all
        for i, st in live.items():  # ran out of turns
            episodes[i].trajectory.truncated = True
            episodes[i].trajectory.final_info = final_info(st.info)
        stats.retokenized = retokenized(s for ep in episodes for s in ep.trajectory.steps)
        return episodes, stats

    def _start(self, pool, seeds, rng_salt, traj_offset, stats) -> tuple[list[TeamEpisode], dict[int, _Live]]:
        t0 = time.perf_counter()
        first = pool.reset(seeds)
        stats.env_s += time.perf_counter() - t0
        episodes, live, copies = [], {}, Counter()
        for i, (obs, info) in enumerate(first):
            g = pool.group_of(i)
            copy = copies[g]
            copies[g] += 1
            tr = Trajectory(group_id=g, traj_id=traj_offset + i, seed=seeds[g], goal=str(info.get("goal", "")),
                            task_type=str(info.get("task_type", "")))
            ctx = SharedContext()
            ctx.add(ENV, obs)
            episodes.append(TeamEpisode(tr, [], ctx))
            if "fault" in info:  # the env could not be reset: it sits this episode out
                tr.truncated = True
            else:
                live[i] = _Live(obs, info, (int(rng_salt), int(seeds[g]) % 2**63, copy))
        return episodes, live

    def _speak(self, episodes, live, turn, draw, temp, multiline, stats) -> list[_Turn]:
        """The router's agent of every live episode answers: one generation call per agent chosen."""
        n = len(self.task.roles)
        chosen = {i: route(self.router, len(episodes[i].agents), episodes[i].context, n) for i in sorted(live)}
        turns: list[_Turn] = []
        for agent in sorted(set(chosen.values())):
            role = self.task.roles[agent]
            envs = [i for i in sorted(live) if chosen[i] == agent]
            mine = [_Turn(i, agent, self.builder.build(role, episodes[i].trajectory.goal, episodes[i].context,
                                                       live[i].info.get("admissible_actions"))) for i in envs]
            stop = self.cfg.stop_at_newline
            if stop is None:
                stop = not (role.acts and multiline)
            self.team.activate(agent)
            t0 = time.perf_counter()
            outs = self.gen.generate([t.prompt for t in mine], max_new_tokens=self.cfg.max_new_tokens,
                                     temperature=temp, top_p=self.cfg.top_p, top_k=self.cfg.top_k,
                                     rng_keys=[(*live[t.env].key, draw, turn) for t in mine], stop_at_newline=stop)
            stats.gen_s += time.perf_counter() - t0
            stats.gen_calls += 1
            for t, o in zip(mine, outs):
                t.text, t.ids, t.logprobs = clean_text(o.text), o.ids, o.logprobs
                t.engine = engine_record(engine_prompt_ids(self.gen, t.prompt, o), o.ids)
                stats.messages[agent] += 1
                if role.acts:
                    t.action, t.parse = parse_action(t.text, live[t.env].info.get("admissible_actions"),
                                                     self.cfg.fuzzy_cutoff)
                    stats.parse_kinds[t.parse] += 1
            turns += mine
        return sorted(turns, key=lambda t: t.env)

    def _step_envs(self, pool, turns: list[_Turn], stats) -> dict[int, tuple]:
        actions = {t.env: t.action for t in turns if t.action is not None}
        t0 = time.perf_counter()
        results = pool.step(actions) if actions else {}
        stats.env_s += time.perf_counter() - t0
        return results

    def _record(self, episodes, live, turns: list[_Turn], results, turn: int) -> None:
        for t in turns:
            ep, st, role = episodes[t.env], live[t.env], self.task.roles[t.agent]
            ctx, tr = ep.context, ep.trajectory
            ctx.add(role.name, t.text.strip() or "(no message)", t.agent)
            obs, reward, term, trunc, info = st.obs, 0.0, False, False, {}
            valid, penalty = bool(t.text.strip()), 0.0
            if role.acts:
                if t.action is None:
                    info = dict(st.info, invalid=True)
                else:
                    obs, reward, term, trunc, info = results[t.env]
                valid = t.action is not None and not info.get("invalid", False)
                penalty = 0.0 if valid else float(self.cfg.invalid_penalty)
                if valid:
                    ctx.add(ENV, obs)
                else:
                    ctx.add(ENV, INVALID + invalid_feedback(
                        st.obs, obs if t.action is not None else None, info))
            row_info = {"role": role.name, "parse": t.parse, ENGINE_IDS: t.engine}
            if "fault" in info:
                row_info["fault"] = info["fault"]
            tr.steps.append(Step(
                group_id=tr.group_id, traj_id=tr.traj_id, step=len(tr.steps), anchor=st.obs,
                prompt_ids=t.prompt, response_ids=t.ids, old_logprobs=t.logprobs,
                reward=float(reward) - penalty, penalty=penalty,
                done=bool(term or trunc or turn == self.max_turns - 1), valid=valid,
                action=t.action or "", response_text=t.text, task_type=tr.task_type, info=row_info))
            ep.agents.append(t.agent)
            if role.acts and valid:
                st.obs, st.info = obs, {**st.info, **info}
            if term or trunc:
                tr.won = bool(info.get("won", False))
                tr.final_info = final_info(info)
                tr.truncated = bool(trunc and not term)
                del live[t.env]
