"""A long-horizon task whose one fact is easy to copy and sits where only a summary can keep it.

Each row is a document of ``pages`` pages (24 by default). Page 1 opens with the document's key, one
digit (``key 7``); every page then holds a long stretch of filler words and ends ``more``, the last one
``end``. The model reads the pages with ``read()`` (no argument: each call returns the next page) until
a page says ``end``, then answers with the key::

    key 7

Reward 1 when the document was read to its last page and the answer's last ``key D`` is its key, else
0 (an answer before the end scores nothing: else reading one page and answering is the best policy, and
RL finds it). The key is the only digit of
the whole episode (the prompts, the pages, the calls and the summary's instruction hold none; only an
elision stub's token count does), so
keeping it is copying one token of a class of its own, which a tiny model learns in a short warm-up —
unlike :mod:`agentrl.environments.long_recall`, whose twenty codes behind multi-token keys it does not.

The pages overflow the context: 24 pages of ~95 tokens (a call, the page, the template's framing) pass
a 2,048-token context near page 21, so with no context policy every episode ends ``context_budget``.
With :class:`~agentrl.rollout.context.Window` or :class:`~agentrl.rollout.context.ElideToolOutput` the
episode goes on but page 1 is dropped or elided at the first compaction: the answer is a guess (one in
ten). With :class:`~agentrl.rollout.context.Summarize` the model keeps the key only if its summaries
write it (``key 7, still reading``) — in every summary of the episode, since each one is all the next
sequence knows.

:func:`key_policy` plays the task as a fake engine's policy
(:class:`agentrl.testing.policy.FakePolicyClient`): it reads until ``end``, writes the summary when the
context policy asks for one (a share ``lossy`` of them leave the key out: ``still reading``), and
answers with the key it can see (a guess when it sees none). It writes the warm-up transcripts of
``examples/long_horizon_prepare.py``.

Example::

    rows = make_key_rows(64, seed=0)
    env = LongKeyEnv(rows[0], context_policy=Summarize(trigger=1100))
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, Field

from agentrl.chat.types import Message, ToolCall
from agentrl.environments.base import Environment
from agentrl.environments.long_recall import check_filler_words, decision_prompt, filler_text
from agentrl.environments.policy import EnvLimits
from agentrl.rewards.math import final_answer_text
from agentrl.tools.base import ToolResult
from agentrl.trajectory import Trajectory

__all__ = ["FULL_SUMMARY", "LOSSY_SUMMARY", "SYSTEM_PROMPT", "TASK_PROMPT", "KeyTask", "LongKeyEnv", "key_page",
           "key_policy", "make_key_rows", "score_key"]

SYSTEM_PROMPT = "Read the document with the read tool, one page a call, until a page says end. Then answer with the key."
TASK_PROMPT = "Start reading the document."
FULL_SUMMARY = "key {key}, still reading"
"""What :func:`key_policy` writes when asked for a summary and it keeps the key."""
LOSSY_SUMMARY = "still reading"
"""What it writes when it leaves the key out (a share ``lossy`` of its summaries)."""
_KEY = re.compile(r"key (\d)")
_ANSWER_KEY = re.compile(r"key (\d)")


class KeyTask(BaseModel):
    """One document: its ``key`` (one digit), ``pages`` (at least 2) and the ``seed`` of its filler."""

    key: str = Field(pattern=r"^\d$")
    pages: int = Field(ge=2, le=500)
    seed: int = 0


def make_key_rows(n: int, *, pages: int = 24, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows ``{"key", "pages", "seed"}`` drawn from ``seed`` (deterministic; keys uniform)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"make_key_rows: n={n!r}; expected an integer >= 1")
    if isinstance(pages, bool) or not isinstance(pages, int) or not 2 <= pages <= 500:
        raise ValueError(f"make_key_rows: pages={pages!r}; expected an integer in [2, 500]")
    rng = random.Random(seed)
    return [{"key": rng.choice("0123456789"), "pages": pages, "seed": rng.randrange(2**31)} for _ in range(n)]


def key_page(task: KeyTask, page: int, filler_words: int) -> str:
    """The text of ``page`` (1-based): the key on page 1, ``filler_words`` filler words, and ``more``
    (``end`` on the last page)."""
    words = filler_text(task.seed, page, filler_words)
    head = f"key {task.key}\n" if page == 1 else ""
    return f"{head}{words}\n{'end' if page == task.pages else 'more'}"


class _ReadTool:
    """``read()``: the next page of this episode's document (a plain object: the environment pickles)."""

    def __init__(self, task: KeyTask, filler_words: int) -> None:
        self.name = "read"
        self.description = "Read the next page of the document."
        self.parameters: dict[str, Any] = {"type": "object", "properties": {}}
        self.task, self.filler_words, self.read = task, filler_words, 0

    async def __call__(self, **arguments: Any) -> ToolResult:
        if arguments:
            return ToolResult(f"read takes no arguments; got {sorted(arguments)}")
        if self.read >= self.task.pages:
            return ToolResult("the document has no more pages: answer with the key")
        self.read += 1
        return ToolResult(key_page(self.task, self.read, self.filler_words))


def score_key(answer: str, key: str) -> float:
    """1.0 when the last ``key D`` of ``answer`` is ``key``, else 0.0."""
    found = _ANSWER_KEY.findall(answer)
    return float(bool(found) and found[-1] == key)


class LongKeyEnv(Environment):
    """Read to the end, answer the key of page 1 (module doc). ``filler_words``: filler per page."""

    task_type = KeyTask
    reward_range = (0.0, 1.0)
    default_limits = EnvLimits(max_turns=64, max_tool_calls=64)

    def __init__(self, task: Any, *, filler_words: int = 60, **kwargs: Any) -> None:
        super().__init__(task, **kwargs)
        self.filler_words = check_filler_words("LongKeyEnv", filler_words)
        self._reader = _ReadTool(self.task, filler_words)
        self.register_tool(self._reader)

    async def reset(self) -> list[Message]:
        return [Message(role="system", content=SYSTEM_PROMPT), Message(role="user", content=TASK_PROMPT)]

    def reference_reply(self, messages: Sequence[Message]) -> Message | None:
        """The winning policy with the whole history in view: read until a page says ``end``, then
        answer the key (what ``agentrl env check`` plays to see a right answer score 1)."""
        results = [m for m in messages if m.role == "tool"]
        if results and str(results[-1].content).endswith("end"):
            return Message(role="assistant", content=f"key {self.task.key}")
        return Message(role="assistant", content="", tool_calls=[ToolCall("read", {}, id=f"call_{len(results)}")])

    @property
    def pages_read(self) -> int:
        """Pages this episode's ``read`` calls have returned so far."""
        return self._reader.read

    def reward(self, trajectory: Trajectory) -> float:
        if self._reader.read < self.task.pages:
            return 0.0
        return score_key(final_answer_text(trajectory.messages), self.task.key)


# --------------------------------------------------------------------------- the scripted policy

_CALL = f"<tool_call>\n{json.dumps({'name': 'read', 'arguments': {}})}\n</tool_call><|im_end|>"


def key_policy(instruction: str, *, lossy: float = 0.0, seed: int = 0) -> Callable[[Any], str]:
    """A fake engine's policy for :class:`LongKeyEnv` under a context policy whose summary ``instruction``
    it recognises: it reads until the last page says ``end`` (or the tool says there are no more pages: a
    compaction can fall between the last page and the answer) and answers ``key D`` with the key it can see
    (a guessed digit when it sees none); asked for a summary, it writes :data:`FULL_SUMMARY` when it sees
    the key, with probability ``lossy`` :data:`LOSSY_SUMMARY` instead. Deterministic per prompt for a
    given ``seed``."""

    def policy(req: Any) -> str:
        text = decision_prompt(req.text)
        rng = random.Random(f"{seed}:{len(text)}:{text[-200:]}")
        keys = _KEY.findall(text)
        last_user = text[text.rfind("<|im_start|>user"):]
        if text.rstrip().endswith("<|im_start|>assistant") and instruction in last_user:
            if keys and rng.random() >= lossy:
                return FULL_SUMMARY.format(key=keys[-1]) + "<|im_end|>"
            return LOSSY_SUMMARY + "<|im_end|>"
        if "<tool_response>" in last_user and re.search(r"(\nend|no more pages.*)\s*</tool_response>", last_user):
            return f"key {keys[-1] if keys else rng.choice('0123456789')}<|im_end|>"
        return _CALL

    return policy
