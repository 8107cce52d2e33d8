"""Alignment methods on the tiny model: one real optimizer step each, the reference, the micro-batched gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from slea.alignment.data import EpisodeRecord, Turn
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
from slea.policy.prompt_builder import PromptBuilder
from slea.testing.numerics import (
    assert_same,
    assert_within,
    gradient_tolerance,
    logprob_tolerance,
    numerics_dtype,
    tolerance,
)

SYSTEM = "You are an agent. Reply with exactly one command copied from the list."


def _traj(observations, actions, *, source: str = "expert", success: bool = True, ret: float = 1.0) -> EpisodeRecord:
    turns = [Turn([{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Your task: take the key. {o}"}],
                  a) for o, a in zip(observations, actions)]
    return EpisodeRecord("slea/TextWorld-v0", "t1", "train", 0, source, success, ret, turns)


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
    """Case 2 of slea.testing.numerics: one pass against micro-batches of 3 turns (other padding, another
    summation order), computed in numerics_dtype() (make test-numerics also runs bf16)."""
    model, tok = lora_policy
    _perturb_adapter(model)
    batch = _pairs(tok)
    params = [p for p in model.parameters() if p.requires_grad]
    one, many = GradRecorder(params), GradRecorder(params)
    dtype = numerics_dtype()
    kw = {"grad_clip": 1e9, "beta": 0.5, "dtype": dtype}
    m1 = alignment_step(model, one, batch, method, micro_batch=64, **kw)
    m2 = alignment_step(model, many, batch, method, micro_batch=3, **kw)
    turns = [s for p in batch for s in p.chosen + p.rejected]
    with torch.no_grad():
        max_logit = max(float(model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits.abs().max())
                        for s in turns)
    # the losses are smooth functions of the turns' log-prob sums with slopes of at most 1 per nat here (β = 0.5;
    # UKL's e^u with the small log-ratios u of a 0.05 adapter; the NLL's 1/tokens): a loss moves by at most the
    # sum of its turns' log-prob bounds
    tokens = sum(len(s.response_ids) for s in turns)
    assert_within(m1["loss"], m2["loss"], tokens * logprob_tolerance(dtype, model.config, max_logit=max_logit),
                  why=f"{method}: loss, one pass against micro-batches")
    flat1, flat2 = torch.cat([g.flatten() for g in one.grads]), torch.cat([g.flatten() for g in many.grads])
    assert flat1.norm() > 0
    assert_within(flat2, flat1, gradient_tolerance(dtype, model.config, scale=float(flat1.abs().max())),
                  why=f"{method}: gradient, one pass against micro-batches")


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
SAME_STEP = ("π_ref runs at the step as π_θ does (step_reference_logprobs): the same micro-batches, padding, shared "
             "prefix and dtype, and each turn's sum is the same float32 reduction; at θ = θ_ref the two forwards are "
             "the same kernels on the same inputs")


@pytest.mark.parametrize("micro_batch", [16, 3])  # one pass; two passes (the loss is not linear in the sums)
@pytest.mark.parametrize("method", ["dpo", "turn_dpo", "dil", "tlm_dre"])
def test_at_the_reference_every_bf16_log_ratio_is_exactly_zero(lora_policy, method, micro_batch):
    """The pipeline's setting: π_ref a frozen copy of the SFT policy (an adapter that is not a no-op), bf16
    autocast, and a reference cache filled first in another batch layout (the pivot histogram runs over the failed
    turns alone). At θ = θ_ref the step's log-ratios are exactly 0 (case 1 of slea.testing.numerics: on every CPU
    kind, AVX2 to AMX) and the loss is its analytic value to float32 rounding."""
    import copy

    model, tok = lora_policy
    _perturb_adapter(model, scale=0.5)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    batch = _pairs(tok)
    turn_reference_logprobs(model, [s for p in batch for s in p.rejected], micro_batch=1, dtype="bfloat16",
                            reference=reference)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    met = alignment_step(model, opt, batch, method, micro_batch=micro_batch, dtype="bfloat16", reference=reference)
    for key in ("chosen_logratio", "rejected_logratio", "margin"):
        assert_same(met[key], 0.0, why=SAME_STEP)
    assert met["accuracy"] == 0.0
    # case 2: the loss at u = 0 in float32 (a log-sigmoid or an exp and a few products) against its value in
    # float64: a few float32 roundings of a quantity of the loss's size
    assert_within(met["loss"], START_LOSS[method], tolerance("float32", scale=START_LOSS[method], stages=4),
                  why="the analytic loss at u = 0, computed in float32")


def test_the_step_replaces_a_reference_cached_in_another_batch_layout(lora_policy):
    """Why the step computes π_ref itself: a turn's log-probs depend on its micro-batch (padding, shared prefix)
    by rounding, so a cache filled in another layout is not the policy's forward. Where the CPU emulates bf16
    (AVX2) the gap is 1e-4 to 1e-1 nats; where it computes bf16 natively (AVX-512-BF16, AMX) it may be 0; in
    float32 it is float32 rounding. Both sit inside the case-2 bound, and the step's own reference replaces any
    cached one: with a cache that is off by more than any layout's rounding, the log-ratios at θ = θ_ref are
    still exactly 0."""
    model, tok = lora_policy
    _perturb_adapter(model, scale=0.5)
    turns = [s for p in _pairs(tok) for s in p.chosen + p.rejected]
    with torch.no_grad():
        max_logit = max(float(model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits.abs().max())
                        for s in turns)
    for dtype in ("float32", "bfloat16"):
        with torch.no_grad():
            alone = turn_logprob_sums(model, turns, micro_batch=1, dtype=dtype)
            batched = turn_logprob_sums(model, turns, micro_batch=16, dtype=dtype)
        # case 2: another batch layout; a turn's sum adds its tokens' bounds and the float32 sum's own rounding
        tokens = max(len(s.response_ids) for s in turns)
        token_scale = math.log(model.config.vocab_size) + 2 * max_logit
        bound = (tokens * logprob_tolerance(dtype, model.config, max_logit=max_logit)
                 + tolerance("float32", scale=tokens * token_scale, n=tokens))
        assert_within(alone, batched, bound,
                      why=f"{dtype}: one turn per micro-batch against 16, shared prefix and padding differ")
    # a cache filled one turn at a time and then off by 0.05 nats per token (the order of a bf16 layout gap on an
    # AVX2 CPU, so the test means the same on a CPU whose gap is 0): the step replaces it
    import copy

    reference = copy.deepcopy(model).eval().requires_grad_(False)
    batch = _pairs(tok)
    cached = [s for p in batch for s in p.chosen + p.rejected]
    turn_reference_logprobs(model, cached, micro_batch=1, dtype="bfloat16", reference=reference)
    for s in cached:
        s.ref_logprobs = [x + 0.05 for x in s.ref_logprobs]
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    met = alignment_step(model, opt, batch, "dpo", micro_batch=3, dtype="bfloat16", reference=reference)
    assert_same(met["chosen_logratio"], 0.0, why=SAME_STEP)
    assert_same(met["rejected_logratio"], 0.0, why=SAME_STEP)
