"""The config keys a TRL or verl user types, and slea's key for each: one mapping, from which an unknown key gets
its hint (``train.learning_rate: unknown key; did you mean train.lr? (TRL's learning_rate)``, slea/config/loading.py)
and which docs/evaluation.md's table of config names shows (tests/test_config.py checks the table against it).

TRL's names are ``GRPOConfig``'s fields; verl's are the dotted keys of its ``ppo_trainer.yaml``. Only keys that mean
the same thing in slea are listed (TRL's ``num_iterations`` or verl's ``ppo_epochs`` have no slea counterpart).
"""

from __future__ import annotations

# slea key -> (TRL GRPOConfig names, verl ppo_trainer.yaml keys)
EQUIVALENTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "train.lr": (("learning_rate",), ("actor_rollout_ref.actor.optim.lr",)),
    "train.critic_lr": ((), ("critic.optim.lr",)),
    "train.weight_decay": (("weight_decay",), ("actor_rollout_ref.actor.optim.weight_decay",)),
    "train.grad_clip": (("max_grad_norm",), ("actor_rollout_ref.actor.grad_clip",)),
    "train.micro_batch": (("per_device_train_batch_size",), ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",)),
    "train.iterations": (("max_steps",), ("trainer.total_training_steps",)),
    "train.save_every": (("save_steps",), ("trainer.save_freq",)),
    "train.keep_checkpoints": (("save_total_limit",), ("trainer.max_actor_ckpt_to_keep",)),
    "train.gradient_checkpointing": (("gradient_checkpointing",),
                                     ("actor_rollout_ref.model.enable_gradient_checkpointing",)),
    "rollout.groups": ((), ("data.train_batch_size",)),
    "rollout.group_size": (("num_generations",), ("actor_rollout_ref.rollout.n",)),
    "rollout.max_new_tokens": (("max_completion_length",),
                               ("data.max_response_length", "actor_rollout_ref.rollout.response_length")),
    "rollout.temperature": (("temperature",), ("actor_rollout_ref.rollout.temperature",)),
    "rollout.top_p": (("top_p",), ("actor_rollout_ref.rollout.top_p",)),
    "rollout.top_k": (("top_k",), ("actor_rollout_ref.rollout.top_k",)),
    "algorithm.name": ((), ("algorithm.adv_estimator",)),
    "algorithm.clip_eps": (("epsilon",), ("actor_rollout_ref.actor.clip_ratio",)),
    "algorithm.clip_eps_high": (("epsilon_high",), ("actor_rollout_ref.actor.clip_ratio_high",)),
    "algorithm.dual_clip_c": ((), ("actor_rollout_ref.actor.clip_ratio_c",)),
    "algorithm.kl_coef": (("beta",), ("actor_rollout_ref.actor.kl_loss_coef",)),
    "algorithm.kl_estimator": ((), ("actor_rollout_ref.actor.kl_loss_type",)),
    "algorithm.entropy_coef": ((), ("actor_rollout_ref.actor.entropy_coeff",)),
    "algorithm.loss_agg": ((), ("actor_rollout_ref.actor.loss_agg_mode",)),
    "algorithm.std_norm": (("scale_rewards",), ("algorithm.norm_adv_by_std_in_grpo",)),
    "algorithm.gae_lambda": ((), ("algorithm.lam",)),
    "algorithm.value_clip": ((), ("critic.cliprange_value",)),
    "model.name_or_path": ((), ("actor_rollout_ref.model.path",)),
    "model.lora_r": ((), ("actor_rollout_ref.model.lora_rank",)),
    "model.lora_alpha": ((), ("actor_rollout_ref.model.lora_alpha",)),
    "model.lora_targets": ((), ("actor_rollout_ref.model.target_modules",)),
    "run.seed": (("seed",), ()),
    "run.dir": (("output_dir",), ("trainer.default_local_dir",)),
    "run.name": (("run_name",), ("trainer.experiment_name",)),
    "run.project": ((), ("trainer.project_name",)),
    "run.loggers": (("report_to",), ("trainer.logger",)),
}

# foreign key -> (slea key, whose): every name above, TRL's first
FOREIGN_KEYS: dict[str, tuple[str, str]] = {
    **{name: (key, "TRL") for key, (trl, _) in EQUIVALENTS.items() for name in trl},
    **{name: (key, "verl") for key, (_, verl) in EQUIVALENTS.items() for name in verl},
}


def foreign_hint(typed: str) -> str:
    """``did you mean train.lr? (TRL's learning_rate)`` for a key as typed (``learning_rate``,
    ``train.learning_rate``, ``actor_rollout_ref.actor.optim.lr``, ``actor.optim.lr``), or ''. The whole key is
    matched first, then its trailing parts (``train.learning_rate`` → ``learning_rate``). Trailing parts match a
    foreign key equal to them or ending in them (a single word only when it is a compound such as
    ``kl_loss_coef``: ``path`` or ``n`` alone say too little), and only when every match means the same slea key
    (``optim.lr`` is verl's actor or critic rate: no hint)."""
    parts = [p for p in str(typed).split(".") if p]
    for i in range(len(parts)):
        tail = ".".join(parts[i:])
        ends = "." in tail or "_" in tail
        hits = [(name, key, who) for name, (key, who) in FOREIGN_KEYS.items()
                if name == tail or ends and name.endswith("." + tail)]
        if hits and len({key for _, key, _ in hits}) == 1:
            name, key, who = next((h for h in hits if h[0] == tail), hits[0])
            return f"did you mean {key}? ({who}'s {name})"
        if hits:
            return ""
    return ""
