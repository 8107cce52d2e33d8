"""``episodes.jsonl``: a small sample of each iteration's episodes, step by step, for ``slea report``.

One JSON object per episode: where it was played (``iteration``, ``group``, ``traj``, env ``seed``), how it ended
(``won``, ``truncated``, ``return``, ``final_info``) and its ``steps``: the observation the agent saw (clipped), its
answer and parsed action, validity, reward, the advantage the algorithm gave the step row, the observation
cluster, and the experiences retrieved for it (ids and, as the library held them then, zone and text). ``sourced``
lists the library entries the episode's iteration created from it (``Entry.sources``), so a report can link an
entry to the episode it came from.

Budget: ``run.episode_samples`` episodes per iteration (half wins, half losses when both exist; episodes an entry
was just distilled from first, then the best wins and the worst losses), and no row once the file holds
``run.episode_samples_bytes``. Resume: :meth:`EpisodeSampler.truncate` drops rows past the resumed iteration, as
metrics.jsonl's truncation does, so a redone iteration is not recorded twice.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from slea.atomic import atomic_write_text
from slea.runs.folder import RunFolder
from slea.runs.jsonfile import EpisodeRow, read_jsonl
from slea.types import Trajectory

if TYPE_CHECKING:
    from slea.algorithms.batch import Advantages

log = logging.getLogger(__name__)

OBS_CHARS = 600  # observation text kept per step
RESPONSE_CHARS = 200  # the model's raw answer kept per step
EXPERIENCE_CHARS = 300  # each retrieved experience's text


class LibraryEntry(Protocol):
    """What a sample reads of an experience-library entry (slea.experience.library.Entry)."""

    @property
    def id(self) -> int: ...
    @property
    def zone(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def created_iter(self) -> int: ...
    @property
    def sources(self) -> Sequence[int]: ...


class Library(Protocol):
    """What a sample reads of an experience library (slea.experience.library.ExperienceLibrary)."""

    def entries(self) -> Sequence[LibraryEntry]: ...
    def get(self, eid: int) -> LibraryEntry | None: ...


class Experience(Protocol):
    """What a sample reads of a run's experience manager (slea.experience.manager.ExperienceManager)."""

    @property
    def library(self) -> Library: ...


def clip(text: Any, limit: int) -> str:
    out = str(text)
    return out if len(out) <= limit else out[: limit - 1] + "…"


def _num(x: Any) -> float | None:
    """A finite float, else None (JSON has no NaN)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def choose(trajs: list[Trajectory], n: int, preferred: Collection[int] = frozenset()) -> list[int]:
    """Indices of up to ``n`` episodes: wins and losses alternating (a win first), each side ordered by
    ``preferred`` traj ids first, then the highest-return wins and the lowest-return losses."""
    wins = sorted((i for i, t in enumerate(trajs) if t.won),
                  key=lambda i: (trajs[i].traj_id not in preferred, -trajs[i].episode_return, i))
    losses = sorted((i for i, t in enumerate(trajs) if not t.won),
                    key=lambda i: (trajs[i].traj_id not in preferred, trajs[i].episode_return, i))
    out: list[int] = []
    while len(out) < n and (wins or losses):
        for side in (wins, losses):
            if side and len(out) < n:
                out.append(side.pop(0))
    return out


def _source_map(library: Library | None, iteration: int) -> dict[int, list[int]]:
    """traj id -> ids of the entries created in ``iteration`` from it."""
    out: dict[int, list[int]] = {}
    if library is None:
        return out
    for e in library.entries():
        if e.created_iter == iteration:
            for s in e.sources:
                out.setdefault(int(s), []).append(e.id)
    return out


def episode_record(t: Trajectory, advantages: Sequence[float | None], iteration: int, *,
                   library: Library | None = None, sourced: Collection[int] = ()) -> dict[str, Any]:
    """One episode as a JSON-able dict (``advantages``: one per step, None when unknown)."""
    steps = []
    for s, adv in zip(t.steps, advantages):
        exps = []
        for eid in s.experience_ids:
            e = library.get(eid) if library is not None else None
            exps.append({"id": int(eid), "zone": e.zone if e else None,
                         "text": clip(e.text, EXPERIENCE_CHARS) if e else None})
        steps.append({"t": s.step, "obs": clip(s.anchor, OBS_CHARS), "action": s.action,
                      "response": clip(s.response_text, RESPONSE_CHARS), "valid": bool(s.valid),
                      "reward": _num(s.reward), "advantage": _num(adv), "cluster": int(s.cluster_id),
                      "experiences": exps, **({"key": s.state_key} if s.state_key else {})})
    info = {k: v for k, v in t.final_info.items() if isinstance(v, (int, float, str, bool)) or v is None}
    return {"iteration": int(iteration), "group": int(t.group_id), "traj": int(t.traj_id), "seed": t.seed,
            "task_type": t.task_type, "goal": clip(t.goal, OBS_CHARS), "won": bool(t.won),
            "truncated": bool(t.truncated), "return": _num(t.episode_return), "final_info": info,
            "sourced": sorted(set(sourced)), "steps": steps}


class EpisodeSampler:
    """Appends each iteration's sampled episodes to ``<run>/episodes.jsonl`` within the size budget."""

    def __init__(self, run_dir: Path, per_iteration: int, max_bytes: int) -> None:
        self.path = RunFolder(run_dir).episodes
        self.per_iteration = int(per_iteration)
        self.max_bytes = int(max_bytes)
        self._taken: dict[int, int] = {}
        self._full_logged = False

    @property
    def enabled(self) -> bool:
        return self.per_iteration > 0 and self.max_bytes > 0

    def record(self, iteration: int, trajs: list[Trajectory], advantages: Advantages | None,
               experience: Experience | None = None) -> int:
        """Record up to the iteration's remaining share of ``trajs`` (the rows of ``advantages.rows`` follow
        ``flatten(trajs)``; ``advantages`` may be None). ``experience``: the run's ExperienceManager or None.
        Returns the number of episodes written."""
        left = self.per_iteration - self._taken.get(iteration, 0)
        if not self.enabled or left <= 0 or not trajs:
            return 0
        library = experience.library if experience is not None else None
        sources = _source_map(library, iteration)
        rows = list(advantages.rows) if advantages is not None else []
        offsets, k = [], 0
        for t in trajs:
            offsets.append(k)
            k += len(t.steps)
        lines = []
        for i in choose(trajs, left, set(sources)):
            t = trajs[i]
            adv = rows[offsets[i]: offsets[i] + len(t.steps)] if len(rows) == k else [None] * len(t.steps)
            rec = episode_record(t, adv, iteration, library=library, sourced=sources.get(t.traj_id, []))
            lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
        size = self.path.stat().st_size if self.path.is_file() else 0
        written = 0
        with self.path.open("a", encoding="utf-8") as fh:
            for line in lines:
                n = len(line.encode("utf-8"))
                if size + n > self.max_bytes:
                    if not self._full_logged:
                        log.info("%s holds %d bytes: no more episode samples (run.episode_samples_bytes %d)",
                                 self.path, size, self.max_bytes)
                        self._full_logged = True
                    break
                fh.write(line)
                size += n
                written += 1
        self._taken[iteration] = self._taken.get(iteration, 0) + len(lines)
        return written

    def truncate(self, last_iteration: int) -> None:
        """Drop rows after ``last_iteration`` (a resumed run redoes those iterations)."""
        self._taken.clear()
        rows = read_episodes(self.path)
        if not self.path.is_file():
            return
        keep = [r for r in rows if int(r.get("iteration", 0)) <= last_iteration]
        atomic_write_text(self.path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep))


def read_episodes(path: Path) -> list[dict[str, Any]]:
    """Every episode row of an episodes.jsonl; torn or malformed lines (not of :class:`slea.runs.jsonfile.
    EpisodeRow`'s shape, too long or too deep) are skipped."""
    return read_jsonl(path, EpisodeRow)
