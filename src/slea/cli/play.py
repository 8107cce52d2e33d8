"""The ``slea`` commands that play or serve a model without training it: ``slea eval`` (a run, a model folder or the
embedded model on an env's held-out games), ``slea agent`` (a frozen model with and without an experience library)
and ``slea serve`` (an OpenAI-compatible server on slea's engine). A served model plays frozen: nothing is
uploaded unless a run's trained adapter must reach the server (slea/policy/served.py)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import typer

from slea.cli.common import console, err, fail, plain, require_env, run_config
from slea.cli.library import portable
from slea.runs.folder import RunFolder


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
    from slea.runs.checkpoint import CheckpointError

    try:
        return played_policy(last, model_cfg=cfg.model, rollout=cfg.rollout, device=device)
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None
    except GeneratorError as exc:
        raise fail(str(exc)) from None
    except CheckpointError as exc:  # weights that do not load (checked before anything was applied)
        raise fail(str(exc)) from None


CHECKPOINT_HELP = ("a checkpoint of the run by name (iter_000006, or 6); default: the newest usable one (a damaged "
                   "newer one is skipped, and said)")


def say_skipped(what: str):
    """The one line a command prints for each damaged checkpoint it skips (stderr: the output stays the result)."""
    return lambda line: err.print(f"{what}: {line}", markup=False, highlight=False, soft_wrap=True)


def _checkpoint_or_exit(what: str, run: Path | None, name: str | None = None) -> Path | None:
    """A run's newest usable checkpoint, or the one named (None when the target is not a run), or one line and exit
    code 2 (also for a team run: its checkpoint holds one adapter per agent, which these commands cannot load
    into one policy). A damaged newer checkpoint skipped is said in one line."""
    if run is None:
        if name is not None:
            raise fail(f"{what}: --checkpoint needs a run folder")
        return None
    from slea.runs.checkpoint import CheckpointError, run_checkpoint

    kind = _trainer_of(run)
    if kind is not None and kind != "rl":
        raise fail(f"{what}: {run} is a run of the {kind} trainer (one adapter per agent), which `slea {what}` "
                   f"cannot load into one policy; its held-out evaluation is {RunFolder(run).evaluation('after')}")

    try:
        return run_checkpoint(run, name, say=say_skipped(what))
    except CheckpointError as exc:
        raise fail(f"{what}: {exc}") from None


def _trainer_of(run: Path) -> str | None:
    """The name of the trainer that trained ``run`` (slea/trainer/select.py), or None when its config does not
    load here (the command's own loading then reports why)."""
    from slea.algorithms.registry import get_algorithm
    from slea.config import load_config
    from slea.trainer.select import trainer_kind

    try:
        return trainer_kind(get_algorithm(load_config(RunFolder(run).config, check_unused=False).algorithm.name)).name
    except Exception:  # noqa: BLE001  (a config error, an unknown plugin: not this check's to report)
        return None


def home_settings(set_: list[str]) -> list[str]:
    """The ``--set`` items that apply to the config's own env: all but its env kwargs, which ``--env`` names
    another env for (they are checked against that one when the config loads)."""
    return [item for item in set_ if not item.startswith(("env.kwargs", "env.eval_kwargs"))]


def _play_setup(what: str, cfg, run: Path | None, checkpoint: str | None, split: str | None):
    """What ``slea eval`` and ``slea agent`` do before they play, in this order: the env's extra checked, torch's
    threads, ``run.device``, the run's checkpoint and the frozen policy on it; then the env kwargs of training's
    evaluation, ``split`` if given. ``(checkpoint or None, prompt builder, generator, env kwargs)``; each failure
    is one line, exit code 2."""
    require_env(cfg.env.id)
    import torch

    from slea.envs.factory import eval_env_kwargs

    torch.set_num_threads(cfg.run.threads)
    device = _run_device(cfg)
    last = _checkpoint_or_exit(what, run, checkpoint)
    _, _, builder, generator = _played(cfg, last, device)
    kwargs = eval_env_kwargs(cfg.env)  # as training's evaluation
    if split is not None:
        kwargs["split"] = split
    return last, builder, generator, kwargs


@contextmanager
def _mid_run(what: str):
    """A served model that went away or refused while the command played: one line, exit code 2."""
    from slea.policy.openai_engine import GeneratorError

    try:
        yield
    except GeneratorError as exc:  # the server went away or refused mid-run: one line
        raise fail(f"{what}: {exc}") from None


def _say_warning(warning: str | None) -> None:
    """A warning line on stderr, if any (the output stays the result)."""
    if warning:
        err.print(warning, markup=False, highlight=False, soft_wrap=True)


def _eval_config(target: str, env: str | None, episodes: int | None, seed: int | None, set_: list[str]):
    """``slea eval``'s target and config: ``(run folder or None, config)``. A run's or YAML file's config, else
    the defaults with ``model.name_or_path=target``; ``--env`` another env: the config's own env is read first
    (without the ``--set`` env kwargs, which are the other env's), and a run's library learnt there is warned
    about. A target that is none of these is one line, exit code 2."""
    path = Path(target)
    run = path if RunFolder(path).is_run() else None
    config_file = RunFolder(run).config if run else path if path.suffix in (".yaml", ".yml") and path.is_file() \
        else None
    over = [f"model.name_or_path={target}"] if config_file is None else []
    if episodes is not None:
        over.append(f"eval.episodes_per_game={episodes}")
    if seed is not None:
        over.append(f"eval.seed={seed}")
    home = run_config(config_file, over + home_settings(set_), trains=False, saved=run is not None).env.id
    moved = env is not None and env != home
    if moved:  # another env: the config's env kwargs do not apply to it
        over = [f"env.id={env}", "env.kwargs={}", "env.eval_kwargs={}", *over]
    cfg = run_config(config_file, [*over, *set_], trains=False, saved=run is not None)
    if moved and run is not None and cfg.experience.mode != "off" and RunFolder(run).library.is_file():
        from slea.evaluation.agent import library_env_warning

        _say_warning(library_env_warning([home], cfg.env.id))  # the run's library is retrieved from on another env
    if config_file is None and not _model_target(target) and cfg.model.generator == "hf":  # a served one: any name
        raise fail(f"eval: {target!r} is neither a run folder (with config.yaml), a model folder (with "
                    f"config.json), 'embedded', 'tiny' nor a YAML config")
    return run, cfg


def eval_(
    target: str = typer.Argument(..., help="a run folder, a model folder, 'embedded', or a YAML config"),
    split: str | None = typer.Option(None, help="env split (default: the config's held-out one)"),
    episodes: int | None = typer.Option(None, help="sampled episodes per game"),
    seed: int | None = typer.Option(None),
    env: str | None = typer.Option(None, "--env", help="another env id than the config's (its kwargs "
                                      "then come only from --set env.kwargs.x=...)"),
    out: Path | None = typer.Option(None, "--out", help="folder for eval/<name>.json|.md (default: the "
                                       "run folder, else runs/eval-<target>)"),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help=CHECKPOINT_HELP),
    set_: list[str] = typer.Option([], "--set"),
) -> None:
    """Evaluate a trained run (its last checkpoint, with its experience library), a model folder, or the
    untrained embedded model; prints and saves the env family's paper-style table. A run's evaluation with its
    own settings reproduces its eval/after.json."""
    run, cfg = _eval_config(target, env, episodes, seed, set_)
    last, builder, generator, kwargs = _play_setup("eval", cfg, run, checkpoint, split)
    from slea.evaluation.evaluate import write_eval
    from slea.evaluation.frozen import evaluate_frozen
    from slea.evaluation.report import PaperTable

    with _mid_run("eval"):
        res = evaluate_frozen(generator, builder, kwargs, rollout=cfg.rollout, env=cfg.env, eval_cfg=cfg.eval,
                              experience=cfg.experience, train_iterations=cfg.train.iterations,
                              run=run is not None, last=last)
    split = kwargs["split"]
    name = f"eval-{split}" if env is None else f"eval-{split}-{cfg.env.id.rsplit('/', 1)[-1]}"
    saved = write_eval(out or run or Path("runs") / f"eval-{Path(target).stem or 'model'}", name, res)
    console.print(PaperTable.from_dict(res["table"]).to_rich(first=cfg.model.name_or_path if run is None
                                                              else run.name))
    plain(_eval_summary(res))  # the table first, then one line; every number is in the JSON written here
    plain(f"wrote {saved} and {saved.with_suffix('.md')}")


def _eval_summary(res: dict) -> str:
    """One line of an evaluation's summary: sampled success, return, invalid rate, episodes, and greedy success
    ("—" and why when greedy episodes were not played)."""
    s, g = res["sampled"], res.get("greedy")
    greedy = f"greedy success {g['success']:.3f}" if g else "greedy success — (eval.greedy is off)"
    return (f"sampled success {s['success']:.3f}, return {s['return']:+.3f}, invalid rate {s['invalid_rate']:.3f} "
            f"({s['episodes']:.0f} episodes on {res.get('games', '?')} games); {greedy}")


def _agent_library(library: Path, evolve: bool):
    """``slea agent --library``, read (:func:`slea.cli.library.portable`); with ``--evolve``, a new
    ``NAME.sqlite`` is made first, empty (a library learnt from nothing)."""
    if evolve and not library.exists() and library.suffix == ".sqlite":  # a library learnt from nothing
        from slea.config import ExperienceSection
        from slea.experience.manager import ExperienceManager

        library.parent.mkdir(parents=True, exist_ok=True)
        ExperienceManager(ExperienceSection(), library).close()
        plain(f"new empty library {library}")
    return portable("agent: --library", library)


def _agent_config(model: str, run: Path | None, env: str, lib, set_: list[str], **eval_keys):
    """``slea agent``'s config: the run's, else the defaults with ``model.name_or_path=model``; the library's
    recorded settings, ``eval_keys`` (games, episodes, seed) and ``--set`` over it; ``env`` (its kwargs only from
    ``--set`` when it is another env than the config's); ``experience.mode=step`` unless the config or ``--set``
    names one. A model that is not there is one line, exit code 2."""
    from slea.evaluation.agent import agent_overrides

    over = agent_overrides(None if run else model, lib.settings, **eval_keys)
    config_file = RunFolder(run).config if run else None
    cfg = run_config(config_file, over + home_settings(set_), trains=False, saved=run is not None)
    if run is None and not _model_target(model) and cfg.model.generator == "hf":  # a served model: any name
        raise fail(f"agent: --model {model!r} is neither a run folder (with config.yaml), a model folder (with "
                    f"config.json), 'embedded' nor 'tiny'")
    if env != cfg.env.id:  # another env: the config's env kwargs do not apply to it
        over = [f"env.id={env}", "env.kwargs={}", "env.eval_kwargs={}", *over]
    if cfg.experience.mode == "off" and not any(s.startswith("experience.mode=") for s in set_):
        over.append("experience.mode=step")
    return run_config(config_file, over + list(set_), trains=False, saved=run is not None)


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
    trace: bool = typer.Option(False, "--trace", help="also write steps.jsonl into --out: one row per step "
                                                      "played (both conditions) with the experiences retrieved"),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help=CHECKPOINT_HELP),
    set_: list[str] = typer.Option([], "--set"),
) -> None:
    """Play a frozen model with and without an experience library on the same games.

    Per-step retrieval, no weight update (--evolve: the library learns from the episodes); prints and saves the
    difference (success, return, invalid rate, retrieval hit rate)."""
    path = Path(model)
    run = path if RunFolder(path).is_run() else None
    lib = _agent_library(library, evolve)
    cfg = _agent_config(model, run, env, lib, set_, games=games, episodes=episodes, seed=seed)
    last, builder, generator, kwargs = _play_setup("agent", cfg, run, checkpoint, split)
    from slea.evaluation.agent import agent_table, library_env_warning, library_envs
    from slea.evaluation.frozen import STEPS, play_agent, write_agent
    from slea.evaluation.report import PaperTable

    # once, with both ids: a library learnt on another env rarely retrieves anything that fits
    _say_warning(library_env_warning(library_envs(lib.provenance, lib.entries), cfg.env.id) if lib.entries else None)
    out = out or Path("runs") / f"agent-{path.name or model}-{cfg.env.id.rsplit('/', 1)[-1]}"
    out.mkdir(parents=True, exist_ok=True)
    with _mid_run("agent"):
        res = play_agent(generator, builder, library, kwargs, model_cfg=cfg.model, rollout=cfg.rollout, env=cfg.env,
                         eval_cfg=cfg.eval, experience=cfg.experience, algorithm=cfg.algorithm, out=out,
                         evolve=evolve, batch=batch, say=plain, trace=trace)
    res.update({"model": model, "checkpoint": last.name if last else None, "library_source": str(library),
                "library_provenance": lib.provenance, "split": kwargs["split"]})
    saved, steps = write_agent(out, res)
    console.print(agent_table(res))
    console.print(PaperTable.from_dict(res["table"]).to_rich(first=model))
    plain(f"wrote {saved}" + (f", {out / STEPS} ({len(steps)} steps)" if steps is not None else "")
          + (f" and the evolved library {RunFolder(out).library}" if evolve else ""))


def serve(
    model: str = typer.Argument(..., help="'tiny', 'embedded', a local HF model folder, or a run folder (its "
                                          "model with its last checkpoint's LoRA adapter)"),
    host: str = typer.Option("127.0.0.1", "--host", help="the address to listen on (another than loopback: set "
                                                         "an API key)"),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="0: a free port (printed)"),
    dtype: str | None = typer.Option(None, "--dtype", help="auto | bfloat16 | float32 (default: the run's, else "
                                                            "auto: bf16 where this CPU computes it natively)"),
    threads: int = typer.Option(2, "--threads", min=1, help="torch intra-op threads"),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help=CHECKPOINT_HELP),
    api_key: str | None = typer.Option(None, "--api-key", envvar="SLEA_API_KEY", show_envvar=True,
                                       help="requests must send 'Authorization: Bearer KEY' (401 without); "
                                            "prefer the environment variable, which ps does not show"),
    lora_dir: Path | None = typer.Option(None, "--lora-dir", help="allow /v1/load_lora_adapter, for adapter "
                                         "folders under DIR only (the trainer's weight sync: its "
                                         "model.openai.sync_dir, or a temp folder, must lie under it); default off"),
    max_model_len: int | None = typer.Option(None, "--max-model-len", min=2, help="prompt + max_tokens at most "
                                             "(default: the model's context, max_position_embeddings)"),
    max_prompt_tokens: int | None = typer.Option(None, "--max-prompt-tokens", min=1, help="prompt tokens at most "
                                                 "(default: max-model-len - 1)"),
    max_n: int = typer.Option(128, "--max-n", min=1, help="answers per prompt (n) at most"),
    max_rows: int = typer.Option(512, "--max-rows", min=1, help="prompts x n in one request at most"),
    max_logprobs: int = typer.Option(20, "--max-logprobs", min=0, help="the completions field logprobs at most"),
    max_stops: int = typer.Option(4, "--max-stops", min=1, help="stop strings at most"),
    max_stop_chars: int = typer.Option(256, "--max-stop-chars", min=1, help="characters per stop string at most"),
    max_body_mb: float = typer.Option(8.0, "--max-body-mb", min=0.001, help="request body size at most, MB (413 "
                                                                            "beyond)"),
    max_queue: int = typer.Option(16, "--max-queue", min=1, help="requests waiting for the engine or generating "
                                                                 "at most (429 beyond)"),
    max_in_flight: int = typer.Option(64, "--max-in-flight", min=2, help="requests in progress at most (503 "
                                      "beyond; idle connections and /health do not count)"),
    header_timeout: float = typer.Option(10.0, "--header-timeout", min=0.1, help="seconds a connection has to send "
                                         "its request line and headers; then it is closed"),
    max_idle_connections: int = typer.Option(256, "--max-idle-connections", min=1, help="connections without a "
                                             "request in progress at most; past it the one idle longest is closed"),
    request_timeout: float = typer.Option(300.0, "--request-timeout", min=0.1, help="seconds from a request's "
                                          "arrival to its answer; past it generation stops (504)"),
    max_tools: int = typer.Option(128, "--max-tools", min=1, help="tools in one chat request at most"),
    max_tool_chars: int = typer.Option(32768, "--max-tool-chars", min=1, help="characters of one tool's JSON at "
                                       "most"),
    max_messages: int = typer.Option(1024, "--max-messages", min=1, help="messages in one chat request at most"),
    max_prompt_chars: int | None = typer.Option(None, "--max-prompt-chars", min=1, help="characters of one prompt "
                                                "at most, checked before it is tokenized (a chat's: its messages "
                                                "and tools; default: max-prompt-tokens x the longest token's "
                                                "characters, which refuses nothing the token cap would take)"),
    tool_parser: str | None = typer.Option(None, "--tool-parser", help="the tool-call syntax chat answers are "
                                           "parsed in: hermes | llama3_json (default: the one the chat template "
                                           "speaks, else hermes)"),
) -> None:
    """An OpenAI-compatible server on slea's engine: /v1/models, /v1/completions (token-id or text prompts,
    log-probs), /v1/chat/completions (the model's chat template; tools in, tool_calls out), streaming as
    server-sent events, and /v1/load_lora_adapter (the trainer's weight sync: model.generator=openai; needs --lora-dir). Every request is
    validated and bounded by the options below (docs/reliability.md, "Serving, library imports and run folders
    under hostile input")."""
    _check_serve_args(model, dtype, lora_dir, checkpoint, api_key, tool_parser)
    from slea.policy.server import ServeSettings

    settings = ServeSettings(api_key=api_key, lora_dir=lora_dir, max_model_len=max_model_len,
                             max_prompt_tokens=max_prompt_tokens, max_n=max_n, max_rows=max_rows,
                             max_logprobs=max_logprobs, max_stops=max_stops, max_stop_chars=max_stop_chars,
                             max_body_bytes=int(max_body_mb * 1e6), max_queue=max_queue,
                             max_in_flight=max_in_flight, header_timeout_s=header_timeout,
                             max_idle_connections=max_idle_connections, request_timeout_s=request_timeout,
                             max_tools=max_tools, max_tool_chars=max_tool_chars, max_messages=max_messages,
                             max_prompt_chars=max_prompt_chars, tool_parser=tool_parser)
    engine, server = _open_server(model, host, port, threads=threads, dtype=dtype, settings=settings,
                                  checkpoint=checkpoint)
    bound = server.server_address[1]
    plain(f"serving {engine.base_id}" + (f" (adapter {engine.lora})" if engine.lora else "") +
           f" at http://{host}:{bound}/v1")
    if settings.api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"serve: warning: listening on {host} without an API key: anyone who reaches it may generate "
                  f"(set SLEA_API_KEY or --api-key)", markup=False, highlight=False, soft_wrap=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _check_serve_args(model: str, dtype: str | None, lora_dir: Path | None, checkpoint: str | None,
                      api_key: str | None, tool_parser: str | None) -> None:
    """``slea serve``'s arguments, checked before any model loads (each refusal one line, exit code 2), and the
    serve extra installed."""
    if not RunFolder(model).is_run() and not _model_target(model):
        raise fail(f"serve: {model!r} is neither a run folder (with config.yaml), a model folder (with "
                    f"config.json), 'embedded' nor 'tiny'")
    if dtype not in (None, "auto", "bfloat16", "float32"):
        raise fail(f"serve: --dtype {dtype!r}: expected auto, bfloat16 or float32")
    if lora_dir is not None and not lora_dir.is_dir():
        raise fail(f"serve: --lora-dir {lora_dir}: no such folder")
    if checkpoint is not None and not RunFolder(model).is_run():
        raise fail("serve: --checkpoint needs a run folder")
    _refuse_an_empty_key(api_key)
    if tool_parser is not None:
        from slea.policy.tool_calls import TOOL_PARSERS

        try:
            TOOL_PARSERS.get(tool_parser)
        except (KeyError, TypeError):
            raise fail(f"serve: --tool-parser {tool_parser!r}: no such tool parser (known: "
                       f"{', '.join(TOOL_PARSERS.names())})") from None
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise fail("serve: slea serve needs FastAPI and uvicorn: pip install 'slea[serve]'") from None


def _open_server(model: str, host: str, port: int, *, threads: int, dtype: str | None, settings,
                 checkpoint: str | None):
    """``slea serve``'s engine (:func:`slea.policy.server.load_engine`) and its HTTP server, listening:
    ``(engine, server)``; a checkpoint that does not load, a limit the model cannot meet or an address that
    cannot be bound is one line, exit code 2."""
    import torch

    from slea.policy.server import load_engine, make_server
    from slea.runs.checkpoint import CheckpointError

    torch.set_num_threads(threads)
    try:
        engine = load_engine(model, dtype=dtype, settings=settings, checkpoint=checkpoint,
                             say=say_skipped("serve"))
    except CheckpointError as exc:
        raise fail(f"serve: {exc}") from None
    except ValueError as exc:  # a limit the model cannot meet (--max-model-len past its context)
        raise fail(f"serve: {exc}") from None
    try:
        server = make_server(engine, host, port)
    except OSError as exc:
        raise fail(f"serve: cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    return engine, server


def _refuse_an_empty_key(api_key: str | None) -> None:
    """An API key that is empty or blank — ``--api-key "$KEY"`` or ``SLEA_API_KEY=$KEY`` with KEY unset — is refused
    (one line, exit 2): it would have served without a key, silently. Click reads an empty variable as unset, so
    the environment is checked here."""
    from slea.policy.server import API_KEY_ENV

    if api_key is not None and (not api_key or api_key.strip() != api_key):
        raise fail(f"serve: --api-key (or {API_KEY_ENV}) is empty or begins or ends with blanks (an unset variable?): "
                   f"give a key, or leave both out to serve without one")
    if api_key is None and os.environ.get(API_KEY_ENV, "x").strip() == "":
        raise fail(f"serve: {API_KEY_ENV} is set but empty (an unset variable?): give a key, or unset it to serve "
                   f"without one")
