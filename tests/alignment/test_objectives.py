"""Alignment methods on the tiny model: one real optimizer step each, the reference, the micro-batched gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from slea.alignment.data import Trajectory, Turn
from slea.alignment.objectives import (
    PairTokens,
    alignment_method_names,
    alignment_step,
    encode_pair,
    encode_trajectory,
    get_alignment_method,
    register_alignment_method,
    turn_logprob_sums,
    turn_reference_logprobs,
)
from slea.alignment.pairs import Pair
from slea.policy.prompts import PromptBuilder

SYSTEM = "You are an agent. Reply with exactly one command copied from the list."


def _traj(observations, actions, *, source: str = "expert", success: bool = True, ret: float = 1.0) -> Trajectory:
    turns = [Turn([{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Your task: take the key. {o}"}],
                  a) for o, a in zip(observations, actions)]
    return Trajectory("slea/TextWorld-v0", "t1", "train", 0, source, success, ret, turns)


@pytest.fixture(scope="module")
def _loaded():
    from slea.config import ModelSection
    from slea.policy.model import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(ModelSection(name_or_path="tiny", lora=True, lora_r=4, dtype="float32"))
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return model, tok, start


@pytest.fixture
def lora_policy(_loaded):
    """The LoRA-wrapped tiny model with its adapter as built (B = 0: the policy starts equal to its reference);
    loaded once per module, the adapter reset before every test."""
    model, tok, start = _loaded
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in start:
                p.copy_(start[n])
    return model, tok


def _encoder(tok):
    builder = PromptBuilder(tok)

    def encode(turn):  # stand-in for slea.alignment.data.encode_turn: prompt + action ids + EOS
        return builder.encode(turn.messages), tok(turn.action, add_special_tokens=False).input_ids + [tok.eos_token_id]

    return encode


def _pairs(tok) -> list[PairTokens]:
    enc = _encoder(tok)
    expert = _traj(["You see a key and a box.", "You are carrying the key."], ["take key", "open box"])
    failed = _traj(["You see a key and a box.", "Nothing happens."], ["go north", "eat the box"],
                   source="sft", success=False, ret=0.0)
    expert2 = _traj(["You see a door.", "The door is open.", "You are in the cellar."], ["open door", "go east", "take coin"])
    failed2 = _traj(["You see a door."], ["drop mug"], source="sft", success=False, ret=0.0)
    return [encode_pair(Pair(expert, failed), enc), encode_pair(Pair(expert2, failed2), enc)]


def _margin(model, batch: list[PairTokens]) -> float:
    """Mean over pairs of (chosen − rejected) log-ratio, summed over action tokens."""
    with torch.no_grad():
        out = []
        for p in batch:
            ref_c = sum(float(np.sum(s.ref_logprobs)) for s in p.chosen)
            ref_r = sum(float(np.sum(s.ref_logprobs)) for s in p.rejected)
            out.append(float(turn_logprob_sums(model, p.chosen).sum()) - ref_c
                       - float(turn_logprob_sums(model, p.rejected).sum()) + ref_r)
    return sum(out) / len(out)


def _perturb_adapter(model, scale=0.05):
    """Move the LoRA B matrices off 0 so the policy differs from its reference."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def test_registry_names_and_paper_defaults():
    assert {"sft", "dpo", "turn_dpo", "dil", "tlm_dre"} <= set(alignment_method_names())
    tlm = get_alignment_method("tlm-DRE")
    assert tlm.settings == {"kernel": "ukl", "alpha": 0.5, "pivot": 0.9, "omega_low": 0.2, "omega_high": 1.0,
                            "chosen_factor": "mean"}
    assert tlm.reference and tlm.pairs and not tlm.linear
    sft = get_alignment_method("sft")
    assert not sft.reference and not sft.pairs and sft.linear
    with pytest.raises(KeyError, match="known: dil, dpo, sft, tlm_dre, turn_dpo"):
        get_alignment_method("ppo")


def test_encode_pair_is_one_sample_per_turn(lora_policy):
    _, tok = lora_policy
    batch = _pairs(tok)
    assert [len(p.chosen) for p in batch] == [2, 3] and [len(p.rejected) for p in batch] == [2, 1]
    s = batch[0].chosen[0]
    assert s.response_ids[-1] == tok.eos_token_id
    assert tok.decode(s.response_ids[:-1]) == "take key"
    assert tok.decode(s.prompt_ids).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(("method", "start_loss"), [
    ("dpo", math.log(2)),       # -log sigmoid(0)
    ("turn_dpo", math.log(2)),
    ("dil", 1.0),               # UKL: r_l - log r_w = e^0 - 0
    ("tlm_dre", 1.0),           # Eq.17: exp(0) - c_w * 0
])
def test_one_step_moves_the_margin_up(lora_policy, method, start_loss):
    model, tok = lora_policy
    batch = _pairs(tok)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    met = alignment_step(model, opt, batch, method, beta=0.5, micro_batch=16)
    # the adapter starts at 0, so before the step the policy is its reference: every log-ratio is 0
    assert met["margin"] == pytest.approx(0.0, abs=1e-5)
    assert met["loss"] == pytest.approx(start_loss, abs=1e-5)
    assert met["skipped"] == 0.0 and met["pairs"] == 2 and met["turns"] == 8
    assert all(s.ref_logprobs is not None for p in batch for s in p.chosen + p.rejected)
    # (chosen - rejected) summed log-ratio after the step; the tiny model's turns all sit below the pivot, so
    # the turn-weighted methods weigh every turn 1 and this is also their weighted margin
    assert _margin(model, batch) > 0.05


def test_sft_step_lowers_the_expert_nll(lora_policy):
    model, tok = lora_policy
    batch = [PairTokens(p.chosen) for p in _pairs(tok)]  # SFT needs no rejected side

    def nll():
        with torch.no_grad():
            s = [x for p in batch for x in p.chosen]
            return -float(turn_logprob_sums(model, s).sum()) / sum(len(x.response_ids) for x in s)

    before = nll()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    met = alignment_step(model, opt, batch, "sft", micro_batch=2)  # 5 turns in 3 micro-batches
    assert met["nll"] == pytest.approx(before, rel=1e-4)  # reported at the pre-step weights
    assert nll() < before - 0.01
    assert all(x.ref_logprobs is None for p in batch for x in p.chosen)  # SFT never runs the reference


class GradRecorder(torch.optim.SGD):
    """SGD with lr 0 that keeps a copy of the gradients it was asked to apply."""

    def __init__(self, params):
        self.params = list(params)
        super().__init__(self.params, lr=0.0)
        self.grads: list[torch.Tensor] = []

    def step(self, closure=None):
        self.grads = [p.grad.detach().clone() for p in self.params]


@pytest.mark.parametrize("method", ["tlm_dre", "dpo", "sft"])
def test_micro_batched_gradient_equals_the_one_pass_gradient(lora_policy, method):
    model, tok = lora_policy
    _perturb_adapter(model)
    batch = _pairs(tok)
    params = [p for p in model.parameters() if p.requires_grad]
    one, many = GradRecorder(params), GradRecorder(params)
    kw = {"grad_clip": 1e9, "beta": 0.5}
    m1 = alignment_step(model, one, batch, method, micro_batch=64, **kw)
    m2 = alignment_step(model, many, batch, method, micro_batch=3, **kw)
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-5)
    flat1, flat2 = torch.cat([g.flatten() for g in one.grads]), torch.cat([g.flatten() for g in many.grads])
    assert flat1.norm() > 0
    # equal up to float32 noise from the different padding of each micro-batch
    assert float((flat1 - flat2).norm() / flat1.norm()) < 1e-5


def test_tlm_dre_step_uses_the_turn_weights(lora_policy):
    model, tok = lora_policy
    _perturb_adapter(model)
    batch = _pairs(tok)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    # adequacy of the tiny random model is low (~1/vocab): with pivot 0.9 every turn is uncertain (omega_U)
    met = alignment_step(model, opt, batch, "tlm_dre", micro_batch=16)
    assert met["low_weight_frac"] == 0.0
    samples = [s for p in batch for s in p.chosen + p.rejected]
    p = [math.exp(np.mean(s.ref_logprobs)) for s in samples]
    pivot = float(np.median(p))
    met = alignment_step(model, opt, batch, "tlm_dre", micro_batch=16, pivot=pivot)
    assert met["low_weight_frac"] == pytest.approx(sum(x > pivot for x in p) / len(p))
    assert met["skipped"] == 0.0 and math.isfinite(met["loss"]) and met["grad_norm"] > 0


def test_reference_is_the_policy_with_its_adapter_disabled(lora_policy):
    model, tok = lora_policy
    samples = encode_trajectory(_traj(["You see a key."], ["take key"]), _encoder(tok))
    _perturb_adapter(model)
    (ref,) = turn_reference_logprobs(model, samples)
    with torch.no_grad(), model.disable_adapter():
        base = float(turn_logprob_sums(model, samples)[0])
    with torch.no_grad():
        policy = float(turn_logprob_sums(model, samples)[0])
    assert ref.sum() == pytest.approx(base, rel=1e-5)
    assert abs(policy - base) > 1e-4  # the adapter does change the policy


def test_bad_calls(lora_policy):
    model, tok = lora_policy
    batch = _pairs(tok)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    with pytest.raises(TypeError, match="unknown setting.*omega_lo\\b.*known: alpha, beta"):
        alignment_step(model, opt, batch, "tlm_dre", omega_lo=0.2)
    with pytest.raises(ValueError, match="'dpo' needs a rejected trajectory"):
        alignment_step(model, opt, [PairTokens(batch[0].chosen)], "dpo")
    # a setting another method declares is ignored by this one (one settings dict serves every method)
    assert alignment_step(model, opt, batch, "dil", beta=0.3)["skipped"] == 0.0


def test_a_non_finite_loss_skips_the_step(lora_policy):
    model, tok = lora_policy
    name = "test_nan_method"

    @register_alignment_method(name, reference=False)
    def nan_loss(chosen, rejected):
        return (chosen.logp * float("nan")).sum(), {}

    try:
        params = [p for p in model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in params]
        opt = torch.optim.SGD(params, lr=1.0)
        met = alignment_step(model, opt, _pairs(tok), name, micro_batch=3)
        assert met["skipped"] == 1.0
        assert all(torch.equal(a, b) for a, b in zip(before, params))
    finally:
        from slea.alignment.objectives import ALIGNMENT_METHODS

        ALIGNMENT_METHODS.remove(name)


# -- π_ref and π_θ are the same computation --------------------------------------------------------------------
START_LOSS = {"dpo": math.log(2), "turn_dpo": math.log(2), "dil": 1.0, "tlm_dre": 1.0}


@pytest.mark.parametrize("micro_batch", [16, 3])  # one pass; two passes (the loss is not linear in the sums)
@pytest.mark.parametrize("method", ["dpo", "turn_dpo", "dil", "tlm_dre"])
def test_at_the_reference_every_bf16_log_ratio_is_exactly_zero(lora_policy, method, micro_batch):
    """The pipeline's setting: π_ref a frozen copy of the SFT policy (an adapter that is not a no-op), bf16
    autocast, and a reference cache filled first in another batch layout (the pivot histogram runs over the failed
    turns alone). At θ = θ_ref the step's log-ratios are 0 to 1e-6 and the loss is its analytic value."""
    import copy

    model, tok = lora_policy
    _perturb_adapter(model, scale=0.5)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    batch = _pairs(tok)
    turn_reference_logprobs(model, [s for p in batch for s in p.rejected], micro_batch=1, dtype="bfloat16",
                            reference=reference)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    met = alignment_step(model, opt, batch, method, micro_batch=micro_batch, dtype="bfloat16", reference=reference)
    assert met["chosen_logratio"] == pytest.approx(0.0, abs=1e-6)
    assert met["rejected_logratio"] == pytest.approx(0.0, abs=1e-6)
    assert met["accuracy"] == 0.0 and met["margin"] == pytest.approx(0.0, abs=1e-6)
    assert met["loss"] == pytest.approx(START_LOSS[method], abs=1e-6)


def test_a_bf16_reference_from_another_batch_layout_is_not_the_policys_forward(lora_policy):
    """Why the step computes π_ref itself: in bf16 a turn's log-probs depend on its micro-batch (padding, shared
    prefix). The same weights scored one turn at a time and in one prompt-sorted batch disagree; in fp32 they agree."""
    model, tok = lora_policy
    _perturb_adapter(model, scale=0.5)
    turns = [s for p in _pairs(tok) for s in p.chosen + p.rejected]
    gaps = {}
    for dtype in ("float32", "bfloat16"):
        with torch.no_grad():
            alone = turn_logprob_sums(model, turns, micro_batch=1, dtype=dtype)
            batched = turn_logprob_sums(model, turns, micro_batch=16, dtype=dtype)
        gaps[dtype] = float((alone - batched).abs().max())
    assert gaps["float32"] < 1e-5
    assert gaps["bfloat16"] > max(1e-4, 100 * gaps["float32"])
