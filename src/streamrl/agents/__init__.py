"""Agents that already exist, trained through an OpenAI-compatible endpoint (docs/agents.md).

``server``: the endpoint (chat completions with tools, streaming, sessions, rewards); ``sessions``:
what each completion recorded and how a session becomes a trajectory; ``runner``: ``AgentBackend``,
which plays a user's ``async def run(client, task) -> float`` as the rollout's episodes.
Above ``policy`` and ``rollout``, below ``train``.
"""

from streamrl.agents.runner import AgentBackend, AgentLoadError, AgentPlayer, AgentSettings, load_agent, read_tasks
from streamrl.agents.server import Endpoint, EndpointServer, EndpointSettings, RequestError, build_app
from streamrl.agents.sessions import Call, Session, SessionStore, to_trajectory

__all__ = [
    "AgentBackend", "AgentLoadError", "AgentPlayer", "AgentSettings", "Call", "Endpoint", "EndpointServer", "EndpointSettings",
    "RequestError", "Session", "SessionStore", "build_app", "load_agent", "read_tasks", "to_trajectory",
]
