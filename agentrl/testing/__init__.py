"""Helpers for tests and CPU demos: a locally built Qwen-style tokenizer and tiny random Qwen3 and Qwen3-MoE models."""

from agentrl.testing.tiny_model import (
    TINY_MODEL_CONFIG,
    TINY_MOE_MODEL_CONFIG,
    build_tiny_model,
    build_tiny_moe_model,
)
from agentrl.testing.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS, build_tokenizer, build_tokenizer_files

__all__ = [
    "ADDED_TOKENS", "SPECIAL_TOKENS", "TINY_MODEL_CONFIG", "TINY_MOE_MODEL_CONFIG", "build_tiny_model",
    "build_tiny_moe_model", "build_tokenizer", "build_tokenizer_files",
]
