"""bench/cost_growth.py end to end on the tiny model and small sweeps: the JSON's fields and the plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from slea.testing.bench import load_script

C = load_script(Path(__file__).resolve().parents[2] / "bench" / "cost_growth.py")


def test_slope():
    assert C.slope([1, 2, 4], [3, 6, 12]) == 1.0
    assert abs(C.slope([1, 10, 100], [5, 5, 5])) < 1e-12


def test_quick_run(tmp_path):
    out = tmp_path / "cost_growth.json"
    res = C.main(["--model", "tiny", "--quick", "--reps", "1", "--threads", str(torch.get_num_threads()),
                  "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    g = res["generation"]
    assert [p["rows"] for p in g["group_size"]["points"]] == C.QUICK["group_sizes"]
    assert all(p["distinct_prompts"] == 1 for p in g["group_size"]["points"])
    assert [(p["rows"], p["distinct_prompts"]) for p in g["groups"]["points"]] == [
        (x * C.GROUP_SIZE, x) for x in C.QUICK["groups"]]
    t = res["training"]["points"]
    assert [p["history"] for p in t] == C.QUICK["history"]
    assert t[0]["mean_prompt_tokens"] < t[1]["mean_prompt_tokens"] and t[0]["model_gflop"] < t[1]["model_gflop"]
    lib = res["library"]
    assert [p["entries"] for p in lib["points"]] == C.QUICK["library"]
    assert all(p["eq1_given_cluster"]["cpu"]["n"] == lib["queries"] for p in lib["points"])
    t = res["training"]
    assert all(math.isfinite(x) for x in (g["group_size"]["slope"], g["groups"]["slope"], t["slope_vs_prompt_tokens"],
                                          t["slope_vs_model_flops"], lib["slope_eq1_given_cluster_mean"],
                                          lib["slope_eq2_fallback_mean"]))
    assert all(p["first_eq2_call_cpu_us"] > 0 for p in lib["points"]) and math.isfinite(lib["slope_first_eq2_call"])
    assert set(res["run_by_part"]) == {"generation", "training", "library"}
    png.unlink()
    C.main(["--plot-only", "--out", str(out)])
    assert png.stat().st_size > 0
    again = C.main(["--model", "tiny", "--quick", "--parts", "library", "--threads", str(torch.get_num_threads()),
                    "--out", str(out)])  # the other sections are kept
    assert again["generation"] == res["generation"] and again["training"] == res["training"]
    assert again["run_by_part"]["generation"] == res["run_by_part"]["generation"]
    assert again["run_by_part"]["library"]["parts"] == ["library"]
