"""bench/fsdp.py end to end on the tiny model (one timed update per set-up): the JSON's set-ups, the share of the
base weights each rank holds, the ratios against the 1-process baseline, and the same update in every set-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_bench_measures_three_setups_of_the_same_update(tmp_path):
    out = tmp_path / "fsdp.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "fsdp.py"), "--model", "tiny", "--reps", "1",
                        "--warmup", "0", "--out", str(out)], env=env, capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    s = res["setups"]
    assert list(s) == ["baseline", "dp", "fsdp"]
    assert [s[k]["processes"] for k in s] == [1, 2, 2] and res["train"]["updates_per_iter"] == 4
    assert s["baseline"]["base_weights_held"] == [1.0] and s["dp"]["base_weights_held"] == [1.0, 1.0]
    assert all(0.45 < f < 0.55 for f in s["fsdp"]["base_weights_held"]), s["fsdp"]["base_weights_held"]
    assert s["fsdp"]["gather_s"] > 0 and s["dp"]["gather_s"] is None
    for name, v in s.items():
        assert v["vs_baseline"]["update_s"] == pytest.approx(v["update_s"] / s["baseline"]["update_s"])
        assert v["vs_baseline"]["peak_rss_update_mib"] == pytest.approx(
            [m / s["baseline"]["peak_rss_update_mib"][0] for m in v["peak_rss_update_mib"]])
        assert v["first_update"]["grad_norm"] > 0, name  # the update trained
        assert v["first_update_rel_diff"]["grad_norm"] < 1e-3, name  # the same update in every set-up (fp32)
        assert v["first_update_rel_diff"]["loss"] < 1e-3, name
    assert "| fsdp (2 x 1 thr) |" in res["table"]
