"""LoRA on the torch backend: low-rank adapters trained on a frozen base model, built with ``peft``.

:func:`attach_lora` injects the adapter layers into a Hugging Face model *in place* (the model object
stays the one the backend prepares: packed attention, checkpointing and the fused head apply to it
unchanged) and returns the :class:`LoraAdapter` that knows them:

- only the adapter's ``A`` and ``B`` matrices require gradients (peft freezes the rest), so the
  optimizer state, the master weights and the gradients are the adapter's alone;
- :meth:`LoraAdapter.disabled` runs the base model (the adapter switched off, no second copy): the
  KL reference of a LoRA run;
- :meth:`LoraAdapter.tensors` are the adapter's weights under the names an engine loads (peft's
  ``base_model.model.`` prefix stripped: ``model.layers.0.self_attn.q_proj.lora_A.weight``), and
  :meth:`LoraAdapter.engine_config` its PEFT ``adapter_config``; :meth:`LoraAdapter.save` writes the
  peft folder (``adapter_config.json`` + ``adapter_model.safetensors``) that ``PeftModel.from_pretrained``
  and SGLang's ``/load_lora_adapter`` read;
- :meth:`LoraAdapter.merged_state` is the base state dict with ``W + (alpha/r)·B·A`` folded in, for
  a Hugging Face folder that serves without the adapter (computed apart: merging in place and back
  would round the base weights in bfloat16);
- :meth:`LoraAdapter.probe_weights` fills the adapter with fixed random weights for a while (B non-zero:
  peft starts at B = 0, where an adapter that is never applied looks exactly like one that is).

Dropout defaults to 0: with dropout the training forward differs from the scoring forward and from
the engine, so the PPO ratio is not 1 on-policy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from agentrl.train.config import DEFAULT_LORA_LR, DEFAULT_TARGET_MODULES, LoraSettings

__all__ = ["DEFAULT_LORA_LR", "DEFAULT_TARGET_MODULES", "LoraAdapter", "LoraSettings", "attach_lora"]

_PEFT_PREFIX = "base_model.model."
_ADAPTER = "default"



def attach_lora(model: torch.nn.Module, settings: LoraSettings, *, seed: int = 0) -> LoraAdapter:
    """Injects ``settings``'s adapter into ``model`` in place (peft) and freezes everything else.
    peft draws ``A`` from the global generator: here from one seeded by ``seed`` (the caller's own
    state untouched), so two runs of one config start from the same adapter. Raises ``ValueError``
    naming the modules when none of ``target_modules`` is in the model."""
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in settings.target_modules if m not in names]
    if len(missing) == len(settings.target_modules):
        raise ValueError(f"train.lora.target_modules={list(settings.target_modules)}: none is a module of "
                         f"{type(model).__name__}; its linear layers include "
                         f"{sorted(n for n in names if n.endswith('proj'))[:12]}")
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha,  # type: ignore[arg-type]  # (a float is fine)
                        lora_dropout=settings.dropout,
                        target_modules=[m for m in settings.target_modules if m in names], bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapper = get_peft_model(model, config)  # (the adapters live in ``model`` itself; the wrapper knows them)
    model.eval()  # peft's new dropout modules start in training mode: on only inside dropout_on()
    return LoraAdapter(model, wrapper, settings)


class LoraAdapter:
    """The adapter injected into ``model`` (see the module doc); ``wrapper`` is peft's ``PeftModel``."""

    def __init__(self, model: torch.nn.Module, wrapper: Any, settings: LoraSettings) -> None:
        self.model, self.wrapper, self.settings = model, wrapper, settings
        self.base_path = str(getattr(getattr(model, "config", None), "_name_or_path", "") or "")

    # -- what is trained ---------------------------------------------------------------------------
    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter's own entries of ``model.state_dict()`` (for checkpoints: the base is the model folder's)."""
        keep = {name for name, p in self.model.named_parameters() if p.requires_grad}
        return {k: v for k, v in self.model.state_dict().items() if k in keep}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(f"the checkpoint's adapter does not fit this model: missing {missing[:3]}, unexpected "
                             f"{unexpected[:3]} (another train.lora rank or target_modules?)")
        self.model.load_state_dict(state, strict=False)

    @contextmanager
    def dropout_on(self) -> Iterator[None]:
        """LoRA dropout active for the block (the training forward); everywhere else the adapter's
        dropout stays off, so scoring (old and reference logprobs, the probe) is deterministic."""
        drops = [m for name, m in self.model.named_modules() if ".lora_dropout." in f".{name}."
                 and isinstance(m, torch.nn.Dropout)]
        for m in drops:
            m.train()
        try:
            yield
        finally:
            for m in drops:
                m.eval()

    # -- the reference -----------------------------------------------------------------------------
    @contextmanager
    def disabled(self) -> Iterator[None]:
        """The base model: every adapter layer is bypassed inside the block."""
        with self.wrapper.disable_adapter():
            yield

    # -- what an engine loads ----------------------------------------------------------------------
    def tensors(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The adapter's weights under the engine's names (peft's prefix and adapter name stripped), on
        the host, in ``dtype`` (``None``: as trained)."""
        from peft import get_peft_model_state_dict

        out: dict[str, torch.Tensor] = {}
        for name, tensor in get_peft_model_state_dict(self.wrapper, adapter_name=_ADAPTER).items():
            t = tensor.detach().to("cpu")
            out[name.removeprefix(_PEFT_PREFIX)] = (t.to(dtype) if dtype is not None else t).contiguous()
        return out

    def engine_config(self) -> dict[str, Any]:
        """The PEFT ``adapter_config`` (JSON-ready) an engine loads the adapter with."""
        cfg = self.wrapper.peft_config[_ADAPTER]
        return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(cfg.r), "lora_alpha": float(cfg.lora_alpha),
                "lora_dropout": float(cfg.lora_dropout), "target_modules": sorted(cfg.target_modules),
                "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
                "modules_to_save": None, "base_model_name_or_path": self.base_path}

    def save(self, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
        """The peft folder: ``adapter_config.json`` and ``adapter_model.safetensors`` (peft's names)."""
        from safetensors.torch import save_file

        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        tensors = {_PEFT_PREFIX + k: v for k, v in self.tensors(dtype).items()}
        save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
        (path / "adapter_config.json").write_text(json.dumps(self.engine_config(), indent=2, sort_keys=True) + "\n",
                                                  encoding="utf-8")
        return path

    def merged_state(self) -> dict[str, torch.Tensor]:
        """The model's state dict with each adapter folded into its base weight (``W + scale·B·A``,
        in float32, then back to the weight's dtype), under the base model's names."""
        from peft.tuners.lora import LoraLayer

        deltas: dict[str, torch.Tensor] = {}
        for name, module in self.model.named_modules():
            layer: Any = module
            if isinstance(module, LoraLayer) and _ADAPTER in layer.lora_A:
                a = layer.lora_A[_ADAPTER].weight.detach().float()
                b = layer.lora_B[_ADAPTER].weight.detach().float()
                deltas[f"{name}.base_layer.weight"] = (b @ a) * float(layer.scaling[_ADAPTER])
        out: dict[str, torch.Tensor] = {}
        for key, tensor in self.model.state_dict().items():
            if ".lora_" in key:
                continue
            delta = deltas.get(key)
            if delta is not None:
                tensor = (tensor.detach().float() + delta.to(tensor.device)).to(tensor.dtype)
            out[key.replace(".base_layer.", ".")] = tensor
        return out

    # -- the start-up check ------------------------------------------------------------------------
    @contextmanager
    def probe_weights(self, seed: int, std: float = 0.05) -> Iterator[None]:
        """Fills every ``A`` and ``B`` with seeded normal values of ``std`` for the block, then puts the
        trained adapter back bit for bit. B ≠ 0, so the adapter visibly changes the model."""
        params = self.parameters()
        saved = [p.detach().clone() for p in params]
        gen = torch.Generator(device="cpu").manual_seed(seed)
        try:
            with torch.no_grad():
                for p in params:
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(std).to(p.dtype))
            yield
        finally:
            with torch.no_grad():
                for p, s in zip(params, saved, strict=True):
                    p.copy_(s)
