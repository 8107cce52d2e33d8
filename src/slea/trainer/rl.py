"""The on-policy training loop: rollout → advantages → (library evolution) → clipped update → log, checkpoint.

One iteration, as a newcomer reads it:
1. ``collector.collect``: N task groups × G copies play one episode each (slea/rollout/collector.py);
2. ``compute_advantages``: one advantage per step row from the registry (slea/algorithms/advantages.py);
3. ``experience.evolve``: the library learns from the batch, when SLEA-RL is on (slea/experience/manager.py);
4. ``ppo_update``: clipped policy-gradient steps on the response tokens (slea/trainer/update.py);
5. metrics.jsonl, TensorBoard, checkpoint (slea/trainer/runlog.py, checkpoint.py).
"""

from __future__ import annotations

import random
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slea.algorithms import compute_advantages
from slea.config import RunConfig, dump_config
from slea.envs.pool import EnvPool
from slea.evaluation.evaluate import evaluate, summarize, write_eval
from slea.policy.generation import HFGenerator
from slea.policy.model import load_policy
from slea.policy.prompts import PromptBuilder
from slea.rollout.collector import RolloutCollector
from slea.trainer import checkpoint as ckpt
from slea.trainer.critic import make_critic
from slea.trainer.guards import BadUpdateGuard, RunHalted, check_fault_rate, finite_weights, nonfinite_count
from slea.trainer.runlog import RunLog, plot_curves, truncate_metrics
from slea.trainer.sampling import collect_batch
from slea.trainer.update import Sample, ppo_update, reference_logprobs
from slea.types import Trajectory, columns, flatten


def run_dir_for(cfg: RunConfig) -> Path:
    if cfg.run.dir:
        return Path(cfg.run.dir)
    name = cfg.run.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / name


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def iteration_seeds(run_seed: int, iteration: int, groups: int) -> list[int]:
    """Env seeds of an iteration's task groups: a pure function of (run seed, iteration), so a resumed run
    and a compared algorithm see the same tasks."""
    rng = np.random.default_rng([run_seed, iteration])
    return [int(s) for s in rng.integers(0, 2**31 - 1, size=groups)]


def build_samples(trajs: list[Trajectory], cfg: RunConfig) -> tuple[list[Sample], np.ndarray]:
    rows = flatten(trajs)
    if not rows:
        return [], np.zeros(0)
    col = columns(rows)
    a = cfg.algorithm
    adv = compute_advantages(a.name, col["group_ids"], col["traj_ids"], col["steps"], col["rewards"],
                             anchors=col["anchors"], clusters=col["clusters"], gamma=a.gamma,
                             step_weight=a.step_weight, std_norm=a.std_norm, eps=a.eps, **a.options)
    samples = [Sample(r.prompt_ids, r.response_ids, r.old_logprobs, float(v))
               for r, v in zip(rows, adv)
               if r.response_ids and not (a.skip_zero_advantage and abs(v) < 1e-8)]
    return samples, adv


def _experience(cfg: RunConfig, run_dir: Path, generator):
    if cfg.experience.mode == "off" and cfg.algorithm.name != "slea":
        return None
    from slea.experience.manager import ExperienceManager

    generate_text = None
    if cfg.experience.extractor == "llm":
        def generate_text(prompts: list[str]) -> list[str]:
            ids = [generator.tok(p, add_special_tokens=False).input_ids for p in prompts]
            return [g.text for g in generator.generate(ids, max_new_tokens=96, temperature=0.7)]
    return ExperienceManager(cfg.experience, run_dir / "library.sqlite", generate_text=generate_text)


class Trainer:
    """Wires config, policy, envs, collector, experience library and logs; :meth:`fit` runs the loop."""

    def __init__(self, cfg: RunConfig, run_dir: Path | None = None, console=None):
        self.cfg = cfg
        self.dir = Path(run_dir) if run_dir else run_dir_for(cfg)
        self.console = console
        torch.set_num_threads(cfg.run.threads)
        seed_everything(cfg.run.seed)
        self.model, self.tok = load_policy(cfg.model)
        self.generator = HFGenerator(self.model, self.tok, dtype=cfg.model.dtype,
                                     stop_at_newline=cfg.rollout.stop_at_newline)
        builder = PromptBuilder(self.tok, history=cfg.rollout.history, obs_max_chars=cfg.rollout.obs_max_chars,
                                one_shot=cfg.rollout.one_shot)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.experience = _experience(cfg, self.dir, self.generator)
        self.collector = RolloutCollector(self.generator, builder, cfg.rollout, cfg.env.max_steps,
                                          experience=self.experience, experience_mode=cfg.experience.mode)
        self.pool = EnvPool(cfg.env.id, cfg.rollout.groups, cfg.rollout.group_size, dict(cfg.env.kwargs),
                            step_timeout_s=cfg.env.step_timeout_s, reset_timeout_s=cfg.env.reset_timeout_s)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, betas=tuple(cfg.train.betas),
                                           weight_decay=cfg.train.weight_decay)
        self.log = RunLog(self.dir)
        self.start_iteration = 0
        self.episodes = 0
        self.env_steps = 0
        # ppo / turn_ppo: a value head on the policy backbone (trainer/critic.py); None for critic-free ones
        self.critic = make_critic(cfg, self.model, pad_id=self.tok.pad_token_id or 0)
        self.bad_updates = BadUpdateGuard(cfg.train.max_bad_updates)
        self.last_checkpoint: str | None = None

    # -- helpers ---------------------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        if self.console is not None:
            self.console.print(msg)

    def progress(self):
        """A transient rich progress bar (a silent one without a console)."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=self.console, transient=True, disable=self.console is None)

    def eval_kwargs(self) -> dict[str, Any]:
        return {**self.cfg.env.kwargs, "split": "heldout", **self.cfg.env.eval_kwargs}

    def evaluate(self, name: str, iteration: int) -> dict:
        res = evaluate(self.collector, self.cfg.env.id, self.eval_kwargs(), self.cfg.eval, iteration=iteration,
                       step_timeout_s=self.cfg.env.step_timeout_s, reset_timeout_s=self.cfg.env.reset_timeout_s)
        write_eval(self.dir, name, res)
        return res

    def resume(self) -> bool:
        """Continue from the newest intact checkpoint (damaged ones are skipped with a warning): weights,
        optimizer, RNGs, counters, and the experience library as of that checkpoint; metrics rows logged after
        it are dropped (the iterations are redone). Without a checkpoint the run restarts from scratch."""
        last, state = ckpt.load_latest(self.dir / "checkpoints", self.model, self.optimizer, warn=self.say)
        if state is None and ckpt.list_checkpoints(self.dir / "checkpoints"):  # never wipe a run over it
            raise RunHalted(f"--resume: no checkpoint in {self.dir / 'checkpoints'} loads (see the warnings); "
                            f"nothing was changed. Move that folder away to start the run over.")
        it = int(state["iteration"]) if state is not None else -1
        if self.experience is not None:  # back to the library of that checkpoint (or an empty one)
            self.experience.close()
            ckpt.restore_library(last, self.dir / "library.sqlite")
            self.experience = _experience(self.cfg, self.dir, self.generator)
            self.collector.experience = self.experience
        truncate_metrics(self.log.path, it)
        self.log.purge_after(it)
        if state is None:
            return False
        self.start_iteration = it + 1
        self.episodes = int(state.get("episodes", 0))
        self.env_steps = int(state.get("env_steps", 0))
        if self.critic is not None:
            self.critic.restore(last, state, warn=self.say)
        self.bad_updates.streak = int(state.get("bad_update_streak", 0))
        self.last_checkpoint = last.name
        self.say(f"resumed from {last.name} (next iteration {self.start_iteration})")
        return True

    # -- one iteration ---------------------------------------------------------------------------------
    def iteration(self, it: int) -> dict[str, float]:
        cfg = self.cfg
        t0 = time.perf_counter()
        seeds = iteration_seeds(cfg.run.seed, it, cfg.rollout.groups)
        with self.progress() as bar:
            task = bar.add_task("rollout", total=cfg.env.max_steps)
            batch = collect_batch(  # algorithm.dynamic_sampling: groups with equal returns dropped, refilled
                self.collector, self.pool, seeds, iteration=it, run_seed=cfg.run.seed,
                dynamic=cfg.algorithm.dynamic_sampling, max_refill_rounds=cfg.algorithm.max_refill_rounds,
                progress=lambda turn, live: bar.update(task, completed=turn, description=f"rollout ({live} live)"))
        trajs, rstats = batch.collected, batch.stats
        self.episodes += len(trajs)
        self.env_steps += batch.env_steps
        faults = self.pool.take_fault_stats()
        # An episode an env fault cut short says nothing about the policy: it is reported, not learned from.
        clean = [t for t in trajs if not _faulted(t)]
        train_set = [t for t in batch.trajs if not _faulted(t)]
        # Numerical guard: a NaN/inf reward or advantage skips the whole update (and the library's evolution).
        bad_rewards = nonfinite_count([s.reward for t in train_set for s in t.steps])
        samples, adv = (([], np.zeros(0)) if bad_rewards else build_samples(train_set, cfg) if self.critic is None
                        else self.critic.build_samples(self.model, train_set))
        metrics: dict[str, float] = {f"train/{k}": v for k, v in summarize(trajs).items()}
        bad_adv = bad_rewards + nonfinite_count(adv)
        metrics["adv/abs_mean"] = float(np.abs(adv[np.isfinite(adv)]).mean()) if adv.size > bad_adv else 0.0
        metrics.update({f"faults/{k}": float(v) for k, v in faults.items()})
        metrics["faults/dropped_episodes"] = float(len(trajs) - len(clean))
        metrics["guard/nonfinite_rewards"] = float(bad_rewards)
        metrics["guard/nonfinite_advantages"] = float(bad_adv - bad_rewards)
        lib_metrics: dict[str, float] = {}
        t_lib = time.perf_counter()
        if self.experience is not None and not bad_adv:
            lib_metrics = {f"library/{k}": float(v) for k, v in self.experience.evolve(clean, it).items()}
        t_lib = time.perf_counter() - t_lib
        t_train = time.perf_counter()
        upd: dict[str, float] = {}
        if bad_adv:
            upd = {"skipped_updates": float(cfg.train.updates_per_iter)}
        elif samples:
            if cfg.algorithm.kl_coef > 0:
                reference_logprobs(self.model, samples, micro_batch=cfg.train.micro_batch,
                                   temperature=cfg.rollout.temperature, dtype=cfg.model.dtype)
            with self.progress() as bar:
                task = bar.add_task(f"update ({len(samples)} samples)", total=cfg.train.updates_per_iter)
                upd = ppo_update(self.model, self.optimizer, samples, cfg.algorithm, cfg.train,
                                 temperature=cfg.rollout.temperature, dtype=cfg.model.dtype,
                                 rng=random.Random(cfg.run.seed * 100_003 + it),
                                 progress=lambda done, total: bar.update(task, completed=done, total=total))
        if self.critic is not None and not bad_adv:
            metrics.update({f"critic/{k}": v for k, v in self.critic.update().items()})
        t_train = time.perf_counter() - t_train
        metrics.update({f"update/{k}": v for k, v in upd.items()})
        metrics.update(batch.metrics)
        metrics["guard/bad_update_streak"] = float(self.bad_updates.observe(bool(upd.get("skipped_updates", 0))))
        metrics.update(lib_metrics)
        metrics.update({
            "tokens/prompt": float(rstats.prompt_tokens), "tokens/generated": float(rstats.gen_tokens),
            "tokens/trained": upd.get("trained_tokens", 0.0),
            "time/generation_s": rstats.gen_s, "time/env_s": rstats.env_s, "time/retrieval_s": rstats.retrieval_s,
            "time/library_s": t_lib, "time/train_s": t_train, "time/iteration_s": time.perf_counter() - t0,
            "throughput/train_tokens_per_s": upd.get("trained_tokens", 0.0) / max(t_train, 1e-9),
            "episodes": float(self.episodes), "env_steps": float(self.env_steps),
        })
        return metrics

    # -- the loop --------------------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> dict[str, Any]:
        cfg = self.cfg
        tmp = self.dir / ".config.yaml.tmp"  # atomic: a kill here must not cost the run its config
        tmp.write_text(dump_config(cfg))
        tmp.replace(self.dir / "config.yaml")
        if resume:
            self.resume()
        t_start = time.perf_counter()
        before = None
        if cfg.eval.before and self.start_iteration == 0:
            before = self.evaluate("before", 0)
            self.say(_eval_line("untrained", before))
        t_train = time.perf_counter()  # the budget covers training iterations, not the evaluations
        last_iter_s = 0.0
        for it in range(self.start_iteration, cfg.train.iterations):
            budget = cfg.train.time_budget_s
            if budget is not None and time.perf_counter() - t_train + 0.5 * last_iter_s > budget:
                self.say(f"time budget of {budget:.0f}s reached after {it} iterations")
                break
            m = self.iteration(it)
            last_iter_s = m["time/iteration_s"]
            self.log.log(it, m)
            self.say(_iter_line(it, cfg.train.iterations, m))
            # Guards stop the run before this iteration's checkpoint: the last one stays the last good one.
            self.bad_updates.check(it, self.last_checkpoint)
            check_fault_rate({k.removeprefix("faults/"): v for k, v in m.items() if k.startswith("faults/")},
                             cfg.env.max_fault_rate, it, self.pool.last_error, self.last_checkpoint)
            if (it + 1) % cfg.train.save_every == 0 or it == cfg.train.iterations - 1:
                if not finite_weights(self.model):
                    raise RunHalted(f"stopped at iteration {it}: the weights hold NaN/inf, so no checkpoint was "
                                    f"written; the last good checkpoint is {self.last_checkpoint}")
                if self.experience is not None:
                    self.experience.save()
                critic_t, critic_meta = self.critic.state_tensors() if self.critic is not None else (None, None)
                path = ckpt.save_checkpoint(
                    self.dir / "checkpoints", it, self.model, self.optimizer, critic=critic_t,
                    extra={"episodes": self.episodes, "env_steps": self.env_steps, "critic": critic_meta,
                           "bad_update_streak": self.bad_updates.streak,
                           "next_env_seeds": iteration_seeds(cfg.run.seed, it + 1, cfg.rollout.groups)},
                    keep=cfg.train.keep_checkpoints,
                    library=self.dir / "library.sqlite" if self.experience is not None else None)
                self.last_checkpoint = path.name
        after = self.evaluate("after", cfg.train.iterations)
        self.say(_eval_line("trained", after))
        rows = self.log.rows()
        evals = {}
        if before is not None:
            evals["held-out before (sampled)"] = before["sampled"]["success"]
        evals["held-out after (sampled)"] = after["sampled"]["success"]
        plot_curves(rows, self.dir / "curves.png", evals)
        self.log.close()
        if self.experience is not None:
            self.experience.close()
        summary = {"run_dir": str(self.dir), "before": before, "after": after, "episodes": self.episodes,
                   "iterations": len(rows), "wall_s": time.perf_counter() - t_start,
                   # log-probs are recorded at generation and recomputed in training, both under this precision
                   "precision": {"generation": cfg.model.dtype, "training": cfg.model.dtype}}
        write_eval(self.dir, "summary", summary)
        return summary


def _faulted(t: Trajectory) -> bool:
    """An episode ended by an env fault (a step or its reset raised or hung)."""
    return (t.truncated and not t.steps) or any("fault" in s.info for s in t.steps)


def _iter_line(it: int, total: int, m: dict[str, float]) -> str:
    return (f"iter {it + 1}/{total}  success {m['train/success']:.2f}  return {m['train/return']:+.2f}  "
            f"invalid {m['train/invalid_rate']:.2f}  loss {m.get('update/loss', 0.0):+.4f}  "
            f"gen {m['time/generation_s']:.0f}s train {m['time/train_s']:.0f}s")


def _eval_line(label: str, res: dict) -> str:
    s = res["sampled"]
    g = res.get("greedy")
    greedy = f", greedy {g['success']:.2f}" if g else ""
    return (f"held-out ({label}): sampled success {s['success']:.2f} (invalid {s['invalid_rate']:.2f})"
            f"{greedy}  [{res['wall_s']:.0f}s]")
