"""The ``teacher`` section of the run config: on-policy distillation.

The student samples as in any run; a teacher scores every sampled token, and the step's advantage
becomes ``A_t = c·A^task_t + β·(log π_T − log μ)`` (:mod:`agentrl.algorithms.distill`): ``coef`` is β,
``task_reward`` sets ``c`` (``false``: the teacher alone). Where the teacher runs (``kind``):

- ``model``: a Hugging Face folder (``path``) loaded by the trainer like the reference model and run
  on its scoring path after each step's rollouts (:class:`~agentrl.train.TeacherModel`; torch backend);
- ``engines``: the folder served on SGLang engines of its own (``engines``: how many and how each
  starts, as ``rollout.engines``), scoring by prefill with input-token logprobs; they are placed like
  rollout engines and shown in the dry run's device map and memory plan;
- ``endpoint``: SGLang-compatible servers already running (``urls``) that score token ids by prefill;
- ``self``: self-distillation, the student itself (the run's own engines) given a privileged prefix,
  ``privileged``: a message (``privileged_role``) filled from the task row with ``str.format``
  (``"The answer is {answer}."``) and placed before the conversation.

The teacher must share the student's tokenizer and chat template (``template``: ``None`` is
``model.template``, the only accepted value); a teacher that does not is refused before anything
starts, in one line naming the difference (:mod:`agentrl.runner.teacher_check`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentrl._config import Section, TemplateName
from agentrl.runner._rollout_sections import EnginesSection

__all__ = ["TeacherKind", "TeacherSection"]

TeacherKind = Literal["model", "engines", "endpoint", "self"]


class TeacherSection(Section):
    """On-policy distillation's teacher (see the module doc)."""

    kind: TeacherKind = "model"
    path: str | None = Field(default=None, min_length=1)
    urls: tuple[str, ...] = ()
    coef: float = Field(default=1.0, gt=0.0)
    task_reward: bool = False
    template: TemplateName | None = None
    privileged: str | None = Field(default=None, min_length=1)
    privileged_role: Literal["system", "user"] = "system"
    engines: EnginesSection = Field(default_factory=EnginesSection)

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> TeacherSection:
        kind, out = self.kind, []
        needs_path = kind in ("model", "engines")
        if needs_path and self.path is None:
            out.append(f"path=None with kind={kind!r}: expected the teacher's Hugging Face folder")
        if not needs_path and self.path is not None:
            out.append(f"path={self.path!r} with kind={kind!r}: expected None (the {kind} teacher has no folder "
                       "of its own)")
        if kind == "endpoint" and not self.urls:
            out.append("urls=() with kind='endpoint': expected the SGLang-compatible servers' URLs, e.g. "
                       "['http://127.0.0.1:30000']")
        if kind != "endpoint" and self.urls:
            out.append(f"urls={list(self.urls)} with kind={kind!r}: expected none (only an 'endpoint' teacher is "
                       "reached by URL)")
        bad = [u for u in self.urls if not u.startswith(("http://", "https://"))]
        if bad:
            out.append(f"urls: {bad[0]!r} is not an http(s) URL; expected e.g. 'http://127.0.0.1:30000'")
        if kind == "self" and self.privileged is None:
            out.append("privileged=None with kind='self': expected the privileged text the teacher reads, a format "
                       "string over the task row, e.g. 'The answer is {answer}.'")
        if kind != "self" and self.privileged is not None:
            out.append(f"privileged={self.privileged!r} with kind={kind!r}: expected None (only a 'self' teacher "
                       "reads a privileged prefix)")
        if self.engines.urls:
            out.append("engines.urls: expected none; a teacher reached by URL is kind='endpoint' with urls=[...]")
        if out:
            raise ValueError("; ".join(out))
        return self

    @property
    def on_trainer(self) -> bool:
        """The trainer scores (``model``); otherwise the rollout side does (engines, endpoint, self)."""
        return self.kind == "model"
