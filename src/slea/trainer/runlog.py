"""The run folder's logs: metrics.jsonl (one line per iteration), TensorBoard events, curves.png."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from slea.atomic import atomic_write_text

log = logging.getLogger(__name__)
_tb_absence_reported = False


class RunLog:
    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.dir = Path(run_dir)
        self.path = self.dir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            self._tb = _open_summary_writer(self.dir / "events")

    def log(self, iteration: int, metrics: dict[str, Any]) -> None:
        row = {"iteration": iteration, **metrics}
        with self.path.open("a") as fh:
            fh.write(json.dumps(row, default=float) + "\n")
            fh.flush()
        if self._tb is not None:
            for key, val in metrics.items():
                if isinstance(val, (int, float)) and math.isfinite(float(val)):
                    self._tb.add_scalar(key.replace(".", "/"), float(val), iteration)
            self._tb.flush()

    def purge_after(self, iteration: int) -> None:
        """A resumed run redoes the iterations after ``iteration``: reopen TensorBoard with ``purge_step`` so
        the points the killed run logged for them are dropped, not shown twice."""
        if self._tb is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb.close()
            self._tb = SummaryWriter(str(self.dir / "events"), purge_step=iteration + 1)

    def rows(self) -> list[dict[str, Any]]:
        return read_metrics(self.path)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _open_summary_writer(events_dir: Path):
    """A SummaryWriter on ``events_dir``, or None when TensorBoard cannot be imported; the first such
    failure in a process logs one warning, later ones stay quiet (metrics.jsonl still gets every row)."""
    global _tb_absence_reported
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        if not _tb_absence_reported:
            _tb_absence_reported = True
            log.warning("TensorBoard unavailable (%s): no events are written; metrics.jsonl still is", exc)
        return None
    return SummaryWriter(str(events_dir))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every row of a metrics.jsonl. A line that is not a JSON object (one torn by a kill, or corrupted)
    is skipped with a warning naming the file and line number; the rows after it are kept."""
    if not Path(path).is_file():
        return []
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        row = _parse_row(line)
        if row is None:
            if line.strip():
                log.warning("%s:%d: skipping malformed metrics line %.80r", path, number, line)
            continue
        rows.append(row)
    return rows


def _parse_row(line: str) -> dict[str, Any] | None:
    """The JSON object on ``line``, or None when it is blank, not JSON, or not an object."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None


def truncate_metrics(path: Path, last_iteration: int) -> None:
    """Drop rows after ``last_iteration`` (a resumed run rewrites what the killed one logged past its
    last checkpoint)."""
    rows = [r for r in read_metrics(path) if r.get("iteration", 0) <= last_iteration]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))  # a kill mid-rewrite keeps the old file


# curves.png's three panels: (metrics key, title); the team trainer plots its own (slea/trainer/teamtr.py)
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

    its = [r["iteration"] for r in rows]
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
