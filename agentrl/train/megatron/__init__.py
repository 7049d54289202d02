"""The megatron-core train backend: Hugging Face Qwen3 models with tensor, pipeline and data parallelism.

Importing this package needs no megatron-core; building a model does (``scripts/setup`` installs
it). Everything device-specific goes through :mod:`agentrl.train.device`; on a CPU-only machine
megatron-core needs a test-only shim (see the tests), so CPU use is for tests.
"""

from agentrl.train.megatron.backend import MegatronTrainBackend
from agentrl.train.megatron.config import MegatronBackendConfig
from agentrl.train.megatron.convert import ParamMapping, merge_shards, shard_for_rank, stage_mapping
from agentrl.train.megatron.forward import block_causal_mask, packed_forward
from agentrl.train.megatron.parallel import ParallelLayout, setup_model_parallel
from agentrl.train.megatron.qwen3 import (
    Qwen3Spec,
    build_gpt_model,
    check_transformer_config,
    transformer_config,
)
from agentrl.train.megatron.state import MegatronCheckpointer
from agentrl.train.megatron.vocab_parallel import vocab_parallel_logprobs
from agentrl.train.megatron.weights import hf_weight_shapes, iter_hf_weights, load_hf_weights, read_hf_state

__all__ = [
    "MegatronBackendConfig",
    "MegatronCheckpointer",
    "MegatronTrainBackend",
    "ParallelLayout",
    "ParamMapping",
    "Qwen3Spec",
    "block_causal_mask",
    "build_gpt_model",
    "check_transformer_config",
    "hf_weight_shapes",
    "iter_hf_weights",
    "load_hf_weights",
    "merge_shards",
    "packed_forward",
    "read_hf_state",
    "setup_model_parallel",
    "shard_for_rank",
    "stage_mapping",
    "transformer_config",
    "vocab_parallel_logprobs",
]
