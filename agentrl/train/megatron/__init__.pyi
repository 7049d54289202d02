"""Type stub: the public names of agentrl.train.megatron (imported lazily at runtime, see __init__.py)."""

from .backend import (
    MegatronTrainBackend,
)
from .config import (
    MegatronBackendConfig,
)
from .convert import (
    ParamMapping,
    merge_shards,
    shard_for_rank,
    stage_mapping,
)
from .forward import (
    block_causal_mask,
    packed_forward,
)
from .moe import (
    MoeRouting,
    check_routing_channels,
    resolve_grouped_gemm,
)
from .parallel import (
    ParallelLayout,
    setup_model_parallel,
)
from .qwen3 import (
    Qwen3Spec,
    build_gpt_model,
    check_transformer_config,
    transformer_config,
)
from .state import (
    MegatronCheckpointer,
)
from .vocab_parallel import (
    vocab_parallel_logprobs,
)
from .weights import (
    hf_weight_shapes,
    iter_hf_weights,
    load_hf_weights,
    read_hf_state,
)

__all__ = [
    "MegatronBackendConfig",
    "MegatronCheckpointer",
    "MegatronTrainBackend",
    "MoeRouting",
    "ParallelLayout",
    "ParamMapping",
    "Qwen3Spec",
    "block_causal_mask",
    "build_gpt_model",
    "check_routing_channels",
    "check_transformer_config",
    "hf_weight_shapes",
    "iter_hf_weights",
    "load_hf_weights",
    "merge_shards",
    "packed_forward",
    "read_hf_state",
    "resolve_grouped_gemm",
    "setup_model_parallel",
    "shard_for_rank",
    "stage_mapping",
    "transformer_config",
    "vocab_parallel_logprobs",
]
