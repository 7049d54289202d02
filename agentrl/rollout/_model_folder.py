"""The model-folder check, re-exported by :mod:`agentrl.rollout` (it lives in :mod:`agentrl.model_folder`)."""

from agentrl.model_folder import ModelFolderError, check_model_folder, model_vocab_size

__all__ = ["ModelFolderError", "check_model_folder", "model_vocab_size"]
