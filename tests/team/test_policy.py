"""n agents as LoRA adapters on one base model: separate weights, switchable, updated one at a time."""

from __future__ import annotations

import pytest
import torch

from slea.algorithms import get_policy_loss
from slea.config import ConfigError, ModelSection
from slea.team.policy import build_team_policy
from slea.trainer.update import Sample, response_logprobs


def _logits(team, agent: int, ids: list[int]) -> torch.Tensor:
    with torch.no_grad(), team.acting(agent):
        return team.model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_one_adapter_per_agent_on_a_shared_base(team, perturb):
    assert set(team.model.peft_config) == {"planner", "actor"}
    a, b = team.named_adapter_parameters(0), team.named_adapter_parameters(1)
    assert a and len(a) == len(b) and not set(a) & set(b)
    assert all(".planner." in n for n in a) and all(".actor." in n for n in b)
    ids = team.tok("go north", add_special_tokens=False).input_ids
    # LoRA B starts at 0: both agents are the base model
    assert torch.equal(_logits(team, 0, ids), _logits(team, 1, ids))
    perturb(team, 1, seed=1)
    assert not torch.allclose(_logits(team, 0, ids), _logits(team, 1, ids))
    with team.model.disable_adapter():
        base = team.model(input_ids=torch.tensor([ids])).logits[0, -1]
    assert torch.equal(_logits(team, 0, ids), base)  # agent 0 is still the base


def test_updating_one_agent_leaves_the_others_bit_identical(team, perturb):
    perturb(team, 0, seed=2)
    perturb(team, 1, seed=3)
    before = [team.state(0), team.state(1)]
    base_before = {n: p.detach().clone() for n, p in team.model.named_parameters() if ".lora_" not in n}
    team.activate(1)
    assert all(p.requires_grad for p in team.parameters(1))
    assert not any(p.requires_grad for p in team.parameters(0))
    # weight decay on, so an adapter that slipped into the optimizer would move even without a gradient
    opt = torch.optim.AdamW(team.parameters(1), lr=1e-2, weight_decay=0.1)
    prompt = team.tok("You are in a kitchen. Your command:", add_special_tokens=False).input_ids
    resp = team.tok(" take apple", add_special_tokens=False).input_ids
    sample = Sample(prompt, resp, [-2.0] * len(resp), [1.0] * len(resp))
    for _ in range(2):
        opt.zero_grad()
        logp, mask = response_logprobs(team.model, [sample], dtype="float32")
        old = torch.tensor([sample.old_logprobs])
        loss, _ = get_policy_loss("teamtr")(logp, old, torch.tensor([1.0]), mask, clip_ratio=0.1, beta=0.1)
        loss.backward()
        opt.step()
    after = [team.state(0), team.state(1)]
    assert all(torch.equal(before[0][n], after[0][n]) for n in before[0])  # bit-identical
    assert any(not torch.equal(before[1][n], after[1][n]) for n in before[1])  # the updated agent moved
    assert all(p.grad is None for p in team.parameters(0))
    assert all(torch.equal(p, base_before[n]) for n, p in team.model.named_parameters() if n in base_before)


def test_state_round_trip_and_lora_required(team, perturb):
    saved = team.state(1)
    perturb(team, 1, seed=4)
    assert not all(torch.equal(saved[n], p) for n, p in team.named_adapter_parameters(1).items())
    team.load_state(1, saved)
    assert all(torch.equal(saved[n], p) for n, p in team.named_adapter_parameters(1).items())
    with pytest.raises(ConfigError, match="model.lora"):
        build_team_policy(ModelSection(name_or_path="tiny", lora=False), ["a", "b"])
    with pytest.raises(ConfigError, match="unique"):
        build_team_policy(ModelSection(name_or_path="tiny"), ["a", "a"])


def test_adapters_round_trip_through_safetensors_files(team, perturb, tmp_path):
    perturb(team, 0, seed=6)
    perturb(team, 1, seed=7)
    saved = [team.state(0), team.state(1)]
    paths = team.save_adapters(tmp_path / "adapters")
    assert [p.name for p in paths] == ["planner.safetensors", "actor.safetensors"]
    perturb(team, 0, seed=8)
    perturb(team, 1, seed=9)
    team.load_adapters(tmp_path / "adapters")
    for agent in (0, 1):
        assert all(torch.equal(saved[agent][n], p) for n, p in team.named_adapter_parameters(agent).items())
    (tmp_path / "adapters" / "actor.safetensors").unlink()
    with pytest.raises(ValueError, match="no adapter file for agent 'actor'"):
        team.load_adapters(tmp_path / "adapters")


def test_every_agents_adapter_lives_on_the_base_device_in_fp32_over_a_bf16_base(device):
    team = build_team_policy(ModelSection(name_or_path="tiny", lora_r=4, base_dtype="bfloat16"),
                             ["planner", "actor"], device=device)
    adapters = {id(q) for j in (0, 1) for q in team.parameters(j)}
    frozen = {(p.device.type, p.dtype) for p in team.model.parameters() if id(p) not in adapters}
    assert frozen == {(device, torch.bfloat16)}
    for agent in (0, 1):
        params = team.parameters(agent)
        assert params and {(p.device.type, p.dtype) for p in params} == {(device, torch.float32)}
