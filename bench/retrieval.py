"""Benchmark: observation clustering and per-step experience retrieval (SLEA-RL), against difflib scans.

    PYTHONPATH=src .venv/bin/python bench/retrieval.py [--quick] [--parts agreement,scale,retrieval] [--out ...]

What it measures (every latency per call, mean / p50 / p99, wall clock and thread CPU time — the CPU column is
the one to read on a shared machine, where wall time includes waiting for a core):

1. Clustering on streams of observations, three implementations side by side: the exact scan
   (``ExactScanIndex``: every prototype, difflib's ratio, rigorous bounds only), ``ObservationIndex()`` (exact, the
   default) and ``ObservationIndex(exact=False)`` (approximate candidate filter); plus a plain
   ``SequenceMatcher.ratio()`` scan timed on sampled queries. Per variant: clusters, Rand index against the exact
   scan, identical assignments, missed joins (a cluster opened although the exact scan joined one), and assign
   latency overall and for short (< 300 characters) and long observations. Streams: real TextWorld +
   ScienceWorld observations (bench/data/textworld_obs.jsonl.gz, played by bench/data/make_corpus.py) as slea's
   cleaned anchors (all, TextWorld only, ScienceWorld only), a harder stream that keeps TextWorld's status line
   (room and move counter, so nearly every observation is a new string), and a seeded synthetic stream of 3,000
   observations from a 26-word vocabulary (many pairs near δ). The peer code's signature grouping (first 300
   characters) is scored on the real streams.
2. Scaling: 500, 10k and 100k prototypes in ONE task type (real prototypes + perturbed copies, loaded directly),
   a query mix of near-duplicates (join), new observations (open) and repeats, for both index modes, against a
   plain ``SequenceMatcher.ratio()`` scan of the prototypes (time-boxed: only as many queries as fit); plus the
   peer's worst case, 2,000 clusters sharing their first 300 characters.
3. Observation-conditioned retrieval at 500, 10k and 100k library entries: Eq.1 (cluster hit) and the Eq.2
   fallback (exact over the whole library: one weighted bincount over the query tokens' postings), with and
   without the cluster assignment; Eq.2's ``similar`` against a plain Python scan of every entry
   (``slea.testing.retrieval.ScanEq2``) on sampled queries, with the share that got the same entries.

``--parts`` runs a subset and keeps the other sections of the existing ``--out`` file.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import platform
import random
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from slea.envs.textworld import clean_observation
from slea.experience.clustering import ObservationIndex
from slea.experience.library import Entry, ExperienceLibrary
from slea.experience.retrieval import Retriever
from slea.testing.clustering import ExactScanIndex, low_vocab_stream, missed_joins, rand_index
from slea.testing.retrieval import ScanEq2

CORPUS = ROOT / "bench" / "data" / "textworld_obs.jsonl.gz"
DELTA = 0.85
_STATUS = re.compile(r"-=\s*(.+?)\s*=-\s*(\d+/\d+)\s*$")


# ---------------------------------------------------------------------------------------------------------------
def load_streams() -> dict[str, list[tuple[str, str]]]:
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    clean, status = [], []
    for r in rows:
        c = clean_observation(r["obs"])
        clean.append((r["task_type"], c))
        last = [ln for ln in r["obs"].splitlines() if ln.strip()][-1:] or [""]
        m = _STATUS.search(" ".join(last[0].split()))
        status.append((r["task_type"], f"{c}\n-= {m.group(1)} =- {m.group(2)}" if m else c))
    return {"clean": clean, "status_line": status,
            "clean_textworld": [x for x in clean if not x[0].startswith("sw-")],
            "clean_scienceworld": [x for x in clean if x[0].startswith("sw-")]}


def stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    s = sorted(xs)
    return {"mean_us": round(statistics.fmean(s) * 1e6, 1), "p50_us": round(s[len(s) // 2] * 1e6, 1),
            "p99_us": round(s[min(len(s) - 1, int(len(s) * 0.99))] * 1e6, 1), "max_us": round(s[-1] * 1e6, 1),
            "n": len(s)}


def timed(fn, items) -> tuple[list, list[float], list[float]]:
    out, wall, cpu = [], [], []
    pc, tt = time.perf_counter, time.thread_time
    for it in items:
        w0, c0 = pc(), tt()
        out.append(fn(*it))
        c1, w1 = tt(), pc()
        wall.append(w1 - w0)
        cpu.append(c1 - c0)
    return out, wall, cpu


def both(wall, cpu) -> dict[str, dict[str, float]]:
    return {"wall": stats(wall), "cpu": stats(cpu)}


def plain_scan(protos: dict[str, list[str]], obs: str, task_type: str) -> int:
    """The plain difflib scan: ratio() against every prototype of the task type, keep the best >= δ."""
    import difflib

    best, best_r = -1, -1.0
    for i, p in enumerate(protos.get(task_type, ())):
        r = difflib.SequenceMatcher(None, obs, p).ratio()
        if r >= DELTA and r > best_r:
            best, best_r = i, r
    return best


def signature_clusters(stream: list[tuple[str, str]]) -> list[int]:
    """The released code's clustering: candidates share (task type, first 300 chars); difflib on 500 chars."""
    import difflib

    buckets: dict[tuple[str, str], list[tuple[int, str]]] = {}
    labels, n = [], 0
    for t, o in stream:
        key = (t, o.strip()[:300])
        found = -1
        for cid, proto in buckets.get(key, []):
            if difflib.SequenceMatcher(None, o[:500], proto[:500]).ratio() >= DELTA:
                found = cid
                break
        if found < 0:
            found = n
            n += 1
            buckets.setdefault(key, []).append((found, o))
        labels.append(found)
    return labels


# ---------------------------------------------------------------------------------------------------------------
VOCAB = ["apple", "door", "north", "south", "east", "west", "key", "table", "chest", "lamp", "box", "fridge", "oven", "knife", "carrot", "coin", "shelf", "sofa", "bed", "counter", "cellar", "attic", "garden", "kitchen", "pantry", "hall", "study", "closet", "red", "blue", "green", "wooden", "iron", "small", "large", "dusty", "shiny", "open", "closed", "locked", "empty", "full", "old", "new", "strange", "heavy", "light"]


def perturb(rng: random.Random, text: str, frac: float, prefix: bool = False) -> str:
    words = text.split()
    for i in range(len(words)):
        if rng.random() < frac:
            words[i] = rng.choice(VOCAB) + (str(rng.randrange(100)) if frac > 0.2 else "")
    if prefix:
        words = [rng.choice(VOCAB), rng.choice(VOCAB)] + words
    return " ".join(words)


def by_length(stream, wall, cpu, long_from: int = 300) -> dict:
    short = [i for i, (_, o) in enumerate(stream) if len(o) < long_from]
    long_ = [i for i, (_, o) in enumerate(stream) if len(o) >= long_from]
    return {"all": both(wall, cpu),
            f"short_lt_{long_from}": both([wall[i] for i in short], [cpu[i] for i in short]),
            f"long_ge_{long_from}": both([wall[i] for i in long_], [cpu[i] for i in long_])}


def part_agreement(streams, quick: bool) -> dict:
    out = {}
    for name, stream in streams.items():
        t0 = time.perf_counter()
        gc.collect()
        ref = ExactScanIndex(DELTA)
        want, ref_wall, ref_cpu = timed(ref.assign, [(o, t) for t, o in stream])
        entry = {"observations": len(stream), "distinct": len(set(stream)),
                 "mean_chars": round(statistics.fmean(len(o) for _, o in stream), 1),
                 "max_chars": max(len(o) for _, o in stream),
                 "exact_scan": {"clusters": len(ref), "assign": by_length(stream, ref_wall, ref_cpu)}}
        for variant, kwargs in (("index_exact_default", {}), ("index_approximate", {"exact": False})):
            gc.collect()
            idx = ObservationIndex(DELTA, **kwargs)
            got, wall, cpu = timed(idx.assign, [(o, t) for t, o in stream])
            entry[variant] = {"clusters": len(idx), "rand_index": round(rand_index(want, got), 6),
                              "identical_assignments": got == want, "missed_joins": missed_joins(got, want),
                              "assign": by_length(stream, wall, cpu), "stats": dict(idx.stats)}
        if not name.startswith("low_vocab"):
            peer = signature_clusters(stream)
            entry["peer_signature"] = {"clusters": len(set(peer)), "rand_index": round(rand_index(want, peer), 6)}
        # the plain difflib scan, timed on a sample of queries against the final prototype set
        protos: dict[str, list[str]] = {}
        for _, (t, o) in sorted({c: (t, o) for (t, o), c in zip(stream, want)}.items()):
            protos.setdefault(t, []).append(o)
        sample = random.Random(0).sample(stream, 20 if quick else 60)
        _, swall, scpu = timed(lambda o, t, protos=protos: plain_scan(protos, o, t), [(o, t) for t, o in sample])
        entry["plain_difflib_scan"] = {**both(swall, scpu), "prototypes": len(ref),
                                       "note": f"{len(sample)} sampled queries against the final prototypes"}
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        out[name] = entry
        d, ap = entry["index_exact_default"], entry["index_approximate"]
        print(f"[agreement] {name}: clusters scan {len(ref)} / default {d['clusters']} / approx {ap['clusters']}; "
              f"default identical {d['identical_assignments']}, approx RI {ap['rand_index']} missed "
              f"{ap['missed_joins']}; assign cpu default {d['assign']['all']['cpu']}", flush=True)
    return out


def part_scale(streams, quick: bool) -> dict:
    """Assign latency with n prototypes in one task type, loaded directly (both modes see the same prototypes)."""
    rng = random.Random(1)
    base = list(dict.fromkeys(o for _, o in streams["clean"]))
    out = {}
    sizes = [500, 10_000] if quick else [500, 10_000, 100_000]
    for n in sizes:
        t0 = time.perf_counter()
        protos = base[:n]
        while len(protos) < n:
            protos.append(perturb(rng, rng.choice(base), 0.3, prefix=True))
        nq = 300 if quick else 1000
        queries = []
        for k in range(nq):
            o = rng.choice(base)
            kind = ("join", "new", "repeat")[k % 3]
            if kind == "join":
                o = perturb(rng, o, 0.03) if len(o.split()) > 8 else o + "."
            elif kind == "new":
                o = perturb(rng, o, 0.4, prefix=True)
            queries.append((kind, o))
        entry = {"prototypes": n, "task_types": 1}
        for variant, kwargs in (("index_exact_default", {}), ("index_approximate", {"exact": False})):
            idx = ObservationIndex(DELTA, max_clusters=2 * n + nq, **kwargs)
            t1 = time.perf_counter()
            for p in protos:
                idx._create(p, "tw")
            build_s = time.perf_counter() - t1
            gc.collect()
            _, wall, cpu = timed(idx.assign, [(o, "tw") for _, o in queries])
            v = {"build_s": round(build_s, 1), "clusters_at_end": len(idx), "assign": both(wall, cpu)}
            for kind in ("join", "new", "repeat"):
                sel = [i for i, q in enumerate(queries) if q[0] == kind]
                v[f"assign_{kind}"] = both([wall[i] for i in sel], [cpu[i] for i in sel])
            entry[variant] = v
            print(f"[scale] {n} {variant}: assign cpu {v['assign']['cpu']}", flush=True)
            del idx
            gc.collect()
        # plain difflib scan, on as many queries as fit in the time box
        budget = 6.0 if quick else 20.0
        scan_wall, scan_cpu, t1 = [], [], time.perf_counter()
        for _, o in queries:
            if time.perf_counter() - t1 > budget or len(scan_wall) >= 200:
                break
            w0, c0 = time.perf_counter(), time.thread_time()
            plain_scan({"tw": protos}, o, "tw")
            scan_cpu.append(time.thread_time() - c0)
            scan_wall.append(time.perf_counter() - w0)
        entry["plain_difflib_scan"] = {**both(scan_wall, scan_cpu), "queries": len(scan_wall)}
        for variant in ("index_exact_default", "index_approximate"):
            entry[variant]["speedup_vs_plain_scan_cpu_mean"] = round(
                statistics.fmean(scan_cpu) / entry[variant]["assign"]["cpu"]["mean_us"] * 1e6, 1)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        out[str(n)] = entry
        print(f"[scale] {n}: scan cpu mean {entry['plain_difflib_scan']['cpu'].get('mean_us')} us on "
              f"{len(scan_wall)} queries", flush=True)
    # the peer's worst case: K clusters sharing their first 300 characters, a query that misses them all
    room = max(base, key=len)[:300]
    K = 2000
    misses = [(room + " " + " ".join(rng.choice(VOCAB) + str(rng.randrange(10_000)) for _ in range(150)), "tw")
              for _ in range(50)]
    tails = [" ".join(rng.choice(VOCAB) + str(rng.randrange(10_000)) for _ in range(150)) for _ in range(K)]
    bucket = {"peer_reported_s_per_assign": 0.575}
    for variant, kwargs in (("index_exact_default", {}), ("index_approximate", {"exact": False})):
        idx = ObservationIndex(DELTA, **kwargs)
        for tail in tails:
            idx._create(room + " " + tail, "tw")  # forced, as the peer's measurement loaded them
        _, wall, cpu = timed(idx.assign, misses)
        bucket[variant] = {"assign_miss": both(wall, cpu)}
        print(f"[scale] shared-prefix bucket of {K}, {variant}: miss cpu {bucket[variant]['assign_miss']['cpu']}",
              flush=True)
    out["shared_prefix_bucket_2000"] = bucket
    if "100000" not in out:
        out["note"] = "quick mode: 100k skipped"
    return out


def part_eq2_scan(r: Retriever, lib: ExperienceLibrary, queries, k: int) -> dict:
    """Eq.2's ``similar`` against a plain Python scan of every entry (slea.testing.retrieval.ScanEq2) on ``k``
    queries spread over the stream: CPU time of both, and whether every query got the same entries."""
    scan = ScanEq2(lib)
    picks = [(o, t) for o, t, _ in queries[:: max(1, len(queries) // k)]][:k]
    got, wall, cpu = timed(lambda o, t: r.similar(o, t), picks)
    want, swall, scpu = timed(lambda o, t: scan.similar(o, t, r.fallback_threshold), picks)
    same = sum({e for _, e in g} == {e for _, e in w} for g, w in zip(got, want, strict=True))
    return {"queries": len(picks), "same_entries": same, "index": both(wall, cpu), "plain_scan": both(swall, scpu),
            "speedup_cpu_mean": round(statistics.fmean(scpu) / max(statistics.fmean(cpu), 1e-12), 1)}


def synthetic_library(stream: list[tuple[str, str]], n: int, rng: random.Random
                      ) -> tuple[ExperienceLibrary, ObservationIndex]:
    """An in-memory library of ``n`` synthetic entries over the clusters of ``stream`` (each names words of one
    observation; 2 in 3 positive; 70 % linked to that observation's cluster), bulk-loaded: admission and novelty
    are benchmarked by the tests, not here. Returns it and the ``ObservationIndex`` those clusters come from."""
    idx = ObservationIndex(DELTA)
    cids = [idx.assign(o, t) for t, o in stream]
    distinct = list(dict.fromkeys(zip(stream, cids)))
    lib = ExperienceLibrary(None, capacity_pos=10**9, capacity_neg=10**9)
    with lib.transaction():
        for eid in range(1, n + 1):
            (t, o), c = rng.choice(distinct)
            words = [w for w in re.findall(r"[a-z]+", o.lower()) if len(w) > 3] or ["room"]
            pick = " ".join(rng.sample(words, min(4, len(words))))
            zone = "pos" if eid % 3 else "neg"
            text = (f"When you see {pick}, '{rng.choice(VOCAB)} {rng.choice(VOCAB)}' "
                    f"{'helped' if zone == 'pos' else 'went wrong'} (lesson {eid}).")
            e = Entry(eid, text, zone, rng.choice(["principle", "pattern", "example"]), rng.random(), t,
                      " ".join(o.split()[:12]), [eid], [c] if rng.random() < 0.7 else [], 0, 0, 0, -1)
            lib._write(e)
            lib._index(e)
            lib._next_id = eid + 1
    return lib, idx


def part_retrieval(streams, quick: bool) -> dict:
    rng = random.Random(2)
    stream = streams["clean"]
    out = {}
    sizes = [500, 10_000] if quick else [500, 10_000, 100_000]
    for n in sizes:
        t0 = time.perf_counter()
        lib, idx = synthetic_library(stream, n, rng)
        r = Retriever(lib, top_k_pos=2, top_k_neg=1, max_tokens=200)
        queries = [(o, t, idx.lookup(o, t)) for t, o in stream]
        gc.collect()
        res, wall, cpu = timed(lambda o, t, c, r=r: r.retrieve(o, c, task_type=t, link=False), queries)
        eq1 = [i for i, x in enumerate(res) if x.entry_ids and not x.fallback]
        eq2 = [i for i, x in enumerate(res) if x.fallback]
        _, fwall, fcpu = timed(lambda o, t, r=r: r.retrieve(o, -1, task_type=t, link=False),
                               [(o, t) for o, t, _ in queries[:: (3 if quick else 1)]])
        _, awall, acpu = timed(lambda o, t, r=r, idx=idx: r.retrieve(o, idx.assign(o, t), task_type=t, link=False),
                               [(o, t) for o, t, _ in queries])
        scan_eq2 = part_eq2_scan(r, lib, queries, 200 if n <= 10_000 else 50)
        out[str(n)] = {
            "entries": len(lib), "build_s": round(time.perf_counter() - t0, 1),
            "retrieve_given_cluster": both(wall, cpu),
            "retrieve_eq1_hits": both([wall[i] for i in eq1], [cpu[i] for i in eq1]),
            "retrieve_eq2_fallback_only": both(fwall, fcpu),
            "assign_plus_retrieve": both(awall, acpu),
            "eq2_similar_vs_plain_scan": scan_eq2,
            "share_eq1": round(len(eq1) / len(res), 3), "share_eq2": round(len(eq2) / len(res), 3),
            "distinct_results": len({tuple(x.entry_ids) for x in res}),
        }
        print(f"[retrieval] {n}: given cluster cpu {out[str(n)]['retrieve_given_cluster']['cpu']}, "
              f"eq2 cpu {out[str(n)]['retrieve_eq2_fallback_only']['cpu']}", flush=True)
        lib.conn.close()
    return out


def table(res: dict) -> str:
    lines = ["| measurement | mean µs (cpu) | p99 µs (cpu) | mean µs (wall) | p99 µs (wall) | notes |",
             "|---|---|---|---|---|---|"]

    def row(name, d, note=""):
        c, w = d.get("cpu", {}), d.get("wall", {})
        lines.append(f"| {name} | {c.get('mean_us', '–')} | {c.get('p99_us', '–')} | {w.get('mean_us', '–')} | "
                     f"{w.get('p99_us', '–')} | {note} |")

    labels = {"exact_scan": "exact scan (ExactScanIndex)", "index_exact_default": "ObservationIndex() (exact)",
              "index_approximate": "ObservationIndex(exact=False)"}
    for name, a in res.get("agreement", {}).items():
        if "exact_scan" not in a:  # a section written by an older version of this script
            continue
        for v, label in labels.items():
            e = a[v]
            note = f"{e['clusters']} clusters"
            if v != "exact_scan":
                note += (f"; Rand {e['rand_index']}, identical {e['identical_assignments']}, "
                         f"missed joins {e['missed_joins']}")
            short = next(k for k in e["assign"] if k.startswith("short"))
            long_ = next(k for k in e["assign"] if k.startswith("long"))
            note += (f"; short/long mean {e['assign'][short]['cpu'].get('mean_us', '–')} / "
                     f"{e['assign'][long_]['cpu'].get('mean_us', '–')} µs, p99 "
                     f"{e['assign'][short]['cpu'].get('p99_us', '–')} / {e['assign'][long_]['cpu'].get('p99_us', '–')}")
            row(f"`{name}` ({a['observations']} obs, mean {a['mean_chars']} chars): {label}", e["assign"]["all"], note)
        row(f"`{name}`: plain difflib scan", a["plain_difflib_scan"],
            f"{a['plain_difflib_scan']['prototypes']} prototypes, sampled queries")
    for n, s in res.get("scale", {}).items():
        if not isinstance(s, dict) or "plain_difflib_scan" not in s:
            continue
        for v in ("index_exact_default", "index_approximate"):
            e = s[v]
            row(f"{n} prototypes, one task type: {labels[v]}", e["assign"],
                f"join/new/repeat mean {e['assign_join']['cpu']['mean_us']} / {e['assign_new']['cpu']['mean_us']} / "
                f"{e['assign_repeat']['cpu']['mean_us']} µs; {e['speedup_vs_plain_scan_cpu_mean']}x the plain scan")
        row(f"{n} prototypes: plain difflib scan", s["plain_difflib_scan"],
            f"{s['plain_difflib_scan']['queries']} queries of the same mix (time-boxed)")
    b = res.get("scale", {}).get("shared_prefix_bucket_2000")
    if b:
        for v in ("index_exact_default", "index_approximate"):
            row(f"miss, 2,000 clusters sharing 300 chars: {labels[v]}", b[v]["assign_miss"],
                "released code: 575,000 µs")
    for n, r in res.get("retrieval", {}).items():
        row(f"retrieve (given cluster), {r['entries']} entries", r["retrieve_given_cluster"],
            f"Eq.1 share {r['share_eq1']}, Eq.2 {r['share_eq2']}, {r['distinct_results']} distinct results")
        row(f"retrieve Eq.2 fallback only, {r['entries']} entries", r["retrieve_eq2_fallback_only"])
        sc = r.get("eq2_similar_vs_plain_scan")
        if sc:
            row(f"Eq.2 similar, {r['entries']} entries", sc["index"],
                f"plain scan {sc['plain_scan']['cpu'].get('mean_us')} µs: {sc['speedup_cpu_mean']}x; "
                f"same entries {sc['same_entries']}/{sc['queries']}")
        row(f"assign + retrieve, {r['entries']} entries", r["assign_plus_retrieve"])
    lines.append("")
    lines.append("Targets: assign mean <= 40 µs, p99 <= 150 µs, flat to 100k, exact (no missed join); retrieval p99 "
                 "<= 100 µs at 10k entries, <= 1 ms at 100k.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes (no 100k), for a smoke run")
    ap.add_argument("--parts", default="agreement,scale,retrieval", help="comma-separated subset to (re)measure")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "retrieval.json"))
    a = ap.parse_args()
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    t0 = time.perf_counter()
    streams = load_streams()
    out = Path(a.out)
    res = json.loads(out.read_text()) if out.exists() and set(parts) != {"agreement", "scale", "retrieval"} else {}
    res["env"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
                  "quick": a.quick, "parts": parts}
    if "agreement" in parts:
        res["agreement"] = part_agreement({**streams, "low_vocab_synthetic": low_vocab_stream()}, a.quick)
    if "scale" in parts:
        res["scale"] = part_scale(streams, a.quick)
    if "retrieval" in parts:
        res["retrieval"] = part_retrieval(streams, a.quick)
    res["env"]["loadavg_end"] = os.getloadavg()
    res["env"]["seconds"] = round(time.perf_counter() - t0, 1)
    res.setdefault("env_by_part", {}).update({p: res["env"] for p in parts})  # which run measured each section
    res["table"] = table(res)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(res["table"])
    print(f"total {res['env']['seconds']} s -> {a.out}")


if __name__ == "__main__":
    main()
