"""Up-front checks of a local Hugging Face model folder, and the model's vocabulary size.

Everything that loads a model — an engine launch, a weight update from disk, the train backend's
``from_pretrained``, ``agentrl render --tokenizer`` — checks the folder first and fails in one line
naming the path and what is missing, instead of a library treating a missing folder as a hub
repository id half a minute later. agentrl loads models from local folders only: download a hub
model first (``huggingface-cli download ORG/NAME --local-dir DIR``).

:func:`model_vocab_size` reads ``vocab_size`` from ``config.json``: the model's embedding rows,
which checkpoints pad beyond the tokenizer (``AgentConfig.vocab_size`` wants it);
:func:`model_routing_shape` the routing of a mixture-of-experts model (``AgentConfig.routed_experts``).

Example::

    folder = check_model_folder("runs/x/hf/step_10", needs=("config", "weights"))
    AgentConfig(vocab_size=model_vocab_size(folder))
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from agentrl.rollout.types import RoutingShape

__all__ = ["ModelFolderError", "Need", "check_model_folder", "has_tokenizer", "model_parameter_count",
           "model_routing_shape", "model_vocab_size"]

Need = Literal["config", "weights", "tokenizer"]
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf", "*.safetensors.index.json", "*.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_NEEDS: tuple[Need, ...] = ("config", "weights", "tokenizer")


class ModelFolderError(ValueError):
    """A model path that is not a usable local model folder (missing, not a folder, files missing)."""


def _missing(folder: Path, need: str) -> str | None:
    if need == "config":
        return None if (folder / "config.json").is_file() else "config.json"
    if need == "weights":
        found = any(next(folder.glob(p), None) is not None for p in _WEIGHT_PATTERNS)
        return None if found else "weights (*.safetensors or *.bin)"
    found = any((folder / name).is_file() for name in _TOKENIZER_FILES)
    return None if found else "tokenizer files (tokenizer.json or tokenizer_config.json)"


def has_tokenizer(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds tokenizer files."""
    return _missing(Path(folder), "tokenizer") is None


def check_model_folder(path: str | os.PathLike[str], *, needs: Iterable[Need] = _NEEDS,
                       what: str = "model_path") -> Path:
    """Returns ``path`` as a :class:`~pathlib.Path` when it is a folder holding what ``needs`` lists
    (``config``: ``config.json``; ``weights``: safetensors/bin files; ``tokenizer``: tokenizer files).

    Raises :class:`ModelFolderError` naming ``what``, the path and everything missing.
    """
    folder = Path(os.fspath(path)).expanduser()
    wanted = list(needs)
    unknown = [n for n in wanted if n not in _NEEDS]
    if unknown:
        raise ValueError(f"check_model_folder: needs={unknown!r}; expected a subset of {list(_NEEDS)}")
    if not folder.exists():
        raise ModelFolderError(f"{what}: {os.fspath(path)!r} does not exist (expected a local model folder; "
                               "agentrl does not download from a model hub)")
    if not folder.is_dir():
        raise ModelFolderError(f"{what}: {os.fspath(path)!r} is a file; expected a model folder")
    missing = [m for m in (_missing(folder, n) for n in wanted) if m is not None]
    if missing:
        raise ModelFolderError(f"{what}: {os.fspath(path)!r} is not a model folder: it lacks {'; '.join(missing)}")
    return folder


def model_vocab_size(path: str | os.PathLike[str]) -> int:
    """``vocab_size`` of the model in folder ``path`` (``config.json``; a multimodal config's
    ``text_config``): the number of ids the model can emit, padding rows included."""
    folder = check_model_folder(path, needs=("config",))
    try:
        config: Any = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"{folder / 'config.json'}: not readable JSON ({exc})") from exc
    for scope in (config, config.get("text_config") if isinstance(config, dict) else None):
        value = scope.get("vocab_size") if isinstance(scope, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ModelFolderError(f"{folder / 'config.json'}: no positive integer vocab_size (nor text_config.vocab_size)")


def model_routing_shape(path: str | os.PathLike[str]) -> RoutingShape | None:
    """The routing a mixture-of-experts model's engine returns per token (layers, top-k, experts, from
    ``config.json``; a multimodal config's ``text_config``); ``None`` for a dense model, or when the
    folder or its config cannot be read here (a recipe checked on another machine)."""
    from agentrl.rollout.types import RoutingShape

    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    try:
        return RoutingShape.from_model_config(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFolderError(f"{Path(path) / 'config.json'}: a mixture-of-experts config without a usable "
                               f"num_hidden_layers / num_experts_per_tok / num_experts ({exc})") from exc


def model_parameter_count(path: str | os.PathLike[str]) -> int | None:
    """The number of parameters stored in the folder's ``*.safetensors`` files, read from their
    headers (no tensor is loaded, no torch import); ``None`` when there are none or a header is unreadable.
    Tied weights are stored once, so they count once."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        try:
            with open(file, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                if not 0 < size < 1 << 30:
                    return None
                header = json.loads(f.read(size))
        except (OSError, ValueError):
            return None
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            count = 1
            for dim in entry.get("shape", []):
                count *= int(dim)
            total += count
    return total
