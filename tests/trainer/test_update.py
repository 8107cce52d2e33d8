"""ppo_update: the update does not depend on how a mini-batch is split into micro-batches."""

from __future__ import annotations

import pytest
import torch

from slea.testing.ddp import MODEL, fixed_update


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batching_does_not_change_the_update(agg, tmp_path):
    """Row by row or all at once, the same gradient: each micro-batch's policy loss is weighted by its share of
    the mini-batch (tokens or rows), and the KL term is always the mini-batch's token mean."""
    from slea.policy.model import load_policy

    torch.manual_seed(0)
    model, _ = load_policy(MODEL)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    torch.save(model.state_dict(), tmp_path / "start.pt")
    one, met_one = fixed_update(tmp_path / "start.pt", agg, None, micro_batch=1)
    whole, met_whole = fixed_update(tmp_path / "start.pt", agg, None, micro_batch=8)
    for n in whole:
        torch.testing.assert_close(one[n], whole[n], rtol=0, atol=1e-6, msg=n)
    for key in ("loss", "kl", "grad_norm"):
        assert met_one[key] == pytest.approx(met_whole[key], rel=1e-5), key
