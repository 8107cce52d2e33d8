"""RunFolder (slea/runs/folder.py): its paths are the files a real run writes, and no other module of slea spells a
run file's name."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import slea
from slea.runs import folder
from slea.runs.folder import RunFolder


def test_the_paths_are_what_a_tiny_run_wrote(tiny_run, tmp_path):
    from slea.evaluation.html_report import write_report
    from slea.runs.checkpoint import latest_checkpoint
    from slea.runs.loggers import _save_id

    run = RunFolder(shutil.copytree(tiny_run, tmp_path / "run"))
    assert write_report(run.root) == run.report and run.report.is_file()  # `slea report`'s default place
    _save_id(run.root, "wandb", "abc123")  # what a W&B run leaves for its resume
    assert run.loggers.is_file()
    for f in (run.config, run.metrics, run.episodes, run.library, run.curves, run.summary,
              run.evaluation("before"), run.evaluation("after")):
        assert f.is_file(), f
    for d in (run.checkpoints, run.events, run.eval):
        assert d.is_dir(), d
    last = latest_checkpoint(run.checkpoints)
    assert last is not None and run.checkpoint(last.name) == last
    assert run.is_run() and not RunFolder(tmp_path).is_run()
    # every name the run wrote at its top is one RunFolder names (the team trainer's adapters/ aside, all of them)
    assert {p.name for p in run.root.iterdir()} == set(folder.NAMES) - {folder.ADAPTERS}


def test_the_layout_is_the_one_runs_have_always_had(tmp_path):
    run = RunFolder(str(tmp_path))  # a str is taken as a Path
    assert run == RunFolder(tmp_path) and run.root == tmp_path
    got = {str(p.relative_to(tmp_path)) for p in (run.config, run.metrics, run.episodes, run.library, run.loggers,
                                                   run.curves, run.report, run.checkpoints, run.events, run.eval,
                                                   run.adapters, run.summary, run.evaluation("eval-heldout", ".md"),
                                                   run.checkpoint("iter_000003"), run.previous_summary,
                                                   run.expert, run.sft, run.samples, run.pairs, run.align,
                                                   run.pivot)}
    assert got == {"config.yaml", "metrics.jsonl", "episodes.jsonl", "library.sqlite", "loggers.json", "curves.png",
                   "report.html", "checkpoints", "events", "eval", "adapters", "eval/summary.json",
                   "eval/eval-heldout.md", "checkpoints/iter_000003",
                   "eval/summary.json.previous", "expert.jsonl", "sft.json", "samples.jsonl", "pairs.json",
                   "align.json", "pivot.png"}
    assert set(folder.MARKERS) <= set(folder.NAMES)


# a run file's name in quotes, or a run subfolder's joined onto a path (`x / "eval"`, `"eval" / x`): every name
# RunFolder knows, and the evaluations every run has
FILES = [n for n in (*folder.NAMES, *folder.ALIGN_NAMES) if "." in n] + ["summary.json", "before.json", "after.json"]
DIRS = [n for n in folder.NAMES if "." not in n]
_files, _dirs = "|".join(map(re.escape, FILES)), "|".join(DIRS)
RUN_FILE = re.compile(rf"""["'](?:{_files})(?!\w)|/\s*["'](?:{_dirs})["']|["'](?:{_dirs})["']\s*/""")
# the page template is a package resource of that name, not a run file
ALLOWED = {("evaluation/html_report.py", 'joinpath("evaluation", "templates", "report.html")')}


def test_no_module_but_runs_folder_spells_a_run_files_name():
    root = Path(slea.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "runs/folder.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if RUN_FILE.search(line) and not any(rel == f and s in line for f, s in ALLOWED):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "use slea.runs.folder.RunFolder:\n" + "\n".join(found)


def test_the_guard_catches_each_spelling():
    for line in ('p = run / "config.yaml"', "f\"{run / 'eval' / 'after.json'}\"", 'd / "checkpoints"',
                 '("eval" / x)', 'Path(r) / "library.sqlite"', 'self.dir / "sft.json"', "x / 'adapters'",
                 'p.with_name("summary.json.previous")'):
        assert RUN_FILE.search(line), line
    for line in ("``config.yaml``, written first", 'STAGES = ("sft", "eval")', 'app.command("eval")',
                 '"eval/%s; left out"', 'Path("runs") / name'):
        assert not RUN_FILE.search(line), line
