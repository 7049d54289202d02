"""The bridge feeding a real Trajectory: the ledger's pieces reproduce the full render, masks follow provenance."""

from __future__ import annotations

import chat_golden as g

from agentrl.chat import BridgeOutcome, BridgeSession, ChatTemplate
from agentrl.testing import build_tokenizer
from agentrl.trajectory import SegmentKind, Trajectory


def test_episode_with_one_call_per_turn_stops() -> None:
    tok = build_tokenizer()
    tpl = ChatTemplate.from_name("qwen3_5", tokenizer=tok)
    session = BridgeSession(tpl, g.MSGS[:1], tools=[g.CALC])
    traj = Trajectory.from_prompt(session.prompt_ids, vocab_size=len(tok))
    # The engine stopped on </tool_call> (one call per turn): no <|im_end|> was sampled.
    sampled = tpl.tokenize(g.Q35_TARGET)[:-1]
    assert tpl.decode(sampled).endswith("</tool_call>")
    traj.append_model(sampled, [-0.5] * len(sampled), finish_reason="stop")
    result = session.step(sampled, g.MSGS[1], g.MSGS[2:3])
    assert result.outcome is BridgeOutcome.APPEND
    for piece in result.pieces:
        traj.append_env(piece.ids, kind=SegmentKind(piece.kind))
    assert traj.tokens == tpl.encode(g.MSGS[:3], tools=[g.CALC], add_generation_prompt=True)
    kinds = [s.kind for s in traj.segments]
    assert kinds == [SegmentKind.PROMPT, SegmentKind.MODEL, SegmentKind.SCAFFOLD, SegmentKind.TOOL]
    scaffold = traj.segments[2]
    assert traj.tokens[scaffold.start:scaffold.end] == [tpl.turn_close_id]
    assert traj.loss_mask == [1] * len(sampled) + [0] * (len(traj.tokens) - traj.prompt_length - len(sampled))
