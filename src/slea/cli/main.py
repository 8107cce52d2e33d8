"""The ``slea`` commands that train, evaluate, compare, report, play and serve (``slea library ...`` and
``slea data ...`` live in :mod:`slea.cli.library` and :mod:`slea.cli.data`)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import typer
from rich.table import Table

from slea.cli.common import console, err, fail, plain, require_env, run_config
from slea.cli.data import data_app
from slea.cli.library import library_app, portable

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Multi-turn agentic RL with a per-step "
                  "experience library (SLEA-RL) and the methods it is compared with.")
app.add_typer(library_app, name="library")
app.add_typer(data_app, name="data")


@app.callback()
def _setup() -> None:
    from slea.progress import setup_logging

    setup_logging()


@app.command()
def train(
    config: Path | None = typer.Argument(None, help="YAML config (default: built-in defaults)"),
    set_: list[str] = typer.Option([], "--set", help="override, e.g. --set rollout.groups=2"),
    resume: Path | None = typer.Option(None, "--resume", help="continue the run in this folder"),
    nproc: int | None = typer.Option(None, "--nproc", min=1, help="data-parallel training processes on this "
                                     "machine (torch.distributed: gloo on CPU, NCCL on GPUs, one GPU per "
                                     "process): each plays its share of the task groups "
                                     "(default 1; with --resume, as many as the run's last checkpoint had)"),
) -> None:
    """Train a policy (or, for an algorithm that needs a team such as teamtr, a team of agents) with RL; writes a
    run folder (metrics, curves, checkpoints, eval)."""
    if resume is not None:
        if not (resume / "config.yaml").is_file():
            raise fail(f"--resume: {resume} has no config.yaml (not a run folder)")
        cfg = run_config(resume / "config.yaml", list(set_) + [f"run.dir={resume}"])
    else:
        cfg = run_config(config, set_)
    require_env(cfg.env.id)
    from slea.algorithms.registry import get_algorithm
    from slea.config import ConfigError
    from slea.trainer.dp_checks import check_data_parallel
    from slea.trainer.guards import RunHalted
    from slea.trainer.rl import run_dir_for
    from slea.trainer.select import build_trainer, trainer_kind

    try:  # the trainer is chosen by what the algorithm declares it needs (slea/trainer/select.py)
        trainer_kind(get_algorithm(cfg.algorithm.name))
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None
    from slea.trainer.checkpoint import trained_processes
    from slea.trainer.distributed import DataParallel, init_from_torchrun, is_torchrun

    if nproc is None:  # a resumed --nproc run (train.fsdp needs it) restarts with its own count; torchrun sets its own
        nproc = trained_processes(resume) if resume is not None and not is_torchrun() else 1
    import os

    from slea.trainer.dp_checks import check_rank_devices

    try:  # run.device names a device this machine has, for every process: before any model loads
        check_rank_devices(cfg.run.device, nproc if nproc > 1 else int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None
    if nproc > 1:
        _train_data_parallel(cfg, nproc, resume is not None)
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
            _train_rank(cfg, dp.from_main(run_dir_for(cfg)), resume is not None)
        finally:
            import torch.distributed as dist

            dist.destroy_process_group()
        return

    from slea.policy.openai_engine import GeneratorError

    try:
        check_data_parallel(cfg, DataParallel())  # one process: train.fsdp is refused
        trainer = build_trainer(cfg)  # the single-agent RL trainer, or the team trainer (TeamTR)
    except ConfigError as exc:  # a value the trainer cannot use, or one checkable only against the model
        raise fail(f"config error: {exc}") from None
    except GeneratorError as exc:  # a managed vLLM server that did not start: its log's tail, one line
        raise fail(str(exc)) from None
    plain(f"run folder: {trainer.dir}")
    try:
        summary = trainer.fit(resume=resume is not None)
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
        if not (resume / "config.yaml").is_file():
            raise fail(f"--resume: {resume} has no config.yaml (not a run folder)")
        cfg = run_config(resume / "config.yaml", over + [f"run.dir={resume}"])
    else:
        cfg = run_config(config, over)
    require_env(cfg.env.id)
    from slea.alignment.pipeline import AlignPipeline
    from slea.config import ConfigError
    from slea.trainer.rl import run_dir_for

    run_dir = run_dir_for(cfg)
    if resume is None and (run_dir / "config.yaml").is_file():
        raise fail(f"align: {run_dir} is already a run folder; continue it with --resume {run_dir}")
    try:
        pipeline = AlignPipeline(cfg, run_dir, say=plain)
        plain(f"run folder: {run_dir}")
        results = pipeline.run()
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None
    for split, res in results.items():
        s, g = res["sampled"], res.get("greedy") or {}
        plain(f"{split}: sampled success {s['success']:.3f}, greedy success {g.get('success', float('nan')):.3f}")

def _build_cached_model(model_cfg) -> None:
    """Build the cached ``tiny`` / ``embedded`` model folders a run names, in this process before it joins a
    process group: in a rank > 0 of one, transformers' ``save_pretrained`` writes nothing."""
    from slea.policy.model import resolve

    for name in {model_cfg.name_or_path, model_cfg.tokenizer or model_cfg.name_or_path}:
        resolve(name)


def _train_data_parallel(cfg, nproc: int, resume: bool) -> None:
    """``slea train --nproc N``: N spawned ranks in one group (slea/trainer/distributed.py; gloo on CPU, NCCL
    with one GPU per rank). (Under
    ``torchrun --nproc-per-node N -m slea.cli train ...`` each process joins torchrun's group instead.)"""
    import torch.multiprocessing as mp

    from slea.config import ConfigError
    from slea.trainer.distributed import DataParallel, launch
    from slea.trainer.dp_checks import check_data_parallel
    from slea.trainer.rl import run_dir_for

    try:
        check_data_parallel(cfg, DataParallel(0, nproc))
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None
    _build_cached_model(cfg.model)  # once, here: a spawned rank > 0 could not write it
    run_dir = run_dir_for(cfg)  # chosen once here: a timestamped name must be the same on every rank
    plain(f"run folder: {run_dir}  ({nproc} data-parallel processes)")
    try:
        launch(_train_rank, nproc, cfg, run_dir, resume, device=cfg.run.device)
    except mp.ProcessExitedException as exc:  # a rank exited 2 or 3 after printing its one line
        raise typer.Exit(exc.exit_code if exc.exit_code in (2, 3) else 1) from None


def _train_rank(cfg, run_dir: Path, resume: bool) -> None:
    """One rank of ``slea train --nproc``: rank 0 logs, writes the run folder and prints the summary."""
    from slea.config import ConfigError
    from slea.plugins import import_plugin
    from slea.progress import setup_logging
    from slea.trainer.distributed import DataParallel
    from slea.trainer.guards import RunHalted
    from slea.trainer.rl import Trainer

    main = DataParallel.current().main
    setup_logging(logging.INFO if main else logging.WARNING)  # one rank reports progress
    for module in cfg.plugins:  # a spawned rank received the config, not the parent's imports: register them here
        import_plugin(module)
    try:
        trainer = Trainer(cfg, run_dir=run_dir)
    except ConfigError as exc:
        err.print(f"config error: {exc}", markup=False, highlight=False)
        sys.exit(2)
    try:
        summary = trainer.fit(resume=resume)
    except RunHalted as exc:
        if main:
            err.print(f"run halted: {exc}", markup=False, highlight=False)
        sys.exit(3)
    if main:
        console.print(summary_table(summary))


def summary_table(summary: dict) -> Table:
    t = Table(title="held-out evaluation")
    t.add_column("")
    t.add_column("sampled success")
    t.add_column("invalid rate")
    t.add_column("greedy success")
    for label in ("before", "after"):
        res = summary.get(label)
        if not res:
            continue
        g = res.get("greedy") or {}
        t.add_row("untrained" if label == "before" else "trained", f"{res['sampled']['success']:.3f}",
                  f"{res['sampled']['invalid_rate']:.3f}", f"{g.get('success', float('nan')):.3f}")
    t.caption = f"episodes used: {summary['episodes']}   wall time: {summary['wall_s'] / 60:.1f} min"
    return t


@app.command()
def compare(
    config: Path | None = typer.Argument(None, help="YAML config shared by every run"),
    algorithms: str | None = typer.Option(None, "--algorithms", help="comma-separated algorithm names "
                                          "(default grpo,rloo,gigpo unless --variant is given)"),
    variant: list[str] = typer.Option([], "--variant", help="instead of --algorithms, one compared variant of the "
                                      "config (repeatable), e.g. --variant naive:team.rollouts=stale"),
    seeds: str = typer.Option("0", "--seeds", help="comma-separated run seeds, e.g. 0,1,2"),
    set_: list[str] = typer.Option([], "--set", help="override for every run, e.g. --set train.iterations=4"),
    out: Path | None = typer.Option(None, "--out", help="output folder (default runs/compare-<config>)"),
) -> None:
    """Train several algorithms (or variants: --variant LABEL:KEY=VALUE,...) × seeds with identical env seeds and
    budget; writes table.md/json and curves.png. Finished sub-runs are reused, unfinished ones resumed."""
    from slea.config import ConfigError
    from slea.trainer import compare as cmp

    if algorithms is None and not variant:
        algorithms = "grpo,rloo,gigpo"
    algos = [a.strip() for a in (algorithms or "").split(",") if a.strip()]
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise fail(f"--seeds: expected comma-separated integers, got {seeds!r}") from None
    out = out or Path("runs") / f"compare-{config.stem if config else 'default'}"
    try:
        plan = cmp.plan(config, algos, seed_list, out, overrides=list(set_), variants=cmp.parse_variants(variant))
    except (ConfigError, ValueError) as exc:
        raise fail(f"compare: {exc}") from None
    require_env(plan.items[0][1].env.id)
    cmp.run(plan, say=plain)
    typer.echo((out / "table.md").read_text())  # plain: a markdown table must not be re-wrapped
    plain(f"wrote {out / 'table.md'}, {out / 'table.json'}, {out / 'curves.png'}")


@app.command()
def report(
    run: Path = typer.Argument(..., help="a run folder, or a `slea compare` output folder"),
    out: Path | None = typer.Option(None, "-o", "--out", help="the HTML file (default: RUN/report.html)"),
) -> None:
    """Write one self-contained HTML page about a run: config, learning curves, evaluation tables, the
    experience library (filterable) and the recorded episodes, step by step; for a compare folder, the
    comparison table and every sub-run's curves. No server, no network: open it from disk."""
    from slea.evaluation.html_report import ReportError, write_report

    try:
        path = write_report(run, out)
    except ReportError as exc:
        raise fail(f"report: {exc}") from None
    except OSError as exc:
        raise fail(f"report: cannot write {out or run / 'report.html'} ({exc.strerror or exc})") from None
    plain(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")


def _model_target(target: str) -> bool:
    """Whether ``target`` names a model: ``embedded``, ``tiny``, a model folder, or a name in the local HF cache."""
    if target in ("embedded", "tiny") or (Path(target) / "config.json").is_file():
        return True
    if Path(target).exists() or target.count("/") != 1:
        return False
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(target, "config.json"), str)
    except Exception:  # noqa: BLE001  (not a valid repo id: not a cached model)
        return False


def _run_device(cfg):
    """``run.device`` resolved for this process, or the one-line config error (exit 2) before any model loads."""
    from slea.config import ConfigError
    from slea.device import run_device

    try:
        return run_device(cfg.run.device)
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None


def _played(cfg, last: Path | None, device):
    """The policy of a command that trains nothing (slea/policy/served.py: a served model is frozen unless a
    run's trained adapter must reach it): ``(model, tokenizer, prompt builder, generator)``, or one line, exit 2
    (a config the model refuses, a server that is not there or lacks what ``model.openai.api`` needs)."""
    from slea.config import ConfigError
    from slea.policy.openai_engine import GeneratorError
    from slea.policy.served import played_policy

    try:
        return played_policy(cfg, last, device=device)
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None
    except GeneratorError as exc:
        raise fail(str(exc)) from None


def _checkpoint_or_exit(what: str, run: Path | None) -> Path | None:
    """A run's newest usable checkpoint (None when the target is not a run), or one line and exit code 2 (also for
    a team run: its checkpoint holds one adapter per agent, which these commands cannot load into one policy)."""
    if run is None:
        return None
    from slea.trainer.checkpoint import CheckpointError, run_checkpoint

    kind = _trainer_of(run)
    if kind is not None and kind != "rl":
        raise fail(f"{what}: {run} is a run of the {kind} trainer (one adapter per agent), which `slea {what}` "
                   f"cannot load into one policy; its held-out evaluation is {run / 'eval' / 'after.json'}")

    try:
        return run_checkpoint(run)
    except CheckpointError as exc:
        raise fail(f"{what}: {exc}") from None


def _trainer_of(run: Path) -> str | None:
    """The name of the trainer that trained ``run`` (slea/trainer/select.py), or None when its config does not
    load here (the command's own loading then reports why)."""
    from slea.algorithms.registry import get_algorithm
    from slea.config import load_config
    from slea.trainer.select import trainer_kind

    try:
        return trainer_kind(get_algorithm(load_config(run / "config.yaml").algorithm.name)).name
    except Exception:  # noqa: BLE001  (a config error, an unknown plugin: not this check's to report)
        return None


def _eval_library(run: Path, cfg, last: Path | None, workdir: Path):
    """The experience library a run evaluated with: a private copy of its checkpoint's snapshot (the
    evaluation's retrievals link entries and open clusters; the run's own files stay untouched)."""
    snap = last / "library.sqlite" if last is not None else None
    if cfg.experience.mode == "off" or snap is None or not snap.is_file():
        return None
    import shutil

    from slea.experience.manager import ExperienceManager

    shutil.copyfile(snap, workdir / "library.sqlite")
    return ExperienceManager(cfg.experience, workdir / "library.sqlite")


@app.command("eval")
def eval_(
    target: str = typer.Argument(..., help="a run folder, a model folder, 'embedded', or a YAML config"),
    split: str | None = typer.Option(None, help="env split (default: the config's held-out one)"),
    episodes: int | None = typer.Option(None, help="sampled episodes per game"),
    seed: int | None = typer.Option(None),
    env: str | None = typer.Option(None, "--env", help="another env id than the config's (its kwargs "
                                      "then come only from --set env.kwargs.x=...)"),
    out: Path | None = typer.Option(None, "--out", help="folder for eval/<name>.json|.md (default: the "
                                       "run folder, else runs/eval-<target>)"),
    set_: list[str] = typer.Option([], "--set"),
) -> None:
    """Evaluate a trained run (its last checkpoint, with its experience library), a model folder, or the
    untrained embedded model; prints and saves the env family's paper-style table. A run's evaluation with its
    own settings reproduces its eval/after.json."""
    path = Path(target)
    run = path if (path / "config.yaml").is_file() else None
    config_file = run / "config.yaml" if run else path if path.suffix in (".yaml", ".yml") and path.is_file() \
        else None
    over = [f"model.name_or_path={target}"] if config_file is None else []
    over += list(set_)
    if episodes is not None:
        over.append(f"eval.episodes_per_game={episodes}")
    if seed is not None:
        over.append(f"eval.seed={seed}")
    cfg = run_config(config_file, over, trains=False)
    if env is not None and env != cfg.env.id:  # another env: the config's env kwargs do not apply to it
        cfg = run_config(config_file, [f"env.id={env}", "env.kwargs={}", "env.eval_kwargs={}", *over], trains=False)
    if config_file is None and not _model_target(target) and cfg.model.generator == "hf":  # a served one: any name
        raise fail(f"eval: {target!r} is neither a run folder (with config.yaml), a model folder (with "
                    f"config.json), 'embedded', 'tiny' nor a YAML config")
    require_env(cfg.env.id)
    import tempfile

    import torch

    from slea.evaluation.evaluate import evaluate, write_eval
    from slea.evaluation.report import PaperTable
    from slea.policy.engines import close_generator
    from slea.policy.openai_engine import GeneratorError
    from slea.rollout.collector import RolloutCollector

    torch.set_num_threads(cfg.run.threads)
    device = _run_device(cfg)
    last = _checkpoint_or_exit("eval", run)
    _, _, builder, generator = _played(cfg, last, device)
    kwargs = {**cfg.env.kwargs, "split": "heldout", **cfg.env.eval_kwargs}  # as training's evaluation
    if split is not None:
        kwargs["split"] = split
    split = kwargs["split"]
    with tempfile.TemporaryDirectory() as work:
        library = None
        try:
            library = _eval_library(run, cfg, last, Path(work)) if run else None
            collector = RolloutCollector(generator, builder, cfg.rollout, cfg.env.max_steps, experience=library,
                                         experience_mode=cfg.experience.mode)
            res = evaluate(collector, cfg.env.id, kwargs, cfg.eval, step_timeout_s=cfg.env.step_timeout_s,
                           reset_timeout_s=cfg.env.reset_timeout_s,
                           iteration=cfg.train.iterations if run else 0)  # the run's "after": warm-up gate open
        except GeneratorError as exc:  # the server went away or refused mid-run: one line
            raise fail(f"eval: {exc}") from None
        finally:
            close_generator(generator)  # a managed vLLM server stops here
            if library is not None:
                library.close()
    res["checkpoint"] = last.name if last else None
    name = f"eval-{split}" if env is None else f"eval-{split}-{cfg.env.id.rsplit('/', 1)[-1]}"
    saved = write_eval(out or run or Path("runs") / f"eval-{path.stem or 'model'}", name, res)
    console.print_json(json.dumps({k: v for k, v in res.items() if k != "table"}))
    console.print(PaperTable.from_dict(res["table"]).to_rich(first=cfg.model.name_or_path if run is None
                                                              else run.name))
    plain(f"wrote {saved} and {saved.with_suffix('.md')}")


@app.command()
def agent(
    model: str = typer.Option(..., "--model", help="'embedded', 'tiny', a local HF model folder, or a run "
                                                   "folder (its config and last checkpoint's weights)"),
    library: Path = typer.Option(..., "--library", help="a run folder, an SQLite library or a JSONL export (with "
                                                        "--evolve, a new NAME.sqlite starts empty)"),
    env: str = typer.Option(..., "--env", help="env id"),
    evolve: bool = typer.Option(False, "--evolve", help="the library keeps learning from the episodes"),
    games: int | None = typer.Option(None, "--games", help="games (env seeds) per condition (eval.games)"),
    episodes: int | None = typer.Option(None, "--episodes", help="sampled episodes per game "
                                                                 "(eval.episodes_per_game)"),
    seed: int | None = typer.Option(None, "--seed", help="env seed of the first game (eval.seed)"),
    batch: int = typer.Option(1, "--batch", min=1, help="with --evolve: games per evolution round"),
    split: str | None = typer.Option(None, help="env split (default heldout)"),
    out: Path | None = typer.Option(None, "--out", help="folder for agent.json (and, with --evolve, the "
                                                        "evolved library.sqlite); default runs/agent-<model>-<env>"),
    set_: list[str] = typer.Option([], "--set"),
) -> None:
    """Play a frozen model with and without an experience library on the same games.

    Per-step retrieval, no weight update (--evolve: the library learns from the episodes); prints and saves the
    difference (success, return, invalid rate, retrieval hit rate)."""
    path = Path(model)
    run = path if (path / "config.yaml").is_file() else None
    if evolve and not library.exists() and library.suffix == ".sqlite":  # a library learnt from nothing
        from slea.config import ExperienceSection
        from slea.experience.manager import ExperienceManager

        library.parent.mkdir(parents=True, exist_ok=True)
        ExperienceManager(ExperienceSection(), library).close()
        plain(f"new empty library {library}")
    lib = portable("agent: --library", library)
    from slea.evaluation.agent import agent_overrides

    over = agent_overrides(None if run else model, lib.settings, games=games, episodes=episodes, seed=seed)
    config_file = run / "config.yaml" if run else None
    cfg = run_config(config_file, over + list(set_), trains=False)
    if run is None and not _model_target(model) and cfg.model.generator == "hf":  # a served model: any name
        raise fail(f"agent: --model {model!r} is neither a run folder (with config.yaml), a model folder (with "
                    f"config.json), 'embedded' nor 'tiny'")
    if env != cfg.env.id:  # another env: the config's env kwargs do not apply to it
        over = [f"env.id={env}", "env.kwargs={}", "env.eval_kwargs={}", *over]
    if cfg.experience.mode == "off" and not any(s.startswith("experience.mode=") for s in set_):
        over.append("experience.mode=step")
    cfg = run_config(config_file, over + list(set_), trains=False)
    require_env(cfg.env.id)
    import tempfile

    import torch

    from slea.algorithms.registry import get_algorithm
    from slea.atomic import atomic_write_text
    from slea.evaluation.agent import agent_table, run_agent
    from slea.evaluation.report import PaperTable
    from slea.experience.portable import working_copy
    from slea.policy.engines import close_generator
    from slea.policy.openai_engine import GeneratorError
    from slea.trainer.rl import experience_manager  # the trainer's manager, extractor and all

    torch.set_num_threads(cfg.run.threads)
    device = _run_device(cfg)
    last = _checkpoint_or_exit("agent", run)
    _, _, builder, generator = _played(cfg, last, device)
    kwargs = {**cfg.env.kwargs, "split": split or "heldout", **cfg.env.eval_kwargs}
    if split is not None:
        kwargs["split"] = split
    out = out or Path("runs") / f"agent-{path.name or model}-{cfg.env.id.rsplit('/', 1)[-1]}"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        workdir = out if evolve else Path(work)  # the evolved library is kept, a read-only use is not
        manager = None
        try:
            working_copy(library, workdir / "library.sqlite")
            manager = experience_manager(cfg, get_algorithm(cfg.algorithm.name), workdir, generator)
            res = run_agent(generator, builder, cfg, manager, kwargs, evolve=evolve, batch=batch, say=plain)
        except GeneratorError as exc:  # the server went away or refused mid-run: one line
            raise fail(f"agent: {exc}") from None
        finally:
            if manager is not None:
                manager.close()
            close_generator(generator)
    res.update({"model": model, "checkpoint": last.name if last else None, "library_source": str(library),
                "library_provenance": lib.provenance, "split": kwargs["split"]})
    saved = atomic_write_text(out / "agent.json", json.dumps(res, indent=2))
    console.print(agent_table(res))
    console.print(PaperTable.from_dict(res["table"]).to_rich(first=model))
    plain(f"wrote {saved}" + (f" and the evolved library {out / 'library.sqlite'}" if evolve else ""))


@app.command()
def serve(
    model: str = typer.Argument(..., help="'tiny', 'embedded', a local HF model folder, or a run folder (its "
                                          "model with its last checkpoint's LoRA adapter)"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="0: a free port (printed)"),
    dtype: str | None = typer.Option(None, "--dtype", help="bfloat16 | float32 (default: the run's, else "
                                                            "bfloat16)"),
    threads: int = typer.Option(2, "--threads", min=1, help="torch intra-op threads"),
) -> None:
    """An OpenAI-compatible completions server on slea's engine: /v1/models, /v1/completions (token-id or text
    prompts, log-probs), /v1/load_lora_adapter (the trainer's weight sync: model.generator=openai)."""
    if not (Path(model) / "config.yaml").is_file() and not _model_target(model):
        raise fail(f"serve: {model!r} is neither a run folder (with config.yaml), a model folder (with "
                    f"config.json), 'embedded' nor 'tiny'")
    if dtype not in (None, "bfloat16", "float32"):
        raise fail(f"serve: --dtype {dtype!r}: expected bfloat16 or float32")
    import torch

    from slea.policy.server import load_engine, make_server
    from slea.trainer.checkpoint import CheckpointError

    torch.set_num_threads(threads)
    try:
        engine = load_engine(model, dtype=dtype)
    except CheckpointError as exc:
        raise fail(f"serve: {exc}") from None
    try:
        server = make_server(engine, host, port)
    except OSError as exc:
        raise fail(f"serve: cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    bound = server.server_address[1]
    plain(f"serving {engine.base_id}" + (f" (adapter {engine.lora})" if engine.lora else "") +
           f" at http://{host}:{bound}/v1")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@app.command()
def export(
    run: Path = typer.Argument(..., help="a run folder (its config and last checkpoint)"),
    out: Path = typer.Argument(..., help="the folder to write (new, or empty)"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (the base checkpoint's) | float32 | bfloat16"),
) -> None:
    """Write a trained run's policy as a Hugging Face model folder (LoRA merged; safetensors, tokenizer, chat
    template) that transformers and vLLM load as it is."""
    from slea.config import ConfigError
    from slea.export import export_run
    from slea.trainer.checkpoint import CheckpointError

    try:
        folder = export_run(run, out, dtype=dtype)
    except (ConfigError, CheckpointError) as exc:
        raise fail(f"export: {exc}".replace("export: export: ", "export: ")) from None
    plain(f"wrote {folder}")


@app.command()
def envs() -> None:
    """List registered environments and whether their extra is installed."""
    import slea.envs as E

    id_width = max(len(s.id) for s in E.registered().values())  # ids never wrap, even at 80 columns
    t = Table(title="registered environments")
    t.add_column("id", no_wrap=True, min_width=id_width)
    for col in ("family", "extra", "installed", "description"):
        t.add_column(col)
    for spec in sorted(E.registered().values(), key=lambda s: s.id):
        missing = spec.missing()
        ok = "[green]yes[/]" if not missing else f"[red]no[/] (missing {', '.join(missing)})"
        t.add_row(spec.id, spec.family, spec.extra or "-", ok, spec.description)
    console.print(t)
    from slea.envs.status import data_status  # files and env variables only: no engine starts

    d = Table(title="data found, per family")
    d.add_column("family")
    d.add_column("ids", no_wrap=True, min_width=id_width)
    for col in ("extra installed", "data"):
        d.add_column(col)
    fams: dict[str, list] = {}
    for spec in sorted(E.registered().values(), key=lambda s: s.id):
        fams.setdefault(spec.family, []).append(spec)
    for fam, specs in sorted(fams.items()):
        missing = sorted({m for s in specs for m in s.missing()})
        ok = "[green]yes[/]" if not missing else f"[red]no[/] (missing {', '.join(missing)})"
        d.add_row(fam, "\n".join(s.id for s in specs), ok, data_status(fam) or "-")
    console.print(d)


def main() -> None:  # pragma: no cover
    sys.exit(app())
