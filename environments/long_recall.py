"""A long-horizon task that a tiny model can learn only with a context policy that keeps facts.

Each row is a document of ``pages`` pages (20 by default); every page holds one code digit (after the
previous page's, ``p4=9 p5=2``) and a long stretch of filler words. The model reads the pages one
``read`` call at a time, in order (each page names the next one, the last says ``next none``), then
answers with every page's code::

    codes: p1=3 p2=7 p3=1 ... p20=5

Reward 1 when every page's code is right, else 0. The pages overflow the context: read in one
sequence, 20 pages of ~110 tokens (a call, the page, the template's framing) pass a 2,048-token
context near page 17, so with no context policy every episode ends ``context_budget``. With
:class:`~agentrl.rollout.context.Window` or :class:`~agentrl.rollout.context.ElideToolOutput` the
episode goes on, but the codes of the pages that were dropped or elided are gone: the answer needs
them. With :class:`~agentrl.rollout.context.Summarize` the model writes its notes when asked (the
codes so far and the next page, ``p1=3 ... p8=4 next 9``) and carries them into the next sequence.

:func:`recall_policy` plays the task as a fake engine's policy
(:class:`agentrl.testing.policy.FakePolicyClient`): it reads the prompt, calls the next page, writes the
summary when the context policy asks for one (a share ``lossy`` of them keep only the last page's code),
and answers with the codes it can see (a guess for the others). It is the unit tests' scripted policy
and writes the warm-up transcripts of ``examples/long_horizon_prepare.py``.

Example::

    rows = make_recall_rows(64, seed=0)
    env = LongRecallEnv(rows[0], context_policy=Summarize(trigger=1000))
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from agentrl.chat.types import Message
from agentrl.environments.base import Environment
from agentrl.environments.policy import EnvLimits
from agentrl.rewards.math import final_answer_text
from agentrl.tools.base import ToolResult
from agentrl.trajectory import Trajectory

__all__ = ["FILLER_WORDS", "SYSTEM_PROMPT", "LongRecallEnv", "RecallTask", "check_filler_words", "decision_prompt",
           "filler_text", "make_recall_rows", "page_text", "recall_policy", "score_codes"]

SYSTEM_PROMPT = "Read every page with the read tool, in order. Then answer with the code of each page."
FILLER_WORDS = (" the", " of", " to", " in", " is", " was", " for", " on", " that", " with", " as", " by", " at",
                " from")
"""Words one token each with the test tokenizer: a page's filler costs about one token a word."""
_PAIR = re.compile(r"p(\d+)=(\d)")
_NEXT = re.compile(r"next (\d+|none)")


def filler_text(seed: int, page: int, words: int) -> str:
    """``words`` filler words for ``page`` of the document drawn from ``seed`` (deterministic)."""
    rng = random.Random(seed * 1_000 + page)
    return "".join(rng.choice(FILLER_WORDS) for _ in range(words)).strip()


def check_filler_words(owner: str, value: Any) -> int:
    """``value`` if it is an integer >= 0, else ``ValueError`` naming ``owner``'s ``filler_words``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner}(filler_words=...): got {value!r}; expected an integer >= 0")
    return value


def decision_prompt(text: str) -> str:
    """The prompt a scripted policy decides on: for a turn resumed after an abort (the prompt already
    holds the turn's start, which the client continues), the prompt before that turn."""
    opened = text.rfind("<|im_start|>assistant\n")
    return text if opened < 0 else text[:opened + len("<|im_start|>assistant\n")]


class RecallTask(BaseModel):
    """One document: ``codes`` has one digit per page (at least 2 pages); ``seed`` draws its filler."""

    codes: str = Field(pattern=r"^\d{2,200}$")
    seed: int = 0


def make_recall_rows(n: int, *, pages: int = 20, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows ``{"codes", "seed"}`` of ``pages`` pages each, drawn from ``seed`` (deterministic)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"make_recall_rows: n={n!r}; expected an integer >= 1")
    if isinstance(pages, bool) or not isinstance(pages, int) or not 2 <= pages <= 200:
        raise ValueError(f"make_recall_rows: pages={pages!r}; expected an integer in [2, 200]")
    rng = random.Random(seed)
    return [{"codes": "".join(rng.choice("0123456789") for _ in range(pages)), "seed": rng.randrange(2**31)}
            for _ in range(n)]


def page_text(codes: str, seed: int, page: int, filler_words: int) -> str:
    """The text of ``page`` (1-based): the previous page's code and its own (``p4=9 p5=2``; page 1 has its
    own only), ``filler_words`` filler words, and the next page (``next 6``, ``next none`` on the last).

    Each page repeating its predecessor's pair makes the document one chain (``p4=9`` is followed by
    ``p5=2`` wherever it appears), so writing the codes in order is copying, which a tiny model learns."""
    words = filler_text(seed, page, filler_words)
    follow = f"next {page + 1}" if page < len(codes) else "next none"
    pairs = f"p{page - 1}={codes[page - 2]} " if page > 1 else ""
    return f"{pairs}p{page}={codes[page - 1]}\n{words}\n{follow}"


class _ReadTool:
    """``read(page)``: one page of this episode's document (a plain object: the environment pickles)."""

    def __init__(self, codes: str, seed: int, filler_words: int) -> None:
        self.name = "read"
        self.description = "Read one page of the document."
        self.parameters: dict[str, Any] = {
            "type": "object", "properties": {"page": {"type": "integer", "description": "The page number."}},
            "required": ["page"]}
        self.codes, self.seed, self.filler_words = codes, seed, filler_words

    async def __call__(self, **arguments: Any) -> ToolResult:
        page = arguments.get("page")
        if isinstance(page, bool) or not isinstance(page, int) or not 1 <= page <= len(self.codes):
            return ToolResult(f"no page {page!r}: the pages are 1 to {len(self.codes)}")
        return ToolResult(page_text(self.codes, self.seed, page, self.filler_words))


def score_codes(answer: str, codes: str) -> float:
    """1.0 when ``answer`` gives every page's code (``pK=D``; a later mention of a page wins), else 0.0."""
    found = {int(k): d for k, d in _PAIR.findall(answer)}
    return float(all(found.get(i + 1) == c for i, c in enumerate(codes)))


class LongRecallEnv(Environment):
    """Read every page, answer with every code (module doc). ``filler_words``: filler per page."""

    task_type = RecallTask
    reward_range = (0.0, 1.0)
    default_limits = EnvLimits(max_turns=64, max_tool_calls=64)

    def __init__(self, task: Any, *, filler_words: int = 60, **kwargs: Any) -> None:
        super().__init__(task, **kwargs)
        self.filler_words = check_filler_words("LongRecallEnv", filler_words)
        self.register_tool(_ReadTool(self.task.codes, self.task.seed, filler_words))

    async def reset(self) -> list[Message]:
        return [Message(role="system", content=SYSTEM_PROMPT),
                Message(role="user", content=f"The document has {len(self.task.codes)} pages. Start with page 1.")]

    def reward(self, trajectory: Trajectory) -> float:
        return score_codes(final_answer_text(trajectory.messages), self.task.codes)


# --------------------------------------------------------------------------- the scripted policy

def _call(page: int) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'read', 'arguments': {'page': page}})}\n</tool_call><|im_end|>"


def _pairs(codes: dict[int, str]) -> str:
    return " ".join(f"p{k}={codes[k]}" for k in sorted(codes))


def recall_policy(instruction: str, *, lossy: float = 0.0, seed: int = 0) -> Callable[[Any], str]:
    """A fake engine's policy for :class:`LongRecallEnv` under a context policy whose summary
    ``instruction`` it recognises. It knows the codes it can see in the prompt (pages and summaries);
    it calls the page the last one names, summarises when asked (``p1=3 ... p8=4 next 9``; with
    probability ``lossy``, only the last page's code: ``p8=4 next 9``), and answers with every page's
    code once a page says ``next none`` (a guessed digit where it knows none). Deterministic per prompt
    for a given ``seed``."""

    def policy(req: Any) -> str:
        text = decision_prompt(req.text)
        rng = random.Random(f"{seed}:{len(text)}:{text[-200:]}")
        codes = {int(k): d for k, d in _PAIR.findall(text)}
        follow = _NEXT.findall(text)
        asked = text.rstrip().endswith("<|im_start|>assistant") and instruction in text[text.rfind("<|im_start|>user"):]
        if asked:
            nxt = f" next {follow[-1]}" if follow else ""
            if codes and rng.random() < lossy:
                last = max(codes)
                return f"p{last}={codes[last]}{nxt}<|im_end|>"
            return f"{_pairs(codes)}{nxt}<|im_end|>"
        if not follow:
            return _call(1)
        if follow[-1] != "none":
            return _call(int(follow[-1]))
        pages = max(codes) if codes else 0
        guessed = {k: codes.get(k, rng.choice("0123456789")) for k in range(1, pages + 1)}
        return f"codes: {_pairs(guessed)}<|im_end|>"

    return policy
