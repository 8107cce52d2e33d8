"""Library evolution input: split the batch at η, pick the trajectories to learn from, distil candidates.

SLEA-RL §3.4: ``T+ = {τ : R(τ) > η}``, ``T− = {τ : R(τ) <= η}`` with η the batch median by default (a fixed
threshold via ``ExperienceSection.eta``); the top-K_traj of T+ yield strategies (zone ``pos``), the bottom-K_traj
of T− warnings (zone ``neg``); every candidate is linked to the observation clusters of the steps it came from
(``Step.cluster_id``).

Two choices differ from the paper's letter, both configurable (docs/experience.md, "Extraction"):

* ``experience.eta_tie`` — ``"top"`` (default): when η equals the batch's best return (half the batch or more at
  the top) and the batch is not all-equal, T+ = {R >= η} (the trajectories at the top) and T− = {R < η};
  ``"strict"``: the paper's T+ = {R > η} as printed, under which T+ is empty as soon as half the batch wins.
* ``experience.warning_score`` — extractors report ``Candidate.score = R(τ_source)`` (the paper's
  ``z_e = R``); :func:`extract_candidates` keeps that for strategies and, with ``"neg_return"`` (default),
  stores ``z = −R`` for warnings, so the worst failure is tried first, kept over milder ones on admission and
  retrieved first (library and retrieval rank every zone by "higher z first"). ``"return"``: z = R, as printed.

Extractors are registered by name (``experience.extractor``; a user's own with :func:`register_extractor`, from a
plugin module): a factory ``f(generate_text) -> extractor`` whose result has ``extract(pos, neg) ->
list[Candidate]`` (``generate_text(prompts) -> texts`` is handed in by the trainer, ``None`` when there is no
model to ask; a prompt is a plain user message or a list of chat messages ``{"role", "content"}``). The built-in
ones live in their own modules, imported by the registry on the first lookup that misses:

* ``rule`` (:mod:`slea.experience.rule_extractor`, ``RuleExtractor``) — deterministic lessons about the task
  *type*, with object and room names replaced by placeholders; the default, and the fallback of ``llm``.
* ``llm`` (:mod:`slea.experience.llm_extractor`, ``LLMExtractor``) — lessons distilled by ``generate_text``
  from chat prompts, parsed defensively; a trajectory whose answer yields nothing falls back to the rules.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slea.plugins import Registry
from slea.types import Trajectory

Prompt = str | list[dict[str, str]]  # a user message, or chat messages (system + user)
GenerateText = Callable[[list[Prompt]], list[str]]
# the built-in extractors register themselves when these modules are imported (on the first lookup that misses)
EXTRACTORS: Registry[Callable] = Registry(
    "experience extractor", ("slea.experience.rule_extractor", "slea.experience.llm_extractor"))
ETA_TIES = ("top", "strict")
WARNING_SCORES = ("neg_return", "return")


def register_extractor(name: str, *, replace: bool = False):
    """Decorator: register ``factory(generate_text) -> extractor`` (``extract(pos, neg) -> list[Candidate]``)."""
    return EXTRACTORS.decorator(name, replace=replace)


def get_extractor(name: str) -> Callable:
    """The extractor factory registered as ``name`` (or ``"module:function"``)."""
    return EXTRACTORS.get(name)


@dataclass
class Candidate:
    text: str
    zone: str  # "pos" | "neg"
    level: str
    score: float  # as reported by an extractor: R(τ_source); extract_candidates maps warnings to their z
    task_type: str = ""
    context: str = ""
    sources: list[int] = field(default_factory=list)
    clusters: list[int] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------
# Outcome split
# ---------------------------------------------------------------------------------------------------------------
def eta_value(returns: Sequence[float], eta: str | float = "median") -> float:
    if isinstance(eta, str):
        if eta != "median":
            raise ValueError(f"eta must be 'median' or a number, got {eta!r}")
        return float(statistics.median(returns)) if returns else 0.0
    return float(eta)


def split_outcomes(trajs: Sequence[Trajectory], eta: str | float = "median", tie: str = "top"
                   ) -> tuple[float, list[Trajectory], list[Trajectory]]:
    """(η, T+, T−): T+ = R > η and T− = R <= η; with ``tie="top"``, when nothing beats η because η is the
    batch's best return (and some trajectory is below it), T+ = R >= η and T− = R < η."""
    if tie not in ETA_TIES:
        raise ValueError(f"tie must be one of {ETA_TIES}, got {tie!r}")
    rets = [t.episode_return for t in trajs]
    e = eta_value(rets, eta)
    pos = [t for t, r in zip(trajs, rets) if r > e]
    if not pos and tie == "top" and rets and max(rets) == e and min(rets) < e:
        pos = [t for t, r in zip(trajs, rets) if r >= e]
        neg = [t for t, r in zip(trajs, rets) if r < e]
        return e, pos, neg
    neg = [t for t, r in zip(trajs, rets) if r <= e]
    return e, pos, neg


def select(trajs: Sequence[Trajectory], eta: str | float = "median", k_traj: int = 5, tie: str = "top"
           ) -> tuple[float, list[Trajectory], list[Trajectory]]:
    """η, the top-k of T+ (highest R first, shorter first) and the bottom-k of T− (lowest R first)."""
    e, pos, neg = split_outcomes(trajs, eta, tie)
    pos = sorted(pos, key=lambda t: (-t.episode_return, len(t.steps), t.traj_id))[:k_traj]
    neg = sorted(neg, key=lambda t: (t.episode_return, -len(t.steps), t.traj_id))[:k_traj]
    return e, pos, neg


def warning_z(ret: float, mode: str = "neg_return") -> float:
    """The library score of a warning distilled from a trajectory of return ``ret``: ``−R`` (``neg_return``:
    the clearest failure ranks first) or ``R`` (``return``, the paper as printed)."""
    if mode not in WARNING_SCORES:
        raise ValueError(f"warning_score must be one of {WARNING_SCORES}, got {mode!r}")
    r = float(ret)
    return (-r if r != 0 else 0.0) if mode == "neg_return" else r



def step_clusters(steps, cap: int = 12) -> list[int]:
    """The observation clusters of ``steps`` (first seen first, at most ``cap``): a candidate's ``clusters``."""
    return list(dict.fromkeys(s.cluster_id for s in steps if s.cluster_id >= 0))[:cap]


def extract_candidates(trajs: Sequence[Trajectory], *, eta: str | float = "median", k_traj: int = 5,
                       extractor=None, eta_tie: str = "top", warning_score: str = "neg_return"
                       ) -> tuple[float, list[Candidate], dict[str, float]]:
    """η, strategy+warning candidates in the order admission tries them, and counts for the metrics.

    Candidates come from ``extractor`` (anything with ``extract(pos, neg)``; default: the rules) on the
    selected T+ / T− (``eta_tie``: :func:`split_outcomes`); warning scores become ``warning_z(R,
    warning_score)``. Order: strategies then warnings, each best z first (a warning's z = −R: the worst failure
    first; with ``warning_score="return"`` still the lowest R first, as the bottom-K selection), then principle,
    pattern, example. The extractor's ``stats`` counter, if any, is reported (``extract_<key>``) and cleared."""
    _, all_pos, all_neg = split_outcomes(trajs, eta, eta_tie)
    e, pos, neg = select(trajs, eta, k_traj, eta_tie)
    extractor = extractor if extractor is not None else get_extractor("rule")(None)
    cands = list(extractor.extract(pos, neg))
    for c in cands:
        if c.zone == "neg":
            c.score = warning_z(c.score, warning_score)
    stats = getattr(extractor, "stats", None)  # a counter of the extractor's own (e.g. the LLM's fallbacks)
    info = {f"extract_{k}": float(v) for k, v in (stats or {}).items()}
    if stats:
        stats.clear()
    order = {lv: i for i, lv in enumerate(("principle", "pattern", "example"))}
    flip = warning_score == "neg_return"
    cands.sort(key=lambda c: (c.zone != "pos", -c.score if c.zone == "pos" or flip else c.score,
                              order.get(c.level, 3)))
    info.update({"eta": e, "t_pos": float(len(all_pos)), "t_neg": float(len(all_neg)),
                 "selected_pos": float(len(pos)), "selected_neg": float(len(neg)), "candidates": float(len(cands))})
    return e, cands, info
