"""Mixture-of-experts training on the megatron backend: rollout routing replay and its metrics.

An engine and a trainer with the same weights still route some tokens to different experts (other
kernels, other precision, near-tied router scores); the importance ratios of those tokens then
compare two different networks. Routing replay makes the trainer use the experts the engine used:
the trajectory's ``routed_experts`` channel (:data:`agentrl.token_data.ROUTED_EXPERTS`, one
``[layers, top_k]`` row of expert ids per position, position-aligned: the row at ``t`` is the
routing of the forward pass that read token ``t``) reaches the backend as
``MicroBatch.channels[ROUTED_EXPERTS]``, and each MoE layer's router takes its top-k *index set* from
there.

Contract of a replayed forward (:func:`token_replay`, megatron-core's ``RouterReplay`` hook, which
``TopKRouter`` calls in place of its ``topk``):

- only the index sets are replayed; the gate weights are recomputed from the trainer's own router
  logits over the replayed experts (Qwen3: the softmax of the k replayed logits), so the router
  still receives gradient through them;
- every forward replays: the policy's training forward, the old-policy and reference scoring
  forwards, and the recomputation of checkpointed layers during the backward pass (megatron-core's
  ``REPLAY_BACKWARD`` action: each training forward queues its rows, each recomputation takes the
  oldest; Megatron's schedules run backward passes in forward order);
- a position without routing (``present`` False: an environment span the engine never prefilled, a
  trajectory recorded before routing existed, the last sampled token) is routed by the trainer and
  counted (``moe/unrouted_tokens``); nothing is dropped silently.

With ``loss.routing_replay`` ``off`` the routers choose for themselves and the same hook only measures.
Metrics of a training step (summed over the step's micro-batches and data-parallel ranks; the
torch backend's names): ``moe/routed_tokens`` (positions with engine routing),
``moe/unrouted_tokens`` (positions without), ``moe/unrouted_sequences``, ``moe/routing_differs``
(fraction of the routed positions whose experts in the trainer's forward differ from the engine's in
at least one layer: measured with replay off, 0 by construction with it on, and checked),
``moe/router_disagrees`` (the same fraction for the experts the trainer's router would have chosen
itself: what replay corrects) and ``moe/replay`` (1 with replay on).

Load balancing: no auxiliary loss (``moe_aux_loss_coeff=0``, ``moe_router_load_balancing_type=
"none"``). RL fine-tunes a router that pre-training already balanced, with a small learning rate;
the auxiliary loss's gradient would pull the router toward uniform load regardless of the reward,
move routing away from the engine that sampled the batch, and add a term that is not part of the
policy objective (nor of its per-rollout denominators). Peers default to 0 for RL as well.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from agentrl.token_data import ROUTED_EXPERTS
from agentrl.train.packing import MicroBatch

__all__ = ["MoeRouting", "RoutingCounts", "check_routing_channels", "resolve_grouped_gemm", "step_routing_metrics",
           "token_replay"]

TopK = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def resolve_grouped_gemm(choice: bool | None, device: torch.device) -> bool:
    """Whether experts run as one grouped GEMM: ``choice``, or (``None``) where Transformer Engine and
    CUDA are there. ``ValueError`` when grouped is asked for without them."""
    try:
        has_te = importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        has_te = False
    usable = has_te and device.type == "cuda"
    if choice is None:
        return usable
    if choice and not usable:
        raise ValueError(f"moe_grouped_gemm=True: needs the transformer_engine package and a CUDA device; got device "
                         f"{device.type}, transformer_engine installed: {has_te}; use moe_grouped_gemm=None or False")
    return choice


def _sets_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: row ``i`` of ``a`` and of ``b`` (``[N, k]`` expert ids) are different sets."""
    return (a.sort(dim=-1).values != b.sort(dim=-1).values).any(dim=-1)


class _Rows:
    """One micro-batch's replay rows for one layer: ``targets`` ``[N, k]`` (the channel's integer type, a
    view) and ``present`` ``[N]``."""

    __slots__ = ("present", "targets")

    def __init__(self, targets: torch.Tensor | None, present: torch.Tensor | None) -> None:
        self.targets, self.present = targets, present


@functools.cache
def token_replay() -> type:
    """:class:`TokenReplay`'s class, built on megatron-core's ``RouterReplay`` on first use (so importing
    this module needs no megatron-core)."""
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    class TokenReplay(RouterReplay):  # type: ignore[misc]
        """One MoE layer's router hook (see the module doc): replays present rows when ``replay``,
        records per position whether the used and the router's own expert sets differ from the
        engine's. Driven by its model's :class:`MoeRouting` only, not by ``RouterReplay``'s
        process-wide static helpers (two models in one process must not share hooks)."""

        def __init__(self, layer: int, replay: bool) -> None:
            super().__init__()
            RouterReplay.global_router_replay_instances.remove(self)
            self.layer, self.replay = layer, replay
            self.rows = _Rows(None, None)
            self.queue: list[_Rows] = []
            self.recording = False
            self.own_differs: torch.Tensor | None = None
            self.used_differs: torch.Tensor | None = None

        def get_replay_topk(self, scores: torch.Tensor, topk: int, num_groups: int | None = None,
                            group_topk: int | None = None, default_compute_topk: TopK | None = None,
                            ) -> tuple[torch.Tensor, torch.Tensor]:
            assert default_compute_topk is not None
            recomputing = self.router_replay_action == RouterReplayAction.REPLAY_BACKWARD
            rows = self.queue.pop(0) if recomputing and self.queue else self.rows
            own_probs, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
            if rows.targets is None or rows.present is None:
                return own_probs, own
            targets = rows.targets.to(device=scores.device, dtype=torch.long)
            if targets.shape != own.shape:
                raise ValueError(f"channels[{ROUTED_EXPERTS!r}]: {tuple(targets.shape)} expert ids for layer "
                                 f"{self.layer}; the router scores {tuple(own.shape)} (tokens, top_k)")
            present = rows.present.to(scores.device)
            used = torch.where(present[:, None], targets, own) if self.replay else own
            if self.recording and not recomputing:
                self.own_differs = _sets_differ(own, targets) & present
                self.used_differs = _sets_differ(used, targets) & present
            if not self.replay:
                return own_probs, own
            return scores.gather(1, used), used

    return TokenReplay


@dataclass
class RoutingCounts:
    """A step's routing tallies on this rank (token flags OR-ed over the stage's layers)."""

    own_differs: list[torch.Tensor] = field(default_factory=list)
    used_differs: list[torch.Tensor] = field(default_factory=list)
    present: list[torch.Tensor] = field(default_factory=list)
    missing_sequences: int = 0


class MoeRouting:
    """The MoE routers of one model stage and their replay hooks (see the module doc).

    ``model``: an unwrapped ``GPTModel`` stage; ``replay``: replay the engine's experts. Call
    :meth:`before_forward` / :meth:`after_forward` around each micro-batch's forward (the schedule
    does), :meth:`start` / :meth:`finish` around a schedule run. Not thread-safe.
    """

    def __init__(self, model: Any, *, replay: bool) -> None:
        from megatron.core.transformer.moe.router_replay import RouterReplay

        cls = token_replay()
        self.replay = replay
        self.hooks: list[Any] = []
        for layer in model.decoder.layers:
            router = getattr(getattr(layer, "mlp", None), "router", None)
            if router is None:
                continue
            old = router.router_replay
            if isinstance(old, RouterReplay) and old in RouterReplay.global_router_replay_instances:
                RouterReplay.global_router_replay_instances.remove(old)
            hook = cls(int(layer.layer_number) - 1, replay)
            router.router_replay = hook
            self.hooks.append(hook)
        self.counts = RoutingCounts()
        self.recording = False

    def start(self, *, record: bool) -> None:
        """A schedule run begins; ``record``: tally this run's routing (the training forward)."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        self.recording = record
        self.counts = RoutingCounts()
        for hook in self.hooks:
            hook.queue.clear()
            hook.recording = record
            hook.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def before_forward(self, mb: MicroBatch) -> None:
        """Hand this micro-batch's rows to every router of the stage (and queue them for recomputation)."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        channel = mb.channels.get(ROUTED_EXPERTS)
        for hook in self.hooks:
            if channel is None or mb.padding:
                rows = _Rows(None, None)
            else:
                rows = _Rows(channel.values[:, hook.layer, :], channel.present)  # uint8 view: long on use
            hook.rows = rows
            hook.own_differs = hook.used_differs = None
            if torch.is_grad_enabled():
                hook.queue.append(rows)
            hook.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def after_forward(self, mb: MicroBatch) -> None:
        """The forward is done: later router calls are recomputations; tally the micro-batch."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for hook in self.hooks:
            hook.set_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
        if not self.recording or mb.padding:
            return
        n = mb.num_tokens
        channel = mb.channels.get(ROUTED_EXPERTS)
        present = (channel.present.to(torch.bool) if channel is not None
                   else torch.zeros(n, dtype=torch.bool, device=mb.input_ids.device))
        own = torch.zeros(n, dtype=torch.bool, device=present.device)
        used = torch.zeros_like(own)
        for hook in self.hooks:
            if hook.own_differs is not None:
                own |= hook.own_differs
                used |= hook.used_differs
        self.counts.own_differs.append(own)
        self.counts.used_differs.append(used)
        self.counts.present.append(present)
        missing = torch.zeros(len(mb.document_lengths), dtype=torch.long, device=present.device)
        missing.index_add_(0, mb.sequence_ids, (~present).long())
        self.counts.missing_sequences += int((missing > 0).sum())

    def finish(self) -> None:
        """The schedule run is over: drop queued rows, route by the trainer until the next run."""
        for hook in self.hooks:
            hook.queue.clear()
            hook.rows = _Rows(None, None)
            hook.clear_router_replay_action()


def step_routing_metrics(routings: Sequence[MoeRouting], layout: Any, device: torch.device, *,
                         replay: bool) -> dict[str, float]:
    """The step's routing metrics (module doc) from every stage's tallies: token flags OR-ed over the
    pipeline stages, counts summed over the world from the reporting ranks. Collective."""
    counts = routings[0].counts
    if counts.present:
        own = torch.cat(counts.own_differs).to(device=device, dtype=torch.int32)
        used = torch.cat(counts.used_differs).to(device=device, dtype=torch.int32)
        present = torch.cat(counts.present).to(device=device, dtype=torch.int32)
    else:
        own = used = present = torch.zeros(0, dtype=torch.int32, device=device)
    flags = torch.stack([own, used])
    if layout.pp_size > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=layout.pp_group)
    sums = torch.zeros(5, dtype=torch.float64, device=device)
    if layout.reports:
        present_b = present.bool()
        sums[0] = float(present_b.sum())
        sums[1] = float((~present_b).sum())
        sums[2] = float(counts.missing_sequences)
        sums[3] = float(flags[1][present_b].sum())
        sums[4] = float(flags[0][present_b].sum())
    if dist.get_world_size() > 1:
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    tokens = float(sums[0])
    metrics = {"moe/routed_tokens": tokens, "moe/unrouted_tokens": float(sums[1]),
               "moe/unrouted_sequences": float(sums[2]),
               "moe/routing_differs": float(sums[3]) / tokens if tokens else 0.0,
               "moe/router_disagrees": float(sums[4]) / tokens if tokens else 0.0, "moe/replay": float(replay)}
    if replay and sums[3] > 0:
        raise RuntimeError(f"routing replay: {int(sums[3])} of {int(tokens)} replayed positions were routed to other "
                           "experts than the engine's; replay is broken")
    return metrics


def check_routing_channels(sequences: Sequence[Any], *, layers: int, top_k: int, experts: int) -> None:
    """Raise ``ValueError`` naming the sequence when a ``routed_experts`` channel does not fit the model:
    rows of ``[layers, top_k]``, expert ids below ``experts``."""
    for i, seq in enumerate(sequences):
        channel = seq.channels.get(ROUTED_EXPERTS)
        if channel is None:
            continue
        what = f"batch.sequences[{i}].channels[{ROUTED_EXPERTS!r}] (rollout {seq.rollout_id!r})"
        if tuple(channel.row_shape) != (layers, top_k):
            raise ValueError(f"{what}: rows of shape {tuple(channel.row_shape)}; the model routes {top_k} experts in "
                             f"each of {layers} layers, expected ({layers}, {top_k})")
        if channel.num_present:
            top = int(channel.values[channel.present].max())
            if top >= experts:
                raise ValueError(f"{what}: expert id {top}; the model has {experts} experts (ids 0..{experts - 1})")
