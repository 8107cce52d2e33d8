"""The run folder's layout: :class:`RunFolder` names every file and subfolder a run writes at its top, so no other
module spells a run file's name.

```
<run>/config.yaml       the resolved config (written first; ``--resume`` reads it)
<run>/metrics.jsonl     one row of metrics per step (slea/runs/runlog.py)
<run>/episodes.jsonl    a sample of each iteration's episodes (slea/runs/episodes.py)
<run>/library.sqlite    the experience library (slea/experience/manager.py)
<run>/loggers.json      the external loggers' run ids, for a resumed run (slea/runs/loggers.py)
<run>/curves.png        the training curves
<run>/report.html       ``slea report``'s page (written where ``--out`` does not say otherwise)
<run>/checkpoints/      ``iter_NNNNNN`` checkpoint folders (slea/runs/checkpoint.py)
<run>/events/           the TensorBoard event files
<run>/eval/             the held-out evaluations: ``before.json``, ``after.json``, ``summary.json``, ...
<run>/adapters/         the team trainer's per-role LoRA adapters
```

``slea align`` writes ``config.yaml``, ``checkpoints/`` and ``eval/`` too, and one file per stage
(slea/alignment/pipeline.py): ``expert.jsonl``, ``sft.json``, ``samples.jsonl``, ``pairs.json``, ``align.json``
and ``pivot.png`` (the tlm-DRE adequacy histogram).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
EPISODES = "episodes.jsonl"
LIBRARY = "library.sqlite"
LOGGERS = "loggers.json"
CURVES = "curves.png"
REPORT = "report.html"
CHECKPOINTS = "checkpoints"
EVENTS = "events"
EVAL = "eval"
ADAPTERS = "adapters"
EXPERT = "expert.jsonl"
SFT = "sft.json"
SAMPLES = "samples.jsonl"
PAIRS = "pairs.json"
ALIGN = "align.json"
PIVOT = "pivot.png"
SUMMARY = "summary"  # <run>/eval/summary.json: the before/after summary of a finished run

# every name at the top of a training run's folder, and the ones only an alignment run writes
NAMES = (CONFIG, METRICS, EPISODES, LIBRARY, LOGGERS, CURVES, REPORT, CHECKPOINTS, EVENTS, EVAL, ADAPTERS)
ALIGN_NAMES = (EXPERT, SFT, SAMPLES, PAIRS, ALIGN, PIVOT)
# what a slea run writes at the top of its folder: a folder holding one of them is a run folder --overwrite may clear
MARKERS = (CONFIG, METRICS, CHECKPOINTS, EVENTS, EVAL, LIBRARY)


@dataclass(frozen=True)
class RunFolder:
    """A run folder's paths (the layout in this module's docstring). ``root`` is the folder itself; nothing is
    read or created by building one."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def episodes(self) -> Path:
        return self.root / EPISODES

    @property
    def library(self) -> Path:
        return self.root / LIBRARY

    @property
    def loggers(self) -> Path:
        return self.root / LOGGERS

    @property
    def curves(self) -> Path:
        return self.root / CURVES

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def events(self) -> Path:
        return self.root / EVENTS

    @property
    def eval(self) -> Path:
        return self.root / EVAL

    @property
    def adapters(self) -> Path:
        return self.root / ADAPTERS

    @property
    def expert(self) -> Path:
        return self.root / EXPERT

    @property
    def sft(self) -> Path:
        return self.root / SFT

    @property
    def samples(self) -> Path:
        return self.root / SAMPLES

    @property
    def pairs(self) -> Path:
        return self.root / PAIRS

    @property
    def align(self) -> Path:
        return self.root / ALIGN

    @property
    def pivot(self) -> Path:
        return self.root / PIVOT

    @property
    def summary(self) -> Path:
        return self.evaluation(SUMMARY)

    @property
    def previous_summary(self) -> Path:
        """``eval/summary.json.previous``: a finished run's summary, moved aside while a resume extends the run (not
        ``*.json``: the report reads those as evaluations)."""
        return self.summary.with_name(self.summary.name + ".previous")

    def evaluation(self, name: str, suffix: str = ".json") -> Path:
        """``eval/<name><suffix>``: an evaluation's result (``before``, ``after``, ``eval-heldout``, ...; ``.md``
        for its table)."""
        return self.eval / f"{name}{suffix}"

    def checkpoint(self, name: str) -> Path:
        """``checkpoints/<name>``: one checkpoint folder (``iter_000001``)."""
        return self.checkpoints / name

    def is_run(self) -> bool:
        """Whether a run wrote its config here (what ``--resume``, ``slea eval`` and ``slea play`` take as a run)."""
        return self.config.is_file()
