"""A small byte-level BPE tokenizer with the Qwen special and added tokens, built locally.

No model hub is reachable from tests or CI, so token-level tests (encode, bridge, drift) and the
tiny model use this tokenizer. It mirrors what matters about the Qwen2/Qwen3 tokenizer:

- byte-level BPE with the same pre-tokenisation split (digits one by one, runs of newlines kept
  together, so ``"\\n\\n"`` is one token and decode→re-encode drift can happen as it does on Qwen);
- ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` as *special* tokens, and ``<tool_call>``,
  ``</tool_call>``, ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>`` as
  *non-special* added tokens (matched before BPE, kept by ``skip_special_tokens``);
- no BOS token is added; EOS is ``<|im_end|>``, padding is ``<|endoftext|>``.

The training corpus is generated deterministically, so two builds produce the same vocabulary.

Example::

    from agentrl.testing import build_tokenizer
    tok = build_tokenizer()                     # cached under ~/.cache/agentrl/tokenizers
    tok.encode("<|im_start|>user\\nhi<|im_end|>")
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

from agentrl.testing._cache import build_folder, cache_root

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED_TOKENS: tuple[str, ...] = (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
# The Qwen2 pre-tokeniser split: contractions, letter runs, single digits, punctuation runs with
# their trailing newlines, newline runs, and whitespace.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEFAULT_VOCAB_SIZE = 2048
_BUILD_VERSION = "1"

_WORDS = (
    "the a an of to in is it that for on with as was be by this are or from at which have not but what all "
    "were when we there can your one if do will each about how up out them then she many some so these would "
    "other into has more her two like him see time could no make than first been its who now people my made "
    "over did down only way find use may water long little very after words called just where most know get "
    "through back much before go good new write our used me man too any day same right look think also around "
    "another came come work three word must because does part even place well such here take why things help "
    "put years different away again off went old number great tell men say small every found still between "
    "name should home big give air line set own under read last never us left end along while might next sound "
    "below saw something thought both few those always looked show large often together asked house world "
    "answer question compute result value python code print return import function tool call calculator "
    "arguments parameter error output user assistant system reasoning step solve sum product total number "
    "add subtract multiply divide equals boxed final let check done use run math problem integer float "
    "string list dict true false none null type object array required description properties"
).split()
_SNIPPETS = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
    "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
    "<think>\n{t}\n</think>\n\n{a}<|im_end|>\n",
    '<tool_call>\n{{"name": "{n}", "arguments": {{"code": "{c}"}}}}\n</tool_call>',
    "<tool_call>\n<function={n}>\n<parameter=code>\n{c}\n</parameter>\n</function>\n</tool_call>",
    "<tool_response>\n{r}\n</tool_response>",
    "\\boxed{{{r}}}",
    "def {n}(x, y):\n    return x + y\n\nprint({n}({r}, 2))\n",
    '{{"type": "function", "function": {{"name": "{n}", "description": "{t}", "parameters": '
    '{{"type": "object", "properties": {{"code": {{"type": "string"}}}}, "required": ["code"]}}}}}}',
)


def _corpus(n_lines: int = 6000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(n_lines):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 14)))
        num = str(rng.randint(0, 10**rng.randint(1, 6)))
        expr = f"{rng.randint(0, 999)} {rng.choice('+-*/')} {rng.randint(0, 999)}"
        snippet = rng.choice(_SNIPPETS).format(q=words + "?", t=words, a=num, n=rng.choice(_WORDS), c=expr, r=num)
        lines.append(words.capitalize() + ". " + snippet + " " + expr + " = " + num + "\n")
    # Some non-ASCII and punctuation so every byte-level merge region is exercised.
    lines += ["Ünïcödé — naïve café 数学 計算 ✓ → ∑ π ≈ 3.14159\n", "< > & \" ' ` ~ | \\ { } [ ] ( ) ; :\n"] * 20
    return lines


def _cache_dir() -> Path:
    key = hashlib.sha256(f"{_BUILD_VERSION}:{DEFAULT_VOCAB_SIZE}:{_SPLIT_PATTERN}".encode()).hexdigest()[:12]
    return cache_root() / "tokenizers" / f"qwen-tiny-{key}"


def build_tokenizer_files(out_dir: str | os.PathLike[str], *, vocab_size: int = DEFAULT_VOCAB_SIZE,
                          chat_template: str | None = None) -> Path:
    """Trains the tokenizer and writes it with ``save_pretrained`` into ``out_dir``; returns the folder."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
        bos_token=None, model_max_length=32768, clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        hf.chat_template = chat_template
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))
    return out


def build_tokenizer(path: str | os.PathLike[str] | None = None, *, chat_template: str | None = None) -> Any:
    """Returns the tiny Qwen-style tokenizer as a ``PreTrainedTokenizerFast``.

    Built once and cached (``path`` or ``$AGENTRL_CACHE/tokenizers/...``); later calls load it.
    ``chat_template`` sets the tokenizer's own template on the returned object (not on disk).
    """
    from transformers import PreTrainedTokenizerFast

    folder = build_folder(Path(path) if path is not None else _cache_dir(), ("tokenizer.json",),
                          build_tokenizer_files)
    tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok
