"""Do the startup log and the engine's own metrics (or SGLang's server info) agree?"""

from __future__ import annotations

from typing import Any, Final

from kvgate.evidence.metrics import MetricSnapshot, is_count
from kvgate.records.status import ScanRecord
from kvgate.vocabulary import kv_dtype_family

# Relative difference of KV tokens between log and metrics that is still the same pool.
CAPACITY_TOLERANCE: Final = 0.01


def _pools_differ(log_tokens: int | None, other_tokens: int | None) -> bool:
    """Both sides name a pool size and they differ by more than CAPACITY_TOLERANCE."""
    if not (log_tokens and other_tokens):
        return False
    return abs(log_tokens - other_tokens) > CAPACITY_TOLERANCE * max(log_tokens, other_tokens)


def _error(code: str, text: str, hint: str) -> Any:
    """A `kvgate.evidence.logs.Finding` of severity `error` (the gate should fail closed)."""
    from kvgate.evidence.logs.model import Finding

    return Finding(code, "error", 0, text, hint)


def cross_check_log(scan: ScanRecord, snapshot: MetricSnapshot) -> tuple[Any, ...]:
    """Disagreements between a startup log scan (as status keeps it) and `/metrics`.

    `log-metrics-dtype-mismatch` (the log's KV dtype and `cache_config_info{cache_dtype}`
    name different dtypes), `log-metrics-capacity-mismatch` (KV tokens differ by more than
    CAPACITY_TOLERANCE) and `log-metrics-blocks-mismatch` (`num_gpu_blocks` differ). A value
    missing on either side is no disagreement: nothing to compare.
    """
    findings = []
    log_dtype, metric_dtype = scan.kv_cache_dtype, snapshot.kv_cache_dtype
    if log_dtype and metric_dtype and kv_dtype_family(log_dtype) != kv_dtype_family(metric_dtype):
        findings.append(
            _error(
                "log-metrics-dtype-mismatch",
                f"startup log says kv_cache_dtype={log_dtype}, /metrics cache_config_info "
                f"says cache_dtype={metric_dtype}",
                "The pod does not run the dtype one source claims: do not trust this arm.",
            )
        )
    log_tokens, metric_tokens = scan.kv_tokens, snapshot.kv_capacity_tokens
    if _pools_differ(log_tokens, metric_tokens):
        findings.append(
            _error(
                "log-metrics-capacity-mismatch",
                f"startup log says {log_tokens:,} KV tokens, /metrics {metric_tokens:,}",
                "Log and metrics describe different KV pools (another pod, a restart, or "
                "a DP rank): compare the same process.",
            )
        )
    log_blocks = scan.capacity.num_gpu_blocks if scan.capacity is not None else None
    log_blocks = log_blocks if log_blocks is not None and log_blocks > 0 else None
    metric_blocks = snapshot.cache_config.get("num_gpu_blocks")
    if log_blocks is not None and is_count(metric_blocks) and int(metric_blocks) != log_blocks:
        findings.append(
            _error(
                "log-metrics-blocks-mismatch",
                f"startup log says {log_blocks:,} GPU blocks, /metrics num_gpu_blocks="
                f"{metric_blocks}",
                "Log and metrics describe different KV pools.",
            )
        )
    return tuple(findings)


def cross_check_server_info(
    scan: ScanRecord, server_dtype: str | None, server_tokens: int | None = None
) -> tuple[Any, ...]:
    """The log against SGLang's server info (SERVER_INFO_PATHS): `kv_cache_dtype` and
    `max_total_num_tokens`.

    `log-server-info-dtype-mismatch` (severity error) when they name different dtypes; `auto`
    on either side matches only `auto`/16-bit (an FP8 pool under `auto` is a disagreement:
    fail closed). `log-server-info-capacity-mismatch` when the KV tokens differ by more than
    CAPACITY_TOLERANCE. Nothing to compare when either side is missing.
    """
    findings = []
    log_tokens, log_dtype = scan.kv_tokens, scan.kv_cache_dtype
    if _pools_differ(log_tokens, server_tokens):
        findings.append(
            _error(
                "log-server-info-capacity-mismatch",
                f"startup log says {log_tokens:,} KV tokens, SGLang server info "
                f"max_total_num_tokens={server_tokens:,}",
                "Log and server info describe different KV pools (another pod or a restart).",
            )
        )
    if log_dtype and server_dtype and kv_dtype_family(log_dtype) != kv_dtype_family(server_dtype):
        findings.append(
            _error(
                "log-server-info-dtype-mismatch",
                f"startup log says kv_cache_dtype={log_dtype}, SGLang server info says "
                f"kv_cache_dtype={server_dtype}",
                "The pod does not run the dtype one source claims: do not trust this arm.",
            )
        )
    return tuple(findings)
