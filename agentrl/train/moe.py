"""Mixture-of-experts models on the torch backend: which are supported, routing replay, routing figures.

A Qwen3-MoE decoder layer sends each token to ``top_k`` of ``num_experts`` experts chosen by its
router (``mlp.gate``: a linear layer, a softmax, the top-k, renormalised when the config says
``norm_topk_prob``). The engine that sampled a trajectory chose experts too, and in another
precision, batch and kernel it does not always choose the same ones: the trainer then computes the
log-probability of a token through experts the sampler never used (the R3 paper measures ~10% of
router decisions differing). **Routing replay** (``LossConfig.routing_replay = "rollout"``) makes
every training forward use the engine's experts:

- only the top-k *index sets* are replayed (the trajectory's ``routed_experts`` channel, one row
  ``[layers, top_k]`` per input position); the gate weights are the trainer's own softmax over the
  router logits, taken at the replayed experts (and renormalised as the model does), so the router
  still gets a gradient through them;
- a position without engine routing (a span the engine never prefilled, an old trajectory) is
  routed by the trainer and counted (``moe/unrouted_tokens``), never silently mixed;
- every forward of the step replays: the old-policy scoring, the reference model's scoring, the
  policy's training forward and its activation recompute in the backward pass
  (:mod:`agentrl.train.recompute` restores each checkpointed forward's binding when it reruns).

Whatever the setting, the trainer's own router choice is compared with the engine's where the
engine's is known: :class:`RoutingStats` counts positions whose experts differ in at least one
layer, both for the experts the forward *used* (0 by construction with replay; checked) and for the
ones the trainer's router *would* choose.

Supported: ``qwen3_moe`` (``Qwen3MoeForCausalLM``). Other mixture-of-experts families are refused
by :func:`check_moe_model` with the reason.

Example::

    routing = MoeRouting.install(model, replay=RoutingReplay.ROLLOUT)   # None for a dense model
    with routing.bind(experts_NLK, present_N):
        logits = model(input_ids=ids[None]).logits
    routing.stats.take()   # {"moe/routing_differs": 0.0, "moe/router_disagrees": 0.03, ...}
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.algorithms.kinds import RoutingReplay
from agentrl.train.moe_models import (
    ATTENTION_MODULES,
    REFUSED_MOE_TYPES,
    SUPPORTED_MOE_TYPES,
    check_moe_lora,
    check_moe_model,
    is_moe_config,
)

__all__ = [
    "ATTENTION_MODULES",
    "REFUSED_MOE_TYPES",
    "SUPPORTED_MOE_TYPES",
    "MoeRouting",
    "RoutingStats",
    "check_moe_lora",
    "check_moe_model",
    "fit_experts_kernel",
    "is_moe_config",
    "mark_routing_differences",
    "per_expert_weights",
    "recompute_binding",
    "routing_shares_prefix",
    "shared_prefix_routing",
]


@dataclasses.dataclass
class RoutingStats:
    """Routing figures summed over forwards until :meth:`take`: positions that had engine routing
    (``routed``), of those how many used experts that differ from the engine's in at least one layer
    (``used_differs``) and how many the trainer's router would have sent elsewhere
    (``router_differs``); positions without engine routing (``unrouted``)."""

    routed: int = 0
    used_differs: int = 0
    router_differs: int = 0
    unrouted: int = 0

    def take(self) -> dict[str, float]:
        """The figures as metrics (fractions of ``routed``), then reset."""
        n = max(self.routed, 1)
        out = {"moe/routing_differs": self.used_differs / n, "moe/router_disagrees": self.router_differs / n,
               "moe/routed_tokens": float(self.routed), "moe/unrouted_tokens": float(self.unrouted)}
        self.routed = self.used_differs = self.router_differs = self.unrouted = 0
        return out


@dataclasses.dataclass
class _Binding:
    """The engine's routing for the tokens of one forward pass, in the order the routers see them."""

    routing: MoeRouting
    experts: torch.Tensor | None  # [T, layers, top_k] long, or None: no engine routing at all
    present: torch.Tensor | None  # [T] bool
    real: torch.Tensor | None  # [T] bool: the tokens to count (padding excluded); None: all
    record: bool  # count this pass in the stats (not for an activation recompute)
    used_differs: torch.Tensor | None = None  # [T] bool, OR over layers
    router_differs: torch.Tensor | None = None
    tokens: int = 0  # tokens the routers saw (per layer)
    layer_counts: torch.Tensor | None = None  # [T] int: layers whose router differs (when collecting)
    collect: bool = False


_BINDING: contextvars.ContextVar[_Binding | None] = contextvars.ContextVar("agentrl_moe_binding", default=None)


def recompute_binding() -> contextlib.AbstractContextManager[object]:
    """The routing binding of the forward running now, as a context manager that re-establishes it
    (without counting it again): what a checkpointed forward enters when it is recomputed."""
    current = _BINDING.get()

    @contextlib.contextmanager
    def restore() -> Iterator[None]:
        token = _BINDING.set(None if current is None else dataclasses.replace(current, record=False))
        try:
            yield
        finally:
            _BINDING.reset(token)

    return restore()


def _same_sets(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[T] bool: whether rows of ``a`` and ``b`` ([T, k]) hold the same experts, in any order."""
    return (a.sort(dim=-1).values == b.sort(dim=-1).values).all(dim=-1)


class MoeRouting:
    """The routers of one mixture-of-experts model, patched to replay (or only compare) engine routing.

    ``replay``: :class:`~agentrl.algorithms.RoutingReplay`. Outside :meth:`bind` the routers route
    as the model does. ``stats`` accumulates :class:`RoutingStats` over the forwards bound with
    ``record=True``. Not thread-safe (one forward at a time, as a backend runs them).
    """

    def __init__(self, routers: dict[int, torch.nn.Module], *, num_layers: int, top_k: int, num_experts: int,
                 replay: RoutingReplay) -> None:
        self.routers = routers
        self.num_layers = num_layers
        self.top_k = top_k
        self.num_experts = num_experts
        self.replay = RoutingReplay(replay)
        self.stats = RoutingStats()
        for layer, router in routers.items():
            router.forward = self._router_forward(layer, router)  # type: ignore[method-assign]

    @classmethod
    def install(cls, model: torch.nn.Module, *, replay: RoutingReplay | str = RoutingReplay.OFF) -> MoeRouting | None:
        """Patch ``model``'s routers; None for a dense model. Raises ``ValueError`` for a mixture of
        experts this module cannot route (:func:`check_moe_model`)."""
        config = getattr(model, "config", None)
        if config is None or not is_moe_config(config):
            return None
        check_moe_model(config)
        from agentrl.train.recompute import decoder_layers

        routers: dict[int, torch.nn.Module] = {}
        for index, layer in enumerate(decoder_layers(model)):
            gate = getattr(getattr(layer, "mlp", None), "gate", None)
            if gate is not None and hasattr(gate, "top_k") and hasattr(gate, "weight"):
                routers[index] = gate
        if not routers:
            raise ValueError(f"model: a {config.model_type!r} config but no router found (expected mlp.gate with "
                             "top_k in its decoder layers)")
        return cls(routers, num_layers=int(config.num_hidden_layers), top_k=int(config.num_experts_per_tok),
                   num_experts=int(config.num_experts), replay=RoutingReplay(replay))

    @contextlib.contextmanager
    def collect(self, experts: torch.Tensor, present: torch.Tensor) -> Iterator[_Binding]:
        """Like :meth:`bind` (nothing counted in the stats), with the binding given back: after the
        forward, its ``layer_counts`` ``[T]`` holds per token the number of layers whose router
        chose other experts than ``experts`` (0 where ``present`` is False)."""
        with self.bind(experts, present, record=False):
            binding = _BINDING.get()
            assert binding is not None
            binding.collect = True
            binding.layer_counts = torch.zeros(experts.shape[0], dtype=torch.int32, device=experts.device)
            yield binding

    @contextlib.contextmanager
    def bind(self, experts: torch.Tensor | None, present: torch.Tensor | None, *, real: torch.Tensor | None = None,
             record: bool = True) -> Iterator[None]:
        """Route the tokens of the forward(s) inside with the engine's ``experts`` ``[T, layers, top_k]``
        (rows where ``present`` ``[T]`` is True): replayed when ``replay`` is ``rollout``, compared
        either way. ``experts=None``: no engine routing (the trainer routes, every token counted as
        unrouted). ``real`` ``[T]``: the tokens to count (a padded batch's padding is not);
        ``record=False``: count nothing."""
        if experts is not None:
            if experts.dim() != 3 or tuple(experts.shape[1:]) != (self.num_layers, self.top_k):
                raise ValueError(f"routed experts: rows of shape {tuple(experts.shape[1:])}; expected "
                                 f"({self.num_layers}, {self.top_k}) (layers, top_k) for this model")
            experts = experts.long()
            if present is None:
                present = torch.ones(experts.shape[0], dtype=torch.bool, device=experts.device)
            if experts.numel() and present.any():
                bad = experts[present]
                lo, hi = int(bad.min()), int(bad.max())
                if lo < 0 or hi >= self.num_experts:
                    raise ValueError(f"routed experts: ids in [{lo}, {hi}]; expected ids in [0, {self.num_experts}) "
                                     "(routing from another model?)")
        binding = _Binding(self, experts, present, real, record)
        token = _BINDING.set(binding)
        try:
            yield
        finally:
            _BINDING.reset(token)
        if record:
            self._count(binding)

    def _count(self, binding: _Binding) -> None:
        real = binding.real
        if binding.experts is None or binding.present is None:
            self.stats.unrouted += binding.tokens if real is None else int(real.sum())
            return
        present = binding.present if real is None else binding.present & real
        self.stats.routed += int(present.sum())
        self.stats.unrouted += int((~binding.present).sum()) if real is None else int((~binding.present & real).sum())
        if binding.used_differs is not None:
            self.stats.used_differs += int((binding.used_differs & present).sum())
        if binding.router_differs is not None:
            self.stats.router_differs += int((binding.router_differs & present).sum())

    def _router_forward(self, layer: int, router: torch.nn.Module) -> Any:
        top_k, normalize = int(router.top_k), bool(getattr(router, "norm_topk_prob", False))  # type: ignore[arg-type]

        def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            weight: torch.Tensor = router.weight  # type: ignore[assignment]
            hidden = hidden_states.reshape(-1, weight.shape[1])
            logits = F.linear(hidden, weight)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float)
            own_weights, own = torch.topk(probs, top_k, dim=-1)
            binding = _BINDING.get()
            weights, used = own_weights, own
            if binding is not None and binding.routing is self:
                binding.tokens = hidden.shape[0]
            if binding is not None and binding.routing is self and binding.experts is not None:
                engine, present = binding.experts[:, layer], binding.present
                assert present is not None
                if engine.shape[0] != hidden.shape[0]:
                    raise ValueError(f"routed experts: {engine.shape[0]} rows for a forward of {hidden.shape[0]} "
                                     f"tokens at layer {layer}; expected one row per token")
                if self.replay is RoutingReplay.ROLLOUT:
                    used = torch.where(present[:, None], engine, own)
                    weights = probs.gather(1, used)
                if binding.collect and binding.layer_counts is not None:
                    with torch.no_grad():
                        binding.layer_counts += (~_same_sets(own, engine) & present).int()
                if binding.record and not torch.compiler.is_compiling():
                    with torch.no_grad():
                        # replaying, the used experts are the engine's element for element where present
                        # (only those rows count): the check needs no sort
                        router_differs = ~_same_sets(own, engine)
                        used_differs = (used != engine).any(dim=-1) if self.replay is RoutingReplay.ROLLOUT \
                            else router_differs
                        binding.used_differs = used_differs if binding.used_differs is None else \
                            binding.used_differs | used_differs
                        binding.router_differs = router_differs if binding.router_differs is None else \
                            binding.router_differs | router_differs
            if normalize:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(logits.dtype), used

        return forward


def routing_shares_prefix(mb: Any) -> bool:
    """Whether a shared-prefix micro-batch's prefix can run once under the engine's routing: true
    without routing, or when every sequence's routing of the prefix agrees."""
    from agentrl.token_data import ROUTED_EXPERTS

    channel = mb.channels.get(ROUTED_EXPERTS)
    if mb.prefix is None or channel is None:
        return True
    return shared_prefix_routing(channel.values, channel.present, mb.document_lengths, mb.prefix.prefix_len,
                                 int(mb.prefix.suffix_ids.shape[1])) is not None


def shared_prefix_routing(
    experts: torch.Tensor, present: torch.Tensor, lengths: tuple[int, ...], prefix_len: int, width: int
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
    """The engine routing of a shared-prefix micro-batch in the order of its two passes: the prefix
    (``[P, layers, top_k]``, ``[P]``) and the right-padded suffix batch (``[k·width, ...]``, padding
    absent), from the packed rows ``experts`` ``[N, layers, top_k]`` of sequences of ``lengths``
    positions. None when the sequences' routing of the shared prefix differs (the prefix cannot run
    once then: each sequence keeps its own routing on the plain path)."""
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    prefix, prefix_present = experts[:prefix_len], present[:prefix_len]
    for start in starts[1:]:
        rows, flags = experts[start: start + prefix_len], present[start: start + prefix_len]
        if not torch.equal(flags, prefix_present) or not torch.equal(rows[flags], prefix[prefix_present]):
            return None
    k = len(lengths)
    suffix = experts.new_zeros((k * width, *experts.shape[1:]))
    suffix_present = present.new_zeros(k * width)
    for s, (start, n) in enumerate(zip(starts, lengths, strict=True)):
        m = n - prefix_len
        suffix[s * width: s * width + m] = experts[start + prefix_len: start + n]
        suffix_present[s * width: s * width + m] = present[start + prefix_len: start + n]
    return (prefix, prefix_present), (suffix, suffix_present)


def fit_experts_kernel(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Run ``model``'s experts through a kernel that takes ``dtype``: transformers' default grouped
    GEMM (``grouped_mm``) takes float32/bfloat16/float16 only, so a float64 model (exact tests) runs
    its experts one by one (``eager``). Nothing changes for a dense model or another dtype."""
    config = getattr(model, "config", None)
    setter = getattr(model, "set_experts_implementation", None)
    if config is None or setter is None or not is_moe_config(config):
        return
    if dtype == torch.float64 and getattr(config, "_experts_implementation", None) != "eager":
        setter("eager")


def per_expert_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` with transformers' stacked expert tensors split by expert, under the names the
    published checkpoints (and SGLang's loader) use: ``...mlp.experts.gate_up_proj`` ``[E, 2I, H]``
    becomes ``...mlp.experts.{e}.gate_proj.weight`` (rows ``[:I]``) and ``up_proj.weight`` (rows
    ``[I:]``), ``...mlp.experts.down_proj`` ``[E, H, I]`` becomes ``...mlp.experts.{e}.down_proj.weight``;
    views, no copies. Every other weight passes as it is. (SGLang skips a stacked name without a word:
    a weight update in transformers' own names would leave the engine's experts as they were.)"""
    for name, tensor in weights:
        prefix, _, last = name.rpartition(".")
        if prefix.endswith("mlp.experts") and last in ("gate_up_proj", "down_proj") and tensor.dim() == 3:
            if last == "down_proj":
                for e in range(tensor.shape[0]):
                    yield f"{prefix}.{e}.down_proj.weight", tensor[e]
            else:
                half = tensor.shape[1] // 2
                for e in range(tensor.shape[0]):
                    yield f"{prefix}.{e}.gate_proj.weight", tensor[e, :half]
                    yield f"{prefix}.{e}.up_proj.weight", tensor[e, half:]
        else:
            yield name, tensor


def mark_routing_differences(backend: Any, sequences: Iterable[Any]) -> int:
    """Score ``sequences`` (trajectories with the engine's ``routed_experts``) on ``backend`` (a
    :class:`~agentrl.train.TorchTrainBackend` of a mixture of experts) and write, per position with
    engine routing, the number of layers whose trainer router picks other experts into their
    ``routing_differs`` channel: what the viewer's "routing" toggle underlines. Returns how many
    positions differ in at least one layer."""
    from agentrl.token_data import ROUTED_EXPERTS, ROUTING_DIFFERS
    from agentrl.train.batching import TrainingBatch, TrainSequence

    trajectories = [t for t in sequences if ROUTED_EXPERTS in t.channels and len(t.tokens) > 1]
    if not trajectories:
        return 0
    batch = TrainingBatch.from_sequences([
        TrainSequence(tokens=list(t.tokens), loss_mask=[0] * len(t.tokens), rollout_logprobs=[0.0] * len(t.tokens),
                      advantages=[0.0] * len(t.tokens), rollout_id=f"mark-{i}", group_id="mark", reward=0.0,
                      denominator=1.0, channels={ROUTED_EXPERTS: t.channels[ROUTED_EXPERTS]})
        for i, t in enumerate(trajectories)])
    differing = 0
    for traj, counts in zip(trajectories, backend.routing_differences(batch), strict=True):
        present = traj.channels[ROUTED_EXPERTS].present
        for start, end in traj.channels[ROUTED_EXPERTS].spans():
            traj.write_channel(ROUTING_DIFFERS, start, counts[start:end].astype("uint8"))
        differing += int(((counts > 0) & present).sum())
    return differing
