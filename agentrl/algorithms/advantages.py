"""From rewards to advantages: GRPO group normalisation, REINFORCE++, GAE.

Group statistics key on the explicit group id, never on positions in the flat batch, so uneven
groups (after filtering, aborts or failures) are handled. With fan-out, one rollout yields several
training sequences that share a ``rollout_id``; pass ``rollout_ids`` and each rollout contributes
its reward **once** to its group's mean and standard deviation.

Standard deviation is the unbiased one (``/(n-1)``, as ``torch.std``). Groups of one rollout and
groups whose rewards are all equal give advantage 0.

Token-level estimators treat positions with ``loss_mask == 0`` (tool output, scaffold) as
transparent: they carry no reward, no value and no discount step, and get advantage 0.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

__all__ = [
    "gae_advantages",
    "group_advantages",
    "masked_whiten",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
]


def _as_vector(name: str, values: torch.Tensor | Sequence[float]) -> torch.Tensor:
    t = values if isinstance(values, torch.Tensor) else torch.tensor(list(values), dtype=torch.float64)
    if t.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of per-sequence values, got shape {tuple(t.shape)}")
    return t


def _keys(name: str, ids: torch.Tensor | Sequence[Hashable], n: int) -> list[Hashable]:
    keys: list[Hashable] = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    if len(keys) != n:
        raise ValueError(f"{name}: expected {n} ids (one per reward), got {len(keys)}")
    for i, k in enumerate(keys):
        if k is None:
            raise ValueError(f"{name}[{i}]: missing id (None); every training sequence needs one")
    return keys


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | Sequence[Hashable],
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
    rollout_ids: torch.Tensor | Sequence[Hashable] | None = None,
) -> torch.Tensor:
    """GRPO advantages ``(r_i - μ_g) / (σ_g + eps)`` (or ``r_i - μ_g`` without ``std_normalize``).

    ``rewards`` and ``group_ids`` (and ``rollout_ids``) are aligned per training sequence. Returns a
    tensor of ``rewards``' length (float64 unless ``rewards`` is a float tensor of another dtype).
    Sequences sharing a rollout id must share its reward and group, else ``ValueError``.
    """
    r = _as_vector("rewards", rewards)
    if not r.is_floating_point():
        r = r.double()
    n = r.shape[0]
    groups = _keys("group_ids", group_ids, n)
    rollouts = _keys("rollout_ids", rollout_ids, n) if rollout_ids is not None else list(range(n))
    values = r.tolist()
    # One reward per (group, rollout): the first occurrence; later ones must agree.
    per_rollout: dict[Hashable, tuple[Hashable, float]] = {}
    for i, (g, rid, val) in enumerate(zip(groups, rollouts, values, strict=True)):
        seen = per_rollout.setdefault(rid, (g, val))
        if seen[0] != g:
            raise ValueError(f"group_ids[{i}]: rollout {rid!r} appears in groups {seen[0]!r} and {g!r}")
        if seen[1] != val and not (seen[1] != seen[1] and val != val):
            raise ValueError(f"rewards[{i}]: rollout {rid!r} has rewards {seen[1]!r} and {val!r}; expected one")
    members: dict[Hashable, list[float]] = {}
    for g, val in per_rollout.values():
        members.setdefault(g, []).append(val)
    stats: dict[Hashable, tuple[float, float]] = {}
    for g, vals in members.items():
        t = torch.tensor(vals, dtype=torch.float64)
        mean = float(t.mean())
        std = float(t.std(unbiased=True)) if len(vals) > 1 else 0.0
        stats[g] = (mean, std)
    out = torch.empty(n, dtype=torch.float64)
    for i, (g, val) in enumerate(zip(groups, values, strict=True)):
        mean, std = stats[g]
        # Singletons and constant groups are exactly 0, not a rounding residue of the mean.
        constant = len(members[g]) == 1 or min(members[g]) == max(members[g])
        centred = 0.0 if constant else val - mean
        out[i] = centred / (std + eps) if std_normalize else centred
    return out.to(device=r.device, dtype=r.dtype)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, *, eps: float = 1e-8, stats: tuple[float, float] | None = None
) -> torch.Tensor:
    """``(values - mean_m) / (std_m + eps)`` on masked positions, 0 elsewhere.

    ``stats = (mean, std)`` lets a data-parallel caller pass global statistics reduced across ranks;
    by default they are the masked (unbiased) statistics of this tensor.
    """
    if mask.shape != values.shape:
        raise ValueError(f"mask: expected shape {tuple(values.shape)}, got {tuple(mask.shape)}")
    m = mask.bool()
    if stats is None:
        picked = values[m].double()
        mean = float(picked.mean()) if picked.numel() else 0.0
        std = float(picked.std(unbiased=True)) if picked.numel() > 1 else 0.0
    else:
        mean, std = stats
    out = (values - mean) / (std + eps)
    return torch.where(m, out, torch.zeros_like(out))


def _discounted_returns(rewards_ST: torch.Tensor, mask_ST: torch.Tensor, gamma: float) -> torch.Tensor:
    out = torch.zeros_like(rewards_ST)
    running = torch.zeros_like(rewards_ST[:, 0])
    m = mask_ST.bool()
    for t in range(rewards_ST.shape[1] - 1, -1, -1):
        step = rewards_ST[:, t] + gamma * running
        running = torch.where(m[:, t], step, running)
        out[:, t] = torch.where(m[:, t], running, torch.zeros_like(running))
    return out


def _last_trainable(mask_ST: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(mask_ST.shape[1], device=mask_ST.device).expand_as(mask_ST)
    return torch.where(mask_ST.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values


def _token_rewards(
    rewards: torch.Tensor, loss_mask: torch.Tensor, *, kl: torch.Tensor | None, kl_coef: float
) -> torch.Tensor:
    """Float64 ``[S, T]`` token rewards: ``-β·k_t`` on trainable tokens, plus each row's sequence
    reward on its last trainable token (rows without one get none)."""
    mask = loss_mask.to(torch.float64)
    token_rewards = torch.zeros_like(mask)
    if kl is not None and kl_coef:
        token_rewards = token_rewards - kl_coef * kl.detach().double() * mask
    last = _last_trainable(loss_mask)
    rows = torch.nonzero(last >= 0).squeeze(1)
    token_rewards[rows, last[rows]] += rewards.double()[rows]
    return token_rewards


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    whiten: bool = True,
) -> torch.Tensor:
    """REINFORCE++ per token for ``[S, T]`` rows: ``r_t = -β·k_t·m_t``, the sequence reward added at
    the last trainable token, ``A_t = Σ_{u≥t} γ^{u-t} r_u`` over trainable tokens, then masked
    whitening over the whole batch (``whiten``)."""
    token_rewards = _token_rewards(rewards, loss_mask, kl=kl, kl_coef=kl_coef)
    adv = _discounted_returns(token_rewards, loss_mask, gamma)
    return masked_whiten(adv, loss_mask) if whiten else adv


def reinforce_pp_baseline_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | Sequence[Hashable],
    loss_mask: torch.Tensor,
    *,
    rollout_ids: torch.Tensor | Sequence[Hashable] | None = None,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    whiten: bool = True,
) -> torch.Tensor:
    """REINFORCE++-baseline: ``A_t = (r_i - μ_g) - β·k_t`` (group mean only), whitened over the batch."""
    centred = group_advantages(rewards, group_ids, std_normalize=False, rollout_ids=rollout_ids)
    adv = centred.double()[:, None].expand(loss_mask.shape).clone()
    if kl is not None and kl_coef:
        adv = adv - kl_coef * kl.detach().double()
    adv = torch.where(loss_mask.bool(), adv, torch.zeros_like(adv))
    return masked_whiten(adv, loss_mask) if whiten else adv


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE for ``[S, T]`` rows: ``(advantages, returns)``.

    Over the trainable positions of a row (others are skipped): ``δ_t = r_t + γ·V_next - V_t``
    (``V`` after the last trainable token is 0), ``A_t = δ_t + γλ·A_next``, ``R_t = A_t + V_t``.
    Non-trainable positions get 0 in both outputs; put the sequence reward on the last trainable
    token of ``token_rewards``.
    """
    if not (token_rewards.shape == values.shape == loss_mask.shape):
        raise ValueError(
            f"values/loss_mask: expected the shape of token_rewards {tuple(token_rewards.shape)}, "
            f"got {tuple(values.shape)} and {tuple(loss_mask.shape)}"
        )
    m = loss_mask.bool()
    v = values.detach()
    adv = torch.zeros_like(v)
    next_value = torch.zeros_like(v[:, 0])
    next_adv = torch.zeros_like(v[:, 0])
    for t in range(v.shape[1] - 1, -1, -1):
        delta = token_rewards[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        next_adv = torch.where(m[:, t], a, next_adv)
        next_value = torch.where(m[:, t], v[:, t], next_value)
        adv[:, t] = torch.where(m[:, t], a, torch.zeros_like(a))
    returns = torch.where(m, adv + v, torch.zeros_like(adv))
    return adv, returns
