"""Training: trajectories → packed micro-batches → optimiser steps on a train backend.

- :func:`build_training_batch` turns trajectories into :class:`TrainSequence` objects with
  per-token advantages and per-rollout denominators (fan-out aware);
- :func:`plan_micro_batches` / :func:`collate` pack them into token-budgeted micro-batches,
  balanced across data-parallel ranks; :func:`plan_shared_prefix_micro_batches` and
  :func:`shared_prefix_layout` let a prompt shared by several sequences run once;
- :class:`TorchTrainBackend` runs the step on any Hugging Face causal LM (CPU, CUDA, Ascend NPU),
  with data parallelism over ``torch.distributed`` (sharded with FSDP2), checkpoints and Hugging
  Face export;
- fitting a step: packed attention without an ``[S, S]`` mask (``attention``), activation
  checkpointing (``recompute``), float32 master weights for bf16 models (``precision``), the fused
  output head (``lm_head``), sharding (``sharding``), and the memory planner (``memory_plan``, pure;
  its measured twin on fake tensors is ``memory_measure``).

A training *run* (rollouts, these steps, weight sync, checkpoints) is ``agentrl.run(config, ...)``
(:mod:`agentrl.runner`); this package is only the trainer's side.
"""

import lazy_loader

# The names are listed in __init__.pyi; each submodule is imported on first use, so importing a
# config module does not pull in torch or Ray.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
