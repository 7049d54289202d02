"""Packed attention for Hugging Face models: each document of a packed row attends to itself only,
and no mask across the row is ever built.

A micro-batch is one row of several sequences (documents) told apart by positions that restart at
0. Hugging Face's ``sdpa`` and ``eager`` attention turn that into a dense ``[S, S]`` boolean mask
(1 GiB at 32k tokens) and attend through it; and when a key/value cache object is present
(``use_cache=True``, the default of ``Qwen3Model``) they stop detecting packing and documents attend
to each other silently. :func:`use_packed_attention` replaces the model's attention by
:func:`packed_attention_forward`, registered with transformers as ``"agentrl_packed"``, which takes
the documents from the call (``agentrl_documents=Documents(...)``, what the scorer passes) or else
from the position ids, whatever the cache, and runs one of these kernels:

- ``"flash_attn"``: ``flash_attn.flash_attn_varlen_func(..., causal=True)`` where the package is
  installed (CUDA, half precision);
- ``"varlen"``: ``torch.nn.attention.varlen.varlen_attn`` (CUDA, half precision). It is **not causal
  by default**: the causal window ``(-1, 0)`` (or ``is_causal=True`` on torch versions whose
  signature has that) is always passed;
- ``"per_document"``: ``scaled_dot_product_attention(is_causal=True)`` on each document's slice, on
  any device; on CPU that is the flash kernel, whose memory is linear in the document's length.

``"auto"`` picks the first that applies, in that order. Calls that are not one packed row (a
padded batch, or queries against a longer cache: the shared-prefix path) go to transformers' own
``sdpa`` attention with the mask transformers built for that batch.

Example::

    use_packed_attention(model, "auto")
    docs = Documents.from_lengths([7, 5], device=model.device)
    logits = model(input_ids=ids[None], position_ids=positions[None], agentrl_documents=docs).logits
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

__all__ = ["ATTENTION_NAME", "AttentionKernel", "Documents", "packed_attention_forward", "resolve_kernel",
           "use_packed_attention"]

ATTENTION_NAME = "agentrl_packed"
AttentionKernel = Literal["auto", "flash_attn", "varlen", "per_document"]
_KERNELS = ("auto", "flash_attn", "varlen", "per_document")
_HALF = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Documents:
    """The documents of one packed row: their lengths (Python ints, so no kernel needs a device
    sync to read them) and the cumulative offsets ``[0, n0, n0+n1, ...]`` (int32, on the row's device)."""

    lengths: tuple[int, ...]
    cu_seqlens: torch.Tensor

    @classmethod
    def from_lengths(cls, lengths: Sequence[int], device: torch.device | str | None = None) -> Documents:
        if not lengths or any(n < 1 for n in lengths):
            raise ValueError(f"lengths: expected one positive length per document, got {list(lengths)!r}")
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + int(n))
        return cls(tuple(int(n) for n in lengths), torch.tensor(offsets, dtype=torch.int32, device=device))

    @classmethod
    def from_positions(cls, position_ids: torch.Tensor) -> Documents:
        """Documents start wherever the position is 0 (the packing convention); a row that does not
        start at 0 is one document."""
        pos = position_ids.reshape(-1)
        starts = [0, *[i for i in torch.nonzero(pos == 0)[:, 0].tolist() if i > 0], int(pos.numel())]
        return cls.from_lengths([b - a for a, b in itertools.pairwise(starts)], device=pos.device)

    @property
    def max_length(self) -> int:
        return max(self.lengths)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)


def _has_flash_attn() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def _varlen() -> Any:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def resolve_kernel(kernel: str, device: torch.device, dtype: torch.dtype) -> str:
    """The kernel ``kernel`` means on ``device`` for ``dtype`` activations (``"auto"`` resolved).

    Raises ``ValueError`` for a kernel that cannot run there (naming what it needs)."""
    if kernel not in _KERNELS:
        raise ValueError(f"attention: expected one of {list(_KERNELS)}, got {kernel!r}")
    cuda_half = device.type == "cuda" and dtype in _HALF
    if kernel == "auto":
        if cuda_half and _has_flash_attn():
            return "flash_attn"
        if cuda_half and _varlen() is not None:
            return "varlen"
        return "per_document"
    if kernel == "flash_attn" and not (cuda_half and _has_flash_attn()):
        raise ValueError(f"attention='flash_attn': needs the flash_attn package, a CUDA device and bfloat16/float16 "
                         f"activations; got device {device.type}, {dtype}, flash_attn installed: {_has_flash_attn()}")
    if kernel == "varlen" and not (cuda_half and _varlen() is not None):
        raise ValueError(f"attention='varlen': needs torch.nn.attention.varlen (torch >= 2.9), a CUDA device and "
                         f"bfloat16/float16 activations; got torch {torch.__version__}, device {device.type}, {dtype}")
    return kernel


def use_packed_attention(model: torch.nn.Module, kernel: str = "auto") -> str:
    """Make ``model`` (a transformers model) attend through :func:`packed_attention_forward` with
    ``kernel``; returns the kernel resolved for the model's device and compute dtype."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, packed_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, _packed_mask)
    setter = getattr(model, "set_attn_implementation", None)
    if not callable(setter):
        raise ValueError("attention: the model is not a transformers model with set_attn_implementation(); "
                         "use attention='model'")
    param = next(model.parameters())
    resolved = resolve_kernel(kernel, param.device, param.dtype)
    setter(ATTENTION_NAME)
    for module in model.modules():
        setattr(module, "agentrl_attention_kernel", resolved)  # noqa: B010 - read back by packed_attention_forward
    return resolved


def _packed_mask(**kwargs: Any) -> torch.Tensor | None:
    """No mask for a packed row (documents come from the call or the positions); the ``sdpa`` mask
    for a padded batch (``attention_mask`` given), which covers that batch only."""
    if kwargs.get("attention_mask") is None:
        return None
    from transformers.masking_utils import sdpa_mask

    mask: torch.Tensor | None = sdpa_mask(**kwargs)
    return mask


def packed_attention_forward(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
    sliding_window: int | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query [B, H, S, D]``, ``key/value [B, Hkv, S_k, D]`` →
    ``([B, S, H, D], None)``. One row without a mask and without a longer cache is a packed row;
    anything else is delegated to transformers' ``sdpa`` attention with its mask."""
    if attention_mask is not None or query.shape[0] != 1 or key.shape[2] != query.shape[2]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        out: tuple[torch.Tensor, None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, sliding_window=sliding_window,
            **kwargs)
        return out
    if sliding_window is not None:
        raise ValueError(f"attention: packed attention does not implement sliding windows (sliding_window="
                         f"{sliding_window}); use attention='model'")
    if dropout:
        raise ValueError(f"attention: packed attention runs without dropout, got dropout={dropout}")
    docs = kwargs.get("agentrl_documents")
    if docs is None:
        position_ids = kwargs.get("position_ids")
        if position_ids is None:
            docs = Documents.from_lengths([query.shape[2]], device=query.device)
        else:
            docs = Documents.from_positions(position_ids)
    if docs.num_tokens != query.shape[2]:
        raise ValueError(f"agentrl_documents: lengths sum to {docs.num_tokens}, the row has {query.shape[2]} tokens")
    kernel = getattr(module, "agentrl_attention_kernel", None) or resolve_kernel("auto", query.device, query.dtype)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [S, H, D]
    if kernel == "flash_attn":
        result = _flash_attn(q, k, v, docs, scaling)
    elif kernel == "varlen":
        result = _torch_varlen(q, k, v, docs, scaling)
    else:
        result = _per_document(q, k, v, docs, scaling)
    return result[None], None


def _per_document(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents,
                  scale: float | None) -> torch.Tensor:
    """``[S, H, D]``: causal SDPA over each document's slice (memory of one document's attention)."""
    gqa = q.shape[1] != k.shape[1]
    if gqa and q.device.type != "cpu":  # enable_gqa can force the math kernel elsewhere: expand instead
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        gqa = False
    outs = []
    start = 0
    for n in docs.lengths:
        sl = slice(start, start + n)
        # 4-D [1, heads, n, d]: with 3-D inputs the CPU dispatcher falls back to the math kernel, which
        # builds the document's [heads, n, n] scores (in float32 for bfloat16 inputs).
        out = F.scaled_dot_product_attention(q[sl].transpose(0, 1)[None], k[sl].transpose(0, 1)[None],
                                             v[sl].transpose(0, 1)[None], is_causal=True, scale=scale, enable_gqa=gqa)
        outs.append(out[0].transpose(0, 1))
        start += n
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents, scale: float | None
                ) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    cu = docs.cu_seqlens.to(device=q.device, dtype=torch.int32)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out: torch.Tensor = flash_attn_varlen_func(q, k, v, cu, cu, docs.max_length, docs.max_length,
                                               softmax_scale=scale, causal=True)
    return out


def varlen_causal_kwargs(params: Sequence[str]) -> dict[str, Any]:
    """The keyword that makes ``varlen_attn`` causal on this torch version: ``window_size=(-1, 0)``
    (newer), or ``is_causal=True`` (older). Without it the kernel attends to future tokens."""
    if "window_size" in params:
        return {"window_size": (-1, 0)}
    if "is_causal" in params:
        return {"is_causal": True}
    raise RuntimeError("torch.nn.attention.varlen.varlen_attn takes neither window_size nor is_causal: cannot "
                       "make it causal on this torch version; use attention='per_document'")


def _torch_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents, scale: float | None
                  ) -> torch.Tensor:
    varlen_attn = _varlen()
    params = list(inspect.signature(varlen_attn).parameters)
    kwargs = varlen_causal_kwargs(params)
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:  # older versions want as many key/value heads as query heads
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if "scale" in params and scale is not None:
        kwargs["scale"] = scale
    elif scale is not None and abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        raise RuntimeError(f"torch's varlen_attn on this version takes no scale; the model needs {scale}")
    cu = docs.cu_seqlens.to(device=q.device, dtype=torch.int32)
    out: torch.Tensor = varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, docs.max_length, docs.max_length,
                                    **kwargs)
    return out
