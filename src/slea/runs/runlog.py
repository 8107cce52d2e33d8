"""The run folder's logs: metrics.jsonl (one line per iteration, always), the loggers of ``run.loggers``
(TensorBoard events, W&B, MLflow: slea/runs/loggers.py), curves.png."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slea.atomic import atomic_write_text
from slea.runs.folder import RunFolder
from slea.runs.jsonfile import MetricsRow, read_jsonl
from slea.runs.loggers import open_sinks, safe_call

log = logging.getLogger(__name__)
DEFAULT_LOGGERS = ("jsonl", "tensorboard")


class RunLog:
    """``metrics.jsonl`` and the other loggers (``loggers``: names of ``run.loggers``; ``tensorboard=False`` leaves
    TensorBoard out). ``config``: the resolved config, which W&B and MLflow record with the run."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, *, loggers: Sequence[str] | None = None,
                 project: str = "slea", config: dict[str, Any] | None = None):
        self.dir = Path(run_dir)
        self.path = RunFolder(self.dir).metrics
        names = [n for n in (DEFAULT_LOGGERS if loggers is None else loggers) if tensorboard or n != "tensorboard"]
        self.sinks = open_sinks(names, self.dir, project=project, config=config)

    def log(self, iteration: int, metrics: dict[str, Any]) -> None:
        row = {"iteration": iteration, **metrics}
        with self.path.open("a") as fh:
            fh.write(json.dumps(row, default=float) + "\n")
            fh.flush()
        self.sinks = safe_call(self.sinks, "log", iteration, metrics)

    def purge_after(self, iteration: int) -> None:
        """A resumed run redoes the iterations after ``iteration``: each logger drops what it can of the points the
        killed run logged for them (TensorBoard's ``purge_step``)."""
        self.sinks = safe_call(self.sinks, "purge_after", iteration)

    def rows(self) -> list[dict[str, Any]]:
        return read_metrics(self.path)

    def close(self) -> None:
        self.sinks = safe_call(self.sinks, "close")
        self.sinks = []


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every row of a metrics.jsonl. A line that is not a JSON object of a row's shape (one torn by a kill, or
    corrupted: slea/runs/jsonfile.py's :class:`MetricsRow`, capped in length and depth) is skipped with a warning
    naming the file, the line number and why; the rows after it are kept."""
    def say(number: int, line: str, why: str) -> None:
        log.warning("%s:%d: skipping malformed metrics line (%s) %.80r", path, number, why, line)

    return read_jsonl(path, MetricsRow, say)


def env_step_curve(rows: list[dict[str, Any]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Cumulative env steps after each logged iteration, and the per-iteration train metrics against them.

    Uses the ``env_steps`` counter the trainer logs; for runs without it, ``train/episode_len ×
    train/episodes`` accumulated; NaN where a run recorded neither (a team run older than its counters), shown
    as "–", not as 0 env steps."""
    if not rows:
        return np.zeros(0), {}
    if all("env_steps" in r for r in rows):
        x = np.array([float(r["env_steps"]) for r in rows])
    elif all("train/episode_len" in r and "train/episodes" in r for r in rows):
        x = np.cumsum([float(r["train/episode_len"]) * float(r["train/episodes"]) for r in rows])
    else:
        x = np.full(len(rows), math.nan)
    ys = {k: np.array([float(r.get(k, math.nan)) for r in rows])
          for k in ("train/success", "train/return", "train/invalid_rate")}
    return x, ys


def truncate_metrics(path: Path, last_iteration: int) -> None:
    """Drop rows after ``last_iteration`` (a resumed run rewrites what the killed one logged past its
    last checkpoint)."""
    rows = [r for r in read_metrics(path) if r.get("iteration", 0) <= last_iteration]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))  # a kill mid-rewrite keeps the old file


# curves.png's three panels: (metrics key, title); the team trainer plots its own (slea/trainer/team.py)
PANELS = (("train/success", "train success"), ("train/return", "mean return"),
          ("train/invalid_rate", "invalid-action rate"), ("rollout/entropy", "token entropy (sampled)"),
          ("collapse/equal_return_frac", "groups with equal returns"))


def plot_curves(rows: list[dict[str, Any]], out: Path, evals: dict[str, float] | None = None,
                panels: tuple[tuple[str, str], ...] = PANELS, xlabel: str = "iteration") -> None:
    """``curves.png``: one panel per ``(key, title)`` of ``panels`` over the rows' ``iteration``; ``evals``
    (label → held-out success) as dashed lines on the first panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = [r["iteration"] + 1 for r in rows]  # counted from 1, as the log lines and checkpoint folders count
    fig, axes = plt.subplots(1, len(panels), figsize=(max(13.0, 3.4 * len(panels)), 3.6))
    for ax, (key, title) in zip(axes, panels):
        ax.plot(its, [r.get(key, float("nan")) for r in rows], marker="o")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    if evals:
        for (label, val), color in zip(evals.items(), ("tab:gray", "tab:green", "tab:red", "tab:purple")):
            axes[0].axhline(val, linestyle="--", alpha=0.8, color=color, label=f"{label}: {val:.2f}")
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
