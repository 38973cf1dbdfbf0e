"""Typed, frozen, schema-versioned records shared by the agent and the controller.

Defined once here; the controller imports them. Everything that crosses the broker or is
stored (JSON lines on the module, SQLite on the controller) is one of these models,
serialised with ``model_dump(mode="json")`` and read back with ``model_validate``.
"""

from __future__ import annotations

import enum
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

SPEC_ARGS = (
    "--speculative-algorithm NEXTN --speculative-num-steps 3 "
    "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
)

TableKind = Literal["sweep", "mtp", "vision"]
RowSource = Literal["release", "probe"]  # who measured the row: the release's benchmark or the agent's probe


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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


class ResultRow(Frozen):
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
}


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
    DONE = "done"  # finished; individual keys may still have failed (see outcomes)
    FAILED = "failed"  # a release-wide step failed; no key could run
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RunState.DONE, RunState.FAILED, RunState.CANCELLED)


class StepError(Frozen):
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


class KeyOutcome(Frozen):
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
    tarball: str  # path on the module (or in a shared folder) of the release tarball
    sha256: str
    release: str = ""
    models: tuple[str, ...]
    model_root: str
    model_paths: dict[str, str] = Field(default_factory=dict)  # per-key overrides
    key_env: dict[str, dict[str, str]] = Field(default_factory=dict)  # extra env per key
    max_attempts: int = 2


class RunProgress(Frozen):
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
    rows: int = 0
    attempt: int = 1
    error: StepError | None = None
    outcomes: tuple[KeyOutcome, ...] = ()


class Heartbeat(Frozen):
    schema_version: int = SCHEMA_VERSION
    module: str
    agent_version: str
    ts: float
    run_id: str | None = None
    step: str | None = None
    free_disk_bytes: int | None = None
    healthy: bool = True
    detail: str = ""
