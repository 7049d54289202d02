"""The chat layer: message types, chat templates, the token bridge and tool-call parsing.

Environments speak messages; this package owns the tokens of a conversation.
"""

from agentrl.chat.bridge import (
    BridgeOutcome,
    BridgePiece,
    BridgeResult,
    BridgeSession,
    PieceKind,
    bridge_turn,
)
from agentrl.chat.conversation import check_conversation, check_tools
from agentrl.chat.parse import parse_token_ids, parse_tool_calls
from agentrl.chat.schema import convert_xml_value, tool_properties, validate_arguments
from agentrl.chat.template import (
    TEMPLATE_NAMES,
    ChatTemplate,
    ChatTemplateError,
    ToolCallFormat,
    detect_tool_call_format,
)
from agentrl.chat.types import (
    ROLES,
    FailureKind,
    Message,
    ParsedReply,
    Role,
    ToolCall,
    ToolCallFailure,
    as_message_dicts,
)

__all__ = [
    "ROLES",
    "TEMPLATE_NAMES",
    "BridgeOutcome",
    "BridgePiece",
    "BridgeResult",
    "BridgeSession",
    "ChatTemplate",
    "ChatTemplateError",
    "FailureKind",
    "Message",
    "ParsedReply",
    "PieceKind",
    "Role",
    "ToolCall",
    "ToolCallFailure",
    "ToolCallFormat",
    "as_message_dicts",
    "bridge_turn",
    "check_conversation",
    "check_tools",
    "convert_xml_value",
    "detect_tool_call_format",
    "parse_token_ids",
    "parse_tool_calls",
    "tool_properties",
    "validate_arguments",
]
