"""PPO / Turn-PPO: the advantages the trainer assigns from given values, value positions, critic clipping."""

import numpy as np
import pytest
import torch

from slea.algorithms import compute_advantages
from slea.config import build_config
from slea.trainer.critic import Critic, assign_advantages, needs_critic, token_advantages
from slea.trainer.update import Sample, _advantages
from slea.types import Step


def step(traj, t, reward, n_tokens, group=0):
    return Step(group_id=group, traj_id=traj, step=t, anchor=f"obs{t}", prompt_ids=[1, 2, 3 + t],
                response_ids=list(range(10, 10 + n_tokens)), old_logprobs=[-1.0] * n_tokens, reward=reward)


def algo(**kw):
    return build_config({"algorithm": {"adv_whiten": False, **kw}}).algorithm


def test_turn_ppo_hand_case():
    # one trajectory, 3 turns, rewards 0,0,1; values 0.5,0.2,0.8; γ=0.9, λ=0.8
    # δ = [0.9·0.2−0.5, 0.9·0.8−0.2, 1−0.8] = [−0.32, 0.52, 0.2]
    # Â2 = 0.2, Â1 = 0.52 + 0.72·0.2 = 0.664, Â0 = −0.32 + 0.72·0.664 = 0.15808
    rows = [step(0, 2, 1.0, 2), step(0, 0, 0.0, 1), step(0, 1, 0.0, 3)]  # any row order
    values = [np.array([0.8]), np.array([0.5]), np.array([0.2])]
    samples, row_adv, targets = assign_advantages(rows, values, algo(name="turn_ppo", turn_gamma=0.9,
                                                                     turn_lambda=0.8), "turn")
    np.testing.assert_allclose(row_adv, [0.2, 0.15808, 0.664])
    np.testing.assert_allclose([s.advantage for s in samples], [0.2, 0.15808, 0.664])
    assert all(s.token_advantages is None for s in samples)  # broadcast to the turn's tokens
    np.testing.assert_allclose(np.concatenate(targets), [1.0, 0.65808, 0.864])  # Â + V
    # the registered estimator gives the same, and refuses to run without values
    adv = compute_advantages("turn_ppo", [0, 0, 0], [0, 0, 0], [2, 0, 1], [1.0, 0.0, 0.0], gamma=0.9,
                             values=[0.8, 0.5, 0.2], lam=0.8)
    np.testing.assert_allclose(adv, [0.2, 0.15808, 0.664])
    with pytest.raises(ValueError, match="learned critic"):
        compute_advantages("turn_ppo", [0], [0], [0], [1.0])
    with pytest.raises(ValueError, match="learned critic"):
        compute_advantages("ppo", [0], [0], [0], [1.0])


def test_ppo_token_level_hand_case():
    # trajectory 0: turn 0 has 2 tokens (values .1,.2, reward −.1), turn 1 has 1 token (value .5, reward 1)
    # laid end to end: r = [0, −.1, 1], V = [.1, .2, .5]; γ = 0.9, λ = 0.5 (γλ = 0.45)
    # δ2 = 1 − .5 = .5            Â2 = .5
    # δ1 = −.1 + .9·.5 − .2 = .15  Â1 = .15 + .45·.5 = .375
    # δ0 = 0 + .9·.2 − .1 = .08    Â0 = .08 + .45·.375 = .24875
    # trajectory 1 (other group): one turn, 2 tokens, values 0, reward 2: δ = [0, 2], Â = [γλ·2, 2]
    rows = [step(0, 1, 1.0, 1), step(5, 0, 2.0, 2, group=1), step(0, 0, -0.1, 2)]
    values = [np.array([0.5]), np.zeros(2), np.array([0.1, 0.2])]
    samples, row_adv, targets = assign_advantages(rows, values, algo(name="ppo", gae_gamma=0.9, gae_lambda=0.5),
                                                  "token")
    got = {(s.prompt_ids[-1], len(s.response_ids)): s.token_advantages for s in samples}
    np.testing.assert_allclose(got[(4, 1)], [0.5])
    np.testing.assert_allclose(got[(3, 2)], [0.24875, 0.375])
    np.testing.assert_allclose(samples[1].token_advantages, [0.9, 2.0])
    np.testing.assert_allclose(row_adv, [0.5, 1.45, (0.24875 + 0.375) / 2])
    np.testing.assert_allclose(targets[2], [0.34875, 0.575])  # Â + V
    # what ppo_update broadcasts: right-aligned per-token advantages (scalar samples broadcast)
    k = 3
    mixed = [samples[2], Sample([1], [7, 8], [0.0, 0.0], 0.7)]
    np.testing.assert_allclose(_advantages(mixed, k).numpy(), [[0, 0.24875, 0.375], [0, 0.7, 0.7]], atol=1e-7)


def test_whitening_and_turn_without_tokens():
    rows = [step(0, 0, 0.0, 2), step(0, 1, 1.0, 0), step(1, 0, 0.0, 1)]
    adv, _ = token_advantages(rows, [np.zeros(2), np.zeros(0), np.zeros(1)], 1.0, 1.0)
    np.testing.assert_allclose(adv[0], [1.0, 1.0])  # the token-less turn's reward lands on the last token
    assert adv[1].size == 0
    samples, _, _ = assign_advantages(rows, [np.zeros(2), np.zeros(0), np.zeros(1)],
                                      algo(name="ppo", adv_whiten=True, gae_gamma=1.0, gae_lambda=1.0), "token")
    flat = np.concatenate([s.token_advantages for s in samples])
    assert len(samples) == 2 and abs(flat.mean()) < 1e-9 and abs(flat.std(ddof=1) - 1) < 1e-3


def _critic(**train):
    cfg = build_config({"algorithm": {"name": "turn_ppo", "value_clip": 0.2},
                        "train": {"critic_lr": 0.02, "critic_updates": 100, **train}})

    class Stub:
        config = type("C", (), {"hidden_size": 2})()

    assert needs_critic(cfg)
    return Critic(cfg, Stub())


def _fit(critic, clip):
    critic.algo.value_clip = clip
    feats = torch.eye(2)
    old = torch.zeros(2)
    ret = torch.tensor([10.0, 0.1])
    critic._batch = (feats, old, ret)
    m = critic.update()
    with torch.no_grad():
        return critic.head(feats), m


def test_critic_value_clipping_in_an_update():
    torch.manual_seed(0)
    clipped, m = _fit(_critic(), 0.2)
    unclipped, m2 = _fit(_critic(), None)
    # with clipping the loss has no gradient once V leaves old ± clip: V stops near 0.2 (Adam's momentum
    # and the bias shared with the other position carry it a little further)
    assert clipped[0] < 0.2 + 0.5
    assert m["vf_clip_frac"] > 0
    # without clipping it moves much further towards the return 10
    assert unclipped[0] > 3.0
    assert m2["vf_clip_frac"] == 0
    # the small target (0.1) is inside the clip range: both reach it
    assert abs(float(clipped[1]) - 0.1) < 0.05


def test_critic_state_round_trip():
    a, b = _critic(), _critic()
    _fit(a, 0.2)
    tensors, meta = a.state_tensors()
    b.load_state(tensors, meta)
    assert torch.equal(a.head.linear.weight, b.head.linear.weight)
    assert b.optimizer.state_dict()["state"][0]["exp_avg"].shape == (1, 2)


def test_value_features_read_the_right_positions(tiny_policy):
    from slea.policy.value import backbone, value_features

    model, _ = tiny_policy
    prompts = [[5, 6, 7, 8, 9], [11, 12]]
    responses = [[20, 21, 22], [30]]
    tok = value_features(model, prompts, responses, "token", micro_batch=2)
    turn = value_features(model, prompts, responses, "turn", micro_batch=2)
    assert [t.shape[0] for t in tok] == [3, 1] and [t.shape[0] for t in turn] == [1, 1]
    with torch.no_grad():
        full = backbone(model)(input_ids=torch.tensor([prompts[0] + responses[0]])).last_hidden_state[0]
    # value before response token j = hidden state at the position that predicts it
    torch.testing.assert_close(tok[0], full[4:7], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(turn[0][0], full[4], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(tok[1][0], turn[1][0], atol=1e-4, rtol=1e-4)


def test_value_head_leaves_the_rng_stream_alone():
    from slea.policy.value import ValueHead

    torch.manual_seed(3)
    ref = torch.rand(3)
    torch.manual_seed(3)
    head = ValueHead(16)
    assert torch.equal(torch.rand(3), ref)
    assert float(head(torch.randn(2, 16)).detach().abs().sum()) == 0.0  # zero-initialised


def test_value_features_shared_prefix_equals_plain(tiny_policy):
    from slea.policy.value import value_features

    model, _ = tiny_policy
    system = list(range(40, 70))
    prompts = [system + [5, 6], system + [7], system + [5, 6]]  # copies of a task share whole prompts
    responses = [[20, 21, 22], [30], [23, 24]]
    for level in ("token", "turn"):
        shared = value_features(model, prompts, responses, level, micro_batch=3)
        plain = value_features(model, prompts, responses, level, micro_batch=3, share_prefix=False)
        for a, b in zip(shared, plain):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
