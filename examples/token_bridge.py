"""One tool round by hand: render, append sampled ids verbatim, parse, bridge the tool result.

The agent loop (``agentrl.rollout.run_episode``) does exactly this for every turn; this script
shows the token boundary step by step. Run: ``.venv/bin/python examples/token_bridge.py``.
"""

from agentrl import Trajectory
from agentrl.chat import ChatTemplate, Message
from agentrl.testing import build_tokenizer

tok = build_tokenizer()
tpl = ChatTemplate.from_name("qwen3", tokenizer=tok)
CALC = {"type": "function", "function": {"name": "calc", "description": "Run python.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}
history = [Message(role="user", content="2**10?")]
prompt_ids = tpl.encode(history, tools=[CALC], add_generation_prompt=True)
traj = Trajectory.from_prompt(prompt_ids, messages=history, vocab_size=len(tok))

# what an engine would return (ids verbatim, with logprobs)
sampled_text = '<think>\nUse code.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"code": "print(2**10)"}}\n</tool_call><|im_end|>'
sampled_ids = tpl.tokenize(sampled_text)
traj.append_model(sampled_ids, [-0.1] * len(sampled_ids), finish_reason="stop")

reply = tpl.parse(sampled_ids, tools=[CALC])
print(reply.calls, reply.failures)
history.append(reply.to_message())
result = tpl.bridge(traj.tokens, history, [Message(role="tool", content="1024")], tools=[CALC])
print(result.outcome, result.prefix_ok, [(p.kind, len(p.ids)) for p in result.pieces])
for piece in result.pieces:
    traj.append_env(piece.ids, kind=piece.kind)
full = tpl.encode([*history, Message(role="tool", content="1024")], tools=[CALC], add_generation_prompt=True)
print("trajectory equals a full render:", traj.tokens == full)
traj.validate()
