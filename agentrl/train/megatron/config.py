"""The megatron backend's config: the torch backend's numerics plus the model-parallel layout
(tensor, pipeline and, for mixture-of-experts models, expert parallelism).

Pure Python (no megatron import), so a config is validated before anything is installed or any
accelerator is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from agentrl.algorithms.kinds import DEFAULT_CHUNK_SIZE
from agentrl.train.config import LossConfig, OptimizerConfig, PackingConfig, _require, _torch_dtype

if TYPE_CHECKING:
    import torch

__all__ = ["MegatronBackendConfig"]


@dataclass(frozen=True)
class MegatronBackendConfig:
    """The megatron-core train backend.

    ``tensor_parallel_size`` × ``pipeline_parallel_size`` ranks hold one model replica; the world
    size divided by their product is the data-parallel size. ``make_vocab_size_divisible_by``:
    the vocabulary is padded to a multiple of this × the TP size (Megatron's convention; padded
    rows never get probability). ``use_distributed_optimizer``: shard optimizer state over the
    data-parallel ranks (megatron-core supports it on CUDA only); ``None`` turns it on for
    accelerators and off on CPU. ``device``, ``dtype``, ``packing``, ``loss``, ``optimizer``,
    ``logprob_chunk_size`` and ``seed`` mean what they mean for :class:`TorchBackendConfig`;
    ``dtype="bfloat16"`` trains with float32 main weights, gradients and Adam state in the optimizer
    (Megatron mixed precision; sharded over data-parallel ranks by the distributed optimizer).
    ``activation_checkpointing``: ``"full"`` recomputes each layer (Megatron's ``recompute_granularity
    ="full"``, uniform, one layer per unit), ``"selective"`` each layer's core attention and MLP
    (``recompute_modules=["core_attn", "mlp"]``; ``"moe"`` for a MoE layer: router, token exchange and
    experts). ``attention``: packed attention without an
    ``[S, S]`` tensor (:mod:`agentrl.train.megatron.attention`: ``"auto"``, ``"te"``,
    ``"per_document"``) or the dense block mask (``"dense"``). ``fused_lm_head``: score tokens from
    the final hidden states and this rank's slice of the output embedding, chunk by chunk, never
    building the ``[tokens, vocab/TP]`` logits. ``export_dtype``: the dtype of exported weights
    (``"auto"``: ``dtype``).

    Mixture-of-experts models (``qwen3_moe``): ``expert_parallel_size`` ranks share each MoE layer's
    experts (each holds ``num_experts / EP`` of them; tokens travel to their experts by all-to-all);
    EP ranks are carved out of the data-parallel ranks, so it must divide ``world / (TP × PP)``.
    ``moe_grouped_gemm``: run a rank's experts as one grouped GEMM (Transformer Engine's
    ``TEGroupedMLP``, CUDA only) instead of one after the other (``SequentialMLP``); ``None``: grouped
    where Transformer Engine and CUDA are there. Routing replay is ``loss.routing_replay`` (see
    :mod:`agentrl.train.megatron.moe`).
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    make_vocab_size_divisible_by: int = 128
    use_distributed_optimizer: bool | None = None
    device: str = "auto"
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = "float32"
    packing: PackingConfig = field(default_factory=PackingConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    logprob_chunk_size: int = DEFAULT_CHUNK_SIZE
    seed: int = 0
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    attention: Literal["auto", "te", "per_document", "dense"] = "auto"
    fused_lm_head: bool = True
    export_dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    expert_parallel_size: int = 1
    moe_grouped_gemm: bool | None = None

    def __post_init__(self) -> None:
        _require(self.tensor_parallel_size >= 1, "tensor_parallel_size", self.tensor_parallel_size,
                 "a positive integer")
        _require(self.pipeline_parallel_size >= 1, "pipeline_parallel_size", self.pipeline_parallel_size,
                 "a positive integer")
        _require(self.make_vocab_size_divisible_by >= 1, "make_vocab_size_divisible_by",
                 self.make_vocab_size_divisible_by, "a positive integer")
        _require(self.dtype in ("float32", "bfloat16", "float16"), "dtype", self.dtype,
                 "'float32', 'bfloat16' or 'float16' (megatron-core has no float64 path)")
        _require(self.logprob_chunk_size > 0, "logprob_chunk_size", self.logprob_chunk_size, "a positive integer")
        _require(self.activation_checkpointing in ("none", "full", "selective"), "activation_checkpointing",
                 self.activation_checkpointing, "'none', 'full' or 'selective'")
        _require(self.attention in ("auto", "te", "per_document", "dense"), "attention", self.attention,
                 "'auto', 'te', 'per_document' or 'dense'")
        _require(self.export_dtype in ("auto", "bfloat16", "float16", "float32"), "export_dtype", self.export_dtype,
                 "'auto', 'bfloat16', 'float16' or 'float32'")
        _require(self.expert_parallel_size >= 1, "expert_parallel_size", self.expert_parallel_size,
                 "a positive integer")

    @property
    def model_parallel_size(self) -> int:
        """Ranks per model replica: ``tensor_parallel_size × pipeline_parallel_size``."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def torch_dtype(self) -> torch.dtype:
        return _torch_dtype(self.dtype)

    @property
    def export_torch_dtype(self) -> torch.dtype:
        """The dtype exported weights are written in."""
        return _torch_dtype(self.dtype if self.export_dtype == "auto" else self.export_dtype)

    def padded_vocab_size(self, vocab_size: int) -> int:
        """``vocab_size`` rounded up to a multiple of ``make_vocab_size_divisible_by × TP``."""
        multiple = self.make_vocab_size_divisible_by * self.tensor_parallel_size
        return -(-vocab_size // multiple) * multiple
