"""The configuration's models: one pydantic model per component, every field documented under it
(docs/configuration.md is written from these docstrings by scripts/config_docs.py). Where a
session's configuration comes from, and how the sources merge, is agent/config.py.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from agent.hooks import HooksFile
from agent.types import Budget, Usage
from harness_store.entries import SkillLimits


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    """Every section: no unknown fields, and no NaN or infinity (JSON, in which session.json and
    requests are written, has neither; a timeout of NaN would silently never fire)."""


class Price(_Section):
    """Dollars per million tokens."""

    input: float = Field(0.0, ge=0)
    """Prompt tokens neither read from the cache nor written to it."""
    cached_input: float | None = Field(None, ge=0)
    """Prompt tokens read from the provider's prompt cache; None bills them as `input`."""
    cache_write: float | None = Field(None, ge=0)
    """Prompt tokens written to the provider's prompt cache (Anthropic: 1.25 times `input` for its
    five-minute cache); None bills them as `input`."""
    output: float = Field(0.0, ge=0)
    """Completion tokens (reasoning tokens included, as providers bill them)."""

    def cost(self, usage: Usage) -> float:
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        written = min(usage.cache_write_tokens, usage.prompt_tokens - cached)
        read_rate = self.input if self.cached_input is None else self.cached_input
        write_rate = self.input if self.cache_write is None else self.cache_write
        return ((usage.prompt_tokens - cached - written) * self.input + cached * read_rate + written * write_rate
                + usage.completion_tokens * self.output) / 1e6


Provider = Literal["openai-chat", "anthropic", "openai-responses"]
PROVIDER_HOSTS: dict[str, Provider] = {"api.anthropic.com": "anthropic", "api.openai.com": "openai-responses"}
"""The services whose base URL names the API to speak."""


class ModelConfig(_Section):
    name: str | None = None
    """Model name sent to the server (PRIME_AGENT_MODEL)."""
    base_url: str | None = None
    """OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 (OPENAI_BASE_URL); None is OpenAI.
    Anything but an http(s) URL with a host is refused where it is set."""
    api_key: str | None = None
    """API key (OPENAI_API_KEY); local servers that need none get a placeholder."""
    action_format: Literal["tools", "text"] = "tools"
    """`tools`: native tool calling with one `ipython` tool. `text`: ```python fenced cells. Unless
    set, a server that says its model renders no tools (ours), or refuses a tools request with a 400
    naming tool choice (vLLM without `--enable-auto-tool-choice`, Ollama), switches the session to
    `text`, with a notice."""
    vision: bool | Literal["auto"] = "auto"
    """Show the model the images its cells display (PNG and JPEG; an SVG is named, not rasterised), as
    images in its next request (docs/models.md#vision). `auto`: what the server lists of the model's
    inputs (OpenRouter's `input_modalities`), else whether its name is of a family known to see images
    (GPT-4o, GPT-4.1, GPT-5, o3, Claude, Gemini, Qwen-VL, Llama 4, Pixtral, ...), else off (it stays
    `auto`). Off, the
    model reads a line naming each image."""
    max_images: int = Field(4, ge=1)
    """With `vision`: the most images one request carries (the latest); each older one is sent as a
    line naming it, so that a session of plots cannot outgrow the context."""
    image_max_edge: int = Field(1024, ge=32)
    """With `vision`: pixels of an image's longer side, at most; a larger one is downscaled (its aspect
    kept) before it is sent."""
    base_prompt: Literal["full", "short"] = "full"
    """The base prompt: `full` (agent/prompts/base.md: every kernel helper, subagents, the harness;
    ~1,000 tokens) or `short` (agent/prompts/short.md: cells and `final()` alone; ~100 tokens), for a
    small model whose context or attention the full one overwhelms. Unless set, `short` is used
    (with a notice) where the system prompt with the full one would take more than an eighth of
    `context_window`."""
    stream: bool = True
    """Stream completions so the user sees text as it is written."""
    temperature: float | None = None
    """Sampling temperature; None: the model's own default where its server advertises one (ours:
    its `generation_config.json`), else the server's."""
    max_completion_tokens: int | None = Field(None, ge=1)
    """Cap on tokens per completion. Unless set, fitted to a context window the server states (or
    `context_window`, where set): a fifth of it, the room the compaction threshold leaves above the
    context, at most 32,768 (SmolLM2's 8,192-token window: 1,638). Where the window is not known
    (OpenAI's API, Ollama) nothing is sent, and the server's own limit applies."""
    repetition_limit: int = Field(500, ge=0)
    """Characters of a completion that may be one piece of text repeated back to back (5 times or
    more) before the completion is stopped there and the turn ends (`budget_exhausted`: a model
    caught in a loop, as small ones fall into at low temperature); twice as many for copies that
    differ only in their numbers, a letter in each (a loop counting up: `Line 12`, `Line 13`, ...;
    rows of numbers alone are data); 0: never stopped for it."""
    timeout: float = 300.0
    """Seconds to wait for one model call (per attempt) before it counts as timed out."""
    max_retries: int = 4
    """Retries after a 429, 5xx, timeout or dropped stream, with exponential backoff and jitter."""
    retry_base_delay: float = 0.5
    """First backoff delay in seconds; doubles each retry."""
    retry_max_delay: float = 20.0
    """Cap on one backoff delay in seconds."""
    record_logprobs: bool = False
    """Request token logprobs (and token ids where offered) and keep them on assistant messages."""
    context_window: int = Field(128_000, ge=1)
    """Tokens the model accepts; compaction starts below this. Unless set, read from the server at
    session start (`GET /v1/models`: `max_model_len` from vLLM and ours, `context_length` from
    OpenRouter; llama.cpp's `/props`: `n_ctx`); this where it says nothing."""
    prices: dict[str, Price] = Field(default_factory=dict)
    """Dollars per million tokens for each model name, for cost accounting, e.g.
    `[model.prices."gpt-4.1"] input = 2.0, cached_input = 0.5, output = 8.0`. A server that states
    the cost itself (OpenRouter's `usage.cost`) is believed instead; a model with no entry costs 0."""
    fallback: list[str] = Field(default_factory=list)
    """Model names to switch to, in order, on the same server, when the one in use keeps failing
    (`fallback_after` failed attempts in a row); the switch is said in a `model.fallback` event."""
    fallback_after: int = Field(3, ge=1)
    """Failed attempts in a row (errors, timeouts, rate limits, quota) before the next `fallback` model."""
    max_wait: float = Field(900.0, ge=0)
    """Seconds in all one model call may spend waiting on rate limits and quota (`Retry-After`,
    `x-ratelimit-reset-*`, quota backoff) before it fails, or falls back."""
    quota_retry_delay: float = Field(30.0, gt=0)
    """First wait after a quota error (`insufficient_quota`, a usage or credit limit); doubles each
    time, within `max_wait`. Quota waits do not count against `max_retries`."""
    send_reasoning: bool = False
    """Send each assistant message's reasoning back as `reasoning_content`: for providers that require
    it (DeepSeek's thinking mode with tool calls). Otherwise reasoning stays out of every request."""
    provider: Provider | None = None
    """The API spoken: `openai-chat` (Chat Completions: OpenAI and every OpenAI-compatible server),
    `anthropic` (Anthropic's Messages API; key from ANTHROPIC_API_KEY) or `openai-responses`
    (OpenAI's Responses API). Unset, the base URL's host says: api.anthropic.com is `anthropic`,
    api.openai.com `openai-responses`, any other (or none) `openai-chat` (docs/models.md#providers)."""
    thinking_budget: int | None = Field(None, ge=1024)
    """`anthropic`: tokens of extended thinking a reply may spend (`thinking.budget_tokens`, at least
    1,024); None: no extended thinking."""
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    """`openai-responses`: the reasoning models' `reasoning.effort`; None: the model's default."""
    reasoning_summary: Literal["auto", "concise", "detailed"] | None = None
    """`openai-responses`: ask for summaries of the model's reasoning (`reasoning.summary`), shown and
    recorded as its reasoning; None: none asked (OpenAI serves them only to verified organizations,
    and refuses the request of any other)."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Extra JSON fields for every request (server-specific sampling options); a model's advertised
    sampling defaults other than `temperature` (`top_p`, ...) go here unless set here."""

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 (a port that is not a number raises here)
        except ValueError as e:
            raise ValueError(f"{url!r} is not a URL ({e}); e.g. http://localhost:8000/v1") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
            raise ValueError(f"{url!r} is not an http(s) URL of a server, e.g. http://localhost:8000/v1")
        return url

    def user_set(self, name: str) -> bool:
        """Whether `name` was set by the user (a config file, the environment, a flag, a request), not
        left at its default: what the user set always wins over what a server says (agent.model.fitted)."""
        return name in self.model_fields_set

    def with_defaults(self, **values: Any) -> ModelConfig:
        """A copy with `values` in place of defaults (what a server says of its model): the fields the
        user set are still the only ones counted as set."""
        return type(self).model_construct(_fields_set=set(self.model_fields_set), **{**dict(self), **values})

    @property
    def api(self) -> Provider:
        """The provider in force: the one set, else the one the base URL's host names."""
        return self.provider or detect_provider(self.base_url)

    @property
    def configured(self) -> bool:
        """A model name, and somewhere to send it (an endpoint, or OpenAI with a key)."""
        return bool(self.name and (self.base_url or self.api_key))


def detect_provider(base_url: str | None) -> Provider:
    """The provider a base URL's host names (`PROVIDER_HOSTS`), else `openai-chat`."""
    try:
        host = urlsplit(base_url).hostname if base_url else None
    except ValueError:  # not a URL: the client says so when it is used
        host = None
    return PROVIDER_HOSTS.get(host or "", "openai-chat")


class KernelConfig(_Section):
    cell_timeout: float = 600.0
    """Default seconds a cell may run before it is interrupted; the model may ask for another."""
    interrupt_grace: float = 3.0
    """Seconds an interrupted cell gets to stop before the kernel is restarted."""
    output_limit: int = 64 * 1024
    """Characters kept per output stream of a cell (head and tail); the middle is cut."""
    output_spill: int = Field(4 * 1024 * 1024, ge=0)
    """Characters per output stream a cell sends to the host; the rest goes to a file in the
    kernel's temp folder, named in a note at the cell's end with the output's tail (0: all of it
    is sent; the host's memory is then not bounded by what a cell prints)."""
    startup_timeout: float = 60.0
    """Seconds to wait for a new kernel to become ready."""
    shutdown_wait: float = 2.0
    """Seconds a kernel asked to shut down gets before it is killed: for the first half it may exit
    on its own (running its atexit handlers), then it is sent SIGTERM, at the end SIGKILL."""


class CompactionConfig(_Section):
    enabled: bool = True
    """Summarise older turns when the context nears the model's window."""
    threshold: float = 0.8
    """Compact when the context exceeds this fraction of `model.context_window`."""
    keep_recent_turns: int = 2
    """Turns kept verbatim after a compaction (the current turn is always kept)."""


class SubagentsConfig(_Section):
    max_depth: int = 2
    """How deep `rlm` may nest: a child at this depth cannot spawn."""
    max_concurrent: int = 8
    """Children of one session running at once; more wait their turn."""
    max_concurrent_process: int = 8
    """Children of one depth running at once across the sessions of the process."""
    max_children: int = 64
    """Children queued or running per session; past this `rlm` refuses."""
    max_context_bytes: int = Field(1 << 30, ge=1)
    """Largest `rlm(context=...)`, pickled: the host copies it to the child (never holding it whole
    in memory); past this `rlm` refuses."""


class RefineConfig(_Section):
    mode: Literal["auto", "review", "dry-run"] = "auto"
    """auto: apply at the next turn boundary; review: wait for approval; dry-run: show, apply nothing."""
    auto_every: int = 25
    """Consider a refinement every N completed turns (behind a cheap review call); 0 switches auto-refine off."""
    after_compaction: bool = True
    """Also consider one after each compaction (when auto-refine is on)."""
    cooldown_turns: int = 5
    """Turns between two automatic refinements."""
    window_chars: int = 24_000
    """How much of the recent transcript the planner reads."""
    default_scope: Literal["session", "project", "user"] = "project"
    """Where an edit lands when the proposal names no scope."""
    json_mode: bool = True
    """Ask the server for a JSON object (response_format) when planning without the reply's schema."""
    structured: Literal["auto"] | bool = "auto"
    """Send the proposal's JSON schema when planning (response_format json_schema), so the server holds the
    reply to it: auto where the server says it can (`structured_outputs` in its /v1/models: `rl serve`
    does), true always, false never."""
    gate_taskset: str | None = None
    """A task set (a built-in name, a .jsonl file, a .py module, `rg:DATASET` or `vf:TASKSET_ID`); when
    set, a refinement that lowers its pass count is refused (run with and without the change, by evals.gate)."""
    gate_n: int | None = None
    """How many of its tasks the gate runs (the same selection as `prime-agent eval -n N --seed S`)."""
    gate_seed: int = 0
    """Seed of the gate's task selection (as `prime-agent eval --seed S`)."""


class HarnessConfig(_Section):
    max_skill_file_bytes: int = Field(SkillLimits.max_file_bytes, ge=1)
    """Largest file a skill may hold (a font, a PDF, an archive); an import refuses a skill with a bigger one."""
    max_skill_bytes: int = Field(SkillLimits.max_skill_bytes, ge=1)
    """Largest skill: all its files together, SKILL.md included."""

    def limits(self) -> SkillLimits:
        return SkillLimits(self.max_skill_file_bytes, self.max_skill_bytes)


class DaemonConfig(_Section):
    pool_size: int = Field(2, ge=0)
    """Kernels the daemon keeps started ahead of time, so creating a session does not wait for one."""
    max_sessions: int = Field(64, ge=1)
    """Sessions with a live kernel at once. Past it, the idle session unused longest (no turn, no
    queue, nobody following its events) is put to sleep to make room; with none, 429."""
    idle_timeout: float = Field(1800.0, gt=0)
    """Seconds an idle session nobody follows keeps its kernel; then it sleeps (dormant: files
    kept, a new kernel on its next prompt, the model told its variables are gone)."""
    max_running_turns: int = Field(8, ge=1)
    """Turns running at once across all sessions; more wait their turn in order."""
    max_goals: int = Field(8, ge=1)
    """Goals running at once across all sessions; one more is refused (429), and goals a restart
    resumes past it wait their turn, oldest first."""
    schedules: bool = True
    """False: every schedule is paused when the daemon starts, before anything fires (as with
    `daemon start --no-schedules`); `prime-agent schedule resume` turns one back on."""
    max_fires_per_minute: int = Field(60, ge=1)
    """Schedule fires across the daemon in any minute; one over waits for room (never a burst)."""
    client_buffer: int = Field(10_000, ge=16)
    """Events held for one event-stream client; a client this far behind is dropped (it reconnects
    with Last-Event-ID and replays from the journal, losing nothing)."""
    max_body_bytes: int = Field(1 << 20, ge=1024)
    """Largest request body accepted (413 past it)."""
    drain_timeout: float = 10.0
    """Seconds a stopping daemon waits for interrupted turns to end and be recorded."""


class McpServerConfig(_Section):
    """One MCP server: a command to run (stdio) or a URL (streamable HTTP, or the older SSE).
    `${VAR}` and `${VAR:-default}` in `command`, `args`, `env`, `url` and `headers` are expanded
    from the host's environment when the server starts, never earlier (nothing expanded is
    written to a session's records). Every server comes from trusted config (the user's, a
    project file a person trusted, a flag or a request): an untrusted .mcp.json is never read."""

    type: Literal["stdio", "http", "sse"] | None = None
    """The transport; None: `stdio` with a `command`, `http` with a `url`."""
    command: str | None = None
    """The executable of a stdio server (looked up on PATH)."""
    args: list[str] = Field(default_factory=list)
    """Arguments of a stdio server's command."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of a stdio server, over a minimal inherited one (HOME, PATH, SHELL, TERM, USER,
    LOGNAME): the host's other variables (its API keys) do not reach the server. Never reaches the kernel."""
    cwd: str | None = None
    """Working directory of a stdio server, relative to the session's; None: a neutral folder
    outside the project (agent/hostrun.py), its relative paths read against the session's."""
    url: str | None = None
    """The endpoint of an HTTP server, e.g. http://localhost:3001/mcp."""
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP headers sent with every request (an Authorization token). Never reaches the kernel."""
    policy: Literal["allow", "ask", "deny"] = "allow"
    """allow: calls run; ask: each call waits for the user's approval (as a command the sandbox
    refused does: `sandbox.approval`; without anyone to ask, it is denied); deny: calls are refused."""
    timeout: float = Field(60.0, gt=0)
    """Seconds one call (or resource read) may take before it fails with McpError."""
    startup_timeout: float = Field(30.0, gt=0)
    """Seconds a server gets to start and list its tools."""

    @model_validator(mode="after")
    def _transport(self) -> McpServerConfig:
        if self.type is None:
            self.type = "http" if self.url and not self.command else "stdio"
        if self.type == "stdio" and not self.command:
            raise ValueError("a stdio server needs a `command` (or give a `url` for an HTTP server)")
        if self.type in ("http", "sse") and not self.url:
            raise ValueError(f"an {self.type} server needs a `url`")
        if self.type != "stdio" and self.command:
            raise ValueError(f"an {self.type} server has a `url`, not a `command`")
        return self


class McpConfig(_Section):
    servers: dict[str, McpServerConfig] = Field(default_factory=dict)
    """MCP servers by name (`[mcp.servers.NAME]`, and the project's .mcp.json `mcpServers`)."""
    prompt_chars: int = Field(3000, ge=0)
    """Size of the system prompt's list of servers and tools (names and one-line descriptions);
    past it a server's remaining tools are counted, and `mcp.list()` shows them all."""


class CheckpointConfig(_Section):
    """A checkpoint at every turn boundary, for `rewind` (agent/checkpoints/)."""

    enabled: bool = True
    """Checkpoint the workspace, conversation, harness and kernel at every turn boundary."""
    max_file_bytes: int = Field(5 << 20, ge=0)
    """Largest workspace file a checkpoint copies; bigger ones are skipped (and listed as skipped)."""
    max_binary_bytes: int = Field(1 << 20, ge=0)
    """Largest binary file (a NUL in its first 8 KiB) a checkpoint copies: build outputs stay out."""
    max_checkpoint_bytes: int = Field(200 << 20, ge=0)
    """Most bytes of changed files one checkpoint copies; past it the rest are skipped."""
    diffs: bool = True
    """Snapshot the workspace after every cell too, to show the files each cell changed (a diff under
    it) and each turn (a summary at its end): a scan of the workspace's metadata per cell, and what
    changed hashed (bench/diffs.py)."""
    kernel: bool = True
    """Snapshot the kernel's user namespace when a turn ends (cloudpickle, in a forked child)."""
    max_variable_bytes: int = Field(64 << 20, ge=0)
    """Largest variable a namespace snapshot keeps (pickled size); bigger ones are listed, not kept."""
    max_namespace_bytes: int = Field(256 << 20, ge=0)
    """Most bytes one namespace snapshot keeps."""


SandboxMode = Literal["read-only", "workspace-write", "full-access"]
SECRET_STORES = [
    # keys and cloud credentials
    "~/.ssh/", "~/.gnupg/", "~/.password-store/", "~/.local/share/keyrings/", "~/.aws/", "~/.azure/",
    "~/.config/gcloud/", "~/.oci/", "~/.kube/", "~/.docker/config.json", "~/.terraform.d/credentials.tfrc.json",
    "~/.ray/",  # Ray's auth_token: with it a process runs code on every node of the cluster, unconfined
    "~/.vault-token", "~/.config/op/", "~/.config/sops/", "~/.config/rclone/", "~/.s3cfg", "~/.boto",
    "~/.databrickscfg", "~/.kaggle/", "~/.modal.toml", "~/.prime/",
    # code hosts and package registries
    "~/.netrc", "~/.git-credentials", "~/.config/git/credentials", "~/.config/gh/", "~/.config/hub",
    "~/.config/github-copilot/", "~/.pypirc", "~/.npmrc", "~/.yarnrc", "~/.yarnrc.yml", "~/.cargo/credentials",
    "~/.cargo/credentials.toml", "~/.gem/credentials", "~/.m2/settings.xml", "~/.gradle/gradle.properties",
    # model providers and other agents
    "~/.cache/huggingface/token", "~/.huggingface/", "~/.claude/", "~/.claude.json", "~/.codex/",
    "~/.config/anthropic/", "~/.config/openai/",
    # databases
    "~/.pgpass", "~/.my.cnf",
    # shell and REPL histories (commands typed with secrets in them)
    "~/.bash_history", "~/.zsh_history", "~/.local/share/fish/", "~/.python_history", "~/.node_repl_history",
    "~/.psql_history", "~/.mysql_history", "~/.sqlite_history", "~/.ipython/",
    # browsers (cookies, saved passwords)
    "~/.mozilla/", "~/.config/google-chrome/", "~/.config/chromium/", "~/.config/BraveSoftware/",
]
"""The secret stores every kernel is denied by default (docs/sandbox.md lists them). A trailing `/`: a
directory (what an absent store inside the workspace is covered by, sandbox.hidden)."""
SECRET_NAMES = ["*KEY*", "*SECRET*", "*TOKEN*", "*PASS*", "*PWD*", "*CREDENTIAL*", "*AUTH*", "*DSN*", "*JWT*",
                "*COOKIE*", "*SESSION*", "PAT", "PAT_*", "*_PAT", "*_PAT_*"]
"""`PAT` (a personal access token) as a word of the name only, so that PATH, PYTHONPATH and the
like pass. `*PWD*` drops the host's PWD too, which names the host's directory, not the kernel's."""


class SandboxConfig(_Section):
    """How the OS confines every kernel and what it starts (agent/kernel/sandbox.py; docs/sandbox.md)."""

    mode: SandboxMode = "workspace-write"
    """`workspace-write`: the workspace and a private /tmp writable, harness scopes, the session's
    records and `.git/` read-only; `read-only`: only /tmp writable; `full-access`: no sandbox."""
    network: bool = True
    """False: the kernel reaches nothing over the network (its host bridge and kernel channels are
    Unix sockets and keep working)."""
    required: bool = False
    """Refuse to start a session where the OS cannot sandbox it, instead of saying so and going on."""
    hidden: list[str] = Field(default_factory=lambda: list(SECRET_STORES))
    """Secret stores the kernel cannot read (`~` is the user's home). One absent when the kernel starts
    but inside the workspace is covered by an empty placeholder (a directory where the entry ends in
    `/`, else a file) the kernel cannot replace, removed when the session ends. Whatever this says,
    $PRIME_AGENT_HOME is hidden but for the session's own records and the harness scopes, and so
    are every other prime-agent home and kernel directory of this user."""
    env_deny: list[str] = Field(default_factory=lambda: list(SECRET_NAMES))
    """Environment variables kept out of the kernel: names or shell patterns, case-insensitive. A
    value holding a URL with a password (`scheme://user:pass@host`) is kept out whatever its name."""
    env_allow: list[str] = Field(default_factory=list)
    """Names (or patterns) passed to the kernel although `env_deny` (or a URL with a password) would drop them."""
    plan: bool = False
    """Plan mode: the session starts with its workspace read-only (mode workspace-write, frozen), the
    model investigates and proposes a plan (`propose_plan(text)`), and once a person approves it the
    same kernel, its variables kept, continues in workspace-write with the plan as its instruction."""
    seccomp: bool = True
    """A seccomp filter in the sandbox refuses the system calls a kernel never needs (ptrace, keyctl,
    bpf, mount, new user namespaces, perf events, kernel modules, reboot...: agent/kernel/sandbox.py);
    False leaves only the namespaces, dropped capabilities and no_new_privs."""
    memory_mb: int | None = Field(None, ge=64)
    """Memory a kernel and everything it starts may use; None: half of the machine's RAM."""
    max_processes: int = Field(512, ge=16)
    """Processes and threads at once in a kernel's sandbox."""
    max_open_files: int = Field(4096, ge=64)
    """Open files per process in the sandbox."""
    approval: Literal["on-request", "never"] = "on-request"
    """`await request_permission(command, reason)` from the kernel, and a call of an MCP server under
    policy `ask`: `on-request` asks the user (an event and a card in the app; at the terminal for
    `prime-agent run`), `never` denies, and the model is told."""
    approval_timeout: float = Field(900.0, gt=0)
    """Seconds a request waits for a decision before it counts as denied."""


class Config(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    kernel: KernelConfig = Field(default_factory=KernelConfig)
    budget: Budget = Field(default_factory=Budget)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    subagents: SubagentsConfig = Field(default_factory=SubagentsConfig)
    refine: RefineConfig = Field(default_factory=RefineConfig)
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    daemon: DaemonConfig = Field(default_factory=DaemonConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)
    checkpoints: CheckpointConfig = Field(default_factory=CheckpointConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    project_instructions: list[str] = Field(default_factory=lambda: ["AGENTS.md", "CLAUDE.md"])
    """Files in the project root whose text follows the base prompt, each once a person trusted it
    (`prime-agent trust`); never read through a link."""

    _ignored: list[str] = PrivateAttr(default_factory=list)

    @property
    def ignored(self) -> list[str]:
        """What `load_config` left out of the project, a line each: files nobody trusted (as they are
        now), and settings a project file may not make. Named at the session's start."""
        return self._ignored

    _pinned: list[tuple[str, str, str]] = PrivateAttr(default_factory=list)

    @property
    def pinned(self) -> list[tuple[str, str, str]]:
        """The project files the configured MCP servers and hooks run (agent/hostrun.py), each as
        (path under the project root, what runs it, "mcp" or "hook"): trusted with their config."""
        return self._pinned

    _hooks: list[tuple[str, HooksFile]] = PrivateAttr(default_factory=list)

    @property
    def hooks(self) -> list[tuple[str, HooksFile]]:
        """The hooks in force (agent/hooks.py), with where each file came from: the user's
        `$PRIME_AGENT_HOME/hooks.json`, and the project's `.prime-agent/hooks.json` once trusted."""
        return self._hooks
