"""The trainer with a learned critic (ppo) and dynamic sampling, end to end on the tiny model and TextWorld."""

import json
from pathlib import Path

import pytest
import torch

from slea.config import load_config
from slea.runs import checkpoint as ckpt

SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")

FAST = ["eval.before=false", "eval.greedy=false", "eval.games=1", "eval.episodes_per_game=1", "env.max_steps=2"]


@pytest.mark.slow
def test_ppo_critic_checkpoint_resume_and_dynamic_sampling(tmp_path):
    pytest.importorskip("textworld")
    from slea.trainer.rl import Trainer

    run = tmp_path / "run"
    over = FAST + [f"run.dir={run}", "algorithm.name=ppo", "train.critic_updates=2"]
    t = Trainer(load_config(SMOKE, over + ["train.iterations=1"]))
    assert t.critic is not None and t.critic.level == "token"
    t.fit()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    m = rows[0]
    assert m["env_steps"] == m["train/episode_len"] * m["train/episodes"] > 0
    assert m["critic/positions"] > 0 and "critic/vf_loss" in m  # the tiny model's invalid steps are penalised
    last = ckpt.latest_checkpoint(run / "checkpoints")
    saved = ckpt.load_critic(last)
    assert saved is not None and saved["head.linear.weight"].abs().sum() > 0
    state = json.loads((last / "state.json").read_text())
    assert state["env_steps"] == m["env_steps"] and state["critic"]["level"] == "token"

    # resume with one more iteration, now with dynamic sampling; with the strict parser every answer of the tiny
    # model is invalid, every group flat: all dropped
    t2 = Trainer(load_config(SMOKE, over + ["train.iterations=2", "algorithm.dynamic_sampling=true",
                                            "algorithm.max_refill_rounds=1", "rollout.fuzzy_cutoff=0.75"]))
    assert t2.resume()
    assert torch.equal(t2.critic.head.linear.weight.detach(), saved["head.linear.weight"])
    m2 = t2.iteration(1)
    assert m2["sampling/refill_rounds"] == 1 and m2["sampling/collected_groups"] == 4
    assert m2["sampling/kept_groups"] + m2["sampling/short_groups"] == 2
    assert m2["train/episodes"] == 8 and m2["env_steps"] > m["env_steps"]
    t2.log.close()
