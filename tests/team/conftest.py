"""A two-agent team on the tiny test model (LoRA adapters ``planner`` and ``actor`` on one base)."""

from __future__ import annotations

import pytest


@pytest.fixture
def team():
    import torch

    from slea.config import ModelSection
    from slea.team.policy import build_team_policy

    torch.manual_seed(0)
    return build_team_policy(ModelSection(name_or_path="tiny", dtype="float32", lora_r=4), ["planner", "actor"])


def _perturb(team, agent: int, seed: int) -> None:
    """Give ``agent``'s LoRA B matrices random values, so its policy differs from the base (B starts at 0)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in team.named_adapter_parameters(agent).items():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


@pytest.fixture
def perturb():
    """``perturb(team, agent, seed)``: make one agent differ from the base model."""
    return _perturb
