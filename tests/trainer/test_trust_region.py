"""The TeamTR single-agent update loop: β adapted until the measured token KL is within δ."""

from __future__ import annotations

import pytest
import torch

from slea.algorithms.teamtr import team_advantage, teamtr_surrogate, token_kl
from slea.trainer.trust_region import TrustRegion, trust_region_update

TR = TrustRegion(delta=0.01, min_steps=3, max_steps=40, factor=2.0, beta_min=1e-3, beta_max=1e3)


class ToyPolicy:
    """A context-free categorical policy over 6 tokens; a message is 3 tokens drawn independently."""

    def __init__(self, lr: float):
        self.theta = torch.nn.Parameter(torch.zeros(6))
        self.opt = torch.optim.Adam([self.theta], lr=lr)
        gen = torch.Generator().manual_seed(0)
        self.tokens = torch.multinomial(torch.full((6,), 1 / 6), 64 * 3, replacement=True, generator=gen).view(64, 3)
        self.mask = torch.ones(64, 3)
        self.logp_cur = self.logp().detach()  # π_cur: the rollouts' policy
        returns = (self.tokens == 0).sum(-1).float().numpy()  # reward: how often the message says token 0
        self.adv = torch.tensor(team_advantage(returns, [0] * 64, a_clip=3.0, eps_norm=1e-6), dtype=torch.float32)

    def logp(self) -> torch.Tensor:
        return torch.log_softmax(self.theta, -1)[self.tokens]

    def step(self, beta: float) -> dict[str, float]:
        self.opt.zero_grad()
        s = teamtr_surrogate(self.logp(), self.logp_cur, self.adv, self.mask, clip_eps=0.2, beta=beta)
        (-s.objective).backward()
        self.opt.step()
        return {"surrogate": float(s.clipped.detach())}

    def kl(self) -> float:
        with torch.no_grad():
            return float(token_kl(self.logp_cur, self.logp(), self.mask))

    def exact_kl(self) -> float:
        """KL(π_cur ‖ π_new) of a whole message: 3 × the per-token categorical KL."""
        with torch.no_grad():
            cur = torch.log_softmax(torch.zeros(6), -1)
            return float(3 * (cur.exp() * (cur - torch.log_softmax(self.theta, -1))).sum())

    def save(self):
        return self.theta.detach().clone()

    def restore(self, saved) -> None:
        with torch.no_grad():
            self.theta.copy_(saved)


def test_adaptive_beta_loop_stops_within_delta_on_a_toy_policy():
    toy = ToyPolicy(lr=0.3)
    res = trust_region_update(toy.step, toy.kl, toy.save, toy.restore, beta=TR.beta_min, tr=TR)
    assert res.kl <= TR.delta and toy.kl() == res.kl
    assert toy.exact_kl() > 1e-4  # it moved (d̂ is a sample estimate of this: it may even be negative)
    assert any(k > TR.delta for k in res.kl_history)  # the lr overshoots: the rule had to act ...
    assert max(res.beta_history) > TR.beta_min  # ... by raising β
    assert torch.softmax(toy.theta, -1)[0] > 1 / 6  # and the rewarded token became more likely
    assert res.steps == len(res.kl_history) <= TR.max_steps

    # the same optimizer steps without the penalty leave the trust region: the loop is what kept it inside
    free = ToyPolicy(lr=0.3)
    for _ in range(res.steps):
        free.step(0.0)
    assert free.kl() > TR.delta


def test_a_loop_that_ends_outside_restores_the_last_iterate_inside():
    # weights are a counter: each step adds 1, d̂ = .004 × weight. δ .01: inside after steps 1, 2; outside from 3.
    w = [0]
    tr = TrustRegion(delta=0.01, min_steps=3, max_steps=5, factor=2.0, beta_min=0.01, beta_max=10.0)

    def step(beta):
        w[0] += 1
        return {}

    res = trust_region_update(step, lambda: 0.004 * w[0], lambda: w[0], lambda saved: w.__setitem__(0, saved),
                              beta=0.1, tr=tr)
    # steps 1, 2 inside (β .1 → .05 → .05: .004 < δ/2 halves it, .008 keeps it); 3, 4, 5 outside (β ×2 each)
    assert res.kl_history == [0.004, 0.008, 0.012, 0.016, 0.02]
    assert res.beta_history == [0.1, 0.05, 0.05, 0.1, 0.2]
    assert res.steps == 5 and res.reverted and w[0] == 2 and res.kl == 0.008
    assert res.beta == 0.4


class SubsetStep:
    """TeamTR's trainer on a toy: a context-free categorical policy over 6 tokens, 16 messages of 3 tokens sampled
    from ``π_cur`` (uniform). 4 messages say "0 0 0" and have advantage +1; the 12 others say only tokens 1-5 and
    have advantage 0. A step trains the surrogate on the 4 (the messages a loss skipping zero advantages keeps)
    and adds ``β·d̂`` over all 16, as slea's TeamTR trainer does."""

    def __init__(self, lr: float):
        self.theta = torch.nn.Parameter(torch.zeros(6))
        self.opt = torch.optim.Adam([self.theta], lr=lr)
        others = [[1, 2, 3], [4, 5, 1], [2, 3, 4], [5, 1, 2], [3, 4, 5], [1, 3, 5],
                  [2, 4, 1], [3, 5, 2], [4, 1, 3], [5, 2, 4], [1, 1, 2], [5, 5, 4]]
        self.tokens = torch.tensor([[0, 0, 0]] * 4 + others)
        self.trained = torch.arange(16) < 4
        self.mask = torch.ones(16, 3)
        self.logp_cur = self.logp().detach()
        self.adv = self.trained.float()

    def logp(self) -> torch.Tensor:
        return torch.log_softmax(self.theta, -1)[self.tokens]

    def step(self, beta: float) -> dict[str, float]:
        self.opt.zero_grad()
        t = self.trained
        s = teamtr_surrogate(self.logp()[t], self.logp_cur[t], self.adv[t], self.mask[t], clip_eps=0.2, beta=0.0)
        (-s.objective + beta * token_kl(self.logp_cur, self.logp(), self.mask)).backward()
        self.opt.step()
        self.stepped = self.save()  # the weights the step reached (the loop may restore earlier ones)
        return {}

    def monitor(self) -> float:
        """Eq.11 over all 16 messages with the default estimator (k3)."""
        with torch.no_grad():
            return float(token_kl(self.logp_cur, self.logp(), self.mask))

    def old_monitor(self) -> float:
        """What slea measured before: k1 on the trained messages only."""
        with torch.no_grad():
            t = self.trained
            return float(token_kl(self.logp_cur[t], self.logp()[t], self.mask[t], "k1"))

    def save(self):
        return self.theta.detach().clone()

    def restore(self, saved) -> None:
        with torch.no_grad():
            self.theta.copy_(saved)


def test_a_step_on_some_messages_that_moves_the_others_outside_delta_is_caught_and_beta_grows():
    tr = TrustRegion(delta=0.01, min_steps=1, max_steps=1, factor=2.0, beta_min=1e-3, beta_max=1e3)
    toy = SubsetStep(lr=0.2)
    res = trust_region_update(toy.step, toy.monitor, toy.save, toy.restore, beta=0.01, tr=tr)
    # Adam's first step moves every logit by lr against its gradient's sign: θ = (.2, −.2 × 5). At θ = 0 the
    # penalty has no gradient (k3's is 0 at r = 1), so β does not matter for this step.
    #   π_new(0) = e^.2 / (e^.2 + 5 e^−.2) = .2298005, π_new(k) = .1540399; r = 6π: 1.3788031, .9242394
    #   k3 per token: r − 1 − ln r = .0575873 (token 0), .0030236 (tokens 1-5)
    #   d̂ = (4 messages × 3 × .0575873 + 12 × 3 × .0030236) / 16 = .0499935 > δ
    assert res.kl_history == [pytest.approx(0.0499935, abs=1e-6)]
    # the exact KL(π_cur ‖ π_new) of a message, 3 Σ_k (1/6) ln((1/6)/π_new(k)) = .0363525, is outside δ too
    assert toy.stepped.tolist() == pytest.approx([0.2, -0.2, -0.2, -0.2, -0.2, -0.2], abs=1e-6)
    exact = 3 * float((torch.log(torch.tensor(1 / 6)) - torch.log_softmax(toy.stepped, -1)).mean())
    assert exact == pytest.approx(0.0363525, abs=1e-6) and exact > tr.delta
    # caught: the step is undone (back at θ = 0, where d̂ = 0) and β doubled for the agent's next update
    assert res.reverted and res.kl == 0.0 and torch.equal(toy.theta.detach(), torch.zeros(6))
    assert res.beta_history == [0.01] and res.beta == pytest.approx(0.02)

    # the monitor slea used before, k1 on the 4 messages the step trained: 3 (ln 1/6 − ln .2298005) = −.9636475,
    # "inside", so the same step was accepted and β halved
    old = SubsetStep(lr=0.2)
    res = trust_region_update(old.step, old.old_monitor, old.save, old.restore, beta=0.01, tr=tr)
    assert res.kl_history == [pytest.approx(-0.9636475, abs=1e-6)]
    assert not res.reverted and res.beta == pytest.approx(0.005)
    # and k1 over all 16 messages still reads negative (−.0636475: the sample over-represents token 0), k3 does not
    assert float(token_kl(old.logp_cur, old.logp().detach(), old.mask, "k1")) == pytest.approx(-0.0636475, abs=1e-6)
    assert old.monitor() == pytest.approx(0.0499935, abs=1e-6)
