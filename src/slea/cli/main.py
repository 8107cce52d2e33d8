"""The ``slea`` commands that train, evaluate, compare, report, play and serve (``slea library ...`` and
``slea data ...`` live in :mod:`slea.cli.library` and :mod:`slea.cli.data`)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import typer
from rich.table import Table

from slea.cli.common import DEBUG_ENV, console, err, fail, plain, require_env, run_config
from slea.cli.data import data_app
from slea.cli.library import library_app
from slea.cli.play import CHECKPOINT_HELP, _model_target, agent, eval_, say_skipped, serve
from slea.cli.runs import finished, fit_with_signals, summary_table
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
    if resume is not None and overwrite:
        raise fail("train: --resume continues the run in its folder and --overwrite deletes it: give one of them")
    if resume is not None:
        if not RunFolder(resume).is_run():
            raise fail(f"--resume: {resume} has no config.yaml (not a run folder)")
        cfg = run_config(RunFolder(resume).config, list(set_) + [f"run.dir={resume}"], saved=True)
        if finished(resume, list(set_)):  # says so; a larger train.iterations or budget extends it instead
            return
    else:
        cfg = run_config(config, set_)
    require_env(cfg.env.id)
    from slea.config import ConfigError
    from slea.parallel.checks import check_data_parallel
    from slea.trainer.guards import RunHalted
    from slea.trainer.lifecycle import RunDirError, fresh_run_dir, run_dir_for
    from slea.trainer.select import build_trainer, check_config

    try:  # the trainer is chosen by what the algorithm declares it needs, and its own checks run (select.py)
        check_config(cfg)
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None
    run_dir = run_dir_for(cfg)  # chosen once: a timestamped name must not change between here and the trainer
    from slea.parallel.distributed import DataParallel, init_from_torchrun, is_torchrun
    from slea.runs.checkpoint import trained_processes

    if nproc is None:  # a resumed --nproc run (train.fsdp needs it) restarts with its own count; torchrun sets its own
        nproc = trained_processes(resume) if resume is not None and not is_torchrun() else 1
    from slea.parallel.checks import check_rank_devices

    try:  # run.device names a device this machine has, for every process: before any model loads
        check_rank_devices(cfg.run.device, nproc if nproc > 1 else int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None
    for key, name in (("model.name_or_path", cfg.model.name_or_path), ("model.tokenizer", cfg.model.tokenizer)):
        if name is not None and not _model_target(name):  # offline: a name that is not here is never downloaded
            raise fail(f"config error: {key}: {name!r} is neither 'embedded', 'tiny', a model folder (with "
                       f"config.json) nor a model in the local Hugging Face cache (nothing is downloaded)")
    if not is_torchrun():  # what these processes can train (a torchrun rank checks its group once it joins it)
        try:
            check_data_parallel(cfg, DataParallel(0, nproc))
        except ConfigError as exc:
            raise fail(f"config error: {exc}") from None
    if resume is None and int(os.environ.get("RANK", "0")) == 0:  # a new run (under torchrun: its rank 0 checks)
        try:  # never two runs in one folder: refused, or cleared with --overwrite, after every check above
            fresh_run_dir(run_dir, overwrite)
        except RunDirError as exc:
            raise fail(f"train: {exc}") from None
    created = not run_dir.exists()  # a folder this command makes is removed again if no training starts in it
    if nproc > 1:
        _train_data_parallel(cfg, nproc, resume is not None, run_dir, created)
        return

    if is_torchrun():
        _build_cached_model(cfg.model)  # before this process joins the group (see the function)
    if init_from_torchrun(cfg.run.device):  # started by torchrun: this process is one rank of its group
        dp = DataParallel.current()
        try:
            check_data_parallel(cfg, dp)
        except ConfigError as exc:
            raise fail(f"config error: {exc}") from None
        try:
            _train_rank(cfg, dp.from_main(run_dir), resume is not None)
        finally:
            import torch.distributed as dist

            dist.destroy_process_group()
        return

    from slea.policy.openai_engine import GeneratorError

    try:
        trainer = build_trainer(cfg, run_dir)  # the single-agent RL trainer, or the team trainer (TeamTR)
    except ConfigError as exc:  # a value the trainer cannot use, one checkable only against the model, a model
        _discard(run_dir, created)  # that does not load, an env that cannot be built
        raise fail(f"config error: {exc}") from None
    except GeneratorError as exc:  # a managed vLLM server that did not start: its log's tail, one line
        _discard(run_dir, created)
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        _discard(run_dir, created)
        raise fail("Ctrl-C: stopped while the model loaded; nothing was trained", 130) from None
    plain(f"run folder: {trainer.dir}")
    try:  # Ctrl-C / SIGTERM: the step in progress is finished and checkpointed, then the resume command
        summary = fit_with_signals(trainer, resume is not None)
    except RunHalted as exc:  # a reliability guard (NaN streak, env fault rate): one clear line, exit 3
        raise fail(f"run halted: {exc}", 3) from None
    finally:
        trainer.close()  # a managed vLLM server stops, also on an error or Ctrl-C
    console.print(summary_table(summary))


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

def _discard(run_dir: Path, created: bool) -> None:
    """Remove the run folder this command created when no training started in it (the trainer could not be built):
    no empty or half-made folder is left behind."""
    import shutil

    if created and not RunFolder(run_dir).config.exists():
        shutil.rmtree(run_dir, ignore_errors=True)


def _build_cached_model(model_cfg) -> None:
    """Build the cached ``tiny`` / ``embedded`` model folders a run names, in this process before it joins a
    process group: in a rank > 0 of one, transformers' ``save_pretrained`` writes nothing."""
    from slea.policy.model import resolve

    for name in {model_cfg.name_or_path, model_cfg.tokenizer or model_cfg.name_or_path}:
        resolve(name)


def _train_data_parallel(cfg, nproc: int, resume: bool, run_dir: Path, created: bool) -> None:
    """``slea train --nproc N``: N spawned ranks in one group (slea/parallel/distributed.py; gloo on CPU, NCCL
    with one GPU per rank). (Under
    ``torchrun --nproc-per-node N -m slea.cli train ...`` each process joins torchrun's group instead.)"""
    import torch.multiprocessing as mp

    from slea.parallel.distributed import launch

    _build_cached_model(cfg.model)  # once, here: a spawned rank > 0 could not write it
    plain(f"run folder: {run_dir}  ({nproc} data-parallel processes)")
    try:
        launch(_train_rank, nproc, cfg, run_dir, resume, device=cfg.run.device)
    except mp.ProcessExitedException as exc:  # a rank exited 2 or 3 after printing its one line
        if exc.exit_code == 2:
            _discard(run_dir, created)
        raise typer.Exit(exc.exit_code if exc.exit_code in (2, 3) else 1) from None


def _train_rank(cfg, run_dir: Path, resume: bool) -> None:
    """One rank of ``slea train --nproc``: rank 0 logs, writes the run folder and prints the summary."""
    from slea.config import ConfigError
    from slea.parallel.distributed import DataParallel
    from slea.plugins import import_plugin
    from slea.progress import setup_logging
    from slea.trainer.guards import RunHalted
    from slea.trainer.rl import Trainer

    main = DataParallel.current().main
    setup_logging(logging.INFO if main else logging.WARNING)  # one rank reports progress
    for module in cfg.plugins:  # a spawned rank received the config, not the parent's imports: register them here
        import_plugin(module)
    try:
        trainer = Trainer(cfg, run_dir=run_dir)
    except ConfigError as exc:
        fail(f"config error: {exc}")  # the line (and under --debug the traceback); this rank's exit code below
        sys.exit(2)
    try:
        summary = trainer.fit(resume=resume)
    except RunHalted as exc:
        if main:
            err.print(f"run halted: {exc}", markup=False, highlight=False)
        sys.exit(3)
    if main:
        console.print(summary_table(summary))


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
