"""Which mixture-of-experts models the torch backend trains, from their Hugging Face config alone.

No torch here: the run's pre-flight (``agentrl train --dry-run``) checks a model folder with these
before anything heavy is imported. The routing itself is :mod:`agentrl.train.moe`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ATTENTION_MODULES", "REFUSED_MOE_TYPES", "SUPPORTED_MOE_TYPES", "check_moe_lora", "check_moe_model",
           "is_moe_config"]

SUPPORTED_MOE_TYPES = ("qwen3_moe",)
"""``model_type`` values whose experts the torch backend routes (and replays)."""

REFUSED_MOE_TYPES: dict[str, str] = {
    "qwen3_5_moe": "Qwen3.5-MoE (Gated DeltaNet layers and a vision tower) is not supported yet",
    "qwen3_next": "Qwen3-Next (Gated DeltaNet layers, shared experts) is not supported yet",
    "qwen2_moe": "Qwen2-MoE (shared experts) is not supported yet",
}
"""Mixture-of-experts families refused with a reason (the run stops before anything starts)."""


def is_moe_config(config: Any) -> bool:
    """Whether a Hugging Face config (object or dict) describes a mixture-of-experts model."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    text = get("text_config")
    if text is not None and not get("num_experts") and not get("num_local_experts"):
        return is_moe_config(text)
    return bool(get("num_experts") or get("num_local_experts") or get("n_routed_experts")) or \
        str(get("model_type", "")) in SUPPORTED_MOE_TYPES or str(get("model_type", "")) in REFUSED_MOE_TYPES


def check_moe_model(config: Any, *, what: str = "model") -> None:
    """Raise ``ValueError`` naming the model type for a mixture-of-experts family the torch backend
    cannot route; a dense model or a supported MoE passes."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    model_type = str(get("model_type", ""))
    if model_type in REFUSED_MOE_TYPES:
        raise ValueError(f"{what}: model_type={model_type!r}: {REFUSED_MOE_TYPES[model_type]}; mixture-of-experts "
                         f"models supported: {list(SUPPORTED_MOE_TYPES)}")
    if is_moe_config(config) and model_type not in SUPPORTED_MOE_TYPES:
        raise ValueError(f"{what}: model_type={model_type!r} is a mixture-of-experts model this backend cannot route; "
                         f"expected one of {list(SUPPORTED_MOE_TYPES)}")


ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
"""The modules a LoRA adapter may target on a mixture-of-experts model (attention only)."""


def check_moe_lora(config: Any, lora: Any) -> None:
    """Raise ``ValueError`` for a LoRA adapter on a mixture-of-experts model that targets anything but
    attention: adapters on experts or routers are not supported (the experts are stacked
    parameters, not linear layers, and an adapted router would route differently from the engine)."""
    if lora is None or config is None or not is_moe_config(config):
        return
    other = sorted(set(lora.target_modules) - set(ATTENTION_MODULES))
    if other:
        model_type = config.get("model_type", "?") if isinstance(config, dict) else getattr(config, "model_type", "?")
        raise ValueError(f"lora.target_modules={list(lora.target_modules)}: on a mixture-of-experts model "
                         f"({model_type}) LoRA adapts attention only; expected some of "
                         f"{list(ATTENTION_MODULES)}, not {other}")
