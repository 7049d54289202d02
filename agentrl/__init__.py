"""agentrl: reinforcement learning of tool-using language models.

The public surface is re-exported here; see ``agentrl.chat`` for templates and tool-call parsing
and :class:`agentrl.Trajectory` for the verified token buffer of one episode.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
