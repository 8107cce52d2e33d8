"""The experience library steering a frozen model behind ``slea serve``, and the same through the in-process engine.

Per family and engine (``served``: ``slea serve embedded`` started here, ``slea agent --set model.generator=openai``;
``hf``: the in-process engine), each condition is one ``slea agent`` run on the same env seeds:

- ``build``: the frozen model plays the family's *training* games with ``--evolve`` from an empty library: the
  library it learns from its own episodes (no training anywhere; one game per round on TextWorld, four on Recall);
- ``static``: held-out games without a library and with ``build``'s library, the paper's retrieval (Eq.1, else
  Eq.2), per step;
- ``evolve``: the same, the library learning as it plays (``--evolve``, four games per round, rule extractor);
- ``evolve_llm`` (served only): as ``evolve``, the lessons written by the served model (``experience.extractor:
  llm``), the rules filling in unusable answers: its parse rate;
- ``rl_library`` (TextWorld only, on request: ``--conditions rl_library``): held-out games with the library of a
  SLEA-RL training run.

Families: ``textworld`` (the default job's games), ``recall`` (the positive control's chambers, which recur across
games so that retrieval fires), ``sokoban``.

Results: ``experiments/results/agent_served/<family>/<engine>/<condition>/agent.json`` (+ ``stdout.txt``, and the
library of ``build`` / ``evolve``); a condition whose ``agent.json`` exists is skipped, so an interrupted study
continues. ``--table`` writes ``experiments/results/agent_served/table.md`` from what exists.

    .venv/bin/python experiments/agent_served.py --family textworld --engine served
    .venv/bin/python experiments/agent_served.py --table
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from slea.runs.folder import RunFolder
from slea.testing import server as testing_server
from slea.testing.server import Server

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "agent_served"
SLEA = [sys.executable, "-m", "slea.cli"]
RL_LIBRARY = ROOT / "experiments/results/evidence/default/slea/runs/slea-s1"

FAMILIES = {
    # the default job's games and prompt settings (configs/default.yaml), as experiments/results/agent/
    "textworld": {"env": "slea/TextWorld-v0", "set": [
        ("env.kwargs.tasks=[coin_collector:1,coin_collector:2,coin_collector:3,coin_collector:4,"
        "treasure_hunter:1,treasure_hunter:2,treasure_hunter:3]"),
        "env.kwargs.num_games=16", "env.eval_kwargs.num_games=8", "env.max_steps=8", "rollout.max_new_tokens=10",
        "rollout.history=1", "rollout.obs_max_chars=300"],
        "build": ["env.eval_kwargs.num_games=16"],  # the training split's 16 games, as the default job trains on
        "batch": {"build": 1, "evolve": 4}},
    # the positive control's settings (configs/control_recall.yaml): chambers recur across games, so the library's
    # clusters match held-out observations
    "recall": {"env": "slea/Recall-v0", "set": [
        "env.kwargs.chambers=3", "env.max_steps=5", "rollout.max_new_tokens=6", "rollout.history=0",
        "rollout.obs_max_chars=300", "rollout.invalid_penalty=0.1", "experience.cluster_threshold=0.85",
        "experience.top_k_pos=2", "experience.top_k_neg=1", "experience.max_tokens=120",
        "experience.fallback_threshold=0.5", "experience.k_strat=6", "experience.k_warn=3", "experience.k_traj=3"],
        "build": [], "batch": {"build": 4, "evolve": 4}},
    # experiments/untrained_eval.py's reduced Sokoban budget
    "sokoban": {"env": "slea/Sokoban-v0", "set": ["env.max_steps=10", "rollout.max_new_tokens=8"], "build": [],
                "batch": {"build": 1, "evolve": 4}},
}
CONDITIONS = ("build", "static", "evolve", "evolve_llm", "rl_library")
DEFAULT_CONDITIONS = ("build", "static", "evolve", "evolve_llm")  # rl_library on request (--conditions)


def rel(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (results name no machine's folders)."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def start_server(log: Path, model: str) -> Server:
    """``slea serve MODEL --port 0`` (:func:`slea.testing.server.start_server`); its address line kept in ``log``."""
    server = testing_server.start_server(model, "--port", "0", "--threads", "2", cwd=ROOT)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"serving {model} at {server.url}\n")
    return server


def agent_args(family: str, engine: str, condition: str, url: str | None, games: int, episodes: int,
               out: Path, model: str = "embedded") -> list[str]:
    spec = FAMILIES[family]
    base = OUT / family / engine
    # build: a library file that does not exist yet, which `slea agent --evolve` starts empty
    library = {"build": base / "empty.sqlite", "rl_library": RL_LIBRARY}.get(
        condition, RunFolder(base / "build").library)
    args = [*SLEA, "agent", "--model", model, "--library", rel(library), "--env", spec["env"],
            "--games", str(games), "--episodes", str(episodes), "--out", rel(out)]
    sets = list(spec["set"])
    if condition == "build":
        args += ["--split", "train", "--evolve", "--batch", str(spec["batch"]["build"])]
        sets += spec["build"]
    elif condition in ("evolve", "evolve_llm"):
        args += ["--evolve", "--batch", str(spec["batch"]["evolve"])]
    if condition == "evolve_llm":
        sets.append("experience.extractor=llm")
    if engine == "served":
        sets += ["model.generator=openai", f"model.openai.base_url={url}", "model.openai.timeout_s=600"]
    for s in sets:
        args += ["--set", s]
    return args


def run(family: str, engine: str, conditions: list[str], games: int, episodes: int, model: str = "embedded"
        ) -> None:
    todo = [c for c in conditions if not (OUT / family / engine / c / "agent.json").is_file()
            and (c != "evolve_llm" or engine == "served") and (c != "rl_library" or family == "textworld")]
    if not todo:
        print(f"{family}/{engine}: nothing to do")
        return
    server = start_server(OUT / family / engine / "server.txt", model) if engine == "served" else None
    url = server.url if server is not None else None
    try:
        for c in todo:
            out = OUT / family / engine / c
            out.mkdir(parents=True, exist_ok=True)
            args = agent_args(family, engine, c, url, games, episodes, out, model)
            t0 = time.perf_counter()
            r = subprocess.run(args, check=False, cwd=ROOT, capture_output=True, text=True)
            (out / "stdout.txt").write_text("$ slea " + " ".join(a if " " not in a else f"'{a}'" for a in args[3:])
                                            + "\n" + r.stdout + r.stderr)
            if r.returncode != 0:
                (out / "agent.json").unlink(missing_ok=True)
                raise SystemExit(f"{family}/{engine}/{c} failed ({r.returncode}): {r.stderr[-2000:]}")
            print(f"{family}/{engine}/{c}: {time.perf_counter() - t0:.0f} s", flush=True)
            if c == "build":  # the empty start is in build/library.sqlite's history, not worth a file
                for p in (OUT / family / engine).glob("empty.sqlite*"):
                    p.unlink()
    finally:
        if server is not None:
            server.stop()


# -- the table ----------------------------------------------------------------------------------------------------
def _load(family: str, engine: str, condition: str) -> dict | None:
    p = OUT / family / engine / condition / "agent.json"
    return json.loads(p.read_text()) if p.is_file() else None


def _row(label: str, summary: dict, greedy: dict | None, by: dict | None, extra: str = "") -> str:
    g = f"{greedy['success']:.3f}" if greedy else "–"
    b = f"{by['better']} / {by['worse']} / {by['same']}" if by else "–"
    return (f"| {label} | {summary['success']:.3f} ({int(summary['episodes'])}) | {summary['invalid_rate']:.3f} | "
            f"{summary['retrieval_hit_rate']:.3f} | {g} | {b} | {extra} |")


def table() -> str:
    lines = ["# The library steering a frozen served model (experiments/agent_served.py)", "",
             ("SmolLM2-135M-Instruct (embedded), frozen. `served`: `slea serve embedded` + `slea agent --set "
             "model.generator=openai` (completions API, token ids); `hf`: the same `slea agent` with the in-process "
             "engine. Every condition plays the same env seeds; sampled episodes draw from the same keyed streams."),
             ""]
    for family in FAMILIES:
        if not any(_load(family, e, c) for e in ("served", "hf") for c in CONDITIONS):
            continue
        lines += [f"## {family}", "",
                  ("| condition | sampled success (episodes) | invalid rate | steps that retrieved | greedy success | "
                  "games better / worse / same (sampled) | served = hf |"), "|---|---:|---:|---:|---:|---:|---|"]
        for engine in ("served", "hf"):
            for c in CONDITIONS:
                res = _load(family, engine, c)
                if res is None:
                    continue
                other = _load(family, "hf" if engine == "served" else "served", c)
                same = "–" if other is None else ("identical" if (other["without"], other["with"]) ==
                                                  (res["without"], res["with"]) else "differs")
                s, w = res["without"].get("sampled"), res["with"].get("sampled")
                name = {"build": "train split, no library", "static": "no library"}.get(c)
                if name and c in ("build", "static"):
                    lines.append(_row(f"{engine}: {name}", s, res["without"].get("greedy"), None, same))
                lib = {"build": "train split, library learning from empty", "static": "library from `build`",
                       "evolve": "library from `build`, evolving", "evolve_llm": "as evolve, lessons by the model",
                       "rl_library": "library of a SLEA-RL run"}[c]
                x = res.get("extraction") or {}
                extra = same + (f"; parse rate {x['parse_rate']:.2f} ({int(x['parsed'])}/{int(x['answers'])})"
                                if x.get("answers") else "")
                lines.append(_row(f"{engine}: {lib}", w, res["with"].get("greedy"),
                                  res["games_by_success"].get("sampled"), extra))
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(FAMILIES))
    ap.add_argument("--engine", choices=["served", "hf"])
    ap.add_argument("--conditions", default=",".join(DEFAULT_CONDITIONS))
    ap.add_argument("--model", default="embedded", help="the played model (tiny: a smoke run)")
    ap.add_argument("--games", type=int, default=8)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--table", action="store_true", help="write table.md from the results that exist")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default experiments/results/agent_served)")
    a = ap.parse_args()
    global OUT
    OUT = a.out or OUT
    if a.table:
        (OUT / "table.md").write_text(table() + "\n")
        print(table())
        return
    if not a.family or not a.engine:
        ap.error("--family and --engine (or --table)")
    run(a.family, a.engine, a.conditions.split(","), a.games, a.episodes, a.model)


if __name__ == "__main__":
    main()
