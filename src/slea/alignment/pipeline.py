"""``slea align``: tlm-DRE's offline pipeline (ETO-style) as resumable stages.

Each stage writes its output into the run folder (atomically) and is skipped when that output exists, so a run
interrupted anywhere resumes at the stage it was in (the stage is redone from its start):

=======  ================================================  ===================================================
stage    output                                             what it does
=======  ================================================  ===================================================
expert   ``expert.jsonl``                                   the env's expert replayed on ``align.expert_episodes``
                                                            tasks of ``align.expert_split`` (slea.alignment.data),
                                                            or a copy of ``align.expert_file`` (checked)
sft      ``checkpoints/iter_000001``, ``sft.json``          ``align.sft_epochs`` of SFT on the expert turns;
                                                            with ``model.init_from`` the run's weights instead
sample   ``samples.jsonl``                                  ``align.samples_per_task`` episodes per expert task
                                                            with the SFT policy at ``align.sample_temperature``
pairs    ``pairs.json``                                     every failed sample paired with its task's expert
align    ``checkpoints/iter_000002``, ``align.json``,        ``align.epochs`` of ``align.method`` over the pairs;
         ``pivot.png`` (methods with turn weights)          π_ref = a frozen copy of the SFT policy
eval     ``eval/eval-<split>.json`` per ``align.eval_splits``  the final policy, as ``slea eval`` plays it
=======  ================================================  ===================================================

Method ``sft`` ends after the sft stage (its policy is the final one). The final policy is the run's latest
checkpoint, so ``slea eval RUN`` evaluates it and ``model.init_from: RUN`` starts ``slea train`` (or another
alignment) from it. The training steps are ``slea.alignment.objectives.alignment_step``; the pipeline passes
every ``align`` setting and each method takes those it declares (it never branches on a method's name).
"""

from __future__ import annotations

import copy
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slea.alignment.data import (
    encode_turn,
    expert_source,
    expert_trajectories,
    load_jsonl,
    prompt_settings,
    sampled_trajectory,
    save_jsonl,
)
from slea.atomic import atomic_write_text
from slea.config import ConfigError, RunConfig, dump_config
from slea.device import run_device
from slea.envs.factory import eval_env_kwargs, make_pool
from slea.policy.engines import make_generator
from slea.policy.model import load_policy
from slea.policy.prompt_builder import PromptBuilder
from slea.rollout.collector import TRAIN_SALT, RolloutCollector
from slea.runs.checkpoint import latest_checkpoint, load_trainable, save_checkpoint
from slea.runs.folder import RunFolder

log = logging.getLogger(__name__)

SFT_ITER, ALIGN_ITER = 1, 2  # checkpoint numbers of the two trained policies
STAGES = ("expert", "sft", "sample", "pairs", "align", "eval")
# align settings handed to the methods (each takes those it declares)
METHOD_SETTINGS = ("beta", "kernel", "alpha", "pivot", "omega_low", "omega_high", "chosen_factor")


def method_spec(name: str):
    """The registered alignment method ``name``; an unknown one is a :class:`ConfigError` naming ``align.method``."""
    from slea.alignment.objectives import alignment_method_names, get_alignment_method

    try:
        return get_alignment_method(name)
    except KeyError:
        raise ConfigError(f"align.method: unknown method {name!r}; known: "
                          f"{', '.join(alignment_method_names())}") from None


def expert_file(path: str, env_id: str, env_kwargs: dict[str, Any], prompt: dict[str, Any], max_steps: int
                ) -> list:
    """The trajectories of ``align.expert_file``, each checked against the run: played on ``env_id`` built with
    ``env_kwargs`` (the split included), rendered with the prompt settings ``prompt``, at most ``max_steps``
    turns; anything else (or an empty or unreadable file) is a :class:`ConfigError` naming the episode."""
    try:
        trajs = load_jsonl(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"align.expert_file: {exc}") from None
    if not trajs:
        raise ConfigError(f"align.expert_file: {path} holds no episode")
    for n, t in enumerate(trajs, 1):
        wrong = [f"env {t.env} (the run plays {env_id})"] if t.env != env_id else []
        if t.env_kwargs != env_kwargs:
            wrong.append(f"env kwargs {t.env_kwargs} (the run's: {env_kwargs})")
        if t.prompt != prompt:
            wrong.append(f"prompt settings {t.prompt} (the run's rollout: {prompt})")
        if len(t.turns) > max_steps:
            wrong.append(f"{len(t.turns)} turns (env.max_steps is {max_steps})")
        if wrong:
            raise ConfigError(f"align.expert_file: {path}:{n} was made with {wrong[0]}")
    return trajs


class AlignPipeline:
    """The stages of one alignment run in ``run_dir``; :meth:`run` plays those whose output is missing."""

    def __init__(self, cfg: RunConfig, run_dir: Path, say: Callable[[str], None] = print):
        self.cfg = cfg
        self.dir = Path(run_dir)
        self.files = RunFolder(self.dir)
        self.say = say
        self.spec = method_spec(cfg.align.method)
        self.device = run_device(cfg.run.device)  # a device this machine lacks: ConfigError before any model loads
        self.model = self.tok = None
        self.builder: PromptBuilder | None = None

    # -- plumbing ---------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.dir.mkdir(parents=True, exist_ok=True)
        saved = self.files.config
        if not saved.is_file():
            atomic_write_text(saved, dump_config(self.cfg))
        torch.manual_seed(self.cfg.run.seed)
        torch.set_num_threads(self.cfg.run.threads)
        expert = self._stage("expert", self.files.expert, self.expert)
        self._stage("sft", self.files.sft, lambda: self.sft(expert))
        if self.spec.pairs:
            samples = self._stage("sample", self.files.samples, lambda: self.sample(expert))
            pairs = self._stage("pairs", self.files.pairs, lambda: self.pairs(expert, samples))
            self._stage("align", self.files.align, lambda: self.align(expert, samples, pairs))
        results = {}
        for split in self.cfg.align.eval_splits:
            results[split] = self._stage(f"eval {split}", self.files.evaluation(f"eval-{split}"),
                                         lambda s=split: self.evaluate(s))
        return results

    def _stage(self, name: str, output: Path, work: Callable[[], Any]) -> Any:
        if output.is_file():
            self.say(f"stage {name}: done ({output.name} exists), skipped")
            return load_jsonl(output) if output.suffix == ".jsonl" else json.loads(output.read_text())
        t0 = time.perf_counter()
        self.say(f"stage {name}: running")
        out = work()
        self.say(f"stage {name}: wrote {output.relative_to(self.dir)} in {time.perf_counter() - t0:.1f}s")
        return out

    def _policy(self, checkpoint: Path | None):
        """The policy (and tokenizer) with ``checkpoint``'s trainable weights (None: the config's start)."""
        if self.model is None:
            self.model, self.tok = load_policy(self.cfg.model, device=self.device)
            self.builder = PromptBuilder.from_rollout(self.tok, self.cfg.rollout)
        if checkpoint is not None:
            load_trainable(self.model, checkpoint)
        return self.model

    def _generator(self):
        """The rollout engine (``model.generator``) over the policy as it is now (a served one gets its weights)."""
        gen = make_generator(self.cfg.model, self.model, self.tok, max_batch=self.cfg.rollout.max_batch)
        gen.sync_weights(self.model)
        return gen

    def _checkpoint(self, iteration: int) -> Path:
        path = self.files.checkpoint(f"iter_{iteration:06d}")
        if not (path / "trainable.safetensors").is_file():
            raise ConfigError(f"{self.dir}: checkpoint {path.name} is missing (remove the stage's .json to redo it)")
        return path

    def _optimizer(self, lr: float) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, betas=tuple(self.cfg.train.betas),
                                 weight_decay=self.cfg.train.weight_decay)

    def _step(self, optimizer, batch, method: str, reference=None) -> dict[str, float]:
        from slea.alignment.objectives import alignment_step

        a = self.cfg.align
        return alignment_step(self.model, optimizer, batch, method, micro_batch=self.cfg.train.micro_batch,
                              grad_clip=self.cfg.train.grad_clip, dtype=self.cfg.model.dtype, reference=reference,
                              **{k: getattr(a, k) for k in METHOD_SETTINGS})

    def _encode(self, turn) -> tuple[list[int], list[int]]:
        return encode_turn(self.builder, turn)

    # -- the stages -------------------------------------------------------------------------------------------
    def expert(self) -> list:
        cfg, a = self.cfg, self.cfg.align
        builder = PromptBuilder.from_rollout(None, cfg.rollout)  # messages only
        kwargs = {**cfg.env.kwargs, "split": a.expert_split}
        if a.expert_file:
            trajs = expert_file(a.expert_file, cfg.env.id, kwargs, prompt_settings(builder), cfg.env.max_steps)
            self.say(f"  read {len(trajs)} expert episodes from {a.expert_file}")
            save_jsonl(self.files.expert, trajs)
            return trajs
        if expert_source(cfg.env.id) is None:
            raise ConfigError(f"align: {cfg.env.id} has no expert of its own; make expert data for it (a tool env: "
                              "`slea data demos`) and name the file in align.expert_file")
        trajs, dropped = expert_trajectories(cfg.env.id, kwargs, list(range(a.expert_episodes)), builder,
                                             max_steps=cfg.env.max_steps, fuzzy_cutoff=cfg.rollout.fuzzy_cutoff)
        self.say(f"  kept {len(trajs)} of {a.expert_episodes} expert episodes"
                 + (f"; dropped {dict(sorted(dropped.items()))}" if dropped else ""))
        if not trajs:
            raise ConfigError(f"align: no expert episode of {cfg.env.id} replays to a win within env.max_steps="
                              f"{cfg.env.max_steps} ({dict(dropped)})")
        save_jsonl(self.files.expert, trajs)
        return trajs

    def sft(self, expert: list) -> dict[str, Any]:
        cfg, a = self.cfg, self.cfg.align
        self._policy(None)
        opt = self._optimizer(a.sft_lr)
        if cfg.model.init_from:  # the run's weights are the SFT policy
            out = {"init_from": cfg.model.init_from, "epochs": 0}
        else:
            from slea.alignment.objectives import PairTokens, encode_trajectory

            data = [PairTokens(encode_trajectory(t, self._encode)) for t in expert]
            rng = random.Random(cfg.run.seed)
            history = []
            for epoch in range(a.sft_epochs):
                order = list(range(len(data)))
                rng.shuffle(order)
                losses = [self._step(opt, [data[i] for i in order[s:s + a.sft_batch_size]], "sft")["loss"]
                          for s in range(0, len(order), a.sft_batch_size)]
                history.append(float(np.mean(losses)))
                self.say(f"  sft epoch {epoch + 1}/{a.sft_epochs}: loss {history[-1]:.4f}")
            out = {"epochs": a.sft_epochs, "loss_per_epoch": history, "trajectories": len(expert),
                   "turns": sum(len(t.turns) for t in expert)}
        save_checkpoint(self.files.checkpoints, SFT_ITER, self.model, opt, extra={"stage": "sft"}, keep=2)
        atomic_write_text(self.files.sft, json.dumps(out, indent=2))
        return out

    def sample(self, expert: list) -> list:
        cfg, a = self.cfg, self.cfg.align
        self._policy(self._checkpoint(SFT_ITER))
        collector = RolloutCollector(self._generator(), self.builder,
                                     cfg.rollout, cfg.env.max_steps, keep_messages=True)
        kwargs = {**cfg.env.kwargs, "split": a.expert_split}
        split = expert[0].split  # the env's own name of the split: the expert's task ids use it
        seeds = sorted({t.seed for t in expert})
        out = []
        for start in range(0, len(seeds), cfg.rollout.groups):
            chunk = seeds[start:start + cfg.rollout.groups]
            with make_pool(cfg.env, len(chunk), a.samples_per_task, kwargs) as pool:
                trajs, _ = collector.collect(pool, chunk, temperature=a.sample_temperature, rng_salt=TRAIN_SALT,
                                             traj_offset=len(out))
            out += [sampled_trajectory(t, cfg.env.id, split, self.builder, kwargs) for t in trajs]
        wins = sum(t.success for t in out)
        self.say(f"  sampled {len(out)} episodes on {len(seeds)} tasks: {wins} won, {len(out) - wins} failed")
        save_jsonl(self.files.samples, out)
        return out

    def pairs(self, expert: list, samples: list) -> dict[str, Any]:
        from slea.alignment.pairs import build_pairs, pairing_summary

        pairs = build_pairs(expert, samples, max_per_task=self.cfg.align.max_pairs_per_task)
        index = {id(t): i for i, t in enumerate(samples)}
        experts = {id(t): i for i, t in enumerate(expert)}
        out = {"summary": pairing_summary(expert, samples, pairs),
               "pairs": [[experts[id(p.chosen)], index[id(p.rejected)]] for p in pairs]}
        c = out["summary"]
        self.say(f"  {c['pairs']} (expert, failure) pairs on {c['tasks_paired']} tasks; left out: "
                 f"{c['failures_without_expert']} failures whose task has no expert episode, "
                 f"{c['sampled_successes']} sampled episodes that succeeded")
        atomic_write_text(self.files.pairs, json.dumps(out, indent=2))
        return out

    def align(self, expert: list, samples: list, pairs: dict[str, Any]) -> dict[str, Any]:
        from slea.alignment.objectives import PairTokens, encode_trajectory, turn_reference_logprobs

        cfg, a = self.cfg, self.cfg.align
        self._policy(self._checkpoint(SFT_ITER))
        data = [PairTokens(encode_trajectory(expert[c], self._encode), encode_trajectory(samples[r], self._encode))
                for c, r in pairs["pairs"]]
        out: dict[str, Any] = {"method": a.method, "pairs": len(data), "settings": {
            k: getattr(a, k) for k in METHOD_SETTINGS if k in self.spec.settings}}
        reference = copy.deepcopy(self.model).eval().requires_grad_(False)  # π_ref: the SFT policy, frozen
        if data and "pivot" in self.spec.settings:  # Eq.9 on the failure set (the paper's Figure 5)
            from slea.alignment.pivot import adequacy_histogram

            failed = [s for p in data for s in p.rejected]
            logps = turn_reference_logprobs(self.model, failed, micro_batch=cfg.train.micro_batch,
                                            dtype=cfg.model.dtype, reference=reference)
            rep = adequacy_histogram(logps, self.files.pivot)
            out["pivot_report"] = {"suggested_pivot": rep.pivot, "turns": rep.n_turns,
                                   "frac_confident_at_suggested": rep.frac_confident,
                                   "frac_confident_at_0.9": rep.frac_confident_at_paper_pivot}
            self.say(f"  adequacy of {rep.n_turns} failed turns: suggested pivot {rep.pivot:.2f} "
                     f"(align.pivot is {a.pivot}); histogram in pivot.png")
        opt = self._optimizer(a.lr)
        rng = random.Random(cfg.run.seed + 1)
        history = []
        for epoch in range(a.epochs):
            order = list(range(len(data)))
            rng.shuffle(order)
            for s in range(0, len(order), a.batch_size):
                history.append(self._step(opt, [data[i] for i in order[s:s + a.batch_size]], a.method, reference))
            if history:
                self.say(f"  {a.method} epoch {epoch + 1}/{a.epochs}: {len(history)} steps, mean loss "
                         f"{np.mean([h['loss'] for h in history]):.4f}")
        out["steps"] = history
        if not data:
            self.say("  no pairs (no failed sample has an expert): the aligned policy is the SFT policy")
        save_checkpoint(self.files.checkpoints, ALIGN_ITER, self.model, opt, extra={"stage": "align"}, keep=2)
        atomic_write_text(self.files.align, json.dumps(out, indent=2))
        return out

    def evaluate(self, split: str) -> dict[str, Any]:
        from slea.evaluation.evaluate import evaluate, write_eval

        cfg = self.cfg
        self._policy(latest_checkpoint(self.files.checkpoints))
        collector = RolloutCollector(self._generator(), self.builder,
                                     cfg.rollout, cfg.env.max_steps)
        res = evaluate(collector, cfg.env, eval_env_kwargs(cfg.env, split), cfg.eval, label=split)
        res["checkpoint"] = latest_checkpoint(self.files.checkpoints).name
        res["prompt"] = prompt_settings(self.builder)
        write_eval(self.dir, f"eval-{split}", res)
        s = res["sampled"]
        self.say(f"  {split}: success {s['success']:.3f}, return {s['return']:.3f}, invalid {s['invalid_rate']:.3f}")
        return {k: v for k, v in res.items() if k != "trajectories"}
