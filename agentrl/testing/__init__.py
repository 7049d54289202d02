"""Helpers for tests and CPU demos: a locally built Qwen-style tokenizer (and, later, a tiny model)."""

from agentrl.testing.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS, build_tokenizer, build_tokenizer_files

__all__ = ["ADDED_TOKENS", "SPECIAL_TOKENS", "build_tokenizer", "build_tokenizer_files"]
