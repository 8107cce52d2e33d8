"""``slea data``: alignment data (expert trajectories, a user's demonstrations of a tool env)."""

from __future__ import annotations

from pathlib import Path

import typer

from slea.cli.common import fail, plain, require_env, run_config

SHOW_DROPPED = 20  # slea data demos: the dropped demonstrations listed with their reason
data_app = typer.Typer(no_args_is_help=True, help="Make alignment data (expert trajectories, demonstrations).")


@data_app.command("expert")
def data_expert(
    env: str | None = typer.Option(None, "--env", help="env id (default: the config's env.id)"),
    split: str = typer.Option("train", "--split", help="env split the tasks come from"),
    n: int = typer.Option(..., "-n", help="number of tasks: env seeds FIRST .. FIRST+n-1"),
    first: int = typer.Option(0, "--first", help="first env seed"),
    out: Path | None = typer.Option(None, "--out", help="JSONL file (default data/expert-<env>-<split>.jsonl)"),
    config: Path | None = typer.Option(None, "--config", help="YAML config whose env and rollout settings apply"),
    set_: list[str] = typer.Option([], "--set", help="override, e.g. --set env.max_steps=50"),
    tokens: bool = typer.Option(True, "--tokens/--no-tokens", help="count the turns longer than "
                                "rollout.max_new_tokens with model.name_or_path's tokenizer"),
) -> None:
    """Replay the env's expert on n tasks and save the winning episodes as JSONL, each turn rendered with the
    prompt a rollout with this config's settings would show (rollout.history, rollout.obs_max_chars,
    rollout.one_shot); replays longer than env.max_steps or not won are dropped and counted."""
    cfg = run_config(config, ([f"env.id={env}"] if env else []) + list(set_))
    if n < 1:
        raise fail(f"data expert: -n must be at least 1 (got {n})")
    require_env(cfg.env.id)
    from slea.alignment.data import expert_source, expert_trajectories, save_jsonl
    from slea.envs import registered
    from slea.policy.prompt_builder import PromptBuilder

    if expert_source(cfg.env.id) is None:
        with_expert = sorted(i for i in registered() if expert_source(i) is not None)
        raise fail(f"data expert: {cfg.env.id} has no expert source (envs with one: {', '.join(with_expert)})")
    out = out or Path("data") / f"expert-{cfg.env.id.rsplit('/', 1)[-1].lower()}-{split}.jsonl"
    builder = PromptBuilder.from_rollout(None, cfg.rollout)  # messages only: no tokenizer needed
    kwargs = {**cfg.env.kwargs, "split": split}
    try:
        trajs, dropped = expert_trajectories(cfg.env.id, kwargs, list(range(first, first + n)), builder,
                                             max_steps=cfg.env.max_steps, fuzzy_cutoff=cfg.rollout.fuzzy_cutoff)
    except (ValueError, KeyError, FileNotFoundError) as exc:  # e.g. an unknown split or task name
        raise fail(f"data expert: {cfg.env.id}: {exc.args[0] if exc.args else exc}") from None
    save_jsonl(out, trajs)
    turns = sum(len(t.turns) for t in trajs)
    plain(f"kept {len(trajs)} of {n} expert episodes ({turns} turns, {turns / max(len(trajs), 1):.1f} per "
           f"episode); source {expert_source(cfg.env.id)}")
    skipped = sum(t.skipped for t in trajs)
    if skipped:
        plain(f"left out {skipped} expert actions a rollout would not play as written (not a valid command, "
               f"or refused by the env)")
    if dropped:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items()))
        hint = f" (env.max_steps is {cfg.env.max_steps})" if "too many steps" in dropped else ""
        plain(f"dropped {sum(dropped.values())}: {why}{hint}")
    if trajs and tokens:
        _over_budget(cfg, trajs, turns)
    plain(f"wrote {out}")


@data_app.command("demos")
def data_demos(
    demos: Path | None = typer.Option(None, "--demos", help="JSON file: [{\"seed\": 0, \"calls\": [call, ...]}, ...]"),
    play: str | None = typer.Option(None, "--play", help="a function play(task, call) as module:function, played "
                                    "on env seeds FIRST .. FIRST+n-1"),
    n: int | None = typer.Option(None, "-n", help="with --play: number of tasks"),
    first: int = typer.Option(0, "--first", help="with --play: first env seed"),
    env: str | None = typer.Option(None, "--env", help="a tool env id (default: the config's env.id)"),
    split: str = typer.Option("train", "--split", help="env split the tasks come from"),
    out: Path | None = typer.Option(None, "--out", help="JSONL file (default data/demos-<env>-<split>.jsonl)"),
    config: Path | None = typer.Option(None, "--config", help="YAML config whose env and rollout settings apply"),
    set_: list[str] = typer.Option([], "--set", help="override, e.g. --set rollout.history=2"),
    tokens: bool = typer.Option(True, "--tokens/--no-tokens", help="count the turns longer than "
                                "rollout.max_new_tokens with model.name_or_path's tokenizer"),
) -> None:
    """Replay your demonstrations of a tool env (a list of calls per task seed, or a function that plays a task)
    in the real env and save those that win as expert data for `slea align` (align.expert_file): each turn the
    prompt a rollout with this config's settings renders, and the calls as the model writes them. A refused call,
    a failing tool, a play past env.max_steps or one that does not win is dropped, with the reason."""
    cfg = run_config(config, ([f"env.id={env}"] if env else []) + list(set_))
    if (demos is None) == (play is None):
        raise fail("data demos: give either --demos FILE or --play MODULE:FUNCTION")
    if play is not None and (n is None or n < 1):
        raise fail(f"data demos: --play needs -n, at least 1 (got {n})")
    if demos is not None and n is not None:
        raise fail("data demos: -n goes with --play (a --demos file names its seeds)")
    if first < 0:
        raise fail(f"data demos: --first must be at least 0 (got {first})")
    require_env(cfg.env.id)
    from slea.alignment.data import calls_play, demonstration_trajectories, load_demonstrations, save_jsonl
    from slea.policy.prompt_builder import PromptBuilder

    if demos is not None:
        try:
            plays = [(d.seed, calls_play(d)) for d in load_demonstrations(demos)]
        except (OSError, ValueError) as exc:
            raise fail(f"data demos: {exc}") from None
    else:
        fn = _play_function(play)
        plays = [(seed, fn) for seed in range(first, first + n)]
    out = out or Path("data") / f"demos-{cfg.env.id.rsplit('/', 1)[-1].lower()}-{split}.jsonl"
    builder = PromptBuilder.from_rollout(None, cfg.rollout)  # messages only: no tokenizer needed
    try:
        trajs, dropped = demonstration_trajectories(cfg.env.id, {**cfg.env.kwargs, "split": split}, plays, builder,
                                                    max_steps=cfg.env.max_steps)
    except (ValueError, KeyError, FileNotFoundError) as exc:  # not a tool env, an unknown split
        raise fail(f"data demos: {cfg.env.id}: {exc.args[0] if exc.args else exc}") from None
    save_jsonl(out, trajs)
    turns = sum(len(t.turns) for t in trajs)
    plain(f"kept {len(trajs)} of {len(plays)} demonstrations ({turns} turns, {turns / max(len(trajs), 1):.1f} per "
          f"episode)")
    for seed, why in dropped[:SHOW_DROPPED]:
        plain(f"dropped seed {seed}: {why}")
    if len(dropped) > SHOW_DROPPED:
        plain(f"and {len(dropped) - SHOW_DROPPED} more dropped")
    if trajs and tokens:
        _over_budget(cfg, trajs, turns)
    plain(f"wrote {out}")


def _play_function(ref: str):
    """The function ``module:function`` names (the module imported as a plugin is: the working directory is
    searched last), or one line and exit code 2."""
    from slea.plugins import import_plugin

    module, _, name = (part.strip() for part in ref.partition(":"))
    if not module or not name:
        raise fail(f"data demos: --play {ref!r}: expected module:function")
    try:
        import_plugin(module)
    except ImportError as exc:
        raise fail(f"data demos: --play: {exc}") from None
    import importlib

    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise fail(f"data demos: --play: module {module!r} has no function {name!r}")
    return fn


def _over_budget(cfg, trajs, turns: int) -> None:
    """Warn about the turns longer than ``rollout.max_new_tokens`` with the config's tokenizer."""
    from slea.alignment.data import turns_over_budget
    from slea.policy.model import load_tokenizer

    long = turns_over_budget(trajs, load_tokenizer(cfg.model.tokenizer or cfg.model.name_or_path),
                             cfg.rollout.max_new_tokens)
    if long:
        plain(f"warning: {long} of {turns} turns need more than rollout.max_new_tokens={cfg.rollout.max_new_tokens} "
              f"tokens with {cfg.model.name_or_path}'s tokenizer (a rollout cuts them)")
