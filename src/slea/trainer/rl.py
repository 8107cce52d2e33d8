"""The on-policy training loop: collect → advantages → evolve the library → update → log, checkpoint.

One iteration (:meth:`Trainer.iteration`), as a newcomer reads it: the rollout scheme plays the iteration's
episodes and hands them over in rounds (slea/rollout/schemes.py: one round of N task groups × G copies; or,
for an algorithm that needs env snapshots such as RTPO, one round per turn k = K−1 … 0 of siblings forked from
trunk boundaries, each played after the previous round's update). Each round (:meth:`Trainer.train_round`):
1. :meth:`Trainer.advantages`: the registered algorithm's estimator turns the step rows (plus the critic's
   values, when it needs a critic) into one advantage per response token (slea/algorithms/);
2. :meth:`Trainer.evolve`: the experience library learns from the round's episodes, when there is one
   (slea/experience/manager.py);
3. :meth:`Trainer.update`: clipped policy-gradient steps on the response tokens (slea/trainer/update.py), then
   the critic's own steps.
Then the run lifecycle (slea/trainer/lifecycle.py) logs the iteration's row (slea/trainer/metrics.py builds it;
metrics.jsonl and TensorBoard, slea/runs/runlog.py) and checkpoints it when due (slea/runs/checkpoint.py).

Data-parallel (``slea train --nproc N``, slea/parallel/distributed.py): each rank plays its share of the task groups,
the ranks exchange their episodes so every rank holds the whole batch, and the update sums their gradients; rank 0
alone writes the run folder, checkpoints and evaluates (the other ranks write their library and metrics to a
scratch folder that is removed at the end). With ``train.fsdp`` the frozen base weights are sharded over the ranks
(FSDP2); rollouts and evaluations run with them gathered whole (:func:`slea.parallel.distributed.full_weights`),
the update with one layer gathered at a time.

The trainer reads the algorithm's spec (``needs``, ``level``), never its name.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slea.algorithms.batch import Advantages, StepBatch, estimate
from slea.algorithms.registry import NEEDS, get_algorithm
from slea.config import ConfigError, RunConfig, estimator_settings
from slea.device import resolve_base_storage, run_device
from slea.envs.factory import eval_env_kwargs
from slea.evaluation.evaluate import evaluate, write_eval
from slea.experience.engine import experience_manager
from slea.parallel.checks import check_data_parallel
from slea.parallel.distributed import DataParallel, full_weights, shard_frozen_base
from slea.policy.engines import close_generator, make_generator, sleep_generator, start_server
from slea.policy.model import enable_gradient_checkpointing, load_policy, store_frozen_linears
from slea.policy.prompt_builder import PromptBuilder
from slea.progress import Progress
from slea.rollout import schemes
from slea.rollout.collector import RolloutCollector, RolloutStats
from slea.rollout.sampling import RoundRollouts, iteration_seeds, merge_stats
from slea.runs import checkpoint as ckpt
from slea.runs.episodes import EpisodeSampler
from slea.runs.folder import RunFolder
from slea.runs.runlog import RunLog
from slea.trainer import lifecycle
from slea.trainer.critic import Critic
from slea.trainer.guards import faulted, nonfinite_count
from slea.trainer.lifecycle import check_saveable, load_resume_point, run_dir_for, seed_everything
from slea.trainer.metrics import (
    Phases,
    iteration_metrics,
    merge_library,
    merge_updates,
    no_update_line,
    sum_metrics,
)
from slea.trainer.run_state import RunState
from slea.trainer.select import TRAINERS
from slea.trainer.update import Sample, ppo_update, to_samples
from slea.types import Trajectory, flatten

log = logging.getLogger(__name__)

# What this trainer can give an algorithm (AlgorithmSpec.needs; "snapshots" through its rollout scheme,
# slea/rollout/schemes.py). `slea train` picks between it and the team trainer by these declarations
# (slea/trainer/select.py); offline data comes with `slea align`.
PROVIDES = next(k.provides for k in TRAINERS if k.name == "rl")


def check_provided(spec, provides: frozenset[str] = PROVIDES) -> None:
    """A :class:`ConfigError` when the algorithm needs what this trainer cannot give (`slea train` picks the
    trainer that can, slea/trainer/select.py)."""
    missing = sorted(spec.needs - provides)
    if missing:
        what = "; ".join(NEEDS[m] for m in missing)
        raise ConfigError(f"algorithm.name: {spec.name} needs {what}, which this trainer does not provide "
                          f"(slea.trainer.select.build_trainer picks the one that does)")


@dataclass
class Estimate:
    """A round's advantages: the training rows and what the metrics and the critic need."""

    samples: list[Sample]
    advantages: Advantages | None
    nonfinite_rewards: int = 0
    nonfinite_advantages: int = 0

    @property
    def ok(self) -> bool:
        return not (self.nonfinite_rewards or self.nonfinite_advantages)


@dataclass
class Round:
    """One training round's rollouts and what each phase made of them."""

    batch: RoundRollouts
    clean: int  # its whole episodes not ended by an env fault
    est: Estimate
    library: dict[str, float]
    update: dict[str, float]
    critic: dict[str, float]
    seconds: dict[str, float]


class Trainer(lifecycle.Fits):
    """Wires config, policy, envs, collector, experience library and logs; :meth:`fit` runs the loop (the run
    lifecycle of slea/trainer/lifecycle.py, a step being one :meth:`iteration`; its :class:`lifecycle.Run` methods
    are :meth:`start`, :meth:`step`, :meth:`save`, :meth:`evaluate`, :meth:`summary` and :meth:`close`)."""

    def __init__(self, cfg: RunConfig, run_dir: Path | None = None):
        self.cfg = cfg
        self.spec = get_algorithm(cfg.algorithm.name)
        check_provided(self.spec)  # before the model loads: a config error costs nothing
        self.dir = Path(run_dir) if run_dir else run_dir_for(cfg)
        self.dp = DataParallel.current()
        check_data_parallel(cfg, self.dp)
        # where this rank writes its library and metrics: the run folder on rank 0, a scratch folder elsewhere
        self.out = self.dir if self.dp.main else Path(tempfile.mkdtemp(prefix=f"slea-rank{self.dp.rank}-"))
        torch.set_num_threads(cfg.run.threads)
        seed_everything(cfg.run.seed)
        self.device = run_device(cfg.run.device)  # run.device (slea/device.py): a missing GPU is a ConfigError here
        server = start_server(cfg.model, self.device)  # a managed vLLM server, before the trainer takes GPU memory
        with lifecycle.building(f"model.name_or_path: {cfg.model.name_or_path!r} does not load", (OSError, ValueError)):
            self.model, self.tok = load_policy(cfg.model, device=self.device)
        if cfg.train.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        if cfg.train.fsdp:  # the frozen base weights sharded over the ranks; the LoRA weights stay whole
            if resolve_base_storage(cfg.model.base_dtype, device=self.device, lora=cfg.model.lora,
                                    dtype=cfg.model.dtype) == "bfloat16_linears":
                store_frozen_linears(self.model, torch.float32)  # FSDP: one dtype per unit; the same numbers
            shard_frozen_base(self.model)
        self.reference = self._frozen_reference()
        self.generator = make_generator(cfg.model, self.model, self.tok, max_batch=cfg.rollout.max_batch,
                                        server=server)  # hf | openai | vllm (slea/policy/engines.py)
        builder = PromptBuilder.from_rollout(self.tok, cfg.rollout)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.experience = experience_manager(self.spec, self.out, self.generator, experience=cfg.experience,
                                             model_cfg=cfg.model)
        self.collector = RolloutCollector(self.generator, builder, cfg.rollout, cfg.env.max_steps,
                                          experience=self.experience, experience_mode=cfg.experience.mode)
        with lifecycle.building(f"env.id: {cfg.env.id} cannot be built"):  # its constructor's error, one line
            self.rollouts = schemes.scheme_for(self.spec.needs)(  # by the spec's needs
                self.collector, self.dp, env=cfg.env, rollout=cfg.rollout, algorithm=cfg.algorithm,
                run_seed=cfg.run.seed)
        self.pool = self.rollouts.pool
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, betas=cfg.train.betas,
                                           weight_decay=cfg.train.weight_decay)
        self.critic = (Critic(self.model, self.spec.level, pad_id=self.tok.pad_token_id or 0, algorithm=cfg.algorithm,
                              train=cfg.train, dtype=cfg.model.dtype) if "critic" in self.spec.needs else None)
        # rank 0 alone reports to W&B / MLflow; every rank keeps its own metrics.jsonl (in its scratch folder)
        self.log = RunLog(self.out, loggers=cfg.run.loggers if self.dp.main else
                          [n for n in cfg.run.loggers if n in ("jsonl", "tensorboard")],
                          project=cfg.run.project, config=cfg.model_dump(mode="json"))
        self.samples = EpisodeSampler(self.out, cfg.run.episode_samples, cfg.run.episode_samples_bytes)
        self.episodes = 0  # trajectories played (rollouts and env steps are the run state's: the budgets count them)
        # the clock, counters, stop signal, budgets and guards; rank 0 decides the time budget for every rank
        self.state = RunState(cfg, self.dir, self.log, total_steps=cfg.train.iterations, unit="iterations",
                              name=self.step_name, main=self.dp.main, agree=self.dp.from_main)
        self.closed = False

    # -- one iteration ---------------------------------------------------------------------------------------
    def iteration(self, it: int) -> dict[str, float]:
        t0 = time.perf_counter()
        seeds = iteration_seeds(self.cfg.run.seed, it, self.cfg.rollout.groups)
        rounds = [self.train_round(batch, it) for batch in self._gathered(self.rollouts.rounds(it, seeds))]
        batches = [r.batch for r in rounds]
        self.episodes += sum(len(b.collected) for b in batches)
        self.state.env_steps += sum(b.env_steps for b in batches)
        self.state.rollouts += sum(b.rollouts for b in batches)
        streak = self.state.guard.observe(any(r.update.get("skipped_updates", 0) for r in rounds))
        return self.metrics(rounds, streak, time.perf_counter() - t0)

    def _gathered(self, rounds):
        """The rollout scheme's rounds, each played with the whole weights on every rank (under ``train.fsdp``
        a rank's generation runs its own number of forwards, which sharded layers cannot: distributed.py), each
        with the seconds it took to play (``RoundRollouts.seconds``)."""
        while True:
            t0 = time.perf_counter()
            with full_weights(self.model):
                batch = next(rounds, None)
            if batch is None:
                return
            batch.seconds = time.perf_counter() - t0
            yield batch

    def train_round(self, batch: RoundRollouts, it: int) -> Round:
        """Advantages → library → update on one round of rollouts."""
        train_set = [t for t in batch.trajs if not faulted(t)]  # an env fault says nothing about the policy
        clean = [t for t in batch.collected if not faulted(t)]
        t_adv = time.perf_counter()
        est = self.advantages(train_set)
        t_lib = time.perf_counter()
        library = self.evolve(clean, it) if est.ok else {}
        t_train = time.perf_counter()
        sleep_generator(self.generator)  # a vLLM server on the trainer's GPU frees it; the sync below wakes it
        upd, critic = self.update(est, it)
        self.generator.sync_weights(self.model)  # the engine generates with the new weights (hf: no-op)
        seconds = {"rollout": batch.seconds, "advantages": t_lib - t_adv, "library": t_train - t_lib,
                   "train": time.perf_counter() - t_train}
        self.samples.record(it, train_set, est.advantages, self.experience)  # episodes.jsonl, for slea report
        return Round(batch, len(clean), est, library, upd, critic, seconds)

    def metrics(self, rounds: list[Round], streak: int, seconds: float) -> dict[str, float]:
        """The iteration's metrics row, over its rounds."""
        batches = [r.batch for r in rounds]
        ests = [r.est for r in rounds]
        trained: list[np.ndarray | list[float]] = [e.advantages.trained_rows for e in ests
                                                   if e.advantages is not None]
        phases = Phases(
            played=[t for b in batches for t in b.collected], clean=sum(r.clean for r in rounds),
            rollout=functools.reduce(merge_stats, (b.stats for b in batches), RolloutStats()),
            sampling=sum_metrics([b.metrics for b in batches]), faults=self.dp.sum_counts(schemes.take_fault_stats(self.rollouts)),
            advantages=np.concatenate(trained or [[]]),
            nonfinite_rewards=sum(e.nonfinite_rewards for e in ests),
            nonfinite_advantages=sum(e.nonfinite_advantages for e in ests),
            bad_update_streak=streak, library=merge_library([r.library for r in rounds]),
            update=merge_updates([r.update for r in rounds]), critic=merge_updates([r.critic for r in rounds]),
            seconds={**sum_metrics([r.seconds for r in rounds]), "iteration": seconds},
            rollouts=sum(b.rollouts for b in batches), env_steps=sum(b.env_steps for b in batches),
            max_new_tokens=self.cfg.rollout.max_new_tokens, lr=self.optimizer.param_groups[0]["lr"])
        return iteration_metrics(phases, self.episodes, self.state.env_steps, self.state.rollouts)

    def advantages(self, trajs: list[Trajectory]) -> Estimate:
        """Round phase 1: the algorithm's advantages, one per response token of every step row."""
        rows = flatten(trajs)
        bad = nonfinite_count([s.reward for s in rows])
        if bad or not rows:  # numerical guard: a NaN/inf reward skips the update and the library's evolution
            return Estimate([], None, nonfinite_rewards=bad)
        values = self.critic.values(self.model, rows) if self.critic is not None else None
        adv = estimate(self.spec, StepBatch.from_steps(rows, values, self.cfg.rollout.invalid_penalty_at),
                       estimator_settings(self.cfg.algorithm, self.spec))
        bad_adv = nonfinite_count(adv.rows)  # a token-level row's value is its tokens' mean: NaN when any is
        tokens = adv.per_token([len(s.response_ids) for s in rows])
        samples = [] if bad_adv else to_samples(rows, tokens, self.cfg.algorithm.skip_zero_advantage,
                                                keep=adv.train)  # RTPO trains each sibling's forked turn alone
        return Estimate(samples, adv, nonfinite_advantages=bad_adv)

    def evolve(self, trajs: list[Trajectory], it: int) -> dict[str, float]:
        """Round phase 2: the experience library learns from the round's clean episodes (when there is one)."""
        return self.experience.evolve(trajs, it) if self.experience is not None else {}

    @property
    def needs_reference(self) -> bool:
        return self.cfg.algorithm.kl_coef > 0 or "reference" in self.spec.needs

    def _frozen_reference(self):
        """π_ref for the KL term. With LoRA it is the policy with its adapters disabled (no copy); a fully
        fine-tuned policy has no such view, so the pretrained weights are loaded once more and frozen (also on
        resume: the reference is always the starting model, never the resumed one)."""
        if not self.needs_reference or hasattr(self.model, "disable_adapter"):
            return None
        ref, _ = load_policy(self.cfg.model.model_copy(update={"lora": False}), device=self.device)
        ref.eval()
        ref.requires_grad_(False)
        return ref

    def update(self, est: Estimate, it: int) -> tuple[dict[str, float], dict[str, float]]:
        """Round phase 3: clipped policy-gradient steps on the samples, then the critic's steps."""
        cfg = self.cfg
        if not est.ok:
            return {"skipped_updates": float(cfg.train.updates_per_iter)}, {}
        upd: dict[str, float] = {}
        if est.samples:
            n = len(est.samples)
            with Progress(f"iteration {it + 1} update", total=cfg.train.updates_per_iter,
                          unit="optimizer steps") as bar:
                upd = ppo_update(self.model, self.optimizer, est.samples, cfg.algorithm, cfg.train,
                                 temperature=cfg.rollout.temperature, dtype=cfg.model.dtype,
                                 rng=random.Random(cfg.run.seed * 100_003 + it),
                                 progress=lambda done, total: bar.update(done, f"{n} samples", total=total),
                                 dp=self.dp,
                                 reference=self.reference, reference_needed=self.needs_reference)
                bar.update(bar.total, f"{n} samples")  # the closing line counts every step taken
        returns = est.advantages.returns if est.advantages is not None else None
        critic = self.critic.update(returns) if self.critic is not None else {}
        return upd, critic

    # -- the run lifecycle's methods (slea/trainer/lifecycle.py) ----------------------------------------------
    def step_name(self, it: int) -> str:
        return f"iteration {it + 1}/{self.cfg.train.iterations}"

    def start(self, resume: bool) -> tuple[Path | None, dict[str, Any] | None, int]:
        """Ready to train: with ``resume``, the newest intact checkpoint (:meth:`load`); then a served engine is
        sent the trainer's weights."""
        point = self.load() if resume else (None, None, -1)
        self.generator.sync_weights(self.model)
        return point

    def load(self) -> tuple[Path | None, dict[str, Any] | None, int]:
        """Load the newest intact checkpoint (damaged ones are skipped with a warning): weights, optimizer, RNGs,
        the episode count, the critic, and the experience library as of that checkpoint (an empty one without
        a checkpoint); episode samples logged after it are dropped. Its folder, ``state.json`` and iteration."""
        last, state, it = load_resume_point(RunFolder(self.dir).checkpoints, self.model, self.optimizer, self.log)
        if self.experience is not None:  # back to the library of that checkpoint (or an empty one)
            self.experience.close()
            ckpt.restore_library(last, RunFolder(self.out).library)
            self.experience = experience_manager(self.spec, self.out, self.generator,
                                                 experience=self.cfg.experience, model_cfg=self.cfg.model)
            self.collector.experience = self.experience
        self.samples.truncate(it)
        if state is not None:
            self.episodes = int(state.get("episodes", 0))
            if self.critic is not None:
                self.critic.restore(last, state)
        return last, state, it

    def step(self, it: int) -> dict[str, float]:
        """One :meth:`iteration` and its log line; its metrics row (its env faults told to the guards)."""
        m = self.iteration(it)
        log.info(_iter_line(it, self.cfg.train.iterations, m))
        loss = m.get("update/loss")
        quiet = no_update_line(m) if not (isinstance(loss, float) and math.isfinite(loss)) else None
        if quiet:  # "loss —" says nothing was trained; this line says why
            log.info(quiet)
        self.state.note_faults({k.removeprefix("faults/"): v for k, v in m.items() if k.startswith("faults/")},
                               schemes.last_error(self.rollouts))
        return m

    def save(self, it: int, state: dict[str, Any]) -> str:
        """Checkpoint iteration ``it`` (never weights that hold NaN/inf) with the run's ``state``; rank 0 writes
        it (every rank holds the same weights). Its folder name, named by the iterations done (``iter_000006``:
        iteration 6/N), as the logs count."""
        check_saveable((p for p in self.model.parameters() if p.requires_grad), self.step_name(it),
                       self.state.last_checkpoint)
        if not self.dp.main:
            return f"{ckpt.PREFIX}{it + 1:06d}"
        if self.experience is not None:
            self.experience.save()
        cfg = self.cfg
        critic_t, critic_meta = self.critic.state_tensors() if self.critic is not None else (None, None)
        path = ckpt.save_checkpoint(
            RunFolder(self.dir).checkpoints, it, self.model, self.optimizer, critic=critic_t, number=it + 1,
            extra={**state, "episodes": self.episodes,
                   "processes": self.dp.world,  # `slea train --resume` restarts as many (checkpoint.py)
                   "critic": critic_meta,
                   "next_env_seeds": iteration_seeds(cfg.run.seed, it + 1, cfg.rollout.groups)},
            keep=cfg.train.keep_checkpoints,
            library=RunFolder(self.dir).library if self.experience is not None else None)
        return path.name

    def evaluate(self, name: str) -> dict | None:
        """The held-out evaluation ``before`` or ``after`` training: every rank gathers the weights (a
        collective), rank 0 alone evaluates and writes ``eval/<name>.json`` (the others get ``None``)."""
        with full_weights(self.model):
            if not self.dp.main:
                return None
            iteration = 0 if name == "before" else self.cfg.train.iterations
            res = evaluate(self.collector, self.cfg.env, eval_env_kwargs(self.cfg.env), self.cfg.eval,
                           iteration=iteration)
            write_eval(self.dir, name, res)
            return res

    def summary(self) -> dict[str, Any]:
        """The summary's own fields: episodes, iterations, precision, device."""
        dtype = self.cfg.model.dtype  # log-probs are recorded at generation and recomputed in training, both under it
        return {"episodes": self.episodes, "iterations": len(self.log.rows()),
                "precision": {"generation": dtype, "training": dtype,
                              "base_weights": str(_frozen_dtype(self.model)).removeprefix("torch.")},
                "device": self.device}

    def close(self) -> None:
        """Close the loggers, env pools and library, free the generation engine (a managed vLLM server stops) and,
        on a rank other than 0, remove its scratch folder; idempotent, also after :meth:`fit`."""
        if self.closed:
            return
        self.closed = True
        close_generator(self.generator)
        self.log.close()
        schemes.close(self.rollouts)
        if self.experience is not None:
            self.experience.close()
        if not self.dp.main:
            shutil.rmtree(self.out, ignore_errors=True)


def _frozen_dtype(model) -> torch.dtype:
    """The storage dtype of the model's frozen (base) weights (fp32 for a fully fine-tuned model)."""
    return next((p.dtype for p in model.parameters() if not p.requires_grad), torch.float32)


def _iter_line(it: int, total: int, m: dict[str, float]) -> str:
    """An iteration's log line, within 80 columns (each phase's seconds are in metrics.jsonl and the report); a
    loss that was not computed (no update) is "—"."""
    loss = m.get("update/loss")
    loss_s = f"{loss:+.4f}" if isinstance(loss, float) and math.isfinite(loss) else "—"
    return (f"iter {it + 1}/{total}  success {m['train/success']:.2f}  return {m['train/return']:+.2f}  "
            f"invalid {m['train/invalid_rate']:.2f}  loss {loss_s}  [{m['time/iteration_s']:.0f}s]")

