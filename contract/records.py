"""Typed, frozen, schema-versioned records shared by the agent and the controller.

Defined once here; the controller imports them. Everything that crosses the broker or is
stored (JSON lines on the module, SQLite on the controller) is one of these models,
serialised with ``model_dump(mode="json")`` and read back with ``model_validate``.
"""

from __future__ import annotations

import enum
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contract.energy import EnergyWindow
from contract.fingerprint import EnvFingerprint
from contract.kernel_store import KernelCacheUse
from contract.version import SCHEMA_VERSION as SCHEMA_VERSION  # re-exported: agent/validate.py

SPEC_ARGS = (
    "--speculative-algorithm NEXTN --speculative-num-steps 3 "
    "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
)

TableKind = Literal["sweep", "mtp", "vision"]
PrecompileSource = Literal["compiled", "cached", "fetched"]  # a run's kernels: compiled, an earlier run's, a fleet's
RowSource = Literal["release", "probe"]

# A run id: it names folders on every module and keys on the broker, so it is strict
# (use ``fullmatch``: no trailing newline, no '/', no ':', no leading '.' or '-').
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
RUN_ID_RULE = "1-128 letters, digits, '.', '_' or '-' (not starting with those)"


def is_run_id(value: object) -> bool:
    return isinstance(value, str) and RUN_ID_PATTERN.fullmatch(value) is not None


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Record(BaseModel):
    """A record the other side only reads (progress, rows, heartbeats, telemetry): a field its reader does not know
    is ignored, so an agent one contract version ahead of its controller is read (ADR 0051). A request stays
    :class:`Frozen`: what an agent is asked to run is checked field by field."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)


class ModelKeySpec(Frozen):
    """One model setup of the release, as the seed's reproduction steps run it."""

    key: str
    start_script: str
    model_dir: str  # default folder name under the module's model root
    env: dict[str, str] = Field(default_factory=dict)
    tables: tuple[TableKind, ...] = ("sweep",)


MODEL_KEYS: dict[str, ModelKeySpec] = {
    s.key: s
    for s in (
        ModelKeySpec(key="qwen3", start_script="start_qwen3_server.sh", model_dir="Qwen3-30B-A3B-GPTQ-Int4"),
        ModelKeySpec(key="qwen35", start_script="start_qwen35_server.sh", model_dir="Qwen3.5-35B-A3B-GPTQ-Int4"),
        ModelKeySpec(
            key="qwen35_mtp",
            start_script="start_qwen35_server.sh",
            model_dir="Qwen3.5-35B-A3B-GPTQ-Int4",
            env={"SGLANG_USE_TL_MOE_GROUPED_GEMM": "0", "QWEN35_EXTRA_SERVER_ARGS": SPEC_ARGS},
            tables=("mtp",),
        ),
        ModelKeySpec(key="qwen35_fq", start_script="start_qwen35_fq_server.sh", model_dir="Qwen3.5_FQ-35B-A3B"),
        ModelKeySpec(
            key="qwen35_fq_mtp",
            start_script="start_qwen35_fq_server.sh",
            model_dir="Qwen3.5_FQ-35B-A3B",
            env={"SGLANG_USE_TL_MOE_GROUPED_GEMM": "0", "QWEN35_FQ_EXTRA_SERVER_ARGS": SPEC_ARGS},
            tables=("mtp",),
        ),
        ModelKeySpec(key="qwen36_fq", start_script="start_qwen36_fq_server.sh", model_dir="Qwen3.6_FQ-35B-A3B"),
        ModelKeySpec(
            key="qwen3vl",
            start_script="start_qwen3vl_server.sh",
            model_dir="Qwen3-VL-8B",
            tables=("sweep", "vision"),
        ),
    )
}


RELEASE_TARBALL = re.compile(r"^SGLang-MUSA-M1000-M1000_(?P<version>[0-9][0-9A-Za-z.+-]*)_sglang\.tar\.gz$")


def release_version_of(filename: str) -> str | None:
    """'SGLang-MUSA-M1000-M1000_1.4.1_sglang.tar.gz' -> '1.4.1' (None for another name)."""
    m = RELEASE_TARBALL.match(filename)
    return m.group("version") if m else None


class UnknownModelKey(KeyError, ValueError):
    def __str__(self) -> str:  # KeyError quotes its message; say it plainly
        return str(self.args[0])


def parse_model_keys(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """'qwen3,qwen35_mtp' or 'all' -> validated keys in the given order, no duplicates."""
    items = text.split(",") if isinstance(text, str) else list(text)
    keys: list[str] = []
    for raw in items:
        k = raw.strip()
        if not k:
            continue
        if k == "all":
            keys.extend(x for x in MODEL_KEYS if x not in keys)
            continue
        if k not in MODEL_KEYS:
            raise UnknownModelKey(f"unknown model key {k!r} (known: {', '.join(MODEL_KEYS)})")
        if k not in keys:
            keys.append(k)
    if not keys:
        raise UnknownModelKey("no model key given")
    return tuple(keys)


class ResultRow(Record):
    """One row of a result table: (run, module, model key, profile).

    Columns follow the seed's tables. ``profile`` is unique within a model key:
    ``prefill_len:input_len`` for the sweep tables, ``gsm8k:<prompt index>`` for MTP
    rows, ``vision:<prefill_len>:<input_len>`` for the VL vision table. ``source`` says who
    measured it: the release's benchmark or the agent's own probe (``agent.probe``), so a
    probe row sits beside the release's row of the same profile.
    """

    schema_version: int = SCHEMA_VERSION
    run_id: str = ""
    module: str = ""
    release: str = ""
    model_key: str = ""
    table: TableKind
    profile: str
    model: str
    size: str | None = None
    prefill_len: int | None = None
    ctx_k: float | None = None
    batch: int | None = None
    nchip: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    prefill_tps: float | None = None
    ttft_ms: float | None = None
    decode_tps: float | None = None
    tpot_ms: float | None = None
    prefix_tokens: int | None = None
    measured_output: int | None = None
    # MTP (GSM8K) rows
    prompt_index: int | None = None
    accept_rate: float | None = None  # (acclen-1)/(4-1)
    accept_rate_len: float | None = None  # acclen/4
    prediction: str | None = None
    ground_truth: str | None = None
    correct: bool | None = None
    # VL vision rows
    vision_fps: float | None = None
    precision: str | None = None
    # unknown extra columns, kept verbatim
    extra: dict[str, str] = Field(default_factory=dict)
    # relation checks that failed on parse (e.g. "ttft_vs_prefill")
    flags: tuple[str, ...] = ()
    source: RowSource = "release"
    # digest of the environment it was measured in (contract.fingerprint; the record: RunProgress.fingerprint)
    env_digest: str | None = None
    # TileLang kernels compiled while the key's benchmark measured (agent.jit_watch; release rows only): how many
    # kernel libraries appeared in the release's cache, their cache-relative paths ("; "-joined), and when the first
    # appeared (seconds into the benchmark step). Not 0: the row's figures may include compile time
    jit_kernels: int = 0
    jit_kernel_names: str = ""
    jit_first_s: float | None = None
    # Energy over the key's benchmark window (agent.telemetry.energy; release rows only; None: not measured, or
    # dropped, ``energy.note`` says why). Every release row of one key shares the window: the release's benchmark
    # runs all its profiles in one process, so the figures are the key's, repeated on each of its rows.
    energy_j: float | None = None
    """Joules over the window."""
    j_per_token: float | None = None
    """``energy_j`` / the output tokens of the key's rows."""
    tokens_per_j: float | None = None
    """1 / ``j_per_token``."""
    avg_power_w: float | None = None
    """``energy_j`` / the window's length."""
    idle_power_w: float | None = None
    """The module's idle power, measured before the key."""
    energy_above_idle_j: float | None = None
    """``energy_j`` - ``idle_power_w`` x the window's length."""
    energy: EnergyWindow | None = None
    """How the figures were reached, or why they were dropped."""
    # start-up costs, wall s (release rows; agent.startup says what each is, and why a precompile has two columns)
    server_ready_s: float | None = None
    warmup_s: float | None = None
    precompile_s: float | None = None
    precompile_fetch_s: float | None = None
    precompile_source: PrecompileSource | None = None

    @property
    def identity(self) -> tuple[str, str, str, str, str]:
        return (self.run_id, self.module, self.model_key, self.profile, self.source)


# Metric columns: name -> True when higher is better.
METRICS: dict[str, bool] = {
    "prefill_tps": True,
    "ttft_ms": False,
    "decode_tps": True,
    "tpot_ms": False,
    "accept_rate": True,
    "accept_rate_len": True,
    "vision_fps": True,
    "j_per_token": False,
    "tokens_per_j": True,
    **{m: False for m in ("server_ready_s", "warmup_s", "precompile_s", "precompile_fetch_s")},
}
# the energy metrics among them (judged with their own tolerance; never make a module a speed outlier)
ENERGY_METRICS: tuple[str, ...] = ("j_per_token", "tokens_per_j")
# start-up costs (own tolerance, ADR 0029); with energy one figure per (module, key): tested over modules (WINDOW)
STARTUP_METRICS: tuple[str, ...] = ("server_ready_s", "warmup_s", "precompile_s", "precompile_fetch_s")
WINDOW_METRICS: tuple[str, ...] = ENERGY_METRICS + STARTUP_METRICS


class RunState(str, enum.Enum):
    """States of one run on one module (explicit state machine, see agent.state)."""

    PENDING = "pending"
    FETCHING = "fetching"
    UNPACKING = "unpacking"
    CONFIGURING = "configuring"
    GENERATING = "generating"
    ENVIRONMENT = "environment"
    PRECOMPILING = "precompiling"
    BENCHMARKING = "benchmarking"
    PUBLISHING = "publishing"
    # finished; individual keys may still have failed (see outcomes)
    DONE = "done"
    # a release-wide step failed, or the request was refused; no key could run
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Not terminal: the agent stopped the run cleanly (SIGTERM) or found it dead after a restart,
    # and re-queued it; it resumes from its passed keys when the module takes it again.
    INTERRUPTED = "interrupted"
    # Terminal, set by the controller only: no heartbeat for ``lost_after``, or the module's
    # deadline passed. A late terminal state from the agent still replaces it (see controller.fleet).
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        return self in (RunState.DONE, RunState.FAILED, RunState.CANCELLED, RunState.LOST)


class StepError(Record):
    """What failed: the step, the model key (if any), exit code and the tail of stderr."""

    step: str
    model_key: str | None = None
    exit_code: int | None = None
    message: str
    stderr_tail: str = ""

    def one_line(self) -> str:
        where = f"{self.step}[{self.model_key}]" if self.model_key else self.step
        code = f" (exit {self.exit_code})" if self.exit_code is not None else ""
        return f"{where}{code}: {self.message}"


KeyStatus = Literal["pending", "running", "passed", "failed", "cancelled", "skipped"]


class KeyOutcome(Record):
    model_key: str
    status: KeyStatus
    rows: int = 0
    flagged_rows: int = 0
    duration_s: float = 0.0
    error: StepError | None = None


class RunRequest(Frozen):
    """What the controller asks one module to do (the Celery task's only argument)."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    module: str
    # path on the module (or in a shared folder) of the release tarball
    tarball: str
    sha256: str
    release: str = ""
    models: tuple[str, ...]
    model_root: str
    # per-key overrides of the model folders; extra environment variables per key
    model_paths: dict[str, str] = Field(default_factory=dict)
    key_env: dict[str, dict[str, str]] = Field(default_factory=dict)
    max_attempts: int = 2

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, v: str) -> str:
        if not is_run_id(v):
            raise ValueError(f"run id {v!r}: use {RUN_ID_RULE}")
        return v


class RunProgress(Record):
    """Live state of one run on one module, published while it runs and at the end."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    module: str
    release: str = ""
    state: RunState = RunState.PENDING
    step: str = ""
    model_key: str | None = None
    keys_total: int = 0
    keys_done: int = 0
    progress: float = 0.0  # 0..1
    started_at: float | None = None
    updated_at: float = 0.0
    finished_at: float | None = None
    precompile_cached: bool | None = None
    precompile_source: PrecompileSource | None = None
    precompile_s: float | None = None
    # the fleet's kernel cache: fetched, or compiled (and published)
    kernel_cache: KernelCacheUse | None = None
    rows: int = 0
    attempt: int = 1
    error: StepError | None = None
    outcomes: tuple[KeyOutcome, ...] = ()
    # device telemetry of the run, set when it ends; contract.kv publishes it under a key of its own
    telemetry: TelemetrySummary | None = None
    # the environment the run measured in (driver, firmware, MUSA, torch_musa, ...), once the release is set up
    fingerprint: EnvFingerprint | None = None
    # the seal of a final state (contract.digest.seal): every row the module keeps for the run (the release's
    # and the probe's), their digest, and the digest of the telemetry summary published with it (None: none);
    # the controller holds a module's part complete only when its history matches them
    stored_rows: int | None = None
    rows_digest: str | None = None
    telemetry_digest: str | None = None


class Heartbeat(Record):
    schema_version: int = SCHEMA_VERSION
    module: str
    agent_version: str
    ts: float
    run_id: str | None = None
    step: str | None = None
    free_disk_bytes: int | None = None
    healthy: bool = True
    detail: str = ""


# -- device telemetry (agent.telemetry) ---------------------------------------------------------
class DeviceSample(Record):
    """One reading of one accelerator by the vendor's tool, tagged with what the run was doing.

    Values keep the tool's units; a field the tool did not answer is None. One per line in
    ``runs/<id>/telemetry.jsonl``.
    """

    schema_version: int = SCHEMA_VERSION
    ts: float
    gpu: int
    run_id: str = ""
    module: str = ""
    attempt: int = 1
    step: str = ""
    model_key: str | None = None
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    graphics_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    utilization_pct: float | None = None
    memory_utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    # NVML clocks event reasons bitmask (contract.vocab.REASONS)
    clock_event_reasons: int | None = None
    ecc_uncorrected: int | None = None  # volatile uncorrected ECC errors
    # the device's cumulative energy counter (NVML total energy), mJ
    energy_mj: float | None = None


class FieldStats(Record):
    n: int
    min: float
    mean: float
    max: float
    p95: float


class KeyTelemetry(Record):
    """One device during one model key (``model_key`` "": the release-wide steps before the keys)."""

    model_key: str
    gpu: int
    samples: int
    first_ts: float
    last_ts: float
    fields: dict[str, FieldStats] = Field(default_factory=dict)  # DeviceSample field -> stats
    reasons: dict[str, float] = Field(default_factory=dict)  # clock-event reason -> share of samples active


class DeviceInfo(Record):
    gpu: int
    name: str = ""
    uuid: str = ""


class TelemetrySummary(Record):
    """Per model key and device: min / mean / max / p95 of every sampled field, and what went wrong."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    module: str
    tool: str = ""  # the tool's name ("" when none could be run)
    period_s: float = 1.0
    samples: int = 0
    devices: tuple[DeviceInfo, ...] = ()
    keys: tuple[KeyTelemetry, ...] = ()
    # once each: tool missing, hanging, failing, fields it lacks
    notes: tuple[str, ...] = ()

    def for_key(self, model_key: str) -> tuple[KeyTelemetry, ...]:
        return tuple(k for k in self.keys if k.model_key == model_key)


RunProgress.model_rebuild()
