"""What one training step does, on the tiny model (slea/trainer/update.py).

The loss maths is tested against hand-worked values in tests/algorithms/test_losses.py; here the update
itself: the direction it moves log-probabilities, that micro-batching and the mini-batch split do not change the
gradient, that each row's advantage reaches its own response tokens and nothing else, what
``skip_zero_advantage`` does to the token-mean denominator, and that the KL reference is the reference's forward.
"""

from __future__ import annotations

import copy
import functools
import math
import random

import numpy as np
import pytest
import torch

from slea.algorithms.batch import Advantages
from slea.config import AlgorithmSection, ModelSection, TrainSection
from slea.policy.model import load_policy
from slea.testing.numerics import (
    assert_same,
    assert_within,
    exact_on,
    gradient_tolerance,
    logprob_tolerance,
    numerics_dtype,
    tolerance,
)
from slea.trainer import update as U
from slea.types import Step

NO_CLIP = 1e9  # gradient comparisons: clip_grad_norm_ must not rescale
DTYPE = numerics_dtype()  # the gradient comparisons' compute dtype (make test-numerics also runs them in bf16)


@pytest.fixture
def model(tiny_policy):
    """A private copy of the tiny fp32 model (updates must not leak into the session fixture)."""
    m = copy.deepcopy(tiny_policy[0])
    m.requires_grad_(True)
    return m


def _samples(n: int, *, seed: int = 0, advantages=None) -> list[U.Sample]:
    """``n`` rows whose prompts share a 6-token prefix and then differ in increasing order (so the update's
    prompt sort keeps this order), with prompts of 3–9 own tokens and responses of 1–5 tokens."""
    rng = random.Random(seed)
    common = [rng.randrange(10, 700) for _ in range(6)]
    out = []
    for i in range(n):
        prompt = common + [100 + i] + [rng.randrange(10, 700) for _ in range(rng.randint(2, 8))]
        response = [rng.randrange(10, 700) for _ in range(rng.randint(1, 5))]
        adv = advantages[i] if advantages is not None else rng.choice([-1.5, -0.5, 0.7, 2.0])
        out.append(U.Sample(prompt, response, [0.0] * len(response), [float(adv)] * len(response)))
    return out


@torch.no_grad()
def _logprobs(model, samples) -> list[list[float]]:
    """Each sample's response log-probs, by a plain full forward per sample (independent of the update's
    batched, prefix-shared, right-aligned layout)."""
    out = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logits = model(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits[len(s.prompt_ids) - 1:-1], dim=-1)
        out.append(logp.gather(-1, torch.tensor(s.response_ids).unsqueeze(-1)).squeeze(-1).tolist())
    return out


def _on_policy(model, samples) -> list[U.Sample]:
    """The samples with old log-probs equal to the model's own (ratio 1 at the first step)."""
    model.eval()
    for s, lp in zip(samples, _logprobs(model, samples)):
        s.old_logprobs = lp
    return samples


def _gradient(model, samples, *, micro_batch: int, agg: str = "token-mean", kl_coef: float = 0.0,
              updates: int = 1) -> list[torch.Tensor]:
    """The gradient ppo_update leaves on the parameters (SGD with lr 0 never moves them), computed in DTYPE."""
    params = [p for p in model.parameters() if p.requires_grad]
    U.ppo_update(model, torch.optim.SGD(params, lr=0.0), samples, AlgorithmSection(loss_agg=agg, kl_coef=kl_coef),
                 TrainSection(updates_per_iter=updates, micro_batch=micro_batch, grad_clip=NO_CLIP),
                 temperature=1.0, dtype=DTYPE, rng=random.Random(0))
    return [p.grad.detach().clone() for p in params]


def _assert_same_gradient(a, b, dtype: str = DTYPE):
    """Case 2 of slea.testing.numerics: the same gradient computed in another layout (micro-batches, mini-batch
    split, devices): within ``dtype`` rounding of the largest gradient element through the forward and backward."""
    scale = max(float(g.abs().max()) for g in a)
    assert scale > 0
    assert_within(b, a, gradient_tolerance(dtype, _tiny_config(), scale=scale), why="the same gradient, another layout")


@functools.cache
def _tiny_config():
    from transformers import AutoConfig

    from slea.policy.tiny import tiny_model_dir

    return AutoConfig.from_pretrained(tiny_model_dir())


# -- direction ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_one_step_moves_the_response_logprob_with_the_sign_of_its_advantage(model, adv):
    """AdamW's first step is lr·sign(g) per weight, so log π(response) changes by ≈ lr·A·Σ|∂ log π/∂θ| / N: up
    for a positive advantage, down for a negative one."""
    samples = _on_policy(model, _samples(1, advantages=[adv]))
    before = sum(_logprobs(model, samples)[0])
    params = [p for p in model.parameters() if p.requires_grad]
    U.ppo_update(model, torch.optim.AdamW(params, lr=1e-3), samples, AlgorithmSection(),
                 TrainSection(updates_per_iter=1), temperature=1.0, dtype="float32", rng=random.Random(0))
    after = sum(_logprobs(model, samples)[0])
    assert (after - before) * adv > 1e-4, (before, after)


def test_a_mixed_batch_raises_positive_and_lowers_negative_responses(model):
    samples = _on_policy(model, _samples(4, advantages=[1.0, -1.0, 1.0, -1.0]))
    before = [sum(x) for x in _logprobs(model, samples)]
    params = [p for p in model.parameters() if p.requires_grad]
    U.ppo_update(model, torch.optim.AdamW(params, lr=1e-3), samples, AlgorithmSection(),
                 TrainSection(updates_per_iter=1, micro_batch=2), temperature=1.0, dtype="float32",
                 rng=random.Random(0))
    after = [sum(x) for x in _logprobs(model, samples)]
    moved = [(a - b) * s.advantages[0] for a, b, s in zip(after, before, samples)]
    assert all(m > 0 for m in moved), moved


# -- micro-batches, mini-batches --------------------------------------------------------------------------------
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                 "seq-mean-token-sum-norm"])
def test_micro_batch_accumulation_equals_one_large_batch(model, agg):
    """The same mini-batch in one forward (micro_batch 7), in 3+3+1 and in single rows: the same gradient."""
    samples = _samples(7, seed=1)
    for i, s in enumerate(samples):  # off-policy by a little, inside the clip range
        s.old_logprobs = [0.05 * ((i + j) % 3 - 1) + lp for j, lp in enumerate(_logprobs(model, [s])[0])]
    whole = _gradient(model, samples, micro_batch=7, agg=agg)
    for mb in (3, 1):
        _assert_same_gradient(whole, _gradient(model, samples, micro_batch=mb, agg=agg))


def test_the_update_on_the_device_gives_the_cpu_update_s_gradient(model, device):
    """Update parity across devices: the same rows (off-policy, KL term on, shared prefix) on ``device`` give
    the CPU's gradient (fp32)."""
    def rows():
        samples = _samples(6, seed=4)
        for i, s in enumerate(samples):
            s.old_logprobs = [0.05 * ((i + j) % 3 - 1) + lp for j, lp in enumerate(_logprobs(model, [s])[0])]
            s.ref_logprobs = [lp - 0.2 for lp in s.old_logprobs]
        return samples

    want = _gradient(model, rows(), micro_batch=4, kl_coef=0.3)
    moved = copy.deepcopy(model).to(device)
    got = _gradient(moved, rows(), micro_batch=4, kl_coef=0.3)
    assert {g.device.type for g in got} == {device}
    if exact_on(device):  # on the CPU both sides are one computation (case 1): the same kernels, rows and layout
        assert_same([g.cpu() for g in got], want, why="the CPU update of a copy of the model on the same rows")
    else:  # another device's kernels (case 2)
        _assert_same_gradient(want, [g.cpu() for g in got])


def test_gradient_checkpointing_leaves_the_update_s_gradient_unchanged(model):
    """With ``train.gradient_checkpointing`` the update runs the plain forward (the shared-prefix one needs the
    KV cache a checkpointed layer drops) and gets the same gradient."""
    from slea.policy.model import enable_gradient_checkpointing

    samples = _on_policy(model, _samples(6, seed=5))
    want = _gradient(model, copy.deepcopy(samples), micro_batch=3)
    ckpt = copy.deepcopy(model)
    enable_gradient_checkpointing(ckpt)
    assert U.share_prefix_for(model, sharded=False) and not U.share_prefix_for(ckpt, sharded=False)
    _assert_same_gradient(want, _gradient(ckpt, copy.deepcopy(samples), micro_batch=3))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_accumulation_of_the_kl_term_equals_one_large_batch(model, agg):
    """β · token-mean(KL) over the whole mini-batch, however it is cut into micro-batches."""
    samples = _on_policy(model, _samples(5, seed=2))
    for i, s in enumerate(samples):
        s.ref_logprobs = [lp - 0.3 * ((i + j) % 2) for j, lp in enumerate(s.old_logprobs)]
        s.advantages = [0.0] * len(s.advantages)  # the KL term alone
    whole = _gradient(model, samples, micro_batch=5, agg=agg, kl_coef=0.5)
    _assert_same_gradient(whole, _gradient(model, samples, micro_batch=2, agg=agg, kl_coef=0.5))


def test_minibatches_cover_every_row_once():
    for n, updates in ((7, 3), (4, 4), (3, 5), (10, 1)):
        minis = U.minibatches(n, updates, random.Random(n))
        assert len(minis) == min(updates, n)
        assert sorted(i for m in minis for i in m) == list(range(n))  # every row, exactly once
        assert max(map(len, minis)) - min(map(len, minis)) <= 1


@pytest.mark.parametrize("old_logprobs", ["recompute", "rollout"])
def test_ppo_update_trains_on_every_row_once_per_iteration(model, monkeypatch, old_logprobs):
    """Through the real update: 7 rows, 3 optimizer steps; the training forwards see each row exactly once, and
    with a recomputed π_old one no-grad forward before the first step sees each row of the later mini-batches."""
    seen: list[int] = []
    no_grad: list[int] = []
    steps: list[int] = []
    real = U.response_logprobs_entropy  # every forward of the update goes through it

    def recording(m, chunk, **kw):
        rows = [s.prompt_ids[6] - 100 for s in chunk]  # the row's own first token: its index
        (seen if torch.is_grad_enabled() else no_grad).extend(rows)
        return real(m, chunk, **kw)

    monkeypatch.setattr(U, "response_logprobs_entropy", recording)
    samples = _on_policy(model, _samples(7, seed=3))
    params = [p for p in model.parameters() if p.requires_grad]
    out = U.ppo_update(model, torch.optim.AdamW(params, lr=1e-4), samples, AlgorithmSection(old_logprobs=old_logprobs),
                       TrainSection(updates_per_iter=3, micro_batch=2), temperature=1.0, dtype="float32",
                       rng=random.Random(5), progress=lambda done, total: steps.append(done))
    assert sorted(seen) == list(range(7))
    first = U.minibatches(7, 3, random.Random(5))[0]  # on-policy: its π_old is its own forward, detached
    assert sorted(no_grad) == (sorted(set(range(7)) - set(first)) if old_logprobs == "recompute" else [])
    assert steps == [0, 1, 2] and out["skipped_updates"] == 0.0 and out["trained_samples"] == 7.0


# -- where the advantage goes -----------------------------------------------------------------------------------
def _rows(samples) -> list[Step]:
    return [Step(0, i, 0, f"obs {i}", s.prompt_ids, s.response_ids, [0.0] * len(s.response_ids))
            for i, s in enumerate(samples)]


def test_each_rows_advantage_reaches_exactly_its_response_tokens(model):
    """Per-row advantages as the trainer passes them (Advantages.per_token → to_samples → ppo_update). The loss
    gradient at the LM head's output is, at ratio 1 with token-mean over N response tokens,
    ∂L/∂z[i, j, :] = A_i / N · (softmax(z[i, j]) − onehot(target)) at the positions that predict a response
    token of row i, and exactly 0 at every prompt and padding position of the batch."""
    base = _samples(4, seed=4)
    rows = _rows(base)
    adv = np.array([2.0, -1.0, 0.5, -3.0])
    tokens = Advantages(adv).per_token([len(r.response_ids) for r in rows])
    samples = _on_policy(model, U.to_samples(rows, tokens, skip_zero=False))
    assert [s.advantages for s in samples] == [[a] * len(s.response_ids) for a, s in zip(adv, samples)]

    captured: list[torch.Tensor] = []

    def keep(_module, _inputs, out):
        if out.requires_grad:  # not π_old's no-grad recompute
            out.retain_grad()
            captured.append(out)

    hook = model.lm_head.register_forward_hook(keep)
    try:
        _gradient(model, samples, micro_batch=4)
    finally:
        hook.remove()
    lens = [len(s.response_ids) for s in samples]
    k = max(lens)
    (z,) = [t for t in captured if t.shape[:2] == (4, k + 1)]  # the rows' forward (not the shared prefix's)
    n_tokens = sum(lens)
    probs = torch.softmax(z.detach(), dim=-1)
    expected = torch.zeros_like(z)
    for i, s in enumerate(samples):
        for t, tok in enumerate(s.response_ids):
            j = k - lens[i] + t  # column j predicts the token at right-aligned position j + 1
            onehot = torch.nn.functional.one_hot(torch.tensor(tok), z.shape[-1]).float()
            expected[i, j] = adv[i] / n_tokens * (probs[i, j] - onehot)
    # case 2: autograd's log-softmax backward against the formula, in the update's dtype. Each element is
    # A_i/N · (p − onehot), p = exp(z − logsumexp(z)): p's relative error is the log-sum-exp's absolute one (a
    # reduction over the vocabulary of values up to ln V + 2·max|z|) plus a few roundings
    lse_scale = math.log(z.shape[-1]) + 2 * float(z.detach().abs().max())
    rel = tolerance(DTYPE, scale=lse_scale, stages=3, n=z.shape[-1])
    torch.testing.assert_close(z.grad.float(), expected.float(), rtol=rel,
                               atol=tolerance(DTYPE, scale=float(np.abs(adv).max()) / n_tokens))
    assert (z.grad[1, : k - lens[1]] == 0).all() and (z.grad[:, k] == 0).all()  # prompt / padding / past the end


# -- skip_zero_advantage -----------------------------------------------------------------------------------------
def test_to_samples_drops_rows_without_a_response_and_with_skip_zero_rows_with_zero_advantage():
    base = _samples(4, seed=5)
    rows = _rows(base)
    rows[3].response_ids = []  # e.g. an empty answer: nothing to train on
    tokens = [np.full(len(r.response_ids), a) for r, a in zip(rows, [1.0, 0.0, -1.0, 2.0])]
    tokens[2][0] = 0.0  # partly zero (a token-level estimator): kept
    kept = U.to_samples(rows, tokens, skip_zero=True)
    assert [s.prompt_ids for s in kept] == [rows[0].prompt_ids, rows[2].prompt_ids]
    assert kept[1].advantages == [0.0] + [-1.0] * (len(rows[2].response_ids) - 1)
    assert [s.prompt_ids for s in U.to_samples(rows, tokens, skip_zero=False)] == [r.prompt_ids for r in rows[:3]]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_skipping_zero_advantage_rows_shrinks_the_denominator(model, agg):
    """Skipped rows carry no gradient but count in the denominator when kept: under token-mean the skipped
    batch's gradient is the kept one's times N_all / N_kept (tokens), under seq-mean-token-mean times
    B_all / B_kept (rows)."""
    base = _samples(6, seed=6, advantages=[1.0, 0.0, -2.0, 0.0, 0.0, 0.5])
    rows = _rows(base)
    tokens = [np.asarray(s.advantages) for s in base]
    kept = _on_policy(model, U.to_samples(rows, tokens, skip_zero=False))
    skipped = _on_policy(model, U.to_samples(rows, tokens, skip_zero=True))
    assert len(kept) == 6 and len(skipped) == 3
    if agg == "token-mean":
        factor = sum(len(s.response_ids) for s in kept) / sum(len(s.response_ids) for s in skipped)
    else:
        factor = 6 / 3
    g_all = _gradient(model, kept, micro_batch=6, agg=agg)
    g_skip = _gradient(model, skipped, micro_batch=6, agg=agg)
    _assert_same_gradient([g * factor for g in g_all], g_skip)


# -- the KL reference ---------------------------------------------------------------------------------------------
def test_lora_reference_logprobs_equal_a_forward_of_the_base_model(tiny_policy):
    """π_ref of a LoRA policy is the policy with adapters disabled: its log-probs (at temperature 0.7) equal a
    plain forward of the base model loaded on its own, and differ from the adapted policy's."""
    torch.manual_seed(1)
    policy, _ = load_policy(ModelSection(name_or_path="tiny", lora=True, dtype="float32"))
    with torch.no_grad():  # LoRA's B starts at 0 (a no-op adapter): move it so the policy differs from its base
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    samples = _samples(5, seed=7)
    U.reference_logprobs(policy, samples, micro_batch=2, temperature=0.7, dtype="float32")
    base = tiny_policy[0]
    scaled = _Tempered(base, 0.7)
    bound = logprob_tolerance("float32", base.config, max_logit=_max_logit(scaled, samples))
    for s, want in zip(samples, _logprobs(scaled, samples)):
        assert_within(s.ref_logprobs, want, bound, why=LAYOUT)
    adapted = _logprobs(_Tempered(policy, 0.7), samples)
    assert max(abs(a - b) for s, row in zip(samples, adapted) for a, b in zip(s.ref_logprobs, row)) > 1e-3


def test_full_finetune_reference_logprobs_equal_a_forward_of_the_frozen_copy(model, tiny_policy):
    reference = tiny_policy[0]
    with torch.no_grad():  # the policy has moved away from its start
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    samples = _samples(4, seed=8)
    with pytest.raises(ValueError, match="frozen copy"):
        U.reference_logprobs(model, samples, micro_batch=4, temperature=1.0, dtype="float32")
    U.reference_logprobs(model, samples, reference=reference, micro_batch=3, temperature=1.0, dtype="float32")
    bound = logprob_tolerance("float32", reference.config, max_logit=_max_logit(reference, samples))
    for s, want, moved in zip(samples, _logprobs(reference, samples), _logprobs(model, samples)):
        assert_within(s.ref_logprobs, want, bound, why=LAYOUT)
        assert max(abs(a - b) for a, b in zip(s.ref_logprobs, moved)) > 1e-4


LAYOUT = "the update's batched, prefix-shared, left-padded forward against a plain forward per sample (case 2)"


@torch.no_grad()
def _max_logit(model, samples) -> float:
    return max(float(model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits.abs().max())
               for s in samples)


class _Tempered(torch.nn.Module):
    """A model whose logits are divided by a temperature (what the update's log-probs use)."""

    def __init__(self, inner, temperature: float):
        super().__init__()
        self.inner, self.temperature = inner, temperature

    def forward(self, **kw):
        out = self.inner(**kw)
        out.logits = out.logits / self.temperature
        return out


# -- π_old: recomputed by the training forward, the rollout's, or truncated importance sampling -----------------
def _off_by(samples, shift: float):
    """Rollout log-probs that differ from the training forward by ``shift`` per token alternating in sign (the
    generation-vs-training numerics gap, exaggerated)."""
    for s in samples:
        s.old_logprobs = [lp + shift * (-1) ** j for j, lp in enumerate(s.old_logprobs)]
    return samples


def _update(model, samples, lr: float = 0.0, **algo):
    params = [p for p in model.parameters() if p.requires_grad]
    return U.ppo_update(model, torch.optim.SGD(params, lr=lr), samples, AlgorithmSection(**algo),
                        TrainSection(updates_per_iter=2, micro_batch=3, grad_clip=NO_CLIP),
                        temperature=1.0, dtype="float32", rng=random.Random(0))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_recomputed_old_logprobs_start_the_first_minibatch_at_ratio_one_exactly(model, dtype):
    """The first, on-policy mini-batch: with π_old recomputed by the same forward, every token's ratio is exactly
    1 (fp32 and bf16 autocast); with the rollout's π_old it is the numerics gap."""
    samples = _off_by(_on_policy(model, _samples(7, seed=11)), 0.05)
    params = [p for p in model.parameters() if p.requires_grad]
    out = {}
    for mode in ("recompute", "rollout"):
        fresh = copy.deepcopy(samples)
        out[mode] = U.ppo_update(model, torch.optim.SGD(params, lr=0.0), fresh, AlgorithmSection(old_logprobs=mode),
                                 TrainSection(updates_per_iter=2, micro_batch=3), temperature=1.0, dtype=dtype,
                                 rng=random.Random(0))
    # case 1: π_old of the first mini-batch is that very forward's output, detached: ratio = e^(x − x) = 1 on any CPU
    for key in ("ratio_dev_onpolicy", "ratio_onpolicy_max_dev"):
        assert_same(out["recompute"][key], 0.0, why="π_old is the training forward's own output")
    assert out["rollout"]["ratio_dev_onpolicy"] > 0.03  # |e^±0.05 − 1| ≈ 0.05, plus bf16's own gap
    assert "mismatch_dev_mean" not in out["rollout"]


def test_the_logged_mismatch_is_the_rollout_versus_trainer_ratio_before_the_first_step(model):
    samples = _on_policy(model, _samples(6, seed=12))
    trainer = [list(s.old_logprobs) for s in samples]
    shifts = [0.1 * (i % 3) - 0.05 for i in range(6)]  # per row: −0.05, 0.05, 0.15, ...
    for s, d in zip(samples, shifts):
        s.old_logprobs = [lp - d for lp in s.old_logprobs]
    max_logit = _max_logit(model, samples)  # at the weights the mismatch is taken at
    out = _update(model, samples, lr=0.5, old_logprobs="recompute")  # the weights move after the first step
    devs = [abs(math.exp(d) - 1) for s, d in zip(samples, shifts) for _ in s.response_ids]
    # case 2: the trainer's log-probs (batched) against _on_policy's (a plain forward per sample): e^d moves by
    # e^d times their gap
    bound = math.exp(max(shifts)) * logprob_tolerance("float32", model.config, max_logit=max_logit)
    assert_within(out["mismatch_dev_mean"], np.mean(devs), bound, why=LAYOUT)
    assert_within(out["mismatch_max_dev"], max(devs), bound, why=LAYOUT)
    # π_old of every mini-batch is the pre-update training forward's, the rollout's is kept
    assert max(abs(a - b) for s, t in zip(samples, trainer) for a, b in zip(_logprobs(model, [s])[0], t)) > 1e-3
    for s, want in zip(samples, trainer):
        assert_within(s.trainer_logprobs, want, bound, why=LAYOUT)


def test_tis_weights_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    rollout = torch.tensor([[-1.0, -1.0, -2.0, -3.5]])
    # ratios: e^0 = 1, e^-1, e^1.5 = 4.48 capped at 2, e^0.5 = 1.65
    want = torch.tensor([[1.0, math.exp(-1.0), 2.0, math.exp(0.5)]])
    torch.testing.assert_close(U.tis_weights(trainer, rollout, cap=2.0), want)
    assert U.tis_weights(trainer, rollout, cap=5.0)[0, 2] == pytest.approx(math.exp(1.5))


def test_tis_gradient_equals_the_recompute_gradient_with_advantages_weighted_by_hand(model):
    """``tis``: the recomputed π_old in the ratio, and each token's loss weighted by min(π_trainer/π_rollout, C)."""
    samples = _on_policy(model, _samples(5, seed=13))
    trainer = [list(s.old_logprobs) for s in samples]
    for i, s in enumerate(samples):
        s.old_logprobs = [lp + 0.8 * ((i + j) % 3 - 1) for j, lp in enumerate(s.old_logprobs)]
    weighted = copy.deepcopy(samples)
    for s, tr in zip(weighted, trainer):
        s.advantages = [a * min(math.exp(t - r), 1.5) for a, t, r in zip(s.advantages, tr, s.old_logprobs)]

    def grad(rows, mode):
        params = [p for p in model.parameters() if p.requires_grad]
        U.ppo_update(model, torch.optim.SGD(params, lr=0.0), rows, AlgorithmSection(old_logprobs=mode, tis_cap=1.5),
                     TrainSection(updates_per_iter=1, micro_batch=2, grad_clip=NO_CLIP), temperature=1.0,
                     dtype="float32", rng=random.Random(0))
        return [p.grad.detach().clone() for p in params]

    tis = grad(copy.deepcopy(samples), "tis")
    _assert_same_gradient(tis, grad(weighted, "recompute"), dtype="float32")
    with pytest.raises(AssertionError):  # the weights matter: plain recompute differs
        _assert_same_gradient(tis, grad(copy.deepcopy(samples), "recompute"), dtype="float32")


def test_kl_to_a_fresh_lora_reference_is_exactly_zero_at_the_first_step():
    """π_ref (adapters disabled) and π_old come from the same pass as the first mini-batch's forward: with a
    fresh adapter (B = 0, the policy equals its reference) the KL term of the first step is exactly 0, in bf16."""
    torch.manual_seed(3)
    policy, _ = load_policy(ModelSection(name_or_path="tiny", lora=True, dtype="bfloat16"))
    samples = _samples(6, seed=14)
    params = [p for p in policy.parameters() if p.requires_grad]
    out = U.ppo_update(policy, torch.optim.SGD(params, lr=0.0), samples, AlgorithmSection(kl_coef=0.1),
                       TrainSection(updates_per_iter=1, micro_batch=4), temperature=1.0, dtype="bfloat16",
                       rng=random.Random(0), reference_needed=True)
    # case 1: π_ref's forward (adapters disabled) and π_θ's (a B = 0 adapter, which adds an exact 0 and casts back
    # to the base layer's dtype) run the same kernels on the same micro-batches, shared prefix and dtype
    why = "π_ref and π_θ are the same forward of the same micro-batches (a B = 0 adapter adds exactly 0)"
    assert_same(out["kl"], 0.0, why=why)
    assert_same(out["ratio_dev_onpolicy"], 0.0, why="π_old is the training forward's own output")
    assert_same([s.ref_logprobs for s in samples], [s.trainer_logprobs for s in samples], why=why)


# -- entropy: logged, and the bonus --------------------------------------------------------------------------
def _plain_entropy(model, samples) -> torch.Tensor:
    """Token-mean entropy of every response position's next-token distribution, by a plain full forward per
    sample, with its graph (independent of the update's batched layout and of slea.algorithms.entropy)."""
    total, n = 0.0, 0
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logits = model(input_ids=ids).logits[0].float()[len(s.prompt_ids) - 1:-1]
        p = torch.softmax(logits, -1)
        total = total + (-(p * torch.log(p)).sum(-1)).sum()
        n += len(s.response_ids)
    return total / n


def test_the_update_logs_the_trained_tokens_mean_entropy(model):
    samples = _on_policy(model, _samples(5, seed=3))
    with torch.no_grad():
        want = float(_plain_entropy(model, samples))
    params = [p for p in model.parameters() if p.requires_grad]
    # one mini-batch in micro-batches of 2 rows, weighted by their tokens: the token mean over all rows
    got = U.ppo_update(model, torch.optim.SGD(params, lr=0.0), samples, AlgorithmSection(),
                       TrainSection(updates_per_iter=1, micro_batch=2), temperature=1.0, dtype="float32",
                       rng=random.Random(0))["entropy"]
    assert want > 1.0  # a random tiny model is far from deterministic
    assert got == pytest.approx(want, rel=1e-5)


def test_the_entropy_bonus_adds_minus_c_times_the_entropy_gradient(model):
    """loss − c·H (token-mean): its gradient is the policy gradient minus c times ∇H, with ∇H from an
    independent plain forward."""
    c = 0.5
    samples = _on_policy(model, _samples(4, seed=5))
    params = [p for p in model.parameters() if p.requires_grad]

    def grad(coef):
        model.zero_grad(set_to_none=True)
        U.ppo_update(model, torch.optim.SGD(params, lr=0.0), copy.deepcopy(samples),
                     AlgorithmSection(entropy_coef=coef), TrainSection(updates_per_iter=1, micro_batch=2,
                                                                        grad_clip=NO_CLIP),
                     temperature=1.0, dtype="float32", rng=random.Random(0))
        return [p.grad.detach().clone() for p in params]

    pg, bonus = grad(0.0), grad(c)
    model.zero_grad(set_to_none=True)
    model.train()
    _plain_entropy(model, samples).backward()
    want = [g - c * p.grad for g, p in zip(pg, params)]
    assert max(float((b - g).abs().max()) for b, g in zip(bonus, pg)) > 0  # the bonus changes the gradient
    _assert_same_gradient(want, bonus)
