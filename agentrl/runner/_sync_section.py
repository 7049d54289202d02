"""The ``sync`` section of the run config: a :class:`~agentrl.runner.weights.WeightSyncConfig` (how
weights reach the engines after each step, and the post-sync logprob probe that checks they did).

``retry_delay_s`` is not a config key: it keeps its default in a run.
"""

from __future__ import annotations

from agentrl._config import RunFields
from agentrl.runner.weights import WeightSyncConfig

__all__ = ["RUN_SYNC"]

RUN_SYNC = RunFields(WeightSyncConfig, keys=(
    "method", "bucket_mb", "pause_mode", "abort_requests", "retries", "export_s", "pause_s", "load_s", "verify_s",
    "resume_s", "keep_folders", "probe_sequences", "probe_length", "probe_bound", "probe_seed"))
"""The sync settings a run config sets (every :class:`WeightSyncConfig` field but ``retry_delay_s``)."""
