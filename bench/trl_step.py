"""One training step of slea against the real TRL ``GRPOTrainer`` (trl 1.16.0, the ``bench`` extra), on the same
model, the same LoRA configuration (same target modules, same layers: one ``LoraConfig`` from
``slea.policy.model.lora_config``) and one shared batch per shape:

- ``grpo``: G=8 completions of one text-game prompt (the Goal / Previous action / Observation / Valid commands
  (13) / Your command: a fixed prompt, through the chat template; 8-16-token completions);
- ``multiturn``: 8 rows with distinct prompts (different previous actions and observations, as later turns of
  slea's rollouts have) and their completions.

What is timed is the training part only: loss forward + backward + gradient clipping + optimizer step, after
``--warmup`` steps, median of ``--steps``. TRL runs its own ``trainer.train()`` loop (its loss, its fused LM head,
its accelerate autocast, its gradient checkpointing and optimizer, all at GRPOConfig's defaults); generation is
replaced by ``rollout_func`` (TRL's own hook) returning the fixed completions, and the inputs GRPOTrainer builds
from them (``_generate_and_score_completions``: padding, rewards, advantages) are built once in the warm-up step
and handed back by ``_prepare_inputs`` afterwards, so the timed steps hold no generation or scoring. slea runs
``ppo_update`` (one mini-batch, one micro-batch of 8) with ``old_logprobs`` from one no-grad forward before the
timing. The timer spans TRL's ``on_step_begin`` .. ``on_step_end`` callbacks, and the ``ppo_update`` call for slea.

Matched settings: beta 0 (no reference model), one iteration per batch, ε = 0.2, advantages equal (TRL's
group-normalised ones from fixed rewards, handed to slea), TRL ``loss_type="dapo"`` (Σ mask·loss over the batch's
completion tokens / their count) = slea ``loss_agg: token-mean``. The loss check runs one step of each in fp32
on identical weights (LoRA B set to the same random values so every adapter gets a gradient) and compares the
loss and every trainable gradient (after TRL's backward, before its optimizer step; clipping off).

Tokens per step: the attention-mask tokens of the prompt+completion rows (TRL's own count),
the same for both. Peak memory: ``VmHWM`` (peak RSS) of a fresh subprocess per (engine, shape), model load included.

    PYTHONPATH=src .venv/bin/python bench/trl_step.py [--model embedded] [--steps 4] [--quick]

writes bench/results/trl_step.json (``--out``) and prints a markdown table. ``--model tiny`` is a smoke run.
Run it alone on the machine (DEVELOPERS.md): it is a timing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch

OUT = Path(__file__).parent / "results" / "trl_step.json"
SHAPES = ("grpo", "multiturn")
G = 8
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]  # fixed rewards: TRL's group-normalised advantages from them
LR = 1e-4
COMMANDS = ["go east", "go west", "go north", "go south", "take coin from wooden chest", "take rusty key",
            "open wooden door", "open wooden chest", "unlock wooden door with rusty key", "examine wooden chest",
            "look around the room", "check your inventory", "drop rusty key on the floor"]  # 13, as the baseline's
ROOMS = ["a dark cellar", "a bright kitchen", "a dusty attic", "a small garden", "a long corridor",
         "a cold pantry", "a narrow hall", "a quiet study"]


def model_section(name: str, lora_layers: int | None, dtype: str):
    from slea.config import ModelSection

    return ModelSection(name_or_path=name, lora=True, lora_layers=lora_layers, dtype=dtype)


def default_lora_layers(name: str) -> int:
    return 1 if name == "tiny" else 15  # tiny: the top 1 of 2 layers; embedded: configs/default.yaml's 15 of 30


def _prompt(tok, goal: str, prev: str, obs: str) -> list[int]:
    text = (f"Goal: {goal}\nPrevious action: {prev}\nObservation: {obs}\n"
            f"Valid commands ({len(COMMANDS)}): {', '.join(COMMANDS)}\nYour command:")
    chat = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(chat, add_special_tokens=False).input_ids


def batch(tok, shape: str, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """The shared batch of ``shape``: 8 (prompt_ids, completion_ids) rows; completions of 8-16 tokens."""
    rng = random.Random(seed)
    goal = ("Find the coin hidden somewhere in the house and take it. The coin is not in the first room; "
            "you may need a key to open a locked door on the way. Take the coin as soon as you see it, do not "
            "drop it again, and avoid rooms you have already searched.")
    obs0 = ("You are in a dark cellar. There is a wooden door to the east and a stair going north. "
            "A small wooden chest sits in the corner under a shelf of old jars, and a rusty key lies on the "
            "floor next to it. The air is damp and smells of earth.")
    rows = []
    for i in range(G):
        if shape == "grpo":
            prompt = _prompt(tok, goal, "none", obs0)
        else:
            room = ROOMS[i % len(ROOMS)]
            prev = rng.choice(COMMANDS)
            obs = (f"You are in {room}. Exits lead {rng.choice(['east', 'west'])} and "
                   f"{rng.choice(['north', 'south'])}. You see {rng.choice(['a table', 'a shelf', 'a box'])} "
                   f"and {rng.choice(['a mug', 'an apple', 'nothing else'])}. The floor is covered in dust "
                   f"and a faint light comes from the window. Your last command: {prev}.")
            prompt = _prompt(tok, goal, prev, obs)
        words = " ".join(rng.choice(COMMANDS) for _ in range(8))
        completion = tok(words + "\n", add_special_tokens=False).input_ids[:rng.randint(8, 16)]
        rows.append((prompt, completion))
    return rows


def grpo_advantages(rewards: list[float]) -> list[float]:
    """TRL's advantages for one group (scale_rewards="group"): (r − mean) / (std + 1e-4), std unbiased, in float32
    torch arithmetic as TRL computes them, so both sides train on the same advantages to float32 rounding (bit-equal
    on one machine, 2.4e-7 apart on another, where TRL's batched std reduces in another order; slea's own
    ``group_normalize`` works in float64 and differs by ~5e-8)."""
    r = torch.tensor(rewards)
    return ((r - r.mean()) / (r.std() + 1e-4)).tolist()


# ---------------------------------------------------------------- slea

def slea_engine(name: str, rows, lora_layers: int, dtype: str, grad_clip: float = 1.0, model=None):
    """(model, optimizer, step, fill_old): ``step()`` runs one ``ppo_update`` and returns its metrics,
    ``fill_old()`` sets the rows' old log-probs. ``model``: train that one (loaded with ``name`` and
    ``lora_layers``) instead of loading a fresh one."""
    from slea.config import AlgorithmSection, TrainSection
    from slea.policy.model import load_policy
    from slea.trainer.update import Sample, ppo_update, response_logprobs

    torch.manual_seed(0)
    if model is None:
        model, _ = load_policy(model_section(name, lora_layers, dtype))
    adv = grpo_advantages(REWARDS)
    samples = [Sample(p, c, [0.0] * len(c), [a] * len(c)) for (p, c), a in zip(rows, adv)]
    algo = AlgorithmSection(policy_loss="ppo_clip", loss_agg="token-mean", clip_eps=0.2, kl_coef=0.0)
    train = TrainSection(lr=LR, updates_per_iter=1, micro_batch=G, grad_clip=grad_clip)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, betas=tuple(train.betas), weight_decay=train.weight_decay)

    def fill_old() -> None:  # on-policy old log-probs, as TRL's num_iterations=1 (old = current, detached)
        with torch.no_grad():
            logp, mask = response_logprobs(model, samples, dtype=dtype)
        for s, row, m in zip(samples, logp, mask):
            s.old_logprobs = row[m.bool()].tolist()

    def step() -> dict:
        return ppo_update(model, optimizer, samples, algo, train, temperature=1.0, dtype=dtype,
                          rng=random.Random(0))

    return model, optimizer, step, fill_old


# ---------------------------------------------------------------- TRL

def step_timer(capture: bool):
    """A TrainerCallback: wall time of each step (on_step_begin .. on_step_end) and the gradients before the first
    optimizer step (``capture``)."""
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def __init__(self, capture: bool):
            self.times: list[float] = []
            self.grads: dict[str, torch.Tensor] | None = None
            self.capture = capture
            self.model = None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            if self.capture and self.grads is None:
                self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                              if p.requires_grad and p.grad is not None}

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    return Timer(capture)


def trl_engine(name: str, rows, lora_layers: int, steps: int, *, bf16: bool, out_dir: str,
               capture: bool = False, max_grad_norm: float = 1.0, init=None):
    """A GRPOTrainer on ``name`` with slea's LoraConfig, fed ``rows`` by ``rollout_func``; returns
    ``(trainer, timer, losses)``; ``trainer.train()`` runs ``steps`` steps. ``init(model)`` sets the weights."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from slea.policy.model import load_tokenizer, lora_config, resolve

    torch.manual_seed(0)
    cfg = model_section(name, lora_layers, "bfloat16" if bf16 else "float32")
    tok = load_tokenizer(name)
    base = AutoModelForCausalLM.from_pretrained(resolve(name), dtype=torch.float32, use_safetensors=True)
    peft_cfg = lora_config(base, cfg)

    def rollout(prompts, trainer):  # TRL's generation hook: the fixed completions, no sampling
        assert len(prompts) == len(rows)
        return {"prompt_ids": [list(p) for p, _ in rows], "completion_ids": [list(c) for _, c in rows],
                "logprobs": None}

    def reward(completions, **kw):
        return list(REWARDS[:len(completions)])

    args = GRPOConfig(output_dir=out_dir, use_cpu=True, per_device_train_batch_size=G, num_generations=G,
                      gradient_accumulation_steps=1, max_completion_length=16, max_steps=steps, learning_rate=LR,
                      beta=0.0, loss_type="dapo", epsilon=0.2, num_iterations=1, bf16=bf16,
                      max_grad_norm=max_grad_norm, logging_steps=10**6, save_strategy="no", report_to="none",
                      seed=0, dataloader_num_workers=0, disable_tqdm=True)
    dataset = Dataset.from_list([{"prompt": "fixed"}] * (G * max(steps, 1)))
    timer = step_timer(capture)
    trainer = GRPOTrainer(model=base, reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=tok, peft_config=peft_cfg, rollout_func=rollout, callbacks=[timer])
    if init is not None:
        init(trainer.model)
    real_prepare = trainer._prepare_inputs
    cache: dict = {}
    losses: list[float] = []

    def prepare(generation_batch):  # build the inputs once (warm-up step), as GRPOTrainer builds them
        if "inputs" not in cache:
            cache["inputs"] = real_prepare(generation_batch)
        return cache["inputs"]

    real_loss = trainer.compute_loss

    def compute_loss(model, inputs, *a, **k):
        loss = real_loss(model, inputs, *a, **k)
        losses.append(float(loss.detach()))
        return loss

    trainer._prepare_inputs = prepare
    trainer.compute_loss = compute_loss
    trainer._bench_inputs = cache
    return trainer, timer, losses


# ---------------------------------------------------------------- the loss check

def loss_check(name: str = "tiny", shape: str = "grpo", lora_layers: int | None = None, seed: int = 0) -> dict:
    """One fp32 step of each on identical weights and one batch: loss and gradients, and how far apart."""
    from slea.policy.model import load_tokenizer

    lora_layers = default_lora_layers(name) if lora_layers is None else lora_layers
    rows = batch(load_tokenizer(name), shape, seed)
    model, optimizer, step, fill_old = slea_engine(name, rows, lora_layers, "float32", grad_clip=1e9)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # LoRA B = 0 at init would leave every A without a gradient: same random B in both
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    fill_old()
    slea_grads: dict[str, torch.Tensor] = {}
    real_step = optimizer.step

    def record_step(*a, **k):
        slea_grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters()
                           if p.requires_grad and p.grad is not None})
        return real_step(*a, **k)

    optimizer.step = record_step
    slea_loss = step()["loss"]

    def init(trl_model):
        trainable = {n: p for n, p in trl_model.named_parameters() if p.requires_grad}
        if set(trainable) != set(weights):
            raise AssertionError(f"trainable parameters differ: slea {len(weights)}, TRL {len(trainable)}; "
                                 f"only slea: {sorted(set(weights) - set(trainable))[:3]}, "
                                 f"only TRL: {sorted(set(trainable) - set(weights))[:3]}")
        with torch.no_grad():
            for n, p in trainable.items():
                p.copy_(weights[n])

    with tempfile.TemporaryDirectory() as tmp:
        trainer, timer, losses = trl_engine(name, rows, lora_layers, 1, bf16=False, out_dir=tmp, capture=True,
                                            max_grad_norm=0.0, init=init)
        trainer.train()
        trl_adv = sorted(trainer._bench_inputs["inputs"]["advantages"].tolist())
    trl_grads = timer.grads
    max_abs = max(float((slea_grads[n] - trl_grads[n]).abs().max()) for n in trl_grads)
    scale = max(float(g.abs().max()) for g in trl_grads.values())
    norm_s = math.sqrt(sum(float(g.pow(2).sum()) for g in slea_grads.values()))
    norm_t = math.sqrt(sum(float(g.pow(2).sum()) for g in trl_grads.values()))
    return {"model": name, "shape": shape, "lora_layers": lora_layers, "dtype": "float32",
            "trainable_tensors": len(weights), "trainable_params": int(sum(w.numel() for w in weights.values())),
            "slea_loss": slea_loss, "trl_loss": losses[0], "loss_abs_diff": abs(slea_loss - losses[0]),
            "advantages_abs_diff": max(abs(a - b) for a, b in zip(sorted(grpo_advantages(REWARDS)), trl_adv)),
            "grad_max_abs_diff": max_abs, "grad_max_abs": scale, "grad_rel_diff": max_abs / max(scale, 1e-30),
            "grad_norm_slea": norm_s, "grad_norm_trl": norm_t, "same_grad_tensors": set(slea_grads) == set(trl_grads)}


# ---------------------------------------------------------------- timing workers (one fresh process each)

def worker(engine: str, name: str, shape: str, lora_layers: int, steps: int, warmup: int, threads: int) -> dict:
    from slea.policy.model import load_tokenizer

    torch.set_num_threads(threads)
    rows = batch(load_tokenizer(name), shape)
    tokens = sum(len(p) + len(c) for p, c in rows)
    if engine == "slea":
        _, _, step, fill_old = slea_engine(name, rows, lora_layers, "bfloat16")
        fill_old()
        times = []
        for _ in range(warmup + steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            trainer, timer, _ = trl_engine(name, rows, lora_layers, warmup + steps, bf16=True, out_dir=tmp)
            trainer.train()
            times = timer.times
    timed = times[warmup:]
    step_s = statistics.median(timed)
    return {"step_s": step_s, "step_s_all": times, "tok_s": tokens / step_s, "tokens": tokens,
            "completion_tokens": sum(len(c) for _, c in rows), "prompt_tokens": [len(p) for p, _ in rows],
            "peak_rss_mib": peak_rss_mib()}


def peak_rss_mib() -> float:
    """This process's peak resident memory: ``VmHWM`` of /proc/self/status (the high-water mark of this process's
    own address space, new at exec). ``ru_maxrss`` is not used where /proc exists: Linux carries it over from the
    parent across fork and exec, so every worker read the parent's peak (the loss check's two fp32 models)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_worker(engine: str, args, shape: str, lora_layers: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", engine, "--shape", shape, "--model", args.model,
           "--lora-layers", str(lora_layers), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(args.threads)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{engine}/{shape} worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(result: dict) -> str:
    head = ("| shape | rows | tokens | slea step s | TRL step s | slea tok/s | TRL tok/s | slea/TRL | "
            "slea peak RSS MiB | TRL peak RSS MiB |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for shape, r in result["shapes"].items():
        s, t = r["slea"], r["trl"]
        lines.append(f"| {shape} | {G} | {s['tokens']} | {s['step_s']:.2f} | {t['step_s']:.2f} | {s['tok_s']:.0f} | "
                     f"{t['tok_s']:.0f} | {r['ratio']:.2f}x | {s['peak_rss_mib']:.0f} | {t['peak_rss_mib']:.0f} |")
    c = result["loss_check"]
    lines.append(f"\nloss check ({c['shape']}, fp32, {c['trainable_params']} trainable params in "
                 f"{c['trainable_tensors']} tensors): slea {c['slea_loss']:.6g} vs TRL {c['trl_loss']:.6g} "
                 f"(|Δ| {c['loss_abs_diff']:.2e}); gradients max |Δ| {c['grad_max_abs_diff']:.2e} of "
                 f"max |g| {c['grad_max_abs']:.2e} (rel {c['grad_rel_diff']:.2e})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", choices=["tiny", "embedded"])
    ap.add_argument("--steps", type=int, default=4, help="timed steps per engine and shape (median)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="2 timed steps, loss check on the GRPO shape only")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora-layers", type=int, default=None, help="adapters on the top N layers (default: "
                    "15 of 30 for embedded, as configs/default.yaml; 1 of 2 for tiny)")
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT} (embedded) or a temp file (tiny)")
    ap.add_argument("--worker", choices=["slea", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--shape", choices=SHAPES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    lora_layers = default_lora_layers(args.model) if args.lora_layers is None else args.lora_layers
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.shape, lora_layers, args.steps, args.warmup,
                                args.threads)))
        return
    if args.quick:
        args.steps = 2
    torch.set_num_threads(args.threads)
    import trl

    checks = [loss_check(args.model, shape, lora_layers) for shape in (SHAPES[:1] if args.quick else SHAPES)]
    result = {"model": args.model, "threads": args.threads, "lora_layers": lora_layers, "trl": trl.__version__,
              "torch": torch.__version__, "steps": args.steps, "warmup": args.warmup,
              "settings": "TRL GRPOConfig defaults (bf16 autocast, gradient checkpointing, fused LM head) with "
                          "beta 0, loss_type dapo, num_iterations 1, lr 1e-4, max_grad_norm 1; slea ppo_update "
                          "ppo_clip token-mean, bf16 autocast, micro_batch 8, grad_clip 1, AdamW lr 1e-4",
              "loss_check": checks[0], "loss_checks": checks, "shapes": {}}
    for shape in SHAPES:
        slea = run_worker("slea", args, shape, lora_layers)
        trl_r = run_worker("trl", args, shape, lora_layers)
        result["shapes"][shape] = {"slea": slea, "trl": trl_r, "ratio": trl_r["step_s"] / slea["step_s"]}
    out = args.out or (OUT if args.model == "embedded" else Path(tempfile.gettempdir()) / "trl_step_tiny.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
