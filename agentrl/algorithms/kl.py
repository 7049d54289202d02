"""Per-token KL estimators between the policy and a reference policy.

With ``x = logprobs - ref_logprobs`` for tokens sampled from the policy:

======================  ======================  =====================================================
kind                    value                   gradient through ``logprobs`` (as a loss)
======================  ======================  =====================================================
``"k1"``                ``x``                   ``∇ℓ``: zero in expectation, pure noise
``"k2"``                ``x² / 2``              ``x ∇ℓ``: the reverse KL ``KL(π‖π_ref)``
``"k3"``                ``e^{-x} - 1 + x``      ``(1 - e^{-x}) ∇ℓ``: the *forward* KL ``KL(π_ref‖π)``
``"low_var_kl"``        ``clamp(k3, -10, 10)``  as k3 inside the clamp, zero outside
======================  ======================  =====================================================

Use as a reward penalty (``r_t -= β·kl(...).detach()``, usually k1) or as a loss term
(``loss += β·reduce(kl(...))``, the GRPO convention); never both at once.
"""

from __future__ import annotations

import torch

from agentrl.algorithms.kinds import KL_KINDS, KLKind

__all__ = ["KLKind", "kl"]

_KINDS = KL_KINDS


def kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k1") -> torch.Tensor:
    """Return the per-token KL estimate of ``kind``; same shape as the (broadcast) inputs.

    Masking is the caller's business (pass the result to :func:`reduce_loss` with the loss mask).
    """
    if kind not in _KINDS:
        raise ValueError(f"kind: expected one of {list(_KINDS)}, got {kind!r}")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"ref_logprobs: expected the shape of logprobs {tuple(logprobs.shape)}, got {tuple(ref_logprobs.shape)}"
        )
    x = logprobs - ref_logprobs
    if kind == "k1":
        return x
    if kind == "k2":
        return 0.5 * x * x
    k3 = torch.expm1(-x) + x
    if kind == "k3":
        return k3
    return torch.clamp(k3, min=-10.0, max=10.0)
