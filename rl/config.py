"""RL run configuration: TOML + pydantic, with dotted command-line overrides
(`--loss.name icepop --train.lr 3e-4`)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.config import describe, merge, parse_override
from rl.losses import IPOConfig, LossConfig
from rl.policy.policy import PolicyConfig
from rl.pull import ModelNotFound, resolve


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvConfig(_Section):
    name: str = "reverse_text"
    """A training environment from rl/envs: reverse_text, kernel_tasks, `rg:DATASET` (reasoning-gym) or
    `vf:TASKSET_ID` (a verifiers taskset), as docs/environments.md describes."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Passed to the environment (reverse_text: min_len, max_len; rg: and vf: their dataset's or taskset's
    config, added to the name's query)."""
    harness: bool = False
    """Roll out through the agent itself: each rollout a real session (kernel, turn loop, text-mode
    cells) against the policy server, scored by the environment's check, trained on from its
    trajectory (rl.envs.harness). Otherwise the bare policy answers in one completion."""
    max_steps: int = Field(3, ge=1)
    """With harness: model calls one rollout may make."""
    timeout: float = Field(120.0, gt=0)
    """With harness: seconds one rollout may take."""
    prompt_tokens: int | None = Field(None, ge=2)
    """With harness: the policy sees only the last this many tokens of each request (asked of the server
    as vLLM's `truncate_prompt_tokens`); default: as much as its context leaves room for."""
    base_prompt: Literal["full", "short"] = "full"
    """With harness: the agent's base prompt (model.base_prompt); "short" for small models."""


class SFTConfig(_Section):
    steps: int = 0
    """Warm-start steps on the environment's demonstrations before RL (0: none)."""
    batch_size: int = 64
    """Demonstrations per warm-start step."""
    lr: float = 1e-3
    """AdamW learning rate of the warm start."""
    noise: float = 0.0
    """Fraction of demonstrations replaced by the environment's plausible wrong answer: the warm start
    then knows the skill but does not always choose it, which is what RL is for."""


class DifficultyConfig(_Section):
    """Which tasks a step trains on, by how often the current policy solves them (INTELLECT-2 kept tasks
    solved at most 75% of the time from 8 samples). Online: each task a step draws is first sampled
    `samples` times (rollouts that only measure, never trained on), and enters the batch only when its solve
    rate lies in [min_solve_rate, max_solve_rate]; more tasks are drawn to fill the batch (train.max_rounds).
    `tasks_measured`, `tasks_too_easy`, `tasks_too_hard` are in metrics.jsonl every step."""

    samples: int = Field(8, ge=1)
    """Rollouts per task to estimate its solve rate."""
    max_solve_rate: float = Field(0.75, ge=0, le=1)
    """Tasks solved more often than this are too easy: left out."""
    min_solve_rate: float = Field(0.0, ge=0, le=1)
    """Tasks solved less often than this are too hard: left out."""
    solved_at: float = Field(1.0, ge=0, le=1)
    """A rollout solves its task when its reward is at least this (1.0: a perfect answer)."""

    @model_validator(mode="after")
    def _a_range(self) -> DifficultyConfig:
        if self.min_solve_rate > self.max_solve_rate:
            raise ValueError(f"min_solve_rate ({self.min_solve_rate}) is above max_solve_rate ({self.max_solve_rate})")
        return self


class TrainConfig(_Section):
    steps: int = Field(50, ge=0)
    """Optimizer steps of RL."""
    batch_size: int = Field(16, ge=1)
    """Tasks per step."""
    group_size: int = Field(8, ge=1)
    """Rollouts per task; advantages are relative to the group's mean reward."""
    lr: float = 3e-4
    """AdamW learning rate of the RL steps."""
    weight_decay: float = 0.0
    """AdamW weight decay of the RL steps."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this total norm (`grad_norm` in metrics.jsonl is the norm before clipping)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; the trainer scores tokens at the same temperature."""
    pack_length: int | None = Field(None, gt=1)
    """Pack each step's samples into rows of this many tokens, one micro-batch per row, attention kept
    within each sample (None: the whole step is one batch, a row per sample)."""
    max_tokens: int = 24
    """Longest completion."""
    std_normalize: bool = False
    """Also divide each group's advantages (reward minus the group's mean, rl.advantages) by the std of its
    scored rewards. Off by default, as in prime-rl."""
    skip_zero_advantage: bool = False
    """Drop groups whose rollouts all score alike (no signal; counted as `zero_advantage_groups`) and draw more
    tasks until the batch holds batch_size groups with signal, for at most max_rounds more rounds
    (INTELLECT-2). `useful_groups` and `extra_rounds` are in metrics.jsonl every step. Off: such groups still
    take their place in the batch, training nothing."""
    difficulty: DifficultyConfig | None = None
    """Keep only tasks the current policy solves at a rate in range, e.g. `{samples = 8, max_solve_rate =
    0.75}` (unset: every task)."""
    max_rounds: int = Field(4, ge=0)
    """With skip_zero_advantage or difficulty: the most extra rounds of tasks (each as many as the batch still
    lacks) a step draws to fill its batch; a batch still short after them trains on what it holds."""
    async_level: int = Field(0, ge=0)
    """Batches sampling may run ahead of training (0: sample, then train)."""
    max_off_policy_steps: int = Field(1, ge=0)
    """Rollouts sampled by a policy older than this many steps are dropped (and counted as `stale`), however
    they came to be old: async_level, policy_lag, a server behind on its reloads (prime-rl's default: 8)."""
    policy_lag: int = Field(0, ge=0)
    """Force off-policy sampling: the sampler gets each step's weights this many steps late (the
    off-policy stress study). Lag grows from 0 to this over the first steps, then stays. max_off_policy_steps
    applies: it must be at least this lag, or every rollout past the first steps would be dropped."""
    seed: int = 0
    """Seeds the initial weights, the warm start's noise, and each step's tasks and sampling."""
    sampler_dtype: Literal["float32", "bfloat16"] = "float32"
    """The built-in server's weights, for a Hugging Face model: bfloat16 samples at half the width, and its
    probabilities then differ from the fp32 trainer's (mismatch_kl per step; what IPO masks)."""
    shard_frozen: bool = False
    """With N processes: shard a LoRA run's frozen base across the ranks as the trained weights are (for a base
    too big for one device), all-gathered for each forward and backward. Off: every rank holds the whole base
    and only the adapter's weights and gradients cross between ranks (rl/dist.py)."""
    threads: int | None = Field(None, ge=1)
    """torch threads for training and sampling; None: torch's own count (the machine's cores, or
    OMP_NUM_THREADS). Under load one thread can be the fastest: two threads spun on two busy cores
    took 2.2x the CPU time of one for the same training run here."""
    out: str = "outputs/rl/run"
    """Run directory: checkpoints, metrics.jsonl, reward.png."""
    checkpoint_every: int = Field(25, ge=1)
    """Steps between checkpoints; the last step always writes one."""
    init_from: str | None = None
    """A checkpoint to start from (default: the run's SFT warm start if any, else fresh weights)."""
    request_timeout: float = 120.0
    """Seconds before a sampling request counts as timed out (its rollouts are excluded)."""
    rollout_url: str | None = None
    """An OpenAI-compatible server, already running, to sample rollouts from (vLLM, SGLang, `prime-agent rl
    serve`), e.g. "http://127.0.0.1:8000/v1"; the trainer then starts no server of its own. After each step
    it writes the new weights to <out>/weights/step-N and POSTs {"path": "<that folder>"} to reload_url."""
    reload_url: str | None = None
    """With rollout_url: the endpoint that loads weights from a path and answers once the server samples
    with them (default: rollout_url + "/reload", the policy server's). vLLM's own work as they are:
    "http://HOST:PORT/collective_rpc" (a model directory) or "http://HOST:PORT/v1/load_lora_adapter" (a LoRA
    run's adapter, loaded as rollout_model); see rl.fleet.reload."""
    rollout_model: str = "policy"
    """The model rollout requests name: vLLM's served model name, or with load_lora_adapter the adapter's
    name (the policy server takes any)."""
    rollout_urls: list[str] = Field(default_factory=list)
    """Several such servers (rollout_url is the case of one): each request goes to the least-loaded live one,
    a step's tasks split across them; after each step all of them load the new weights at once, and one that
    fails to (or cannot be reached) leaves the rotation, reported in the console and as `servers_lost` in
    metrics.jsonl, while training goes on with the rest (rl/fleet.py). Each rollout carries the policy
    version its server held."""
    reload_urls: list[str] = Field(default_factory=list)
    """With rollout_urls: each one's reload_url, in the same order (default: each URL + "/reload")."""

    @model_validator(mode="after")
    def _a_lagged_sampler_trains(self) -> TrainConfig:
        if self.policy_lag > self.max_off_policy_steps:
            raise ValueError(f"policy_lag = {self.policy_lag} samples with weights {self.policy_lag} steps old, and "
                             f"max_off_policy_steps = {self.max_off_policy_steps} drops every rollout that old: "
                             f"set max_off_policy_steps to at least {self.policy_lag}, or lag less")
        return self

    @model_validator(mode="after")
    def _one_way_to_name_servers(self) -> TrainConfig:
        if self.rollout_url and self.rollout_urls:
            raise ValueError("rollout_url and rollout_urls: name the servers in one of them")
        if self.reload_url and self.rollout_urls:
            raise ValueError("reload_url is rollout_url's: with rollout_urls, set reload_urls")
        if self.reload_urls and len(self.reload_urls) != len(self.rollout_urls):
            raise ValueError(f"reload_urls: {len(self.reload_urls)} for {len(self.rollout_urls)} rollout_urls")
        return self

    def rollout_servers(self) -> list[tuple[str, str]]:
        """Each external rollout server's base URL and reload URL ([]: the trainer starts its own)."""
        urls = self.rollout_urls or ([self.rollout_url] if self.rollout_url else [])
        reloads = self.reload_urls or ([self.reload_url] if self.reload_url else [])
        return [(u, reloads[i] if reloads else u.rstrip("/") + "/reload") for i, u in enumerate(urls)]


class EvalConfig(_Section):
    """Evaluation during training: every `every` steps the weights the rollout servers hold answer a fixed
    selection of tasks (the one `prime-agent eval TASKSET -n TASKS --seed SEED` makes), each `rollouts`
    times, as bare completions at train.temperature and train.max_tokens, scored by the task set's reward.
    Eval rows (`"kind": "eval"`, with 95% intervals over the tasks) go to metrics.jsonl, their mean reward onto
    reward.png, and the last evaluation, task by task, to results.json. The run's first step is preceded by one
    (step 0)."""

    every: int = Field(0, ge=0)
    """Steps between evaluations (0: none); the last step is always followed by one."""
    tasks: int | None = Field(None, ge=1)
    """How many tasks (eval's -n; unset: the set's own size)."""
    taskset: str | None = None
    """A task set as `prime-agent eval` names it (unset: the training environment, with env.options)."""
    seed: int = 0
    """The selection's seed (eval's --seed); the sampling seed is the same at every evaluation. On the training
    environment, a seed a training step deals with (train.seed * 1000003 + step) evaluates on that step's tasks:
    the run warns; choose one apart for held-out tasks."""
    rollouts: int = Field(1, ge=1)
    """Rollouts per task."""


class RolloutsConfig(_Section):
    ray: str | None = None
    """With env.harness: run each rollout as a task on this Ray cluster (`auto`, `HOST:PORT`,
    `ray://HOST:PORT`): its session and scoring on whichever node runs it (docs/cluster.md). The
    rollout server's URL must be one every node reaches (train.rollout_url)."""
    num_cpus: float = Field(1.0, gt=0)
    """With ray: CPUs each rollout takes on its node (Ray runs as many at once as the nodes' CPUs allow,
    at most train.threads in flight)."""


class RunConfig(_Section):
    model: PolicyConfig = Field(default_factory=PolicyConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    loss: LossConfig = Field(default_factory=IPOConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    rollouts: RolloutsConfig = Field(default_factory=RolloutsConfig)

    @field_validator("model")
    @classmethod
    def _the_model_is_there(cls, model: PolicyConfig) -> PolicyConfig:
        if model.hf:
            try:  # a name to pull or a path mistyped says so now, not after a warm start
                resolve(model.hf)
            except ModelNotFound as e:
                raise ValueError(f"hf: {e}") from None
        elif model.lora is not None:
            raise ValueError("lora: an adapter trains on a Hugging Face model (model.hf)")
        return model

    @model_validator(mode="after")
    def _the_harness_samples_one_server_plainly(self) -> RunConfig:
        t = self.train
        if self.env.harness and len(t.rollout_urls) > 1:
            raise ValueError("train.rollout_urls: rollouts through the harness (env.harness) come from one server")
        if self.rollouts.ray and not self.env.harness:
            raise ValueError("rollouts.ray: Ray runs rollouts through the harness (env.harness = true); a bare "
                             "completion is one request, which train.rollout_urls spreads")
        if self.env.harness and self.eval.every:
            raise ValueError("eval.every: evaluation during training samples bare completions, not yet rollouts "
                             "through the harness (env.harness); evaluate checkpoints with `prime-agent eval`")
        if self.env.harness and (t.skip_zero_advantage or t.difficulty is not None):
            raise ValueError("train.skip_zero_advantage and train.difficulty apply to bare completions, not yet to "
                             "rollouts through the harness (env.harness)")
        return self

    @model_validator(mode="after")
    def _whole_samples_fit_a_packed_row(self) -> RunConfig:
        if self.train.pack_length is not None and not self.model.hf and self.train.pack_length < self.model.max_seq:
            raise ValueError(f"train.pack_length ({self.train.pack_length}) must hold a whole sample: at least "
                             f"model.max_seq ({self.model.max_seq})")
        return self


def load(path: str | None, overrides: list[str]) -> RunConfig:
    """A config file plus `--section.field value` overrides (values parsed as TOML, else strings)."""
    data: dict[str, Any] = tomllib.loads(Path(path).read_text()) if path else {}
    it = iter(overrides)
    for flag in it:
        if not flag.startswith("--") or "." not in flag:
            raise ValueError(f"override {flag!r}: expected --section.field VALUE")
        try:
            merge(data, parse_override(f"{flag[2:]}={next(it)}"))
        except StopIteration:
            raise ValueError(f"override {flag!r} has no value") from None
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ValueError(f"{path or 'config'}: {describe(e)}") from None
