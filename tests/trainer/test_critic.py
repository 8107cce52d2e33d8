"""PPO / Turn-PPO: the advantages the registered estimators give from given values, value positions, critic
clipping."""

import numpy as np
import pytest
import torch

from slea.algorithms import StepBatch, compute_advantages, estimate, get_algorithm
from slea.config import build_config, estimator_settings
from slea.trainer.critic import Critic
from slea.trainer.update import right_aligned, to_samples
from slea.types import Step


def step(traj, t, reward, n_tokens, group=0):
    return Step(group_id=group, traj_id=traj, step=t, anchor=f"obs{t}", prompt_ids=[1, 2, 3 + t],
                response_ids=list(range(10, 10 + n_tokens)), old_logprobs=[-1.0] * n_tokens, reward=reward)


def run(rows, values, **algo_kw):
    """The estimator of ``algo_kw['name']`` on the rows, with the config's settings (as the trainer calls it)."""
    algo = build_config({"algorithm": {"adv_whiten": False, **algo_kw}}).algorithm
    spec = get_algorithm(algo.name)
    return estimate(spec, StepBatch.from_steps(rows, values), estimator_settings(algo, spec))


def test_turn_ppo_hand_case():
    # one trajectory, 3 turns, rewards 0,0,1; values 0.5,0.2,0.8; γ=0.9, λ=0.8
    # δ = [0.9·0.2−0.5, 0.9·0.8−0.2, 1−0.8] = [−0.32, 0.52, 0.2]
    # Â2 = 0.2, Â1 = 0.52 + 0.72·0.2 = 0.664, Â0 = −0.32 + 0.72·0.664 = 0.15808
    rows = [step(0, 2, 1.0, 2), step(0, 0, 0.0, 1), step(0, 1, 0.0, 3)]  # any row order
    values = [np.array([0.8]), np.array([0.5]), np.array([0.2])]
    adv = run(rows, values, name="turn_ppo", turn_gamma=0.9, turn_lambda=0.8)
    np.testing.assert_allclose(adv.rows, [0.2, 0.15808, 0.664])
    assert adv.tokens is None  # turn level: broadcast to the turn's tokens
    np.testing.assert_allclose(adv.per_token([2, 1, 3])[0], [0.2, 0.2])
    np.testing.assert_allclose(np.concatenate(adv.returns), [1.0, 0.65808, 0.864])  # Â + V
    # the functional entry point gives the same, and refuses to run without values
    got = compute_advantages("turn_ppo", [0, 0, 0], [0, 0, 0], [2, 0, 1], [1.0, 0.0, 0.0], turn_gamma=0.9,
                             values=[0.8, 0.5, 0.2], turn_lambda=0.8, adv_whiten=False)
    np.testing.assert_allclose(got, [0.2, 0.15808, 0.664])
    with pytest.raises(ValueError, match="critic's values"):
        compute_advantages("turn_ppo", [0], [0], [0], [1.0], turn_gamma=0.9, turn_lambda=0.8, adv_whiten=False)
    with pytest.raises(ValueError, match="token-level"):
        compute_advantages("ppo", [0], [0], [0], [1.0], values=[[0.0]], gae_gamma=1.0, gae_lambda=1.0,
                           adv_whiten=False)


def test_ppo_token_level_hand_case():
    # trajectory 0: turn 0 has 2 tokens (values .1,.2, reward −.1), turn 1 has 1 token (value .5, reward 1)
    # laid end to end: r = [0, −.1, 1], V = [.1, .2, .5]; γ = 0.9, λ = 0.5 (γλ = 0.45)
    # δ2 = 1 − .5 = .5            Â2 = .5
    # δ1 = −.1 + .9·.5 − .2 = .15  Â1 = .15 + .45·.5 = .375
    # δ0 = 0 + .9·.2 − .1 = .08    Â0 = .08 + .45·.375 = .24875
    # trajectory 1 (other group): one turn, 2 tokens, values 0, reward 2: δ = [0, 2], Â = [γλ·2, 2]
    rows = [step(0, 1, 1.0, 1), step(5, 0, 2.0, 2, group=1), step(0, 0, -0.1, 2)]
    values = [np.array([0.5]), np.zeros(2), np.array([0.1, 0.2])]
    adv = run(rows, values, name="ppo", gae_gamma=0.9, gae_lambda=0.5)
    np.testing.assert_allclose(adv.tokens[0], [0.5])
    np.testing.assert_allclose(adv.tokens[2], [0.24875, 0.375])
    np.testing.assert_allclose(adv.tokens[1], [0.9, 2.0])
    np.testing.assert_allclose(adv.rows, [0.5, 1.45, (0.24875 + 0.375) / 2])
    np.testing.assert_allclose(adv.returns[2], [0.34875, 0.575])  # Â + V
    # what ppo_update consumes: right-aligned per-token advantages, one layout for every algorithm
    samples = to_samples(rows, adv.per_token([1, 2, 2]), skip_zero=True)
    k = 3
    np.testing.assert_allclose(right_aligned([samples[2].advantages, [0.7, 0.7]], k).numpy(),
                               [[0, 0.24875, 0.375], [0, 0.7, 0.7]], atol=1e-7)


def test_whitening_and_turn_without_tokens():
    rows = [step(0, 0, 0.0, 2), step(0, 1, 1.0, 0), step(1, 0, 0.0, 1)]
    values = [np.zeros(2), np.zeros(0), np.zeros(1)]
    adv = run(rows, values, name="ppo", gae_gamma=1.0, gae_lambda=1.0)
    np.testing.assert_allclose(adv.tokens[0], [1.0, 1.0])  # the token-less turn's reward lands on the last token
    assert adv.tokens[1].size == 0
    whitened = run(rows, values, name="ppo", adv_whiten=True, gae_gamma=1.0, gae_lambda=1.0)
    samples = to_samples(rows, whitened.per_token([2, 0, 1]), skip_zero=False)
    flat = np.concatenate([s.advantages for s in samples])
    assert len(samples) == 2 and abs(flat.mean()) < 1e-9 and abs(flat.std(ddof=1) - 1) < 1e-3
    np.testing.assert_allclose(np.concatenate(whitened.returns), np.concatenate(adv.returns))  # targets raw


def _critic(**train):
    cfg = build_config({"algorithm": {"name": "turn_ppo", "value_clip": 0.2},
                        "train": {"critic_lr": 0.02, "critic_updates": 100, **train}})

    class Stub:
        config = type("C", (), {"hidden_size": 2})()

    assert "critic" in get_algorithm(cfg.algorithm.name).needs
    return Critic(Stub(), "turn", algorithm=cfg.algorithm, train=cfg.train, dtype=cfg.model.dtype)


def _fit(critic, clip):
    critic.algo.value_clip = clip
    feats = torch.eye(2)
    critic._cache = ([feats[:1], feats[1:]], [np.zeros(1), np.zeros(1)])  # what values() keeps
    m = critic.update([np.array([10.0]), np.array([0.1])])
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


def test_value_features_shared_prefix_equals_plain(tiny_policy, device):
    import copy

    from slea.policy.value import value_features

    model = tiny_policy[0] if device == "cpu" else copy.deepcopy(tiny_policy[0]).to(device)
    system = list(range(40, 70))
    prompts = [system + [5, 6], system + [7], system + [5, 6]]  # copies of a task share whole prompts
    responses = [[20, 21, 22], [30], [23, 24]]
    for level in ("token", "turn"):
        shared = value_features(model, prompts, responses, level, micro_batch=3)
        plain = value_features(model, prompts, responses, level, micro_batch=3, share_prefix=False)
        cpu = value_features(tiny_policy[0], prompts, responses, level, micro_batch=3)
        for a, b, c in zip(shared, plain, cpu):
            assert a.device.type == device
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(a.cpu(), c, atol=1e-4, rtol=1e-4)


def test_the_critic_lives_and_learns_on_the_policys_device(tiny_policy, device):
    import copy

    model = tiny_policy[0] if device == "cpu" else copy.deepcopy(tiny_policy[0]).to(device)
    cfg = build_config({"algorithm": {"name": "ppo"}, "train": {"critic_updates": 3}})
    critic = Critic(model, "turn", algorithm=cfg.algorithm, train=cfg.train, dtype=cfg.model.dtype)
    assert critic.head.linear.weight.device.type == device
    rows = [step(0, 0, 1.0, 2), step(1, 0, 0.0, 3)]
    vals = critic.values(model, rows)
    assert [v.shape for v in vals] == [(1,), (1,)] and all(float(v[0]) == 0.0 for v in vals)  # V ≡ 0 at start
    met = critic.update([np.array([1.0]), np.array([0.0])])
    assert met["values_new_mean"] != 0.0 and np.isfinite(met["vf_loss"])
