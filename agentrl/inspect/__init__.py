"""Seeing episodes: the trajectory viewer (standalone HTML and Jupyter display), browsing a run
folder, and run reports with plots.

- :func:`trajectory_html` / :func:`episode_html` / :func:`write_viewer`: one episode as
  self-contained HTML (provenance colours, trainability, token ids and logprobs, a logprob heat
  map, tool calls with results, failure kinds and durations, reward, weight versions, forks);
  ``Trajectory`` and ``Episode`` display it in Jupyter (the ``agentrl`` package attaches it to them and
  imports this viewer on the first display; :func:`view` adds token texts);
- :class:`RunIndex`: filter a run folder's (or a JSONL file's) episodes by step, reward, stop
  reason, failure kind and tool-call count; :class:`GroupView` shows one group side by side;
- :func:`write_run_report` / :func:`write_file_report`: what ``agentrl inspect`` writes.

Example::

    from agentrl.inspect import RunIndex, view
    index = RunIndex.of_run("runs/exp1")
    view(index.episode(index.filter(failure="any")[0]), tokenizer="runs/exp1/model")
"""

from typing import Any

from agentrl.episode import Episode
from agentrl.inspect._style import PROVENANCE_COLOURS
from agentrl.inspect.calls import CallView, TurnCalls, calls_by_message
from agentrl.inspect.decode import TokenDecoder, token_decoder
from agentrl.inspect.files import InspectError, RunFolder, read_episodes_file
from agentrl.inspect.group import GroupView
from agentrl.inspect.html import episode_html, trajectory_html, write_viewer
from agentrl.inspect.index import EpisodeRow, RunIndex
from agentrl.inspect.report import write_file_report, write_run_report
from agentrl.trajectory import Trajectory

__all__ = ["PROVENANCE_COLOURS", "CallView", "EpisodeRow", "GroupView", "InspectError", "RunFolder", "RunIndex",
           "TokenDecoder", "TurnCalls", "View", "calls_by_message", "episode_html", "read_episodes_file",
           "token_decoder", "trajectory_html", "view", "write_file_report", "write_run_report", "write_viewer"]


class View:
    """A trajectory or episode with a token decoder; displays as its viewer in Jupyter."""

    def __init__(self, item: Trajectory | Episode, decoder: TokenDecoder | None = None) -> None:
        self.item, self.decoder = item, decoder

    def to_html(self) -> str:
        if isinstance(self.item, Episode):
            return episode_html(self.item, decoder=self.decoder)
        return trajectory_html(self.item, decoder=self.decoder)

    def _repr_html_(self) -> str:
        return self.to_html()


def view(item: Trajectory | Episode, *, tokenizer: Any = None) -> View:
    """``item``'s viewer with token texts from ``tokenizer`` (see :func:`token_decoder`; None: ids only)."""
    return View(item, token_decoder(tokenizer) if tokenizer is not None else None)
