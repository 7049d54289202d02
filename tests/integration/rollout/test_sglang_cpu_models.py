"""The CPU engine's model shortcut (``SGLANG_EXTERNAL_MODEL_PACKAGE`` = the shims' model package) against
the installed SGLang: the Qwen3 and Llama classes resolve without SGLang importing its other model files,
Qwen3-MoE resolves to the shims' class (SGLang's, tying a tied checkpoint's output head), and an
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
llama, _ = ModelRegistry.resolve_model_cls(["LlamaForCausalLM"])
moe, _ = ModelRegistry.resolve_model_cls(["Qwen3MoeForCausalLM"])
print(moe.__module__, moe.__mro__[1].__module__)
shortcut = "sglang.srt.models.mistral" not in sys.modules
other, other_arch = ModelRegistry.resolve_model_cls(["MistralForCausalLM"])
print(cls.__module__, cls.__name__, llama.__module__, llama.__name__, shortcut, other.__module__, other_arch)
"""


def test_qwen3_and_llama_resolve_without_the_other_models_and_others_still_load() -> None:
    env = engine_environment("cpu")
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    moe, moe_base, module, name, llama_module, llama_name, shortcut, other_module, other_arch = out.stdout.split()[-9:]
    # Qwen3-MoE: SGLang's class under the shim that ties a tied checkpoint's output head
    assert (moe, moe_base) == ("agentrl_sglang_models.qwen3_moe", "sglang.srt.models.qwen3_moe")
    assert (module, name) == ("sglang.srt.models.qwen3", "Qwen3ForCausalLM")
    assert (llama_module, llama_name) == ("sglang.srt.models.llama", "LlamaForCausalLM")  # SmolLM2's class
    assert shortcut == "True"  # no model file outside the package was imported for them
    assert (other_module, other_arch) == ("sglang.srt.models.mistral", "MistralForCausalLM")
