"""Prompt data for training and evaluation: file readers, row checks, seeded resumable order.

- :class:`DataSource` / :class:`DataConfig`: JSONL, Parquet, Hugging Face ``save_to_disk`` folders;
  field mapping; shuffle by seed; epochs; ``state_dict`` / ``load_state_dict``.
- :class:`DataRow`: one drawn prompt; :class:`BadRow`: a row left out and why.
"""

from agentrl.data.source import (
    BadRow,
    BadRowPolicy,
    DataConfig,
    DataError,
    DataExhausted,
    DataFormat,
    DataRow,
    DataSource,
    read_rows,
)

__all__ = ["BadRow", "BadRowPolicy", "DataConfig", "DataError", "DataExhausted", "DataFormat", "DataRow",
           "DataSource", "read_rows"]
