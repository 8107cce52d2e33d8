"""The TeamTR trainer: a team's agents fine-tuned one at a time, each on fresh rollouts of the intermediate team.

One stage (Xie et al. 2026, TeamTR §3, Algorithm "one stage"; each single-agent update is one :meth:`TeamTrainer.step`
of the run lifecycle, slea/trainer/lifecycle.py, which logs and checkpoints it):

1. the stage's task batch B (N task seeds, :func:`slea.rollout.sampling.iteration_seeds`) and an order σ of the agents
   (:func:`stage_order`, ``team.order``);
2. π̂^0 = the current team plays G episodes per task (:class:`slea.team.rollout.TeamCollector`);
3. for i = 1..n, agent j = σ(i):
   * the algorithm's estimator (``algorithm.name: teamtr``: Eq.9) scores every message of these *fresh*
     rollouts of π̂^{i−1}; agent j's messages are ``M_j`` (all of them, whatever their advantage);
   * agent j's adapter takes optimizer steps on the policy loss (``teamtr``: the Eq.10 surrogate over the messages
     it trains — all of ``M_j``, or those with a non-zero advantage under ``algorithm.skip_zero_advantage`` —
     minus the penalty β·d̂ over all of ``M_j``) until the token KL d̂ (Eq.11, measured on all of ``M_j`` with
     ``team.trust_region.kl_estimator``) is within δ (:mod:`slea.trainer.trust_region`, the rule
     :func:`slea.algorithms.teamtr.adapt_beta`); the other adapters are untouched;
   * π̂^i = π̂^{i−1} with agent j replaced: the team plays B again. Those rollouts are the return *after* update i
     and the fresh rollouts of update i+1 (n + 1 collections per stage).

The paper's baselines run in the same loop (``team.rollouts``): ``stale`` (naive sequential training: every
update of a stage learns from π̂^0's rollouts) and ``stale_iw`` (the same, advantages weighted by
:func:`stale_weights`).

One metrics row per single-agent update (``metrics.jsonl``, ``iteration`` = the update's index):
``teamtr/token_kl`` (d̂ of the accepted weights), ``teamtr/kl_estimator`` and ``teamtr/kl_messages`` (which
estimator, over how many messages), ``teamtr/token_kl_k1`` and ``teamtr/token_kl_k3`` (both estimates of the accepted
weights), ``teamtr/kl_max`` (the largest d̂ measured after any step of the update, rejected ones included),
``teamtr/beta`` (the β of its last step), ``teamtr/beta_next``, ``teamtr/steps``, ``teamtr/reverted``,
``teamtr/samples`` (the messages trained on), ``team/return_before`` and ``team/return_after`` (a coordination regression shows up as
after < before), ``train/success``, ``train/return``, ``train/invalid_rate`` (of the rollouts the update learns
from), the cumulative ``rollouts`` (team episodes) and ``env_steps`` (the acting agent's moves), what the update's
collections added to them (``budget/rollouts``, ``budget/env_steps``, as a single-agent iteration's), plus the loss's.
Budgets (``train.time_budget_s``, ``rollout_budget``, ``env_step_budget``) are checked before every single-agent
update, and the guards (``train.max_bad_updates``, ``env.max_fault_rate``) after it, by the run's state
(:class:`slea.trainer.run_state.RunState`) as in a single-agent run; a budget stop checkpoints the last update and
evaluates as a finished run does. The evaluation after training first writes the evaluated team's adapters.

``slea train`` runs this trainer for an algorithm that declares it needs a team (slea/trainer/select.py), into
the single-agent run folder layout. After every single-agent update (every ``train.save_every`` updates) an
atomic checkpoint ``checkpoints/iter_<update>/`` is written and ``slea train --resume RUN`` continues from the
newest intact one, bit for bit (:meth:`TeamTrainer.save`, :meth:`TeamTrainer.load`). After every stage the adapters are also written to
``<run>/adapters/<agent>.safetensors`` (:meth:`slea.team.policy.TeamPolicy.save_adapters`).
:meth:`TeamTrainer.fit` evaluates the team on held-out games before (``eval.before``) and after training
(:meth:`TeamTrainer.evaluate`: ``eval/before.json``, ``eval/after.json``, ``eval/summary.json``) and plots
``curves.png``. The entry point is :func:`slea.trainer.select.build_trainer` (``slea train``), or
``TeamTrainer(cfg, run_dir).fit(resume=False)``.
"""

from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slea.algorithms.batch import StepBatch, estimate
from slea.algorithms.registry import get_algorithm, get_policy_loss
from slea.algorithms.teamtr import KL_ESTIMATORS, token_kl
from slea.config import ConfigError, RunConfig, estimator_settings, loss_settings
from slea.device import run_device
from slea.envs.factory import make_pool
from slea.evaluation.evaluate import summarize
from slea.evaluation.team import evaluate_team
from slea.policy.engines import make_generator
from slea.progress import Progress, episodes_note
from slea.rollout.collector import retokenized
from slea.rollout.sampling import iteration_seeds
from slea.runs import checkpoint as ckpt
from slea.runs.folder import RunFolder
from slea.runs.runlog import RunLog
from slea.team.prompt_builder import TeamPromptBuilder
from slea.team.rollout import TeamCollector, TeamEpisode
from slea.team.routers import get_router
from slea.team.tasks import get_team_task
from slea.trainer import lifecycle
from slea.trainer.guards import faulted
from slea.trainer.lifecycle import building, check_saveable, load_resume_point, run_dir_for, seed_everything
from slea.trainer.metrics import group_collapse, no_update_line, response_metrics
from slea.trainer.run_state import RunState
from slea.trainer.team_checkpoint import pending_from_state, pending_state
from slea.trainer.trust_region import TrustRegion, TrustRegionResult, trust_region_update
from slea.trainer.update import Sample, accumulated_step, response_logprobs, right_aligned, to_samples

log = logging.getLogger(__name__)

# curves.png of a team run: one point per single-agent update
PANELS = (("team/success_after", "team success after the update"), ("team/return_after", "team return after it"),
          ("teamtr/token_kl", "token KL d̂ (Eq.11)"))


def stage_order(mode: str, n: int, run_seed: int, stage: int) -> list[int]:
    """σ of a stage: ``fixed`` (role order), ``reverse``, or ``random`` (a permutation drawn from (run seed,
    stage), so a resumed or repeated run trains in the same order)."""
    if mode == "fixed":
        return list(range(n))
    if mode == "reverse":
        return list(range(n - 1, -1, -1))
    if mode == "random":
        return [int(i) for i in np.random.default_rng([run_seed, stage, 7]).permutation(n)]
    raise ValueError(f"team.order must be random, fixed or reverse (got {mode!r})")


def mean_return(episodes: list[TeamEpisode]) -> float:
    """The team's mean episode return over a collection (0 for none)."""
    return float(np.mean([e.team_return for e in episodes])) if episodes else 0.0


def agent_samples(episodes: list[TeamEpisode], agent: int, spec, settings: dict[str, Any], *, penalty_at: str,
                  skip_zero: bool, weights: list[float] | None = None) -> list[Sample] | None:
    """Agent ``agent``'s messages as samples, with the algorithm's advantage one per response token (``skip_zero``
    leaves out those whose advantages are all 0; the trainer passes ``False``: Eq.11's ``M_j`` is all of them).

    The estimator sees every message of the collection (so every rollout's team return counts in its group's
    statistics); then only the agent's rows are kept. ``weights`` (one per episode) multiply the advantages of
    each episode's rows (the ``stale_iw`` baseline). Episodes ended by an env fault are left out
    (:func:`slea.trainer.guards.faulted`: a fault says nothing about the team); non-finite advantages give ``None``
    (a warning: the agent skips the update, which the bad-update guard counts)."""
    weights = [1.0] * len(episodes) if weights is None else list(weights)
    kept = [(e, w) for e, w in zip(episodes, weights) if not faulted(e.trajectory)]
    episodes = [e for e, _ in kept]
    rows = [s for e in episodes for s in e.trajectory.steps]
    row_weight = np.asarray([w for e, w in kept for _ in e.trajectory.steps], dtype=np.float64)
    mine = [a == agent for e in episodes for a in e.agents]
    if not any(mine):
        return []
    adv = estimate(spec, StepBatch.from_steps(rows, penalty_at=penalty_at), settings)
    if not np.all(np.isfinite(adv.rows)):
        log.warning("non-finite advantages: agent %d skips this update", agent)
        return None
    tokens = [t * w for t, w in zip(adv.per_token([len(s.response_ids) for s in rows]), row_weight)]
    own = [i for i, m in enumerate(mine) if m]
    return to_samples([rows[i] for i in own], [tokens[i] for i in own], skip_zero)


def stale_weights(log_ratios: Any, clip: float) -> np.ndarray:
    """The ``stale_iw`` baseline's rollout weights: ``clip(exp(Σ log π̂^{i−1}(m) − log π̂^0(m)), 1/clip, clip)``
    per rollout, the sum over the messages of the agents updated earlier in the stage (per-decision importance
    sampling of a team trajectory, truncated as in Ionides 2008's truncated IS)."""
    lr = np.asarray(log_ratios, dtype=np.float64)
    return np.clip(np.exp(np.clip(lr, -50.0, 50.0)), 1.0 / clip, clip)


def check_team_config(cfg: RunConfig) -> None:
    """A :class:`ConfigError` when the config cannot train a team (checked before the model loads)."""
    spec = get_algorithm(cfg.algorithm.name)
    if "team" not in spec.needs:
        raise ConfigError(f"algorithm.name: {spec.name} trains no team (the TeamTR trainer needs an algorithm "
                          f"that needs one, such as teamtr)")
    task = get_team_task(cfg.team.task)
    if cfg.env.id not in task.env_ids:
        raise ConfigError(f"env.id: team task {task.name} is written for {', '.join(task.env_ids)}, "
                          f"not {cfg.env.id}")
    if not cfg.model.lora:
        raise ConfigError("model.lora: a team's agents are LoRA adapters on one base model; set model.lora: true")
    if cfg.model.generator != "hf":
        raise ConfigError(f"model.generator: a team switches adapters per agent in-process; {cfg.model.generator} "
                          f"is not supported by the TeamTR trainer (use hf)")
    # what the team trainer does not read must not be set (a value silently ignored is an error): the config check
    # refuses these when the config loads (team_settings.py), but a `slea compare` sub-run's only when no compared
    # algorithm reads them
    if "beta" in cfg.algorithm.options:
        raise ConfigError("algorithm.options.beta: TeamTR adapts β; set team.trust_region.beta (its start) instead")
    if cfg.algorithm.kl_coef > 0:
        raise ConfigError("algorithm.kl_coef: TeamTR's KL term is the trust region's β·d̂ (team.trust_region)")
    if cfg.algorithm.dynamic_sampling:
        raise ConfigError("algorithm.dynamic_sampling: the TeamTR trainer replays the stage's tasks, it refills none")
    if cfg.experience.mode != "off":
        raise ConfigError("experience.mode: team rollouts retrieve no experiences; set experience.mode: off")


class TeamTrainer(lifecycle.Fits):
    """Wires the team (n LoRA adapters on one base), its collector, one optimizer and one β per agent, the
    logs; :meth:`fit` runs ``train.iterations`` stages (the run lifecycle of slea/trainer/lifecycle.py, a step
    being one single-agent update; its :class:`lifecycle.Run` methods are :meth:`start`, :meth:`step`,
    :meth:`save`, :meth:`evaluate`, :meth:`summary` and :meth:`close`)."""

    def __init__(self, cfg: RunConfig, run_dir: Path | None = None):
        from slea.team.policy import build_team_policy

        check_team_config(cfg)
        self.cfg = cfg
        self.spec = get_algorithm(cfg.algorithm.name)
        self.task = get_team_task(cfg.team.task)
        self.dir = Path(run_dir) if run_dir else run_dir_for(cfg)
        torch.set_num_threads(cfg.run.threads)
        seed_everything(cfg.run.seed)
        self.device = run_device(cfg.run.device)  # run.device (slea/device.py): a missing GPU is a ConfigError here
        with building(f"model.name_or_path: {cfg.model.name_or_path!r} does not load", (OSError, ValueError)):
            self.team = build_team_policy(cfg.model, self.task.agents, device=self.device)
        self.generator = make_generator(cfg.model, self.team.model, self.team.tok,
                                        max_batch=cfg.rollout.max_batch)  # hf (check_team_config)
        t = cfg.team
        builder = TeamPromptBuilder(self.team.tok, context_messages=t.context_messages,
                                    message_max_chars=t.message_max_chars, one_shot=cfg.rollout.one_shot)
        self.collector = TeamCollector(self.team, self.generator, builder, self.task, get_router(t.router),
                                       cfg.rollout, t.max_turns)
        with building(f"env.id: {cfg.env.id} cannot be built"):  # its constructor's error, one line
            self.pool = make_pool(cfg.env, cfg.rollout.groups, cfg.rollout.group_size)
        n = len(self.task.roles)
        self.optimizers = [torch.optim.AdamW(self.team.parameters(j), lr=cfg.train.lr, betas=tuple(cfg.train.betas),
                                             weight_decay=cfg.train.weight_decay) for j in range(n)]
        self.betas = [t.trust_region.beta] * n  # each agent carries its own β from update to update
        self.trust_region = TrustRegion(**t.trust_region.model_dump(exclude={"beta", "kl_estimator"}))
        self.kl_estimator = t.trust_region.kl_estimator
        self.loss_fn = get_policy_loss(cfg.algorithm.policy_loss)
        self.loss_kwargs = loss_settings(cfg.algorithm, self.loss_fn)
        params = inspect.signature(self.loss_fn).parameters
        self.loss_takes_beta = "beta" in params
        if "kl_estimator" in params:
            self.loss_kwargs["kl_estimator"] = self.kl_estimator
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = RunLog(self.dir, loggers=cfg.run.loggers, project=cfg.run.project,
                          config=cfg.model_dump(mode="json"))
        self.updates = 0  # single-agent updates done (the metrics rows' index)
        self.messages = 0  # agent messages of the training episodes
        # the clock, counters, stop signal, budgets and guards; its rollouts are the training episodes played (every
        # collection of every stage), its env steps their steps (the acting agent's moves; a planner's message is none)
        self.state = RunState(cfg, self.dir, self.log, total_steps=cfg.train.iterations * n,
                              unit="single-agent updates", name=self.step_name,
                              curves={"panels": PANELS, "xlabel": "single-agent update"})
        self.closed = False
        # what a checkpoint holds: every agent's adapter (by peft parameter name) and every agent's optimizer
        self.weights = {k: v for j in range(n) for k, v in self.team.named_adapter_parameters(j).items()}
        self.optimizer_set = ckpt.OptimizerSet(self.optimizers)
        # mid-stage, what the stage's next update learns from: the rollouts and the stale_iw log-ratios (None when
        # the next update opens a stage); a checkpoint keeps it, so a resumed run enters a stage where it stopped
        self.pending: tuple[list[TeamEpisode], np.ndarray] | None = None
        self.last_kl: dict[str, float] = {}  # measure_kl's last measurement: both estimates and the messages

    # -- the phases of one stage -----------------------------------------------------------------------------
    def collect(self, stage: int, draw: int, seeds: list[int]) -> list[TeamEpisode]:
        """The current (intermediate) team plays one episode per env of the pool on the stage's tasks; ``draw``
        (the collection's index in the stage) keys the sampling, so each collection is a fresh sample."""
        with Progress(f"stage {stage + 1} rollout {draw + 1}", total=self.cfg.team.max_turns, unit="turns") as bar:
            episodes, _ = self.collector.collect(self.pool, seeds, draw=stage * (len(self.task.roles) + 1) + draw,
                                                 progress=episodes_note(bar, len(self.pool)))
        self.state.rollouts += len(episodes)
        self.messages += sum(len(e.agents) for e in episodes)
        self.state.env_steps += sum(1 for e in episodes for s in e.trajectory.steps if s.action)
        return episodes

    # -- held-out evaluation ---------------------------------------------------------------------------------
    def evaluate(self, name: str) -> dict[str, Any]:
        """The current team on the held-out games (:func:`slea.evaluation.team.evaluate_team`), written to
        ``<run>/eval/<name>.json``. ``after`` training, the team's adapters are written first
        (:meth:`write_adapters`): a run a budget stopped mid-stage leaves the team it evaluated."""
        if name == "after":
            self.write_adapters()
        return evaluate_team(self.collector, self.cfg, self.task.name, RunFolder(self.dir).evaluation(name))

    def samples_for(self, agent: int, episodes: list[TeamEpisode], weights: list[float] | None = None
                    ) -> list[Sample] | None:
        """All of ``agent``'s messages in ``episodes`` (Eq.11's ``M_j``, zero advantages included), with the
        advantages of this run's algorithm and settings (:func:`agent_samples`; ``None``: non-finite ones); which
        of them the loss trains is :meth:`trained`'s choice."""
        return agent_samples(episodes, agent, self.spec, estimator_settings(self.cfg.algorithm, self.spec),
                             penalty_at=self.cfg.rollout.invalid_penalty_at, skip_zero=False, weights=weights)

    def trained(self, messages: list[Sample]) -> list[bool]:
        """Which of an agent's messages the surrogate averages over: all of them (Eq.10's ``E_m``, the default),
        or, with ``algorithm.skip_zero_advantage``, those with a non-zero advantage (the β·d̂ penalty and the
        monitor still cover all of them)."""
        if not self.cfg.algorithm.skip_zero_advantage:
            return [True] * len(messages)
        return [not all(abs(a) < 1e-8 for a in s.advantages) for s in messages]

    @torch.no_grad()
    def message_logprobs(self, agent: int, episodes: list[TeamEpisode]) -> np.ndarray:
        """Per episode, the summed log-prob of ``agent``'s messages under its current adapter (training forward)."""
        self.team.activate(agent)
        rows = [(k, s) for k, e in enumerate(episodes) for s, a in zip(e.trajectory.steps, e.agents)
                if a == agent and s.response_ids]
        out = np.zeros(len(episodes))
        for start in range(0, len(rows), self.cfg.train.micro_batch):
            chunk = rows[start:start + self.cfg.train.micro_batch]
            logp, _, _, _ = self._forward([Sample(s.prompt_ids, s.response_ids, [], []) for _, s in chunk])
            for (k, _), total in zip(chunk, logp.sum(-1).tolist()):
                out[k] += total
        return out

    def update_agent(self, agent: int, samples: list[Sample]) -> TrustRegionResult:
        """One TeamTR single-agent update of ``agent`` (module docstring, step 3). ``samples``: all of its
        messages ``M_j`` (:meth:`samples_for`); the surrogate trains those :meth:`trained` picks, the penalty β·d̂
        and the monitor d̂ run over all of them.

        ``π_cur``'s log-probs are recomputed first with the training forward (the pre-update weights): the ratio
        and d̂ then start at exactly 1 and 0, not at the generation-vs-training numerics gap (bf16 autocast). The
        same micro-batches are used for every forward of the update, so the numbers stay comparable."""
        team = self.team
        team.activate(agent)
        team.model.train()
        samples = self.recompute_old_logprobs(samples)
        trained = self.trained(samples)
        res = trust_region_update(lambda beta: self._optimizer_step(agent, samples, trained, beta),
                                  lambda: self.measure_kl(samples), lambda: team.state(agent),
                                  lambda saved: team.load_state(agent, saved), self.betas[agent], self.trust_region)
        self.betas[agent] = res.beta
        return res

    @torch.no_grad()
    def recompute_old_logprobs(self, samples: list[Sample]) -> list[Sample]:
        """``samples`` with ``old_logprobs`` from the active agent's current weights (the training forward)."""
        out = []
        for chunk in self._chunks(samples):
            logp, mask, _, _ = self._forward(chunk)
            out += [Sample(s.prompt_ids, s.response_ids, row[m.bool()].tolist(), s.advantages)
                    for s, row, m in zip(chunk, logp, mask)]
        return out

    def _chunks(self, samples: list[Sample]):
        mb = self.cfg.train.micro_batch
        for start in range(0, len(samples), mb):
            yield samples[start:start + mb]

    def _forward(self, chunk: list[Sample]):
        logp, mask = response_logprobs(self.team.model, chunk, temperature=self.cfg.rollout.temperature,
                                       dtype=self.cfg.model.dtype)
        k = mask.shape[1]
        return logp, mask, right_aligned([s.old_logprobs for s in chunk], k, logp.device), right_aligned(
            [s.advantages for s in chunk], k, logp.device)

    def _optimizer_step(self, agent: int, samples: list[Sample], trained: list[bool], beta: float
                        ) -> dict[str, float]:
        """One optimizer step of ``agent`` on Eq.10: the policy loss over the ``trained`` messages (its mean over
        them: micro-batches weighted by their trained messages) plus ``β·d̂`` over all of ``samples`` (Eq.11's
        ``M_j``: micro-batches weighted by their messages). A loss with a ``beta`` keyword (``teamtr``) gets 0
        there, so the penalty is counted once. Metrics: the loss's (over the trained messages), ``loss`` (the
        whole objective) and ``penalty_kl`` (the penalty's d̂, at the weights before this step); a ``*_max_dev``
        metric is the maximum over the micro-batches, as in the single-agent update."""
        n_trained = max(sum(trained), 1)

        def passes():
            start = 0
            for chunk in self._chunks(samples):
                logp, mask, old, adv = self._forward(chunk)
                rows = [k for k, t in enumerate(trained[start:start + len(chunk)]) if t]
                start += len(chunk)
                kl = token_kl(old, logp, mask, self.kl_estimator)
                loss = beta * kl * (len(chunk) / len(samples))
                met: dict[str, float] = {}
                if rows:
                    idx = torch.tensor(rows, dtype=torch.long, device=logp.device)
                    extra = {"beta": 0.0} if self.loss_takes_beta else {}
                    policy_loss, met = self.loss_fn(logp[idx], old[idx], adv[idx], mask[idx], **self.loss_kwargs,
                                                    **extra)
                    share = len(rows) / n_trained
                    loss = loss + policy_loss * share
                    met = {k: float(v) if k.endswith("_max_dev") else float(v) * share for k, v in met.items()}
                yield loss, {**met, "loss": float(loss.detach()),
                             "penalty_kl": float(kl.detach()) * len(chunk) / len(samples)}

        totals, grad_norm, stepped = accumulated_step(self.optimizers[agent], self.team.parameters(agent),
                                                      self.cfg.train.grad_clip, passes())
        if not stepped:  # numerical guard: the step was skipped, the weights kept
            totals["skipped"] = 1.0
        totals["grad_norm"] = grad_norm
        return totals

    @torch.no_grad()
    def measure_kl(self, samples: list[Sample]) -> float:
        """Eq.11's d̂ of the active agent's current weights against ``π_cur`` (``old_logprobs``) over all of
        ``samples`` (every message of the agent, whatever its advantage), with ``team.trust_region.kl_estimator``.
        Both estimates of the same forward are kept in :attr:`last_kl` (``k1``, ``k3``, ``messages``)."""
        totals = dict.fromkeys(KL_ESTIMATORS, 0.0)
        messages = 0
        for chunk in self._chunks(samples):
            logp, mask, old, _ = self._forward(chunk)
            for est in KL_ESTIMATORS:
                totals[est] += float(token_kl(old, logp, mask, est)) * len(chunk)
            messages += len(chunk)
        self.last_kl = {**{est: v / max(messages, 1) for est, v in totals.items()}, "messages": messages}
        return self.last_kl[self.kl_estimator]

    # -- one single-agent update: the run lifecycle's step (slea/trainer/lifecycle.py) ---------------------------
    def step_name(self, k: int) -> str:
        """A single-agent update as the log lines number it (from 1): ``stage 2/3, update 1/2``."""
        stage, position = divmod(k, len(self.task.roles))
        return f"stage {stage + 1}/{self.cfg.train.iterations}, update {position + 1}/{len(self.task.roles)}"

    def step(self, k: int) -> dict[str, Any]:
        """Single-agent update ``k`` = stage ``s``, position ``i`` in σ (module docstring); its metrics row. The
        stage's first update collects π̂^0; each learns from :attr:`pending` (the rollouts the update before it left,
        or a resumed checkpoint kept) and leaves the next one's there; a stage's last update writes the team's
        adapters to ``<run>/adapters/``.

        Baselines (``team.rollouts``): ``stale``, naive sequential training, every agent of the stage learns from
        the stage's first collection, and the team plays again only after the last update (2 collections per
        stage, ``team/return_after`` on the last row only); ``stale_iw``, the same with each rollout's advantages
        weighted by :func:`stale_weights` of the agents updated before in the stage.

        The guards are told whether the update was bad (non-finite advantages, or an optimizer step the numerical
        guard skipped) and the env faults of its collections."""
        cfg = self.cfg
        mode = cfg.team.rollouts
        n = len(self.task.roles)
        s, i = divmod(k, n)
        seeds = iteration_seeds(cfg.run.seed, s, cfg.rollout.groups)
        order = stage_order(cfg.team.order, n, cfg.run.seed, s)
        played_before = (self.state.rollouts, self.state.env_steps)
        if self.pending is None:
            episodes = self.collect(s, 0, seeds)  # π̂^0
            log_ratio = np.zeros(len(episodes))  # stale_iw: Σ log π̂^{i−1} − log π̂^0 of updated agents' messages
        else:
            episodes, log_ratio = self.pending[0], np.array(self.pending[1], dtype=np.float64)
        agent = order[i]
        t0 = time.perf_counter()
        weights = stale_weights(log_ratio, cfg.team.iw_clip) if mode == "stale_iw" else None
        samples = self.samples_for(agent, episodes, None if weights is None else weights.tolist())
        nonfinite = samples is None
        samples = samples or []
        row: dict[str, Any] = {"stage": s, "position": i, "agent": agent, "role": self.task.agents[agent],
                               "team/return_before": mean_return(episodes),
                               # rows trained on other ids than their engine consumed or produced (always 0)
                               "rollout/retokenized": retokenized(st for e in episodes for st in e.trajectory.steps)}
        played = summarize([e.trajectory for e in episodes])  # the rollouts this update learns from
        row.update({f"train/{key}": played[key] for key in ("success", "return", "invalid_rate")})
        row.update(group_collapse([e.trajectory for e in episodes]))
        row.update({f"response/{key}": v for key, v in response_metrics([e.trajectory for e in episodes],
                                                                       cfg.rollout.max_new_tokens).items()})
        if weights is not None:
            row["teamtr/iw_mean"], row["teamtr/iw_max"] = float(weights.mean()), float(weights.max())
        before = self.message_logprobs(agent, episodes) if mode == "stale_iw" else None
        self.last_kl = {"k1": 0.0, "k3": 0.0, "messages": len(samples)}
        if any(any(abs(a) >= 1e-8 for a in s.advantages) for s in samples):
            res = self.update_agent(agent, samples)
            beta_used = res.beta_history[-1]
        else:  # nothing to learn from (no message, or every advantage 0): the agent stays as it is
            res, beta_used = TrustRegionResult(0.0, self.betas[agent], 0, False), self.betas[agent]
        kl = self.last_kl  # both estimates at the accepted weights (the last measurement of the update)
        if before is not None:
            log_ratio += self.message_logprobs(agent, episodes) - before
        t_update = time.perf_counter() - t0
        if mode == "fresh" or i == n - 1:
            after = self.collect(s, i + 1, seeds)  # π̂^i plays: the return after this update
            row["team/return_after"] = mean_return(after)
            row["team/success_after"] = float(np.mean([e.trajectory.won for e in after])) if after else 0.0
            if mode == "fresh":
                episodes = after  # TeamTR: the next agent learns from the intermediate team's fresh rollouts
        row = {
            **row, "teamtr/token_kl": res.kl, "teamtr/kl_estimator": self.kl_estimator,
            "teamtr/kl_messages": kl["messages"], "teamtr/token_kl_k1": kl["k1"], "teamtr/token_kl_k3": kl["k3"],
            "teamtr/kl_max": max(res.kl_history, default=0.0), "teamtr/beta": beta_used,
            "teamtr/beta_next": res.beta, "teamtr/steps": res.steps, "teamtr/reverted": float(res.reverted),
            "teamtr/samples": sum(self.trained(samples)) if res.steps else 0,
            **{f"update/{key}": v for key, v in res.step_metrics.items()},
            "update/lr": self.optimizers[agent].param_groups[0]["lr"],
            "time/update_s": t_update, "time/stage_s": time.perf_counter() - t0,
            "episodes": self.state.rollouts, "rollouts": self.state.rollouts, "env_steps": self.state.env_steps,
            # what this update spent of the budgets (its collections), as the single-agent rows' budget/*
            "budget/rollouts": self.state.rollouts - played_before[0],
            "budget/env_steps": self.state.env_steps - played_before[1],
        }
        self.updates += 1
        self.pending = None if i == n - 1 else (episodes, log_ratio)
        if i == n - 1:
            self.write_adapters()  # the team after each stage, one file per agent
        self.state.guard.observe(nonfinite or res.skipped > 0)
        self.state.note_faults(self.pool.take_fault_stats(), self.pool.last_error)
        self.report(row)
        return row

    def write_adapters(self) -> None:
        """The team after a stage, one file per agent under ``<run>/adapters/``; weights that hold NaN/inf are never
        written (:class:`RunHalted`, as for a checkpoint)."""
        check_saveable(self.weights.values(), "the stage's adapters", self.state.last_checkpoint)
        self.team.save_adapters(RunFolder(self.dir).adapters)

    def report(self, row: dict[str, Any]) -> None:
        """The update's progress line."""
        after = f"{row['team/return_after']:+.3f}" if "team/return_after" in row else "-"
        log.info("stage %d/%d update %d/%d (%s)  return %+.3f -> %s  token KL %.4f  beta %.3g  %d steps  [%.0fs]",
                 row["stage"] + 1, self.cfg.train.iterations, row["position"] + 1, len(self.task.roles), row["role"],
                 row["team/return_before"], after, row["teamtr/token_kl"], row["teamtr/beta"], row["teamtr/steps"],
                 row["time/stage_s"])
        quiet = no_update_line(row) if not row["teamtr/steps"] else None
        if quiet:  # "0 steps" says the agent did not move; this line says why
            log.info(quiet)

    # -- checkpoints, the summary, the end (the run lifecycle's methods) ---------------------------------------
    def start(self, resume: bool) -> tuple[Path | None, dict[str, Any] | None, int]:
        """Ready to train: with ``resume``, the newest intact checkpoint (:meth:`load`); the engine is in-process."""
        return self.load() if resume else (None, None, -1)

    def save(self, k: int, state: dict[str, Any]) -> str:
        """Checkpoint single-agent update ``k``, the one just logged (``checkpoints/iter_<k + 1>``: named by the
        updates done, as the log lines count them): every agent's adapter and optimizer, the RNG states, and in
        ``state.json`` the run's ``state`` beside the stage and position, β per agent, the counters and the pending
        rollouts (what the stage's next update learns from, so no collection is replayed; ``None`` after a
        stage's last update). Weights that hold NaN/inf are never written (:class:`RunHalted`). Its folder name."""
        check_saveable(self.weights.values(), self.step_name(k), self.state.last_checkpoint)
        stage, position = divmod(k, len(self.task.roles))
        path = ckpt.save_checkpoint(
            RunFolder(self.dir).checkpoints, k, self.weights, self.optimizer_set, keep=self.cfg.train.keep_checkpoints,
            number=k + 1,
            extra={**state, "stage": stage, "position": position, "updates": self.updates,
                   "episodes": self.state.rollouts, "messages": self.messages, "betas": list(self.betas),
                   "agents": list(self.task.agents), "pending": pending_state(self.pending)})
        return path.name

    def load(self) -> tuple[Path | None, dict[str, Any] | None, int]:
        """Load the newest intact checkpoint (damaged ones are skipped with a warning; only damaged ones:
        :class:`RunHalted`, nothing changed): adapters, optimizers, RNGs, β, the update and message counts and the
        pending rollouts; rows logged after it are dropped (those updates are redone). Its folder, ``state.json``
        and update."""
        last, state, k = load_resume_point(RunFolder(self.dir).checkpoints, self.weights, self.optimizer_set, self.log)
        if state is not None:
            self.updates, self.messages = int(state["updates"]), int(state["messages"])
            self.betas = [float(b) for b in state["betas"]]
            self.pending = pending_from_state(state.get("pending"))
        return last, state, k

    def summary(self) -> dict[str, Any]:
        """The summary's own fields: the team, the counts, the budget that stopped the run, precision, device."""
        cfg = self.cfg
        return {"team_task": self.task.name, "agents": self.task.agents, "rollouts": cfg.team.rollouts,
                "stages": cfg.train.iterations, "updates": self.updates, "iterations": len(self.log.rows()),
                "episodes": self.state.rollouts, "messages": self.messages, "env_steps": self.state.env_steps,
                "stopped_by": self.state.stopped_by or None,
                "precision": {"generation": cfg.model.dtype, "training": cfg.model.dtype}, "device": self.device}

    def close(self) -> None:
        """Close the loggers and the env pool (an in-process engine holds nothing more); idempotent."""
        if not self.closed:
            self.closed = True
            self.log.close()
            self.pool.close()
