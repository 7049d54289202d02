"""Supervised fine-tuning on multi-turn tool-use conversations, with RL's exact token layout.

- :class:`TranscriptBuilder` / :func:`episode_from_messages`: a scripted conversation becomes the
  :class:`~agentrl.episode.Episode` the agent loop would have built (assistant tokens trainable,
  tool and user tokens masked);
"""

from agentrl.sft.transcript import TranscriptBuilder, TranscriptError, episode_from_messages

__all__ = ["TranscriptBuilder", "TranscriptError", "episode_from_messages"]
