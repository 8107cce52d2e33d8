"""One TeamTR single-agent update: optimizer steps with the Eq.10 penalty, β adapted until ``d̂ ≤ δ_i``.

The loop is policy-agnostic: it gets callables for one optimizer step under a given β, for measuring the token KL
(Eq.11) of the current weights against ``π_cur``, and for saving / restoring the agent's weights. Eq.11 averages
over ``M_j``, every message of the agent in the rollouts (not only those the step trained on, whose likelihood the
step has just raised: there the printed k1 estimate reads negative after most steps), and the TeamTR trainer
measures it so, with the never-negative k3 estimate by default (slea/trainer/team.py). The decisions are :func:`slea.algorithms.teamtr.adapt_beta`'s (a pure function): after each step it
raises or relaxes β and says when to stop. The weights the loop ends with are always inside the trust region:
when it stops outside (``max_steps`` reached), the last iterate that was inside is restored (the pre-update
weights at worst, where ``d̂ = 0``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slea.algorithms.teamtr import adapt_beta


@dataclass(frozen=True)
class TrustRegion:
    """The trust-region settings of one single-agent update (``team.trust_region`` in the config)."""

    delta: float
    min_steps: int
    max_steps: int
    factor: float
    beta_min: float
    beta_max: float


@dataclass
class TrustRegionResult:
    """What one single-agent update did: ``kl`` is ``d̂`` of the weights it ended with (≤ δ), ``beta`` the β
    to start the agent's next update with, ``reverted`` whether it restored an earlier iterate."""

    kl: float
    beta: float
    steps: int
    reverted: bool
    kl_history: list[float] = field(default_factory=list)
    beta_history: list[float] = field(default_factory=list)
    step_metrics: dict[str, float] = field(default_factory=dict)  # the last step's loss metrics
    skipped: int = 0  # steps the numerical guard skipped (a non-finite loss or gradient: the weights kept)


def trust_region_update(step: Callable[[float], dict[str, float]], measure_kl: Callable[[], float],
                        save: Callable[[], Any], restore: Callable[[Any], None], beta: float,
                        tr: TrustRegion) -> TrustRegionResult:
    """Run optimizer steps ``step(beta)`` until :func:`adapt_beta` stops, measuring ``d̂`` after each one.

    ``save()`` is called on the pre-update weights and after every step that ends inside the region;
    ``restore(saved)`` when the loop stops outside it."""
    inside = save()
    kls: list[float] = []
    betas: list[float] = []
    metrics: dict[str, float] = {}
    kl = 0.0
    steps = skipped = 0
    while True:
        metrics = step(beta)
        steps += 1
        skipped += bool(metrics.get("skipped"))
        kl = float(measure_kl())
        betas.append(beta)
        kls.append(kl)
        d = adapt_beta(kl, tr.delta, beta, steps_done=steps, min_steps=tr.min_steps, max_steps=tr.max_steps,
                       factor=tr.factor, beta_min=tr.beta_min, beta_max=tr.beta_max)
        beta = d.beta
        if d.within and not d.stop:
            inside = save()
        if d.stop:
            break
    reverted = not d.within
    if reverted:
        restore(inside)
        kl = float(measure_kl())
    return TrustRegionResult(kl, beta, steps, reverted, kls, betas, metrics, skipped)
