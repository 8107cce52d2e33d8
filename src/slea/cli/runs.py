"""What ``slea train`` tells a person about a run: the summary table, a finished run met by ``--resume``, and a run
stopped by Ctrl-C or SIGTERM (where it stopped, what its last checkpoint holds, the command that resumes it)."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.table import Table

from slea.cli.common import err, fail, plain
from slea.runs.folder import RunFolder

# --set keys that ask a finished run to train further
EXTEND_KEYS = ("train.iterations", "train.time_budget_s", "train.rollout_budget", "train.env_step_budget")
NO_VALUE = "—"


def _num(v, digits: int = 3) -> str:
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) and math.isfinite(v) else NO_VALUE


def summary_table(summary: dict) -> Table:
    """The held-out evaluations before (``untrained``) and after (``trained``) training; a value that was not
    measured is "—", and the caption says why."""
    t = Table(title="held-out evaluation")
    for col in ("", "sampled success", "invalid rate", "greedy success"):
        t.add_column(col, justify="left" if not col else "right")
    notes = []
    greedy_off = False
    for label in ("before", "after"):
        res = summary.get(label)
        if not res:
            continue
        g = res.get("greedy")
        greedy_off |= not g
        t.add_row("untrained" if label == "before" else "trained", _num(res["sampled"].get("success")),
                  _num(res["sampled"].get("invalid_rate")), _num((g or {}).get("success")))
    if greedy_off:
        notes.append(f"greedy {NO_VALUE}: eval.greedy is off")
    if not summary.get("before"):
        notes.append("no untrained row: eval.before is off")
    notes.append(f"episodes used: {summary['episodes']}   wall time: {summary['wall_s'] / 60:.1f} min")
    t.caption = "\n".join(notes)
    return t


def finished(run: Path, overrides: list[str]) -> bool:
    """``slea train --resume RUN`` on a run that is finished (``eval/summary.json`` is written last): True after
    saying so, unless ``overrides`` extend it (a larger ``train.iterations`` or a budget; :data:`EXTEND_KEYS`);
    then its old summary is moved aside (``summary.json.previous``), so an extension stopped midway resumes as the
    unfinished run it is. An extension to no more iterations than were trained is one line, exit 2."""
    from slea.runs.jsonfile import RunFileError, Summary, read_json

    path = RunFolder(run).summary
    if not path.is_file():
        return False
    try:
        summary = read_json(path, Summary)
    except RunFileError as exc:  # damaged: the run is treated as unfinished (its evaluation is redone)
        err.print(f"train: {run}: {exc}; resuming it as unfinished", markup=False, highlight=False, soft_wrap=True)
        return False
    done = summary.get("stages", summary.get("iterations"))
    asked = {k.partition("=")[0].strip(): k.partition("=")[2] for k in overrides}
    extend = [k for k in EXTEND_KEYS if k in asked]
    if not extend:
        before, after = summary.get("before") or {}, summary.get("after") or {}
        held = (f"; held-out sampled success {_num((before.get('sampled') or {}).get('success'))} → "
                f"{_num((after.get('sampled') or {}).get('success'))}") if after else ""
        plain(f"{run} is finished: {done} iterations trained and evaluated ({path}){held}. Nothing to resume; "
              f"to train further: slea train --resume {run} --set train.iterations=N (N > {done})")
        return True
    if "train.iterations" in asked and isinstance(done, int) and not summary.get("stopped_by"):
        try:
            wanted = int(asked["train.iterations"])
        except ValueError:
            wanted = None  # the config check names the bad value
        if wanted is not None and wanted <= done:
            raise fail(f"config error: train.iterations: {run} already trained {done} iterations; give more to "
                       f"extend it (or leave --resume alone: the run is finished)")
    path.replace(RunFolder(run).previous_summary)
    return False


def interrupted_lines(trainer, exc=None) -> list[str]:
    """What a run stopped by a signal prints: the step it stopped after (``exc``: :class:`slea.trainer.interrupt.
    Interrupted`) or abandoned (a second Ctrl-C: ``exc`` None), its last checkpoint, the command that resumes it."""
    from slea.trainer.interrupt import resume_hint

    sig = getattr(exc, "signal_name", None) or trainer.stop.requested or "SIGINT"
    who = "Ctrl-C" if sig == "SIGINT" else sig
    if exc is not None:
        lines = [f"{who}: stopped after {exc.where}" if exc.where else f"{who}: stopped before the first training step"]
    elif trainer.stop.doing:
        lines = [f"{who}: {trainer.stop.doing} abandoned (nothing of it is kept)"]
    else:  # the second signal came after the step in progress was checkpointed: it abandoned nothing
        lines = [f"{who}: stopped after {trainer.saved_step}"]
    if trainer.last_checkpoint:
        path = RunFolder(trainer.dir).checkpoint(trainer.last_checkpoint)
        lines.append(f"last checkpoint: {trainer.saved_step} ({path})")
    else:
        lines.append("no checkpoint yet: resuming starts the run from its beginning")
    lines.append(f"resume with: {resume_hint(trainer.dir)}")
    return lines


def fit_with_signals(trainer, resume: bool) -> dict:
    """``trainer.fit`` with SIGINT / SIGTERM routed to its stop signal (slea/trainer/interrupt.py): a stopped run
    prints where it stopped and how to resume, exit 130 (SIGINT) or 143 (SIGTERM)."""
    from slea.trainer.interrupt import EXIT_CODES, Interrupted

    try:
        with trainer.stop.installed():
            return trainer.fit(resume=resume)
    except Interrupted as exc:
        _say(interrupted_lines(trainer, exc))
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        _say(interrupted_lines(trainer))
        raise typer.Exit(EXIT_CODES.get(trainer.stop.requested or "SIGINT", 130)) from None


def _say(lines: list[str]) -> None:
    for line in lines:
        err.print(line, markup=False, highlight=False, soft_wrap=True)
