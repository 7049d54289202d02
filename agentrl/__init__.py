"""agentrl: reinforcement learning of tool-using language models.

The public surface is re-exported here; see ``agentrl.chat`` for templates and tool-call parsing
and :class:`agentrl.Trajectory` for the verified token buffer of one sequence; :class:`agentrl.Episode`
holds all of an episode's sequences and is what to save and batch.
"""

from agentrl.episode import Episode, iter_episodes, load_episodes, save_episodes
from agentrl.trajectory import (
    EpisodeError,
    ErrorKind,
    Segment,
    SegmentKind,
    Status,
    StopReason,
    Trajectory,
    TrajectoryError,
    status_for,
)

__version__ = "0.1.0"


def _notebook_html(item: Trajectory | Episode) -> str:
    """Jupyter's display of a :class:`Trajectory` or :class:`Episode`: the viewer of :mod:`agentrl.inspect`.

    The data types do not know their viewer, which sits above them (DESIGN.md §2); the package that
    exports both attaches the display to them here, and imports the viewer only when a notebook first
    shows one, so ``import agentrl`` stays free of it.
    """
    from agentrl.inspect.html import episode_html, trajectory_html

    return episode_html(item) if isinstance(item, Episode) else trajectory_html(item)


Trajectory._repr_html_ = Episode._repr_html_ = _notebook_html  # type: ignore[attr-defined]


def __getattr__(name: str) -> object:
    # ``agentrl.train`` / ``agentrl.train_async`` import the runner (torch, Ray...) only when called.
    # ``train`` is the ``agentrl.train`` package, which is callable: once imported, Python binds the
    # package here whatever this function returns, so returning it keeps one object either way.
    if name == "train":
        import agentrl.train as package

        return package
    if name == "train_async":
        from agentrl.runner import api

        return api.train_async
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")

__all__ = ["Episode", "EpisodeError", "ErrorKind", "Segment", "SegmentKind", "Status", "StopReason", "Trajectory",
           "TrajectoryError", "__version__", "iter_episodes", "load_episodes", "save_episodes", "status_for", "train",
           "train_async"]
