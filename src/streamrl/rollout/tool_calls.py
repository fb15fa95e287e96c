"""The tool form's action parser: the model's reply, read by its tool-call format, becomes the
``AssistantMessage`` the environment runs. Whether each call is well formed (decodable, a known tool,
arguments that fit its schema, within the calls allowed per turn) is judged once, by the
environment (``streamrl.envs.tools``), which answers every call with a message naming its problem."""

from __future__ import annotations

from streamrl.envs.base import ActionParser, ParsedAction
from streamrl.envs.tools import AssistantMessage
from streamrl.policy.tool_format import ToolFormat


class ToolCallParser(ActionParser):
    def __init__(self, tool_format: ToolFormat):
        self.tool_format = tool_format

    def parse(self, text: str) -> ParsedAction:
        return ParsedAction(AssistantMessage.from_parsed(self.tool_format.parse(text)), True)
