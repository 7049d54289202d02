"""The memory planner's measurement twin: the torch backend's real training step on fake tensors,
measured by PyTorch's ``MemTracker``.

:func:`measure_train_step` builds a model of the given Hugging Face config under ``FakeTensorMode``
(shapes and dtypes, no storage: a Qwen3-8B step at 32k tokens measures on a laptop), wraps it in a
:class:`~agentrl.train.TorchTrainBackend` configured like the plan (precision, master weights,
activation checkpointing, packed attention, fused head), and runs what a step runs: the
old-logprob forward, then forward and backward of each micro-batch (the backend's own
``_micro_batch``), clipping and the optimizer step. ``MemTracker`` records every tensor's storage
and the peak; a dispatch mode records the largest tensor any operation allocated (the check that no
``[S, S]`` or ``[S, vocab]`` tensor exists; views of weights allocate nothing). The optimizer's state exists before measuring (a
steady-state step), so the figures compare with :func:`~agentrl.train.memory_plan.plan_trainer_memory`.

The default dtype is set before the model is built (``model.to(torch.bfloat16)`` fails on fake
tensors), and ``MemTracker``'s per-module peak bookkeeping is skipped (it makes the backward pass of a
36-layer model ~10× slower; the global peak is what is compared).

Example::

    measured = measure_train_step(qwen3_4b_config, TrainerSetup(micro_batch_tokens=4096))
    print(measured.peak / 2**30, measured.largest_tensor)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves as pytree_leaves

from agentrl.train.memory_plan import TrainerSetup

__all__ = ["MeasuredStep", "measure_train_step"]


@dataclass
class MeasuredStep:
    """A step measured on fake tensors: ``peak`` (bytes, all tracked tensors), ``start`` (tracked at
    entry: weights, master weights, optimizer state), ``gradients`` (bytes of gradients at the end),
    the largest tensor any operation allocated (elements, shape, operation), wall seconds, and
    ``large``: how many tensors of each (shape, operation) had at least ``report_at_least`` elements."""

    peak: int
    start: int
    gradients: int
    largest_numel: int
    largest_shape: tuple[int, ...]
    largest_op: str
    seconds: float
    large: dict[tuple[tuple[int, ...], str], int]

    @property
    def dynamic(self) -> int:
        """The peak above what is resident (weights, masters, optimizer state) and the gradients:
        activations, the head's working set, recomputation and temporaries."""
        return self.peak - self.start - self.gradients


def _storage(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


class _LargestAllocation(TorchDispatchMode):
    """The largest tensor an operation allocated (views and in-place results share an input's
    storage and allocate nothing)."""

    def __init__(self, report_at_least: int | None = None) -> None:
        super().__init__()
        self.numel, self.op = 0, ""
        self.shape: tuple[int, ...] = ()
        self.threshold = report_at_least
        self.large: dict[tuple[tuple[int, ...], str], int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {_storage(t) for t in pytree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor)}
        for t in out if isinstance(out, tuple | list) else (out,):
            if not isinstance(t, torch.Tensor) or _storage(t) in inputs:
                continue
            if t.numel() > self.numel:
                self.numel, self.shape, self.op = t.numel(), tuple(t.shape), str(func)
            if self.threshold is not None and t.numel() >= self.threshold:
                key = (tuple(t.shape), str(func))
                self.large[key] = self.large.get(key, 0) + 1
        return out


def _tracker() -> Any:
    from copy import deepcopy

    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType

    class PeakOnly(MemTracker):  # type: ignore[misc]
        def _track_module_params_and_buffers(self, module: torch.nn.Module, install_grad_hooks: bool = True
                                             ) -> tuple[int, int]:
            # A frozen parameter (LoRA's base) takes no gradient hook: register_hook refuses it.
            memory: tuple[int, int] = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
            if install_grad_hooks:
                def on_grad(grad: torch.Tensor) -> None:
                    self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

                for p in module.parameters():
                    if p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:
                        self._param_to_grad_hook_handles[p] = (
                            p.register_hook(on_grad), p.register_post_accumulate_grad_hook(lambda q: on_grad(q.grad)))
            return memory

        def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
            # A step calls the model several times (scoring, then each micro-batch): per-module
            # statistics restart with each call of the root (the global peak is kept).
            name = self._mod_tracker.get_known_fqn(module)
            if module in self.memory_tracking and not self._mod_tracker.is_bw \
                    and set(self._mod_tracker.parents) - {name} == {"Global"}:
                self.reset_mod_stats()
            super()._pre_fw_hook(module, inputs)

        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = deepcopy(snap)

    return PeakOnly()


@contextmanager
def _convertible_fake_modules() -> Iterator[None]:
    """``Module.to`` converts a module holding fake tensors by swapping each parameter for its
    converted copy, which a fake tensor refuses (a weak reference is held to it). Peft converts every
    adapter it injects (to the base layer's device and dtype), so inside this block a refused swap of
    fake tensors falls back to ``param.data = converted`` (what ``Module.to`` does for real tensors)."""
    from torch._subclasses.fake_tensor import FakeTensor

    swap = torch.utils.swap_tensors

    def swap_or_set(t1: torch.Tensor, t2: torch.Tensor) -> None:
        try:
            swap(t1, t2)
        except RuntimeError:
            if not isinstance(t1, FakeTensor):
                raise
            t1.data = t2.data

    torch.utils.swap_tensors = swap_or_set
    try:
        yield
    finally:
        torch.utils.swap_tensors = swap


def _micro_batch(vocab: int, tokens: int, documents: int) -> Any:
    from agentrl.train.packing import MicroBatch

    lengths = [tokens // documents] * documents
    lengths[-1] += tokens - sum(lengths)
    ids = torch.randint(0, vocab, (tokens,))
    positions = torch.cat([torch.arange(n) for n in lengths])
    zeros = torch.zeros(tokens)
    return MicroBatch(input_ids=ids, position_ids=positions, target_ids=torch.randint(0, vocab, (tokens,)),
                      loss_mask=torch.ones(tokens), advantages=torch.ones(tokens), rollout_logprobs=zeros.clone(),
                      denominators=torch.full((tokens,), float(tokens)), sequence_ids=torch.zeros(tokens, dtype=torch.long),
                      indices=list(range(documents)), lengths=tuple(lengths), trainable=tokens)


def measure_train_step(hf_config: Mapping[str, Any], setup: TrainerSetup, *, documents: int = 8,
                       attention: str = "per_document", report_at_least: int | None = None) -> MeasuredStep:
    """Measure one steady-state step of ``setup.micro_batches`` micro-batches of
    ``setup.micro_batch_tokens`` tokens (``documents`` packed documents each) on fake tensors.

    Only the unsharded torch backend runs here (one process); ``attention="model"`` measures
    transformers' own attention (its dense ``[S, S]`` mask) for comparison."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.train.config import LossConfig, OptimizerConfig, PackingConfig, TorchBackendConfig
    from agentrl.train.objective import StepCounts
    from agentrl.train.torch_backend import TorchTrainBackend

    if setup.backend != "torch" or setup.sharded:
        raise ValueError("measure_train_step: measures the unsharded torch backend only")
    config = AutoConfig.for_model(**copy.deepcopy(dict(hf_config)))
    config._attn_implementation = "sdpa"
    if getattr(config, "num_experts", None):  # transformers' grouped-GEMM experts: the eager ones call
        config._experts_implementation = "grouped_mm"  # nonzero(), which fake tensors refuse
    cfg = TorchBackendConfig(
        device="cpu", dtype=setup.dtype, master_weights="float32" if setup.master_weights else "none",  # type: ignore[arg-type]
        sharding="none", activation_checkpointing=setup.activation_checkpointing,  # type: ignore[arg-type]
        attention=attention, fused_lm_head=setup.fused_lm_head,  # type: ignore[arg-type]
        logprob_chunk_size=setup.logprob_chunk_size, verify_packing=False, shared_prefix=False,
        packing=PackingConfig(max_tokens=setup.micro_batch_tokens),
        loss=LossConfig(old_logprobs="recompute"), optimizer=OptimizerConfig(lr=1e-6, grad_clip=1.0), lora=setup.lora)
    started = time.perf_counter()
    default = torch.get_default_dtype()
    with FakeTensorMode(allow_non_fake_inputs=True):
        torch.set_default_dtype(torch.float32 if setup.compute_bytes == 4 else getattr(torch, setup.dtype))
        try:
            model = AutoModelForCausalLM.from_config(config)
        finally:
            torch.set_default_dtype(default)
        with _convertible_fake_modules():
            backend = TorchTrainBackend(model, cfg)
        for p in backend.update_params:  # Adam's state exists in a steady-state step
            p.grad = torch.zeros_like(p)
        backend.optimizer.step()
        backend._zero_grad()
        mbs = [_micro_batch(config.vocab_size, setup.micro_batch_tokens, documents) for _ in range(setup.micro_batches)]
        counts = StepCounts(num_rollouts=documents * len(mbs), num_tokens=setup.micro_batch_tokens * len(mbs))
        tracker, largest = _tracker(), _LargestAllocation(report_at_least)
        tracker.track_external(backend.model, backend.optimizer, *backend.offloadable())
        with tracker:
            start = int(tracker.get_tracker_snapshot("current")[torch.device("cpu")]["Total"])
            with largest:
                backend._fill_side_logprobs(mbs)
                for mb in mbs:  # as forward_backward runs them (LoRA dropout on in the training forward)
                    with backend.adapter.dropout_on() if backend.adapter is not None else nullcontext():
                        backend._micro_batch(mb, counts)
                grads = sum(p.grad.numel() * p.grad.element_size() for p in backend.update_params
                            if p.grad is not None)
                backend.clip_gradients()
                backend.apply_update()
        peak = int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
    return MeasuredStep(peak=peak, start=start, gradients=int(grads), largest_numel=largest.numel,
                        largest_shape=largest.shape, largest_op=largest.op, seconds=time.perf_counter() - started,
                        large=largest.large)
