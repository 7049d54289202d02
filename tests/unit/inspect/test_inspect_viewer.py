"""The trajectory viewer's HTML: every segment shown with its provenance and trainability, tool calls
with their outcome, hostile tool output escaped, token texts that add up to the decoded ids, forks
linked, and no cost to ``import agentrl``."""

from __future__ import annotations

import subprocess
import sys
from html.parser import HTMLParser
from typing import Any

import pytest

from agentrl import Episode, SegmentKind, Status, StopReason, Trajectory
from agentrl.chat.types import Message, ToolCall
from agentrl.inspect import calls_by_message, episode_html, token_decoder, trajectory_html, view
from agentrl.inspect._style import HEAT_THRESHOLDS, heat_class
from agentrl.testing import build_tokenizer
from agentrl.testing.episodes import HOSTILE_TOOL_OUTPUT, showcase_episode


class _Tree(HTMLParser):
    """Collects start tags with their attributes and the text inside <script> elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data
        else:
            self.text.append(data)


def _parse(markup: str) -> _Tree:
    tree = _Tree()
    tree.feed(markup)
    tree.close()
    return tree


def _classes(tree: _Tree, tag: str = "div") -> list[set[str]]:
    return [set((a.get("class") or "").split()) for t, a in tree.tags if t == tag]


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_tokenizer()


@pytest.fixture(scope="module")
def showcase(tok: Any) -> Episode:
    return showcase_episode(tok)


def _hand_made() -> Episode:
    traj = Trajectory.from_prompt([1, 2, 3], messages=[Message("user", "hi")], group_id="g", rollout_id="r",
                                  sample_id="s:0")
    traj.messages.append(Message("assistant", "", tool_calls=[ToolCall("search", {"q": "<b>x</b>"}, id="call_0"),
                                                              ToolCall("nope", {}, id="call_1")]))
    traj.append_model([4, 5], [-0.01, -3.0], weight_version="7", finish_reason="stop", message_index=1)
    traj.messages += [Message("tool", HOSTILE_TOOL_OUTPUT, tool_call_id="call_0", name="search"),
                      Message("tool", "Error: unknown_tool: no tool named 'nope'", tool_call_id="call_1", name="nope")]
    traj.append_env([6], kind=SegmentKind.SCAFFOLD)
    traj.append_env([7, 8], kind=SegmentKind.TOOL, message_index=2)
    traj.messages.append(Message("user", "go on"))
    traj.append_env([9], kind=SegmentKind.USER, message_index=4)
    traj.messages.append(Message("assistant", "done"))
    traj.append_model([10], [-0.5], weight_version="8", finish_reason="length", message_index=5)
    traj.mask_model_segments(lambda s: s.weight_version == "7")
    traj.finish(Status.TRUNCATED, StopReason.ENGINE_LENGTH)
    traj.reward, traj.reward_parts = 0.25, {"correct": 0.0, "format": 0.25}
    traj.metrics = {"failures/unknown_tool": 1.0, "tool_calls": 2.0}
    info = [{"turn": 1, "tool_calls": 2, "calls": [{"id": "call_0", "name": "search", "failure": None, "duration_s": 0.0123},
                                                   {"id": "call_1", "name": "nope", "failure": "unknown_tool",
                                                    "duration_s": 0.0}]}]
    return Episode(sequences=[traj], env_info=info)


def test_every_segment_is_a_block_with_its_kind_and_trainability() -> None:
    ep = _hand_made()
    tree = _parse(episode_html(ep))
    blocks = [c for c in _classes(tree) if "seg" in c]
    assert [next(k[2:] for k in c if k.startswith("k-")) for c in blocks] == [s.kind.value for s in ep.trajectory.segments]
    assert ["tr" in c for c in blocks] == [s.trainable for s in ep.trajectory.segments]
    assert ["nt" in c for c in blocks] == [not s.trainable for s in ep.trajectory.segments]
    text = "".join(tree.text)
    for needle in ("weights 7", "weights 8", "finish length", "stop reason engine_length", "truncated",
                   "correct 0", "format 0.25", "7 (turns 1), 8 (turns 2)", "unknown_tool"):
        assert needle in text, needle


def test_tool_calls_show_arguments_results_failure_kind_and_duration() -> None:
    ep = _hand_made()
    calls = calls_by_message(ep.trajectory.messages, ep.env_info)
    (turn,) = calls.values()
    assert [(c.name, c.failure, c.duration_s, c.result_is_error) for c in turn.calls] == [
        ("search", None, 0.0123, False), ("nope", "unknown_tool", 0.0, True)]
    assert turn.calls[0].result == HOSTILE_TOOL_OUTPUT and turn.calls[0].arguments == {"q": "<b>x</b>"}
    tree = _parse(trajectory_html(ep.trajectory, env_info=ep.env_info))
    cards = [c for c in _classes(tree) if "call" in c]
    assert len(cards) == 2 and "err" in cards[1] and "err" not in cards[0]
    assert "12.3 ms" in "".join(tree.text)


def test_calls_without_step_info_are_matched_by_id_then_order() -> None:
    msgs = [Message("assistant", "", tool_calls=[ToolCall("a", {}, id="x"), ToolCall("b", {})]),
            Message("tool", "B", tool_call_id=None), Message("tool", "A", tool_call_id="x")]
    (turn,) = calls_by_message(msgs).values()
    assert [(c.name, c.result, c.failure, c.duration_s) for c in turn.calls] == [("a", "A", None, None),
                                                                                 ("b", "B", None, None)]


@pytest.mark.parametrize("with_decoder", [False, True])
def test_hostile_tool_output_is_escaped(showcase: Episode, tok: Any, with_decoder: bool) -> None:
    markup = episode_html(showcase, decoder=token_decoder(tok) if with_decoder else None, full_page=True)
    assert HOSTILE_TOOL_OUTPUT not in markup and "<img" not in markup
    tree = _parse(markup)
    assert [t for t, _ in tree.tags].count("img") == 0
    assert not [a for _, a in tree.tags if any(k.startswith("on") for k in a)]  # no event-handler attribute
    assert len(tree.scripts) == 1 and "__pwned" not in tree.scripts[0]  # only the viewer's own script
    assert "window.__pwned=2" in "".join(tree.text)  # shown as text, where it belongs
    assert "default-src 'none'" in markup  # nothing may be fetched: no network, no CDN


def test_token_texts_add_up_to_the_decoded_ids(tok: Any) -> None:
    text = "héllo wörld 世界 🙂 <tool_call>\n\n"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = token_decoder(tok)(ids)
    assert len(pieces) == len(ids) and "".join(pieces) == tok.decode(ids) == text


def test_token_spans_carry_ids_logprobs_and_heat_buckets(showcase: Episode, tok: Any) -> None:
    traj = showcase.sequences[0]
    tree = _parse(trajectory_html(traj, decoder=token_decoder(tok)))
    spans = [a for t, a in tree.tags if t == "span" and "t" in (a.get("class") or "").split()]
    assert [int(a["data-i"] or -1) for a in spans] == traj.tokens
    model_pos = [p for s in traj.segments_of(SegmentKind.MODEL) for p in range(s.start, s.end)]
    lp_spans = [(i, a) for i, a in enumerate(spans) if "data-l" in a]
    assert [i for i, _ in lp_spans] == model_pos
    for pos, a in lp_spans:
        lp = traj.logprobs[pos - traj.prompt_length]
        assert a["data-l"] == f"{lp:.2f}" and f"h{heat_class(lp)}" in (a["class"] or "")
    assert [heat_class(x) for x in (0.0, -0.1, -0.3, -0.7, -1.5, -3.0, -9.0)] == list(range(len(HEAT_THRESHOLDS) + 1))


def test_forks_link_to_each_other(showcase: Episode) -> None:
    assert len(showcase.sequences) == 2
    tree = _parse(episode_html(showcase))
    sections = [a["id"] for t, a in tree.tags if t == "section"]
    links = {a["href"] for t, a in tree.tags if t == "a"}
    assert len(sections) == 2 and {f"#{s}" for s in sections} <= links  # each sequence links to the other
    assert "forked from sequence 0" in "".join(tree.text)


def test_without_a_tokenizer_segments_show_their_messages() -> None:
    ep = _hand_made()
    text = "".join(_parse(episode_html(ep)).text)
    assert "go on" in text and "done" in text and "no tokenizer given" in text


def test_message_level_trajectory_shows_its_messages() -> None:
    traj = Trajectory.from_messages([Message("user", "2+2?"), Message("assistant", "4")])
    text = "".join(_parse(trajectory_html(traj)).text)
    assert "2+2?" in text and "4" in text


def test_notebook_display_and_a_lazy_import(showcase: Episode, tok: Any) -> None:
    assert 'class="arl"' in showcase._repr_html_() and 'class="arl"' in showcase.trajectory._repr_html_()
    assert "data-l=" in view(showcase, tokenizer=tok)._repr_html_()
    code = "import sys, agentrl; print(any(m.startswith('agentrl.inspect') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
