"""``slea data``: alignment data (expert trajectories)."""

from __future__ import annotations

from pathlib import Path

import typer

from slea.cli.common import fail, plain, require_env, run_config

data_app = typer.Typer(no_args_is_help=True, help="Make alignment data (expert trajectories).")


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
        from slea.alignment.data import turns_over_budget
        from slea.policy.model import load_tokenizer

        long = turns_over_budget(trajs, load_tokenizer(cfg.model.tokenizer or cfg.model.name_or_path),
                                 cfg.rollout.max_new_tokens)
        if long:
            plain(f"warning: {long} of {turns} turns need more than rollout.max_new_tokens="
                   f"{cfg.rollout.max_new_tokens} tokens with {cfg.model.name_or_path}'s tokenizer (a rollout cuts "
                   f"them)")
    plain(f"wrote {out}")
