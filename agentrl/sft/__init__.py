"""Supervised fine-tuning on multi-turn tool-use conversations, with RL's exact token layout.

- :class:`TranscriptBuilder` / :func:`episode_from_messages`: a scripted conversation becomes the
  :class:`~agentrl.episode.Episode` the agent loop would have built (assistant tokens trainable,
  tool and user tokens masked);
- :class:`SftConfig` and :func:`run_sft`: conversations (JSONL) → packed next-token NLL on the
  assistant tokens with the torch backend → a Hugging Face model folder (``agentrl sft CONFIG``);
- :func:`arithmetic_conversations`: synthetic tool-use conversations of the toy arithmetic task.
"""

from agentrl.sft.config import SftConfig, SftDataSection, SftModelSection, SftTrainSection
from agentrl.sft.synthetic import arithmetic_conversations
from agentrl.sft.trainer import SftDataError, SftResult, load_sft_sequences, run_sft, sft_sequences
from agentrl.sft.transcript import TranscriptBuilder, TranscriptError, episode_from_messages

__all__ = [
    "SftConfig",
    "SftDataError",
    "SftDataSection",
    "SftModelSection",
    "SftResult",
    "SftTrainSection",
    "TranscriptBuilder",
    "TranscriptError",
    "arithmetic_conversations",
    "episode_from_messages",
    "load_sft_sequences",
    "run_sft",
    "sft_sequences",
]
