"""The CPU engine's model shortcut (``SGLANG_EXTERNAL_MODEL_PACKAGE`` = the shims' model package) against
the installed SGLang: the Qwen3 class resolves without SGLang importing its other model files, and an
architecture the package does not list still resolves (SGLang then imports its own models)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentrl.rollout.engine import engine_environment

pytestmark = [pytest.mark.integration, pytest.mark.slow]

pytest.importorskip("sglang")

CODE = """
import sys
from sglang.srt.models.registry import ModelRegistry
cls, arch = ModelRegistry.resolve_model_cls(["Qwen3ForCausalLM"])
shortcut = "sglang.srt.models.llama" not in sys.modules
other, other_arch = ModelRegistry.resolve_model_cls(["LlamaForCausalLM"])
print(cls.__module__, cls.__name__, shortcut, other.__module__, other_arch)
"""


def test_qwen3_resolves_without_the_other_models_and_others_still_load() -> None:
    env = engine_environment("cpu")
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    module, name, shortcut, other_module, other_arch = out.stdout.split()[-5:]
    assert (module, name) == ("sglang.srt.models.qwen3", "Qwen3ForCausalLM")
    assert shortcut == "True"  # no model file outside the package was imported for it
    assert (other_module, other_arch) == ("sglang.srt.models.llama", "LlamaForCausalLM")
