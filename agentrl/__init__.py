"""agentrl: reinforcement learning of tool-using language models.

The public surface is re-exported here; see ``agentrl.chat`` for templates and tool-call parsing
and :class:`agentrl.Trajectory` for the verified token buffer of one sequence; :class:`agentrl.Episode`
holds all of an episode's sequences and is what to save and batch.

``agentrl.run(config, ...)`` runs a training run (:mod:`agentrl.runner.api`; ``agentrl.run_async`` in
a running event loop). ``agentrl.train`` is the package of train backends (batching, packing, the torch
and megatron backends): one name, one thing.
"""

from agentrl._deprecated import moved_names
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


def _lazy(name: str) -> object:
    # ``agentrl.run`` / ``agentrl.run_async`` import the runner (torch, Ray...) only when first used.
    # ``agentrl.train`` is the package of train backends, and only that (the run function is ``run``).
    if name in ("run", "run_async"):
        from agentrl.runner import api

        return getattr(api, name)
    if name == "train":
        import agentrl.train as package

        return package
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")


# ``agentrl.train_async`` was the run function's name before ``run_async`` (a deprecated alias for a release)
__getattr__ = moved_names(__name__, {"train_async": "agentrl.runner.api:run_async"}, fallback=_lazy)

__all__ = ["Episode", "EpisodeError", "ErrorKind", "Segment", "SegmentKind", "Status", "StopReason", "Trajectory",
           "TrajectoryError", "__version__", "iter_episodes", "load_episodes", "run", "run_async", "save_episodes",
           "status_for"]
