"""The ``slea`` commands that train, evaluate, compare, report, play and serve (``slea library ...`` and
``slea data ...`` live in :mod:`slea.cli.library` and :mod:`slea.cli.data`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.table import Table

from slea.cli.common import DEBUG_ENV, console, fail, plain, require_env, run_config
from slea.cli.data import data_app
from slea.cli.launch import preflight, train_config, train_data_parallel, train_here, train_torchrun_rank
from slea.cli.library import library_app
from slea.cli.play import CHECKPOINT_HELP, agent, eval_, say_skipped, serve
from slea.runs.folder import CURVES, RunFolder

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Multi-turn agentic RL with a per-step "
                  "experience library (SLEA-RL) and the methods it is compared with.")
app.add_typer(library_app, name="library")
app.add_typer(data_app, name="data")


@app.callback()
def _setup(debug: bool = typer.Option(False, "--debug", help="print the full traceback behind a one-line error "
                                      "(slea --debug train ...)")) -> None:
    from slea.progress import setup_logging

    if debug:
        os.environ[DEBUG_ENV] = "1"
    setup_logging()


@app.command()
def train(
    config: Path | None = typer.Argument(None, help="YAML config (default: built-in defaults)"),
    set_: list[str] = typer.Option([], "--set", help="override, e.g. --set rollout.groups=2"),
    resume: Path | None = typer.Option(None, "--resume", help="continue the run in this folder"),
    overwrite: bool = typer.Option(False, "--overwrite", help="start over in a run folder that already holds a "
                                   "run: what it holds is deleted first (a slea run folder only)"),
    nproc: int | None = typer.Option(None, "--nproc", min=1, help="data-parallel training processes on this "
                                     "machine (torch.distributed: gloo on CPU, NCCL on GPUs, one GPU per "
                                     "process): each plays its share of the task groups "
                                     "(default 1; with --resume, as many as the run's last checkpoint had)"),
) -> None:
    """Train a policy (or, for an algorithm that needs a team such as teamtr, a team of agents) with RL; writes a
    run folder (metrics, curves, checkpoints, eval). A folder that already holds a run is refused: continue it
    with --resume, or start it over with --overwrite."""
    cfg = train_config(config, set_, resume, overwrite)
    if cfg is None:  # a finished run met by --resume: said
        return
    require_env(cfg.env.id)
    launch = preflight(cfg, resume=resume, overwrite=overwrite, nproc=nproc)
    if launch.nproc > 1:
        train_data_parallel(cfg, launch, resume is not None)
    elif not train_torchrun_rank(cfg, launch, resume is not None):
        train_here(cfg, launch, resume is not None)


@app.command()
def align(
    config: Path | None = typer.Argument(None, help="YAML config (its align section; see docs/alignment.md)"),
    method: str | None = typer.Option(None, "--method", help="sft | dpo | turn_dpo | dil | tlm_dre "
                                      "(default: align.method)"),
    set_: list[str] = typer.Option([], "--set", help="override, e.g. --set align.samples_per_task=2"),
    resume: Path | None = typer.Option(None, "--resume", help="continue the run in this folder"),
) -> None:
    """Offline alignment: expert data, SFT, K samples per task with the SFT policy, (expert, failure) pairs, one
    alignment epoch, evaluation on align.eval_splits. Every stage writes into the run folder; a stage whose
    output exists is skipped, so --resume continues an interrupted run."""
    over = list(set_) + ([f"align.method={method}"] if method else [])
    if resume is not None:
        if not RunFolder(resume).is_run():
            raise fail(f"--resume: {resume} has no config.yaml (not a run folder)")
        cfg = run_config(RunFolder(resume).config, over + [f"run.dir={resume}"], saved=True)
    else:
        cfg = run_config(config, over)
    require_env(cfg.env.id)
    from slea.alignment.pipeline import AlignPipeline
    from slea.config import ConfigError
    from slea.trainer.lifecycle import run_dir_for

    run_dir = run_dir_for(cfg)
    if resume is None and RunFolder(run_dir).is_run():
        raise fail(f"align: {run_dir} is already a run folder; continue it with --resume {run_dir}")
    try:
        pipeline = AlignPipeline(cfg, run_dir, say=plain)
        plain(f"run folder: {run_dir}")
        results = pipeline.run()
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None
    for split, res in results.items():
        s, g = res["sampled"], res.get("greedy")
        greedy = f"greedy success {g['success']:.3f}" if g else "greedy success — (eval.greedy is off)"
        plain(f"{split}: sampled success {s['success']:.3f}, {greedy}")

@app.command()
def compare(
    config: Path | None = typer.Argument(None, help="YAML config shared by every run"),
    algorithms: str | None = typer.Option(None, "--algorithms", help="comma-separated algorithm names "
                                          "(default grpo,rloo,gigpo unless --variant is given)"),
    variant: list[str] = typer.Option([], "--variant", help="instead of --algorithms, one compared variant of the "
                                      "config (repeatable), e.g. --variant naive:team.rollouts=stale"),
    seeds: str = typer.Option("0", "--seeds", help="comma-separated run seeds, e.g. 0,1,2"),
    set_: list[str] = typer.Option([], "--set", help="override for every run, e.g. --set train.iterations=4"),
    out: Path | None = typer.Option(None, "--out", help="output folder (default runs/compare-<config>-<hash>, the "
                                    "hash over the config, arms, seeds, overrides and baseline: a different "
                                    "comparison never shares a folder)"),
    baseline: str | None = typer.Option(None, "--baseline", help="the arm every other is compared with, paired "
                                        "by seed (default the first)"),
    table_only: bool = typer.Option(False, "--table-only", help="train nothing: write table.md/json again from "
                                    "the finished sub-runs under --out"),
) -> None:
    """Train several algorithms (or variants: --variant LABEL:KEY=VALUE,...) × seeds with identical env seeds and
    budget; writes table.md/json and curves.png, with every arm against the baseline paired by seed (differences,
    exact sign-flip p, bootstrap CI). Finished sub-runs are reused, unfinished ones resumed. The terminal shows
    the main columns within 80; table.md has them all."""
    from slea import compare as cmp
    from slea.config import ConfigError

    if table_only:
        if out is None:
            raise fail("compare --table-only: give the comparison's folder with --out")
        try:
            table = cmp.rewrite_table(out, baseline)
        except ValueError as exc:
            raise fail(f"compare: {exc}") from None
        typer.echo(cmp.terminal_table(table))  # within 80 columns; every column is in table.md
        plain(f"wrote {out / 'table.md'} (every column), {out / 'table.json'}")
        return
    if algorithms is None and not variant:
        algorithms = "grpo,rloo,gigpo"
    algos = [a.strip() for a in (algorithms or "").split(",") if a.strip()]
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise fail(f"--seeds: expected comma-separated integers, got {seeds!r}") from None
    try:
        plan = cmp.plan(config, algos, seed_list, out, overrides=list(set_), variants=cmp.parse_variants(variant),
                        baseline=baseline)
    except (ConfigError, ValueError) as exc:
        raise fail(f"compare: {exc}") from None
    require_env(plan.items[0][1].env.id)
    out = plan.out
    plain(f"comparison folder: {out}")
    table = cmp.run(plan, say=plain)
    typer.echo(cmp.terminal_table(table))  # within 80 columns, never re-wrapped; every column is in table.md
    plain(f"wrote {out / 'table.md'} (every column), {out / 'table.json'}, {out / CURVES}")


@app.command()
def report(
    run: Path = typer.Argument(..., help="a run folder, or a `slea compare` output folder"),
    out: Path | None = typer.Option(None, "-o", "--out", help="the HTML file (default: RUN/report.html)"),
) -> None:
    """Write one self-contained HTML page about a run: config, learning curves, evaluation tables, the
    experience library (filterable) and the recorded episodes, step by step; for a compare folder, the
    comparison table and every sub-run's curves. No server, no network: open it from disk."""
    from slea.evaluation.html_report import ReportError, write_report

    _damaged_checkpoints(run)
    try:
        path = write_report(run, out)
    except ReportError as exc:
        raise fail(f"report: {exc}") from None
    except OSError as exc:
        raise fail(f"report: cannot write {out or RunFolder(run).report} ({exc.strerror or exc})") from None
    plain(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")


def _damaged_checkpoints(run: Path) -> None:
    """``slea report`` reads a run's logs, not its weights; it still says, in one line each, which of the run's
    newest checkpoints are damaged (those ``slea eval`` / ``serve`` / ``export`` would skip)."""
    from slea.runs.checkpoint import latest_checkpoint

    if RunFolder(run).checkpoints.is_dir():
        latest_checkpoint(RunFolder(run).checkpoints, say_skipped("report"))


# the commands that play or serve a model without training it (slea/cli/play.py), in this place in --help
app.command("eval")(eval_)
app.command()(agent)
app.command()(serve)


@app.command()
def export(
    run: Path = typer.Argument(..., help="a run folder (its config and last checkpoint)"),
    out: Path = typer.Argument(..., help="the folder to write (new, or empty)"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (the base checkpoint's) | float32 | bfloat16"),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help=CHECKPOINT_HELP),
) -> None:
    """Write a trained run's policy as a Hugging Face model folder (LoRA merged; safetensors, tokenizer, chat
    template) that transformers and vLLM load as it is."""
    from slea.config import ConfigError
    from slea.export import export_run
    from slea.runs.checkpoint import CheckpointError

    try:
        folder = export_run(run, out, dtype=dtype, checkpoint=checkpoint, say=say_skipped("export"))
    except (ConfigError, CheckpointError) as exc:
        raise fail(f"export: {exc}".replace("export: export: ", "export: ")) from None
    plain(f"wrote {folder}")


@app.command()
def envs() -> None:
    """List registered environments and whether their extra is installed."""
    import slea.envs as E
    from slea.envs.status import data_status  # files and env variables only: no engine starts

    specs = sorted(E.registered().values(), key=lambda s: s.id)
    id_width = max(len(s.id) for s in specs)  # ids never wrap, even at 80 columns
    # a terminal narrower than this gets the compact layout: the description keeps >= 40 columns, never a word
    # per line (family and extra are in the second table)
    wide = console.width >= 120
    t = Table(title="registered environments")
    t.add_column("id", no_wrap=True, min_width=id_width)
    if wide:
        t.add_column("family", no_wrap=True)
        t.add_column("extra", no_wrap=True)
    t.add_column("installed", no_wrap=True)
    t.add_column("description", ratio=1, min_width=30)
    for spec in specs:
        missing = spec.missing()
        ok = "[green]yes[/]" if not missing else ("[red]no[/]" if not wide else
                                                 f"[red]no[/] (missing {', '.join(missing)})")
        t.add_row(spec.id, *((spec.family, spec.extra or "-") if wide else ()), ok, spec.description)
    console.print(t)
    fams: dict[str, list] = {}
    for spec in specs:
        fams.setdefault(spec.family, []).append(spec)
    d = Table(title="data found, per family")
    d.add_column("family", no_wrap=True)
    if wide:
        d.add_column("ids", no_wrap=True, min_width=id_width)
    d.add_column("extra", no_wrap=True)
    d.add_column("data", ratio=1, min_width=30)
    for fam, group in sorted(fams.items()):
        missing = sorted({m for s in group for m in s.missing()})
        extra = group[0].extra
        ok = "-" if not extra else f"{extra}: " + ("[green]yes[/]" if not missing else "[red]no[/]")
        d.add_row(fam, *(("\n".join(s.id for s in group),) if wide else ()), ok, data_status(fam) or "-")
    console.print(d)
    absent = sorted({s.extra for s in specs if s.extra and s.missing()})
    if absent:
        plain(f"not installed: pip install 'slea[{','.join(absent)}]' (missing "
              f"{', '.join(sorted({m for s in specs for m in s.missing()}))})")


def main() -> None:  # pragma: no cover
    sys.exit(app())
