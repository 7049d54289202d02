"""One prompt group side by side: the G answers to one prompt, their rewards and advantages.

The advantages are GRPO's group normalisation, ``(r_i - mean) / (std + eps)`` over the group's
rollouts (each rollout once, however many sequences it forked into), computed with
:func:`agentrl.algorithms.group_advantages` — the function the trainer uses — and the run's
``algorithm.std_normalize`` / ``algorithm.advantage_eps`` when the run folder's config has them.
Members without a reward get no advantage.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl.episode import Episode
from agentrl.inspect._style import CSS
from agentrl.inspect.calls import message_text
from agentrl.inspect.html import episode_html

if TYPE_CHECKING:
    from agentrl.inspect.index import RunIndex

__all__ = ["GroupView", "group_advantages_of"]


def group_advantages_of(episodes: Sequence[Episode], *, std_normalize: bool = True,
                        eps: float = 1e-6) -> list[float | None]:
    """Each episode's group-normalised advantage (None for an episode without a reward)."""
    from agentrl.algorithms import group_advantages

    rated = [i for i, ep in enumerate(episodes) if ep.reward is not None]
    out: list[float | None] = [None] * len(episodes)
    if not rated:
        return out
    values = group_advantages([float(episodes[i].reward) for i in rated], ["g"] * len(rated),  # type: ignore[arg-type]
                              std_normalize=std_normalize, eps=eps).tolist()
    for i, value in zip(rated, values, strict=True):
        out[i] = float(value)
    return out


def _answer(episode: Episode) -> str:
    for message in reversed(episode.trajectory.messages):
        if message.role == "assistant":
            text = message_text(message)
            if message.tool_calls:
                text += "".join(f"\n\u2192 {c.name}({c.arguments})" for c in message.tool_calls)
            return text
    return ""


@dataclass
class GroupView:
    """A group's episodes with their advantages; shows itself in Jupyter (``_repr_html_``)."""

    episodes: list[Episode]
    advantages: list[float | None]
    labels: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_episodes(cls, episodes: Sequence[Episode], *, std_normalize: bool = True, eps: float = 1e-6,
                      labels: Sequence[str] | None = None) -> GroupView:
        eps_list = list(episodes)
        return cls(eps_list, group_advantages_of(eps_list, std_normalize=std_normalize, eps=eps),
                   list(labels) if labels is not None else [e.trajectory.sample_id or str(i) for i, e in enumerate(eps_list)],
                   {"std_normalize": std_normalize, "eps": eps})

    @classmethod
    def from_index(cls, rows: RunIndex) -> GroupView:
        """The group of ``rows`` (one group's rows), with the run's advantage settings when known."""
        algorithm: Mapping[str, Any] = {}
        if rows.folder is not None:
            found = rows.folder.config().get("algorithm")
            algorithm = found if isinstance(found, Mapping) else {}
        std = algorithm.get("std_normalize")
        eps = algorithm.get("advantage_eps")
        labels = [f"step {r.step} · {r.sample_id}" if r.step is not None else str(r.sample_id) for r in rows]
        return cls.from_episodes([rows.episode(r) for r in rows],
                                 std_normalize=std if isinstance(std, bool) else True,
                                 eps=float(eps) if isinstance(eps, int | float) else 1e-6, labels=labels)

    def to_html(self, *, with_viewers: bool = True) -> str:
        """The members in columns: reward, advantage, outcome, final answer (and each one's viewer)."""
        cols = []
        for label, ep, adv in zip(self.labels, self.episodes, self.advantages, strict=True):
            traj = ep.trajectory
            sign = "pos" if adv is not None and adv > 0 else "neg" if adv is not None and adv < 0 else ""
            adv_text = f"{adv:+.3f}" if adv is not None else "-"
            fails = ", ".join(k.split("/", 1)[1] for k, v in traj.metrics.items() if k.startswith("failures/") and v)
            errors = ", ".join(e.kind.value for seq in ep.sequences for e in seq.errors)
            viewer = (f"<details><summary>viewer</summary>{episode_html(ep)}</details>" if with_viewers else "")
            cols.append(
                f'<div class="member"><b>{html.escape(label)}</b><table class="kv">'
                f"<tr><th>reward</th><td>{traj.reward if traj.reward is not None else '-'}</td></tr>"
                f'<tr><th>advantage</th><td class="{sign}">{adv_text}</td></tr>'
                f"<tr><th>outcome</th><td>{html.escape(traj.status.value)} · "
                f"{html.escape(traj.stop_reason.value if traj.stop_reason else '-')}</td></tr>"
                f"<tr><th>tool calls</th><td>{int(traj.metrics.get('tool_calls', 0))}</td></tr>"
                f'<tr><th>failures</th><td class="fk">{html.escape(fails) or "-"}</td></tr>'
                f'<tr><th>errors</th><td class="fk">{html.escape(errors) or "-"}</td></tr>'
                f"<tr><th>tokens</th><td>{sum(s.response_length for s in ep.sequences)} response</td></tr></table>"
                f'<div class="msg">{html.escape(_answer(ep)[-1500:])}</div>{viewer}</div>')
        rule = "(r - mean) / (std + eps)" if self.settings.get("std_normalize", True) else "r - mean"
        head = (f"<h3>group of {len(self.episodes)} · advantage = {rule}, eps {self.settings.get('eps', 1e-6):g}</h3>")
        return f'{head}<div class="side">{"".join(cols)}</div>'

    def _repr_html_(self) -> str:
        return f'<div class="arl"><style>{CSS}</style>{self.to_html()}</div>'
