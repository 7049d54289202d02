"""agentrl: reinforcement learning of tool-using language models.

The public surface is re-exported here; see ``agentrl.chat`` for templates and tool-call parsing
and :class:`agentrl.Trajectory` for the verified token buffer of one episode.
"""

from agentrl.trajectory import Segment, SegmentKind, Status, StopReason, Trajectory, TrajectoryError

__version__ = "0.1.0"

__all__ = ["Segment", "SegmentKind", "Status", "StopReason", "Trajectory", "TrajectoryError", "__version__"]
