"""What the team trainer (slea/trainer/team.py) reads of a run config, and what it does instead of the rest.

:data:`READS` is every setting the team path reads: trainer/team.py, slea/team/, slea/evaluation/team.py, and what
they pass a section or the config to (the policy's loader, the engine, the env pools, the run's state, budgets and
lifecycle), each with the module under ``slea/`` that reads it; a key that names a section stands for each of its
keys. The estimator's and the policy loss's own ``algorithm.*`` settings (their keyword-only parameters, which
team.py fills through slea.config's ``estimator_settings`` and ``loss_settings``) are read whatever this says.

For an algorithm the team trainer trains (one that needs a team and nothing else), slea.config's
``unused_settings`` refuses every other setting that differs from its default, when the config loads, in one line
that names it and says the team trainer does not read it, then what it does instead where :data:`INSTEAD` says. A
setting added to the schema is refused on a team run until this declares it read. The ``align`` section
(``slea align``'s) and ``plugins`` (the loader's) are no trainer's to refuse. tests/trainer/test_team_settings.py
scans the team's modules for the settings they read (ast) and checks each is declared here.

This module imports nothing: slea.config reads it while it validates a config.
"""

from __future__ import annotations

from collections.abc import Mapping

# setting -> the module (under slea/) that reads it on the team path
READS: Mapping[str, str] = {
    # the run's folder, seed, threads, device and loggers
    "run.name": "trainer/lifecycle.py",
    "run.dir": "trainer/lifecycle.py",
    "run.seed": "trainer/team.py",
    "run.threads": "trainer/team.py",
    "run.device": "trainer/team.py",
    "run.loggers": "trainer/team.py",
    "run.project": "trainer/team.py",
    # the base model and the agents' adapters on it (team/policy.py builds them with policy/model.py), the engine
    "model.name_or_path": "policy/model.py",
    "model.tokenizer": "policy/model.py",
    "model.dtype": "trainer/team.py",
    "model.base_dtype": "team/policy.py",
    "model.lora": "team/policy.py",  # must be true (check_team_config)
    "model.lora_r": "policy/model.py",
    "model.lora_alpha": "policy/model.py",
    "model.lora_dropout": "policy/model.py",
    "model.lora_targets": "policy/model.py",
    "model.lora_layers": "policy/model.py",
    "model.generator": "policy/engines.py",  # must be hf (check_team_config)
    # the training and evaluation env pools, and the fault guard
    "env.id": "envs/factory.py",
    "env.kwargs": "envs/factory.py",
    "env.eval_kwargs": "envs/factory.py",
    "env.step_timeout_s": "envs/factory.py",
    "env.reset_timeout_s": "envs/factory.py",
    "env.workers": "envs/factory.py",
    "env.num_workers": "envs/factory.py",
    "env.ray_cpus": "envs/factory.py",
    "env.max_fault_rate": "trainer/run_state.py",
    # a stage's tasks, the agents' sampling and the acting agent's parsing, its penalty, the prompt's example
    "rollout.groups": "trainer/team.py",
    "rollout.group_size": "trainer/team.py",
    "rollout.temperature": "team/rollout.py",
    "rollout.top_p": "team/rollout.py",
    "rollout.top_k": "team/rollout.py",
    "rollout.max_new_tokens": "team/rollout.py",
    "rollout.stop_at_newline": "team/rollout.py",
    "rollout.invalid_penalty": "team/rollout.py",
    "rollout.fuzzy_cutoff": "team/rollout.py",
    "rollout.invalid_penalty_at": "trainer/team.py",
    "rollout.max_batch": "trainer/team.py",
    "rollout.one_shot": "trainer/team.py",
    # the estimator and the loss (their own settings besides), which messages the surrogate trains
    "algorithm.name": "trainer/team.py",
    "algorithm.policy_loss": "trainer/team.py",
    "algorithm.options": "trainer/team.py",
    "algorithm.skip_zero_advantage": "trainer/team.py",
    # the stages, each agent's AdamW, the micro-batches, the checkpoints, the budgets and the bad-update guard
    "train.iterations": "trainer/team.py",
    "train.lr": "trainer/team.py",
    "train.betas": "trainer/team.py",
    "train.weight_decay": "trainer/team.py",
    "train.grad_clip": "trainer/team.py",
    "train.micro_batch": "trainer/team.py",
    "train.keep_checkpoints": "trainer/team.py",
    "train.save_every": "trainer/lifecycle.py",
    "train.time_budget_s": "trainer/budgets.py",
    "train.rollout_budget": "trainer/budgets.py",
    "train.env_step_budget": "trainer/budgets.py",
    "train.max_bad_updates": "trainer/run_state.py",
    # the held-out evaluation before and after training
    "eval.games": "evaluation/team.py",
    "eval.episodes_per_game": "evaluation/team.py",
    "eval.temperature": "evaluation/team.py",
    "eval.greedy": "evaluation/team.py",
    "eval.seed": "evaluation/team.py",
    "eval.before": "trainer/lifecycle.py",
    # the team itself: its task, router, episode, prompt, order, rollouts and trust region
    "team": "trainer/team.py",
}

# a setting the team trainer acts on as one value whatever it says: that value is accepted (and auto resolves to
# it, slea/config/loading.py), any other refused
DOES: Mapping[str, object] = {
    "algorithm.old_logprobs": "recompute",  # π_old recomputed with the training forward before every update
}

# what the team trainer does instead of reading a setting (the end of its refusal: "...does not read it; it ...")
INSTEAD: Mapping[str, str] = {
    "train.updates_per_iter": "takes the trust region's optimizer steps instead (team.trust_region.min_steps, "
                              "max_steps)",
    "train.gradient_checkpointing": "checkpoints no activations",
    "train.fsdp": "trains its agents in one process",
    "run.episode_samples": "writes no episodes.jsonl",
    "run.episode_samples_bytes": "writes no episodes.jsonl",
    "algorithm.old_logprobs": "always recomputes π_old with the training forward (leave it auto or set recompute)",
    "algorithm.kl_coef": "penalises the trust region's token KL instead (β·d̂, team.trust_region)",
    "algorithm.dynamic_sampling": "replays the stage's tasks and refills none",
    "rollout.history": "shows the last team.context_messages messages instead",
    "rollout.history_summary": "summarises no older actions (its context is the last team.context_messages "
                               "messages)",
    "rollout.obs_max_chars": "clips each message at team.message_max_chars instead",
    "rollout.experience_in": "puts no experiences in its prompts (experience.mode: off)",
    "experience.mode": "retrieves no experiences (set experience.mode: off)",
    "env.max_steps": "ends an episode after team.max_turns agent messages instead",
    "model.init_from": "starts every agent's adapter fresh on the base model",
}
