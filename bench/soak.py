"""Soak benchmark: a long smoke run (tiny model, TextWorld) under injected faults, checked against an
uninterrupted run of the same config with the same (deterministic) faults.

Injected: SIGKILL of the training process at random moments (each followed by ``slea train --resume``), env
crashes (the env stays dead until rebuilt), env hangs past ``env.step_timeout_s``, env reset crashes, NaN
rewards, NaN losses, and garbage model output (adversarial strings in place of the model's answer); plus a
long run of the parser fuzzers. Reported: faults injected, faults survived, and data lost — metrics rows,
checkpoints and library rows — which must be zero, and whether the resumed run's metrics, final weights,
library and held-out eval equal the uninterrupted run's.

    .venv/bin/python bench/soak.py                  # ~6 min on 2 busy cores; writes bench/results/soak.json
    .venv/bin/python bench/soak.py --iterations 8 --kills 3 --fuzz 20000   # a quicker pass
    .venv/bin/python bench/soak.py serve --seconds 60   # `slea serve` under hostile and good requests: "serve"
    .venv/bin/python bench/soak.py serve --seconds 30 --bad-frac 0 --idle-sockets 200   # beside an idle flood

``serve``: a ``slea serve tiny`` process on 127.0.0.1 gets each hostile request of docs/reliability.md's serving
table once (each followed by a normal request, timed), then ``--clients`` threads send good and hostile requests
for ``--seconds`` (slea/testing/serve_hostile.py); the requests, errors, p50 / p99 latency of the good requests
and the server's RSS at the start and end go to soak.json's ``serve`` field (the rest of the file is kept). With
``--idle-sockets N`` the table is skipped and the clients run beside N connections that send nothing (held open,
reopened as the server closes them): soak.json's ``serve_idle`` field.

The training processes run ``slea train`` through this file's ``child`` entry, which only adds the fault
injectors (the faulty env id, the NaN loss, the garbage generator) before calling the CLI.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from slea.runs.folder import RunFolder
from slea.runs.runlog import read_metrics

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "soak.json"
VOLATILE = ("time/", "throughput/")
VOLATILE_KEYS = {"library/evolve_s"}


# -- the child: `slea train` with fault injectors installed --------------------------------------------------
def child(argv: list[str]) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import slea.testing.faulty_env as F
    from slea.trainer import rl

    F.register_nan_loss(float(os.environ.get("SOAK_NAN_LOSS", "0")), seed=int(os.environ.get("SOAK_SEED", "0")))
    garbage = float(os.environ.get("SOAK_GARBAGE", "0"))
    make_generator = rl.HFGenerator
    rl.HFGenerator = lambda *a, **k: F.GarbageGenerator(make_generator(*a, **k), prob=garbage,
                                                        seed=int(os.environ.get("SOAK_SEED", "0")))
    iteration = rl.Trainer.iteration

    def counted(self, it):  # the injections of each iteration, as metrics (replayed exactly on resume)
        before = Counter(F.INJECTED)
        m = iteration(self, it)
        m.update({f"soak/{k}": float(F.INJECTED[k] - before[k])
                  for k in ("crash", "hang", "nan", "reset_crash", "garbage", "nan_loss")})
        return m

    rl.Trainer.iteration = counted
    from slea.cli import app

    app(argv, prog_name="slea")


# -- the driver -----------------------------------------------------------------------------------------------
def soak_config(iterations: int, seed: int) -> dict:
    import yaml

    cfg = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    cfg["run"].update(name=None, seed=seed)
    inner = dict(cfg["env"]["kwargs"])
    cfg["env"].update(
        id="slea/test-Faulty-v0",
        kwargs={"inner": cfg["env"]["id"], **inner, "crash_prob": 0.05, "hang_prob": 0.05, "hang_s": 30.0,
                "nan_prob": 0.04, "reset_crash_prob": 0.05, "fault_seed": seed},
        eval_kwargs={**cfg["env"].get("eval_kwargs", {}), "crash_prob": 0.0, "hang_prob": 0.0, "nan_prob": 0.0,
                     "reset_crash_prob": 0.0},
        step_timeout_s=1.0, max_fault_rate=1.0)  # injected rates are far above real ones: never stop on them
    cfg["rollout"]["fuzzy_cutoff"] = 0.3  # some of the tiny model's babble is admissible: real updates
    cfg["algorithm"]["policy_loss"] = "test_nan_ppo_clip"
    cfg["train"].update(iterations=iterations, keep_checkpoints=2, max_bad_updates=8, save_every=1)
    cfg["eval"].update(games=1, episodes_per_game=2, greedy=False)
    cfg["experience"] = {"mode": "step", "warmup_iters": 1, "min_entries": 1}
    return cfg


def _env(seed: int) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                SOAK_GARBAGE="0.15", SOAK_NAN_LOSS="0.04", SOAK_SEED=str(seed))


def _launch(args: list[str], seed: int, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "child", *args], env=_env(seed),
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def run_reference(config: Path, run: Path, seed: int) -> float:
    t0 = time.perf_counter()
    with open(run.parent / f"{run.name}.log", "w") as log:
        p = _launch(["train", str(config), "--set", f"run.dir={run}"], seed, log)
        if p.wait() != 0:
            raise SystemExit(f"reference run failed; see {run.parent / (run.name + '.log')}")
    return time.perf_counter() - t0


def run_with_kills(config: Path, run: Path, seed: int, kills: int, rng: random.Random) -> dict:
    """Launch, SIGKILL after a random delay, resume; ``kills`` times; then let it finish."""
    t0 = time.perf_counter()
    events = []
    done = 0
    launches = 0
    with open(run.parent / f"{run.name}.log", "w") as log:
        while True:
            resume = RunFolder(run).config.is_file()
            # killed before its config.yaml was written (the folder may hold events/ already): start it over
            args = ["train", "--resume", str(run)] if resume else ["train", str(config), "--set", f"run.dir={run}",
                                                                    "--overwrite"]
            launches += 1
            p = _launch(args, seed, log)
            if done < kills:
                # Odd kills land anywhere from model loading on; even ones once the run has made progress (a new
                # metrics row), a random moment later: mid-rollout, mid-update, mid-checkpoint, in the eval.
                t_launch = time.perf_counter()
                if done % 2 == 1:
                    target = _count_rows(run) + rng.randint(1, 5)
                    while p.poll() is None and _count_rows(run) < target:
                        time.sleep(0.05)
                delay = rng.uniform(0.0, 8.0) if done % 2 == 1 else rng.uniform(2.0, 30.0)
                try:
                    rc = p.wait(timeout=delay)
                except subprocess.TimeoutExpired:
                    rows = _count_rows(run)
                    ckpts = sorted(x.name for x in RunFolder(run).checkpoints.glob("iter_*")) if run.exists() else []
                    p.send_signal(signal.SIGKILL)
                    p.wait()
                    done += 1
                    events.append({"kill": done, "after_s": round(time.perf_counter() - t_launch, 1),
                                   "resumed_launch": resume, "metrics_rows_at_kill": rows,
                                   "last_checkpoint_at_kill": ckpts[-1] if ckpts else None})
                    continue
            else:
                rc = p.wait()
            if rc != 0:
                raise SystemExit(f"training process exited with {rc}; see {run.parent / (run.name + '.log')}")
            break
    return {"kills": done, "launches": launches, "events": events, "wall_s": time.perf_counter() - t0}


def _count_rows(run: Path) -> int:
    try:
        return len(RunFolder(run).metrics.read_text().splitlines())
    except OSError:
        return 0


def _comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE) and k not in VOLATILE_KEYS}


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _library_rows(path: Path) -> set[tuple]:
    if not path.is_file():
        return set()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        out = set()
        for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'"):
            out |= {(t, *r) for r in con.execute(f'SELECT * FROM "{t}"')}
        return out
    finally:
        con.close()


def compare(run: Path, ref: Path, iterations: int) -> dict:
    import torch
    from safetensors.torch import load_file

    from slea.runs import checkpoint as ckpt

    got, want = read_metrics(RunFolder(run).metrics), read_metrics(RunFolder(ref).metrics)
    its = [r["iteration"] for r in got]
    missing = sorted(set(range(iterations)) - set(its))
    duplicated = sorted(i for i, n in Counter(its).items() if n > 1)
    by_it = {r["iteration"]: _comparable(r) for r in want}
    mismatched = sorted(r["iteration"] for r in got if r["iteration"] in by_it and (
        _comparable(r).keys() != by_it[r["iteration"]].keys()
        or not all(_same(v, by_it[r["iteration"]][k]) for k, v in _comparable(r).items())))
    expected_ck = [f"iter_{i:06d}" for i in range(max(1, iterations - 1), iterations + 1)]  # named by iterations done
    intact = []
    for name in expected_ck:
        try:
            ckpt.verify_checkpoint(RunFolder(run).checkpoint(name))
            intact.append(name)
        except ckpt.CheckpointError:
            pass
    lib_got, lib_want = _library_rows(RunFolder(run).library), _library_rows(RunFolder(ref).library)
    w_got = load_file(str(RunFolder(run).checkpoint(expected_ck[-1]) / "trainable.safetensors"))
    w_want = load_file(str(RunFolder(ref).checkpoint(expected_ck[-1]) / "trainable.safetensors"))
    ev_got = json.loads(RunFolder(run).evaluation("after").read_text())["sampled"]
    ev_want = json.loads(RunFolder(ref).evaluation("after").read_text())["sampled"]
    return {
        "metrics_rows": {"expected": iterations, "present": len(got), "missing": missing, "duplicated": duplicated,
                         "differ_from_uninterrupted": mismatched},
        "checkpoints": {"expected": expected_ck, "intact": intact, "lost": sorted(set(expected_ck) - set(intact))},
        "library_rows": {"uninterrupted": len(lib_want), "resumed": len(lib_got), "lost": len(lib_want - lib_got),
                         "extra": len(lib_got - lib_want)},
        "final_weights_equal": w_got.keys() == w_want.keys() and all(torch.equal(w_got[k], w_want[k]) for k in w_want),
        "heldout_eval_equal": ev_got == ev_want,
    }


def fuzz(n: int, seed: int) -> dict:
    """The parsers on ``n`` adversarial strings each (the in-suite fuzz runs 10k)."""
    from slea.policy.prompt_builder import parse_action
    from slea.rollout.collector import clean_text
    from slea.testing.faulty_env import adversarial_text

    parsers = {"parse_action": lambda t: parse_action(clean_text(t), ["take coin", "go north", "open door"])}
    try:
        from slea.envs.search_qa import parse_action as qa

        parsers["search_qa"] = qa
    except ImportError:
        pass
    try:
        from slea.experience.llm_extractor import parse_llm_list

        parsers["extraction"] = lambda t: parse_llm_list(clean_text(t))
    except ImportError:
        pass
    rng = random.Random(seed)
    errors: Counter = Counter()
    t0 = time.perf_counter()
    for _ in range(n):
        text = adversarial_text(rng)
        for name, fn in parsers.items():
            try:
                fn(text)
            except Exception:  # noqa: BLE001  (counted: must be zero)
                errors[name] += 1
    return {"strings": n, "parsers": sorted(parsers), "calls": n * len(parsers), "exceptions": sum(errors.values()),
            "by_parser": dict(errors), "wall_s": round(time.perf_counter() - t0, 1)}


def table(res: dict) -> str:
    inj, m = res["injected"], res["data"]
    ok = res["completed"]
    rows = [("SIGKILL of the training process, then `slea train --resume`", res["kill"]["kills"],
             res["kill"]["kills"] if ok else 0),
            ("env crash (exception; the env stays dead until rebuilt)", inj["crash"], res["survived"]["crash"]),
            ("env hang past `env.step_timeout_s`", inj["hang"], res["survived"]["hang"]),
            ("env reset crash", inj["reset_crash"], res["survived"]["reset_crash"]),
            ("NaN reward (update skipped)", inj["nan"], res["survived"]["nan"]),
            ("NaN loss (optimizer step skipped)", inj["nan_loss"], res["survived"]["nan_loss"]),
            ("garbage model output", inj["garbage"], res["survived"]["garbage"]),
            (f"fuzz strings x {len(res['fuzz']['parsers'])} parsers", res["fuzz"]["calls"],
             res["fuzz"]["calls"] - res["fuzz"]["exceptions"])]
    out = ["| injected fault | count | survived |", "|---|---:|---:|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    lost = (f"metrics rows lost {len(m['metrics_rows']['missing'])} of {m['metrics_rows']['expected']} "
            f"(duplicated {len(m['metrics_rows']['duplicated'])}), checkpoints lost {len(m['checkpoints']['lost'])}, "
            f"library rows lost {m['library_rows']['lost']} of {m['library_rows']['uninterrupted']}")
    same = ("yes" if not m["metrics_rows"]["differ_from_uninterrupted"] and m["final_weights_equal"]
            and m["heldout_eval_equal"] and not m["library_rows"]["extra"] else "no")
    out += ["", (f"Data lost: {lost}. Metrics, final weights, library and held-out eval equal to the "
                 f"uninterrupted run with the same faults: **{same}** ({res['iterations']} iterations, "
                 f"{res['kill']['launches']} launches, {res['kill']['wall_s'] / 60:.1f} min vs "
                 f"{res['reference_wall_s'] / 60:.1f} min uninterrupted).")]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fuzz", type=int, default=100_000, help="adversarial strings per parser")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a fresh folder under /tmp")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import tempfile

    import yaml

    work = args.workdir or Path(tempfile.mkdtemp(prefix="slea-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    config = work / "soak.yaml"
    config.write_text(yaml.safe_dump(soak_config(args.iterations, args.seed), sort_keys=False))
    print(f"soak: {args.iterations} iterations, {args.kills} kills, workdir {work}", flush=True)
    ref_s = run_reference(config, work / "reference", args.seed)
    print(f"uninterrupted reference: {ref_s:.0f}s", flush=True)
    kill = run_with_kills(config, work / "soak", args.seed, args.kills, random.Random(args.seed))
    print(f"killed {kill['kills']}x, {kill['launches']} launches: {kill['wall_s']:.0f}s", flush=True)
    data = compare(work / "soak", work / "reference", args.iterations)
    rows = read_metrics(RunFolder(work / "soak").metrics)
    inj = {k: int(sum(r.get(f"soak/{k}", 0) for r in rows))
           for k in ("crash", "hang", "nan", "reset_crash", "garbage", "nan_loss")}
    counted = {k: int(sum(r.get(k, 0) for r in rows)) for k in
               ("faults/env_errors", "faults/env_timeouts", "faults/reset_errors", "guard/nonfinite_rewards",
                "update/skipped_updates")}
    completed = RunFolder(work / "soak").summary.is_file()
    # A fault is survived when the run went on past it and completed; env faults are also checked against the
    # pool's own counts (a dead env raises on every later call, so errors >= crashes).
    survived = {k: (v if completed else 0) for k, v in inj.items()}
    survived["crash"] = min(inj["crash"], counted["faults/env_errors"]) if completed else 0
    survived["hang"] = min(inj["hang"], counted["faults/env_timeouts"]) if completed else 0
    fz = fuzz(args.fuzz, args.seed)
    print(f"fuzz: {fz['calls']} parser calls, {fz['exceptions']} exceptions, {fz['wall_s']}s", flush=True)
    res = {"iterations": args.iterations, "seed": args.seed, "completed": completed, "kill": kill,
           "reference_wall_s": ref_s, "injected": inj, "survived": survived, "pool_counts": counted,
           "data": data, "fuzz": fz, "workdir": str(work),
           "config": yaml.safe_load(config.read_text())}
    res["table"] = table(res)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.is_file():  # the serving soak's record stays (bench/soak.py serve writes it)
        old = json.loads(args.out.read_text())
        if "serve" in old:
            res["serve"] = old["serve"]
    args.out.write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(res["table"])
    lost = (data["metrics_rows"]["missing"] or data["metrics_rows"]["duplicated"] or data["checkpoints"]["lost"]
            or data["library_rows"]["lost"])
    sys.exit(1 if lost or not completed else 0)


def serve_soak(argv: list[str]) -> None:
    """``bench/soak.py serve``: the hostile table once, then the concurrent soak; into soak.json's ``serve``."""
    ap = argparse.ArgumentParser(prog="bench/soak.py serve", description=serve_soak.__doc__)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bad-frac", type=float, default=0.4, help="the share of hostile requests")
    ap.add_argument("--idle-sockets", type=int, default=0, help="idle connections held open beside the clients")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from slea.testing import serve_hostile as H

    served = H.start("soak-key")
    try:
        status, _ = H.normal(served)
        assert status == 200, status
        rss0, table_rows = served.rss_mb(), []
        for row, what, send, want in [] if args.idle_sockets else H.HOSTILE:
            got = send(served)
            after, seconds = H.normal(served)
            table_rows.append({"row": row, "sent": what, "answer": got, "expected": want,
                               "normal_after": after, "normal_after_s": round(seconds, 3)})
            print(f"row {row:>2} {what}: {got} (expected {want}); a normal request then: {after} in {seconds:.2f}s",
                  flush=True)
        rss1 = served.rss_mb()
        res = H.soak(served, seconds=args.seconds, clients=args.clients, seed=args.seed, bad_frac=args.bad_frac,
                     idle_sockets=args.idle_sockets)
    finally:
        served.stop()
    res = {"hostile": table_rows, "hostile_rss_mb": [round(rss0, 1), round(rss1, 1)], "soak": res,
           "python": sys.version.split()[0]}
    print(json.dumps(res["soak"], indent=2))
    whole = json.loads(args.out.read_text()) if args.out.is_file() else {}
    whole["serve_idle" if args.idle_sockets else "serve"] = res
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(whole, indent=2, default=str) + "\n")
    bad = [r for r in table_rows if r["answer"] != r["expected"] or r["normal_after"] != 200]
    sys.exit(1 if bad or res["soak"]["errors"] else 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        sys.path.insert(0, str(ROOT / "src"))
        child(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve_soak(sys.argv[2:])
    else:
        main()
