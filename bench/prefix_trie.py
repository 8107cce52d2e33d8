"""The update step with the trie of shared prefixes against the common prefix alone, on a GRPO batch.

The batch is the default job's first turn: ``--tasks`` TextWorld tasks x ``--group`` identical copies of each
task's turn-0 prompt (``PromptBuilder`` with history 1 and obs_max_chars 300 over real TextWorld observations,
bench/cost_growth.py's prompts: ``slea.testing.bench.rollout_prompts``), each row answering one of the prompt's
commands (3-5 tokens), with group-normalised advantages of random 0/1 rewards. One update step is one
``ppo_update`` at the default config (two mini-batches, micro-batches of 8, ppo_clip, token-mean, π_old
recomputed by a no-grad forward of the second mini-batch) of the embedded model with the default preset's LoRA,
in bf16. Each mini-batch is prompt-sorted, so a micro-batch of 8 holds the rows of about two tasks.

Two variants, timed in alternating rounds in one process on one model (bench/mfu.py's ``timed_rounds``):

- ``common_prefix``: every forward shares the micro-batch's common prefix alone (``prefix_levels=1``), the
  forward before the trie: each row then recomputes the rest of its prompt;
- ``trie``: the default, every shared prefix once (slea/policy/prefix.py): each task's prompt once per
  micro-batch, then the rows' last prompt token and response.

Besides the median seconds it records the token positions each variant passes to the model per step (padding
included; a forward hook on the embeddings), and ``speedup`` = common_prefix s / trie s.

    PYTHONPATH=src .venv/bin/python bench/prefix_trie.py [--model embedded] [--reps 3]

writes bench/results/prefix_trie.json (``--out``; ``--model tiny`` is a smoke run into a temp folder). Run it
alone on the machine: it is a timing.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mfu
import retrieval
import trl_step

OUT = Path(__file__).parent / "results" / "prefix_trie.json"
VARIANTS = {"common_prefix": 1, "trie": None}  # prefix_levels of every response_logprobs of the update


def grpo_rows(tok, tasks: int, group: int, seed: int = 0):
    """``tasks x group`` samples: each task's turn-0 prompt ``group`` times, a short command as each answer."""
    from slea.policy.prompt_builder import PromptBuilder
    from slea.testing.bench import ROLLOUT_ACTIONS, rollout_prompts
    from slea.trainer.update import Sample

    rng = random.Random(seed)
    observations = random.Random(4).sample([o for _, o in retrieval.load_streams()["clean_textworld"]], 256)
    prompts = rollout_prompts(PromptBuilder(tok, history=1, obs_max_chars=300), rng, tasks, group, later=False,
                              observations=observations)
    rows = []
    for t in range(tasks):
        rewards = torch.tensor([float(rng.random() < 0.5) for _ in range(group)])
        adv = ((rewards - rewards.mean()) / (rewards.std() + 1e-4)).tolist()
        for i in range(group):
            answer = tok(" " + rng.choice(ROLLOUT_ACTIONS) + "\n", add_special_tokens=False).input_ids
            rows.append(Sample(prompts[t * group + i], answer, [0.0] * len(answer), [adv[i]] * len(answer)))
    return rows


def update_step(model, samples, levels: int | None):
    """One ``ppo_update`` of ``samples`` whose every forward shares prefixes up to ``levels`` trie levels."""
    from slea.config import AlgorithmSection, TrainSection
    from slea.trainer import update as U

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=trl_step.LR)
    forward = functools.partial(U.response_logprobs_entropy, prefix_levels=levels)

    def step() -> dict:
        with mock.patch.object(U, "response_logprobs_entropy", forward):
            return U.ppo_update(model, optimizer, samples, AlgorithmSection(), TrainSection(), temperature=1.0,
                                dtype="bfloat16", rng=random.Random(0))

    return step


def computed_tokens(model, step) -> int:
    """Token positions (padding included) the model's embeddings see during one ``step()``."""
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, inp, _o: seen.append(inp[0].numel()))
    try:
        step()
    finally:
        hook.remove()
    return sum(seen)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", choices=["tiny", "embedded"])
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3, help="timed rounds, after one warm-up step per variant")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT} (embedded) or a temp file (tiny)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from slea.policy.model import load_policy

    torch.manual_seed(0)
    lora_layers = trl_step.default_lora_layers(args.model)
    model, tok = load_policy(trl_step.model_section(args.model, lora_layers, "bfloat16"))
    samples = grpo_rows(tok, args.tasks, args.group)
    steps = {name: update_step(model, samples, levels) for name, levels in VARIANTS.items()}
    tokens = {name: computed_tokens(model, step) for name, step in steps.items()}  # also the warm-up
    timed = mfu.timed_rounds(steps, args.reps, 0.9 * args.threads)
    res = {"model": args.model, "cpu": mfu.cpu_kind(), "threads": args.threads, "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "lora_layers": lora_layers, "tasks": args.tasks, "group": args.group,
           "rows": len(samples), "prompt_tokens": len(samples[0].prompt_ids), "reps": args.reps,
           "variants": {name: {"tokens_per_step": tokens[name], **timed[name]} for name in VARIANTS},
           "speedup": timed["common_prefix"]["s"] / timed["trie"]["s"]}
    out = args.out or (OUT if args.model == "embedded" else Path(tempfile.mkdtemp()) / "prefix_trie.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    for name, v in res["variants"].items():
        print(f"{name}: {v['s']:.3f} s per update step, {v['tokens_per_step']} token positions")
    print(f"speedup {res['speedup']:.2f}x; wrote {out}")
    return res


if __name__ == "__main__":
    main()
