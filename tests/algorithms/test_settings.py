"""Which ``algorithm.*`` settings a config may change: the chosen estimator's keyword-only parameters, the chosen
policy loss's (under verl's names, which the schema's fields carry: LOSS_SETTINGS), and the trainer's own
(slea.config.checks.TRAINER_SETTINGS; for a team, what slea/trainer/team_settings.py declares it reads). A changed
setting nothing on the chosen path reads is refused in one line that names who reads it."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from slea.algorithms.registry import ALGORITHMS, POLICY_LOSSES, register_algorithm, register_policy_loss
from slea.config import AlgorithmSection, ConfigError, build_config, unused_settings

# a valid value other than the schema's default, for every algorithm.* setting but name, policy_loss, options
CHANGED = {"loss_agg": "seq-mean-token-sum", "gamma": 0.9, "step_weight": 0.5, "std_norm": False, "eps": 1e-5,
           "clip_eps": 0.3, "clip_eps_high": 0.28, "dual_clip_c": 5.0, "kl_coef": 0.01, "entropy_coef": 0.01,
           "kl_estimator": "k1", "skip_zero_advantage": False, "old_logprobs": "recompute", "tis_cap": 3.0,
           "gae_gamma": 0.9, "gae_lambda": 0.9, "turn_gamma": 0.9, "turn_lambda": 0.8, "value_clip": 0.3,
           "vf_coef": 0.5, "adv_whiten": False, "dynamic_sampling": True, "max_refill_rounds": 5}

# Stated by hand, independently of the code: the settings each built-in algorithm refuses (with its default policy
# loss, ppo_clip but for teamtr's own), and each built-in loss refuses (under grpo), when set alone.
# Everywhere: the KL estimator (algorithm.kl_coef is 0), the refill rounds (dynamic sampling is off) and tis_cap
# (algorithm.old_logprobs is not tis; the hand-kept table read tis_cap on every path: a cap nothing applied passed).
EVERYWHERE = {"kl_estimator", "max_refill_rounds", "tis_cap"}
NOT_PPO_CLIP = {"clip_eps_high", "dual_clip_c"}  # ppo_clip and teamtr take one symmetric ε
CRITIC = {"value_clip", "vf_coef"}
ESTIMATOR = {"gamma", "step_weight", "std_norm", "eps", "gae_gamma", "gae_lambda", "turn_gamma", "turn_lambda",
             "adv_whiten"}
REFUSED_BY_ALGORITHM = {
    "grpo": EVERYWHERE | NOT_PPO_CLIP | CRITIC | ESTIMATOR - {"std_norm", "eps"},
    "rloo": EVERYWHERE | NOT_PPO_CLIP | CRITIC | ESTIMATOR,
    "reinforce_pp": EVERYWHERE | NOT_PPO_CLIP | CRITIC | ESTIMATOR - {"std_norm", "eps"},
    "gigpo": EVERYWHERE | NOT_PPO_CLIP | CRITIC | ESTIMATOR - {"gamma", "step_weight", "std_norm", "eps"},
    "slea": EVERYWHERE | NOT_PPO_CLIP | CRITIC | ESTIMATOR - {"gamma", "step_weight", "std_norm", "eps"},
    "ppo": EVERYWHERE | NOT_PPO_CLIP | ESTIMATOR - {"gae_gamma", "gae_lambda", "adv_whiten"},
    "turn_ppo": EVERYWHERE | NOT_PPO_CLIP | ESTIMATOR - {"turn_gamma", "turn_lambda", "adv_whiten"},
    "rtpo": EVERYWHERE | NOT_PPO_CLIP | CRITIC | ESTIMATOR - {"gamma"} | {"dynamic_sampling"},
    # the team trainer reads no KL coefficient (its trust region's β·d̂ instead), no dynamic sampling (it replays
    # the stage's tasks), and its loss no loss_agg_mode: its declaration (slea/trainer/team_settings.py) omits them
    "teamtr": EVERYWHERE | NOT_PPO_CLIP | CRITIC | ESTIMATOR | {"entropy_coef", "kl_coef", "dynamic_sampling",
                                                                  "loss_agg"},
}
GRPO_ONLY = REFUSED_BY_ALGORITHM["grpo"] - NOT_PPO_CLIP  # grpo's refusals that no loss changes
REFUSED_BY_LOSS = {
    "ppo_clip": GRPO_ONLY | {"clip_eps_high", "dual_clip_c"},
    "clip_higher": GRPO_ONLY | {"dual_clip_c"},
    "dual_clip": GRPO_ONLY,
    "clip_cov": GRPO_ONLY | {"dual_clip_c"},
    "kl_cov": GRPO_ONLY | {"clip_eps", "clip_eps_high", "dual_clip_c"},
    "teamtr": GRPO_ONLY | {"clip_eps_high", "dual_clip_c"},
}


def _refused(overrides: list[str]) -> set[str]:
    """The algorithm.* settings of :data:`CHANGED` that ``unused_settings`` refuses, each set alone."""
    base = build_config({}, overrides, check_unused=False)
    out = set()
    for key, value in CHANGED.items():
        cfg = base.model_copy(update={"algorithm": base.algorithm.model_copy(update={key: value})})
        out |= {k.removeprefix("algorithm.") for k in unused_settings(cfg) if k.startswith("algorithm.")}
    return out


def test_every_setting_is_changed_once():
    assert set(CHANGED) == set(AlgorithmSection.model_fields) - {"name", "policy_loss", "options"}
    assert all(AlgorithmSection.model_fields[k].default != v for k, v in CHANGED.items())


def test_loss_settings_are_derived_from_the_schema_s_fields():
    """LOSS_SETTINGS is read off AlgorithmSection's LossKeywords markers; stated here by hand (verl's names)."""
    from slea.config import LOSS_SETTINGS, loss_settings

    assert LOSS_SETTINGS == {"clip_eps": ("clip_ratio", "clip_ratio_low"), "clip_eps_high": ("clip_ratio_high",),
                             "dual_clip_c": ("clip_ratio_c",), "loss_agg": ("loss_agg_mode",)}
    algo = AlgorithmSection(clip_eps=0.3, clip_eps_high=0.28, dual_clip_c=5.0, loss_agg="seq-mean-token-sum")
    # a loss gets each under the names it declares, and no other
    assert loss_settings(algo, POLICY_LOSSES.get("dual_clip")) == {
        "clip_ratio": 0.3, "clip_ratio_low": 0.3, "clip_ratio_high": 0.28, "clip_ratio_c": 5.0,
        "loss_agg_mode": "seq-mean-token-sum"}
    assert loss_settings(algo, POLICY_LOSSES.get("teamtr")) == {"clip_ratio": 0.3}


def test_the_built_in_algorithms_are_all_stated():
    assert set(REFUSED_BY_ALGORITHM) == set(ALGORITHMS.builtin_names())  # a plugin a test registered left out
    assert set(REFUSED_BY_LOSS) == set(POLICY_LOSSES.builtin_names())


@pytest.mark.parametrize("name", sorted(REFUSED_BY_ALGORITHM))
def test_what_each_built_in_algorithm_refuses(name):
    assert _refused([f"algorithm.name={name}"]) == REFUSED_BY_ALGORITHM[name]


@pytest.mark.parametrize("loss", sorted(REFUSED_BY_LOSS))
def test_what_each_built_in_policy_loss_refuses(loss):
    assert _refused([f"algorithm.policy_loss={loss}"]) == REFUSED_BY_LOSS[loss]


def test_switches_and_needs_other_sections():
    assert _refused(["algorithm.kl_coef=0.01"]) == GRPO_ONLY - {"kl_estimator"} | NOT_PPO_CLIP
    assert _refused(["algorithm.dynamic_sampling=true"]) == GRPO_ONLY - {"max_refill_rounds"} | NOT_PPO_CLIP
    assert _refused(["algorithm.old_logprobs=tis"]) == GRPO_ONLY - {"tis_cap"} | NOT_PPO_CLIP

    def refused(*overrides: str) -> set[str]:
        return set(unused_settings(build_config({}, list(overrides), check_unused=False)))

    for override, key, readers in [("train.critic_lr=0.1", "train.critic_lr", {"ppo", "turn_ppo"}),
                                   ("train.critic_updates=2", "train.critic_updates", {"ppo", "turn_ppo"}),
                                   ("rollout.trunks=2", "rollout.trunks", {"rtpo"}),
                                   ("team.max_turns=4", "team.max_turns", {"teamtr"}),
                                   ("team.trust_region.delta=0.02", "team.trust_region.delta", {"teamtr"})]:
        assert {n for n in REFUSED_BY_ALGORITHM if key not in refused(f"algorithm.name={n}", override)} == readers
    assert refused("rollout.max_batch=4") == set()
    assert refused("rollout.max_batch=4", "model.generator=openai") == {"rollout.max_batch"}


def test_every_algorithm_setting_has_a_reader_that_names_it():
    """Each algorithm.* key is a built-in estimator's or loss's parameter or the trainer's (TRAINER_SETTINGS),
    and the module a trainer entry names does read it."""
    from pathlib import Path

    import slea
    from slea.config import LOSS_SETTINGS, TRAINER_SETTINGS

    estimators = set().union(*(ALGORITHMS.get(n).settings for n in ALGORITHMS.names()))
    losses = {k for k, names in LOSS_SETTINGS.items()
              if any(set(names) & set(inspect.signature(POLICY_LOSSES.get(n)).parameters) for n in POLICY_LOSSES.names())}
    trainer = {k.removeprefix("algorithm.") for k in TRAINER_SETTINGS if k.startswith("algorithm.")}
    assert set(AlgorithmSection.model_fields) - estimators - losses - trainer == set()
    for key, reader in TRAINER_SETTINGS.items():
        assert key.split(".")[-1] in (Path(slea.__file__).parent / reader.by).read_text(), (key, reader.by)


# -- a plugin's settings: accepted because its function declares them ------------------------------------------
@pytest.fixture
def plugin_algorithm():
    @register_algorithm("test_settings_tempered", level="trajectory")
    def tempered(batch, *, gae_lambda: float, temperature: float = 1.0) -> np.ndarray:
        """A toy estimator with a schema setting (gae_lambda) and a new one (temperature)."""
        return np.zeros(batch.n)

    @register_policy_loss("test_settings_capped")
    def capped(logprobs, old_logprobs, advantages, mask, *, clip_ratio_c: float = 3.0, cap: float = 1.0):
        """A toy loss taking dual-clip's c and a new setting of its own."""
        raise NotImplementedError

    yield
    ALGORITHMS.remove("test_settings_tempered")
    POLICY_LOSSES.remove("test_settings_capped")


def test_a_plugin_algorithm_gets_its_settings_without_a_table(plugin_algorithm):
    base = ["algorithm.name=test_settings_tempered"]
    cfg = build_config({}, [*base, "algorithm.gae_lambda=0.5", "algorithm.options={temperature: 0.5}"])
    assert cfg.algorithm.gae_lambda == 0.5 and cfg.algorithm.options == {"temperature": 0.5}
    # another algorithm's setting: one line naming the key, what the chosen one reads, and who reads it
    reads = "(it reads: gae_lambda, temperature); read by algorithm"
    for override, says in [
        ("algorithm.turn_lambda=0.5", f"algorithm.turn_lambda: {{}} {reads} turn_ppo"),
        ("algorithm.step_weight=0.5", f"algorithm.step_weight: {{}} {reads} gigpo, slea"),
        ("algorithm.options={similarity_threshold: 0.9}", ("algorithm.options.similarity_threshold: {} (its options: "
                                                           "temperature) nor of policy_loss ppo_clip; read by "
                                                           "algorithm gigpo")),
    ]:
        with pytest.raises(ConfigError) as info:
            build_config({}, [*base, override])
        assert str(info.value) == says.format("not a setting of algorithm test_settings_tempered")
    # gae_lambda is still refused where nothing reads it
    with pytest.raises(ConfigError, match="^algorithm.gae_lambda: not a setting of algorithm grpo .*; read by "
                                          "algorithm ppo, test_settings_tempered$"):
        build_config({}, ["algorithm.gae_lambda=0.5"])


def test_a_plugin_loss_gets_its_settings_without_a_table(plugin_algorithm):
    base = ["algorithm.policy_loss=test_settings_capped"]
    cfg = build_config({}, [*base, "algorithm.dual_clip_c=5", "algorithm.options={cap: 2.0}"])
    assert cfg.algorithm.dual_clip_c == 5 and cfg.algorithm.options == {"cap": 2.0}
    with pytest.raises(ConfigError) as info:
        build_config({}, [*base, "algorithm.clip_eps=0.3"])
    assert str(info.value) == ("algorithm.clip_eps: not read by policy_loss test_settings_capped (it reads: "
                               "dual_clip_c); read by policy_loss clip_cov, clip_higher, dual_clip, ppo_clip, teamtr")
    with pytest.raises(ConfigError, match="^algorithm.dual_clip_c: not read by policy_loss ppo_clip .*; read by "
                                          "policy_loss dual_clip, test_settings_capped$"):
        build_config({}, ["algorithm.dual_clip_c=5"])
