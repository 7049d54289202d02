"""On-policy distillation: per-token advantages from a teacher's logprobs of the student's own samples.

The student samples ``y ~ μ`` (the behaviour policy: the engine's weights when it sampled); a
teacher ``π_T`` scores every sampled token. The per-token reverse KL to the teacher, estimated on
the sample, is ``k_t = log μ(y_t | y_<t) − log π_T(y_t | y_<t)``, and its negative is the
distillation advantage (discount 0: each token's own term, no return; not group-normalised)::

    A^KL_t = log π_T(y_t | y_<t) − log μ(y_t | y_<t)          on sampled tokens, 0 elsewhere
    A_t    = c · A^task_t + β · A^KL_t                         c = 1 (task reward and teacher) or 0 (teacher alone)

``log μ`` is the engine's sampling logprob (data, detached); the mixed advantage goes through the
estimator's loss unchanged (importance ratio against the recomputed old logprobs, clipping, TIS/MIS).
Tokens the environment wrote (tool output, scaffold) have loss mask 0 and are never scored as the
student's: their advantage stays 0.

Every function here is a pure function of tensors (``[S, T]`` rows of sequences × positions).

Example::

    a_kl = distillation_advantages(teacher_ST, behaviour_ST, mask_ST)
    adv = mix_advantages(task_ST, a_kl, coef=1.0, task=True)
    metrics = distillation_metrics(teacher_ST, behaviour_ST, mask_ST, task_ST, a_kl, coef=1.0)
"""

from __future__ import annotations

import math

import torch

__all__ = ["distillation_advantages", "distillation_metrics", "mix_advantages"]


def _check_shapes(**tensors: torch.Tensor) -> torch.Size:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    for name, shape in shapes.items():
        if shape != first:
            raise ValueError(f"{name}: expected shape {first} (that of {next(iter(shapes))}), got {shape}")
    if len(first) != 2:
        raise ValueError(f"{next(iter(shapes))}: expected [S, T] rows, got shape {first}")
    return torch.Size(first)


def distillation_advantages(teacher_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                            mask: torch.Tensor) -> torch.Tensor:
    """``A^KL_t = log π_T − log μ`` where ``mask`` is set, 0 elsewhere; float64 ``[S, T]``, detached.

    ``mask`` marks the sampled (trainable) tokens the teacher scored. Raises ``ValueError`` on shape
    mismatch or a non-finite logprob under the mask."""
    _check_shapes(teacher_logprobs=teacher_logprobs, behaviour_logprobs=behaviour_logprobs, mask=mask)
    m = mask.bool()
    teacher, behaviour = teacher_logprobs.detach().double(), behaviour_logprobs.detach().double()
    for name, values in (("teacher_logprobs", teacher), ("behaviour_logprobs", behaviour)):
        bad = m & ~torch.isfinite(values)
        if bool(bad.any()):
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{name}[{row}, {col}] = {float(values[row, col])!r}; expected a finite logprob on "
                             "every sampled token")
    diff = teacher - behaviour
    return torch.where(m, diff, torch.zeros_like(diff))


def mix_advantages(task_advantages: torch.Tensor, distill_advantages: torch.Tensor, *, coef: float,
                   task: bool = True) -> torch.Tensor:
    """``A = c·A^task + β·A^KL`` with ``β = coef`` and ``c = 1`` if ``task`` else 0 (pure distillation)."""
    _check_shapes(task_advantages=task_advantages, distill_advantages=distill_advantages)
    if not (isinstance(coef, (int, float)) and not isinstance(coef, bool) and math.isfinite(coef) and coef >= 0):
        raise ValueError(f"coef: expected a finite number >= 0 (β, the teacher's weight), got {coef!r}")
    base = task_advantages.double() if task else torch.zeros_like(task_advantages, dtype=torch.float64)
    return base + float(coef) * distill_advantages.double()


def distillation_metrics(teacher_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor,
                         task_advantages: torch.Tensor, distill_advantages: torch.Tensor, *, coef: float,
                         task: bool = True) -> dict[str, float]:
    """Per-step figures over the scored sampled tokens (``mask``):

    - ``reverse_kl``: mean ``log μ − log π_T`` (the k1 estimate of ``KL(μ ‖ π_T)`` per token);
    - ``teacher_logprob`` / ``student_logprob``: mean ``log π_T`` and ``log μ`` of the sampled tokens;
    - ``teacher_share``: ``Σ|β·A^KL| / (Σ|c·A^task| + Σ|β·A^KL|)``, the share of the advantage's
      magnitude that came from the teacher (0 when both are 0);
    - ``tokens``: how many tokens were scored.

    With no scored token every mean is NaN and ``tokens`` is 0."""
    _check_shapes(teacher_logprobs=teacher_logprobs, behaviour_logprobs=behaviour_logprobs, mask=mask,
                  task_advantages=task_advantages, distill_advantages=distill_advantages)
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return {"reverse_kl": math.nan, "teacher_logprob": math.nan, "student_logprob": math.nan,
                "teacher_share": math.nan, "tokens": 0.0}
    teacher, behaviour = teacher_logprobs.double()[m], behaviour_logprobs.double()[m]
    from_teacher = float((float(coef) * distill_advantages.double()).abs()[m].sum())
    from_task = float(task_advantages.double().abs()[m].sum()) if task else 0.0
    total = from_teacher + from_task
    return {"reverse_kl": float((behaviour - teacher).mean()), "teacher_logprob": float(teacher.mean()),
            "student_logprob": float(behaviour.mean()), "teacher_share": from_teacher / total if total > 0 else 0.0,
            "tokens": float(n)}
