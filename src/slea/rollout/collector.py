"""The multi-turn rollout loop: N task groups x G copies stepped in lockstep, one generation call per turn.

Per turn, every live env gets a prompt (goal, last-k history, observation, admissible actions, and — when an
experience source is handed in — the experiences retrieved for this observation in the system message);
the generator answers all of them in one batched call; answers are parsed tolerantly into actions. An
unparseable or inadmissible answer does not step the env: it is an invalid step with a penalty, the agent
sees the same observation again. The output is trajectories of :class:`slea.types.Step` rows.

The experience source is duck-typed (``cluster(obs, task_type) -> int`` and
``retrieve(obs, task_type=, goal=, iteration=) -> obj with cluster_id, entry_ids, text``), so rollouts run
the same with or without a library and this module imports nothing of ``slea.experience``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from slea.policy.prompts import PromptBuilder, parse_action
from slea.types import Step, Trajectory


def final_info(info: dict[str, Any], max_chars: int = 200) -> dict[str, Any]:
    """The numbers, flags and short strings of an env's last info (``score``, ``em``, ``split``...): what a
    trajectory keeps for evaluation tables (lists such as admissible actions and long texts are dropped)."""
    return {k: v for k, v in info.items()
            if isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= max_chars)}


_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_ANSWER_CHARS = 4000  # an answer is one command or one tagged call; degenerate outputs ("!!!!...") get cut


def clean_text(text: object) -> str:
    """Model output as safe text: non-strings become ``''``, lone surrogates (possible from JSON-speaking remote
    generators) become U+FFFD, and the length is capped (the parsers' regexes are not linear on long runs)."""
    return _SURROGATE.sub("\ufffd", text[:MAX_ANSWER_CHARS]) if isinstance(text, str) else ""


class ExperienceSource(Protocol):
    def cluster(self, observation: str, task_type: str = "") -> int: ...

    def retrieve(self, observation: str, *, task_type: str = "", goal: str = "", iteration: int = 0) -> Any: ...


@dataclass
class RolloutStats:
    gen_s: float = 0.0
    env_s: float = 0.0
    retrieval_s: float = 0.0
    prompt_tokens: int = 0
    gen_tokens: int = 0
    gen_calls: int = 0
    parse_kinds: dict[str, int] = field(default_factory=dict)


@dataclass
class _Live:
    obs: str
    info: dict[str, Any]
    past: list[tuple[str, str]] = field(default_factory=list)
    task_exp: Any = None  # held retrieval for mode "task"


class RolloutCollector:
    def __init__(self, generator, builder: PromptBuilder, rollout_cfg, max_steps: int,
                 experience: ExperienceSource | None = None, experience_mode: str = "off"):
        self.gen = generator
        self.builder = builder
        self.cfg = rollout_cfg
        self.max_steps = max_steps
        self.experience = experience
        self.mode = experience_mode if experience is not None else "off"

    def collect(self, pool, seeds: list[int], *, iteration: int = 0, temperature: float | None = None,
                traj_offset: int = 0, progress=None) -> tuple[list[Trajectory], RolloutStats]:
        """Play one episode on every env of ``pool`` (group g reset with ``seeds[g]``)."""
        stats = RolloutStats()
        temp = self.cfg.temperature if temperature is None else temperature
        t0 = time.perf_counter()
        first = pool.reset(seeds)
        stats.env_s += time.perf_counter() - t0
        trajs = [Trajectory(group_id=pool.group_of(i), traj_id=traj_offset + i, seed=seeds[pool.group_of(i)],
                            goal=str(info.get("goal", "")), task_type=str(info.get("task_type", "")))
                 for i, (_, info) in enumerate(first)]
        live = {i: _Live(obs, info) for i, (obs, info) in enumerate(first) if "fault" not in info}
        for i, (_, info) in enumerate(first):
            if "fault" in info:  # the env could not be reset (EnvPool rebuilt it): it sits this episode out
                trajs[i].truncated = True
        if self.mode == "task":
            for i, st in live.items():
                st.task_exp = self._retrieve(st, trajs[i], iteration, stats)
        for turn in range(self.max_steps):
            if not live:
                break
            idx = sorted(live)
            prompts, exps, clusters = [], [], []
            for i in idx:
                st, tr = live[i], trajs[i]
                if self.mode == "step":  # retrieval assigns this observation's cluster
                    exp = self._retrieve(st, tr, iteration, stats)
                    cid = exp.cluster_id
                else:  # task mode holds the episode's first retrieval; the cluster is still per step
                    exp = st.task_exp
                    cid = self.experience.cluster(st.obs, tr.task_type) if self.experience is not None else -1
                exps.append(exp)
                clusters.append(cid)
                prompts.append(self.builder.build(tr.goal, st.obs, st.info.get("admissible_actions"),
                                                  st.past, exp.text if exp is not None else ""))
            t0 = time.perf_counter()
            outs = self.gen.generate(prompts, max_new_tokens=self.cfg.max_new_tokens, temperature=temp,
                                     top_p=self.cfg.top_p, top_k=self.cfg.top_k)
            for o in outs:  # model text is data: a bounded str without lone surrogates (SQLite/UTF-8 reject them)
                o.text = clean_text(o.text)
            stats.gen_s += time.perf_counter() - t0
            stats.gen_calls += 1
            stats.prompt_tokens += sum(len(p) for p in prompts)
            stats.gen_tokens += sum(len(o.ids) for o in outs)
            actions, parsed = {}, {}
            for k, i in enumerate(idx):
                act, kind = parse_action(outs[k].text, live[i].info.get("admissible_actions"),
                                         self.cfg.fuzzy_cutoff)
                stats.parse_kinds[kind] = stats.parse_kinds.get(kind, 0) + 1
                parsed[i] = (act, kind)
                if act is not None:
                    actions[i] = act
            t0 = time.perf_counter()
            results = pool.step(actions) if actions else {}
            stats.env_s += time.perf_counter() - t0
            for k, i in enumerate(idx):
                st, tr, out = live[i], trajs[i], outs[k]
                act, kind = parsed[i]
                if act is None:
                    obs, reward, term, trunc, info = st.obs, 0.0, False, False, dict(st.info, invalid=True)
                else:
                    obs, reward, term, trunc, info = results[i]
                valid = act is not None and not info.get("invalid", False)
                if not valid:
                    reward -= self.cfg.invalid_penalty
                last = term or trunc or turn == self.max_steps - 1
                exp = exps[k]
                tr.steps.append(Step(
                    group_id=tr.group_id, traj_id=tr.traj_id, step=turn, anchor=st.obs,
                    prompt_ids=prompts[k], response_ids=out.ids, old_logprobs=out.logprobs,
                    reward=float(reward), done=bool(last), valid=valid, action=act or "",
                    response_text=out.text, task_type=tr.task_type, cluster_id=int(clusters[k]),
                    experience_ids=list(exp.entry_ids) if exp is not None else [],
                    info={"parse": kind, "fault": info["fault"]} if "fault" in info else {"parse": kind},
                ))
                st.past.append((st.obs, act if act is not None else f"{out.text.strip()[:40]} (invalid)"))
                if valid:
                    st.obs, st.info = obs, {**st.info, **info}
                if term or trunc:
                    tr.won = bool(info.get("won", False))
                    tr.final_info = final_info(info)
                    tr.truncated = bool(trunc and not term)
                    del live[i]
            if progress is not None:
                progress(turn + 1, len(live))
        for i, st in live.items():  # ran out of steps
            trajs[i].truncated = True
            trajs[i].final_info = final_info(st.info)
        return trajs, stats

    def _retrieve(self, st: _Live, tr: Trajectory, iteration: int, stats: RolloutStats):
        t0 = time.perf_counter()
        res = self.experience.retrieve(st.obs, task_type=tr.task_type, goal=tr.goal, iteration=iteration)
        stats.retrieval_s += time.perf_counter() - t0
        return res
