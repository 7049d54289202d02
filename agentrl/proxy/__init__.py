"""The agent proxy: an OpenAI-compatible endpoint whose sessions are agentrl episodes.

Bring your own agent: an agent harness written against the OpenAI client (any framework that takes
a base URL and speaks Chat Completions) trains with agentrl's verified token accounting.

- :class:`Agent`: ``Agent(run, reward)`` turns ``async def run(task, client) -> answer`` into a
  ``row -> episode`` factory that ``agentrl train`` / ``agentrl eval`` / ``agentrl env check`` take
  by name like an environment; :class:`AgentRunner` runs one episode (:mod:`agentrl.proxy.adapter`);
- :class:`ProxyServer` / :class:`ProxySession` / :class:`ProxyConfig`: the server and its
  sessions, usable on their own (:mod:`agentrl.proxy.server`, :mod:`agentrl.proxy.session`);
- :func:`check_agent`: the checks behind ``agentrl env check`` for an agent.

See docs/environments.md, "Bring your own agent".
"""

from agentrl.proxy._wire import ChatRequest, Reply, RequestError, parse_request
from agentrl.proxy.adapter import Agent, AgentEpisode, AgentRunner
from agentrl.proxy.check import check_agent
from agentrl.proxy.server import ProxyServer
from agentrl.proxy.session import ProxyConfig, ProxySession, SessionError

__all__ = [
    "Agent",
    "AgentEpisode",
    "AgentRunner",
    "ChatRequest",
    "ProxyConfig",
    "ProxyServer",
    "ProxySession",
    "Reply",
    "RequestError",
    "SessionError",
    "check_agent",
    "parse_request",
]
