"""``math_tir``: math with tool-integrated reasoning (a sandboxed Python tool), embedded.

* ``problems``: the nine-family generator, the fixed 1,500-problem test set and its OOD slice;
* ``tools``: finding the code in a model turn; ``grading``: ``\\boxed{}`` answers, exact numeric
  equivalence, optional ``math-verify``; ``formatting``: what the model sees after a run;
* ``env.MathTIREnv``, ``prompts.MathActionParser``, ``prompts.MathPromptBuilder``.

This environment depends on ``streamrl.sandbox`` (it runs code); the sandbox depends on nothing.
"""

from streamrl.envs.math_tir.env import MathTIREnv
from streamrl.envs.math_tir.grading import Grade, compare, extract_answer, extract_boxed, grade, parse_number
from streamrl.envs.math_tir.prompts import MathActionParser, MathPromptBuilder, tool_instructions
from streamrl.envs.math_tir.tools import BadToolCall, ToolCall, find_tool_calls, last_tool_call
from streamrl.envs.registry import register

register("math_tir", MathTIREnv, MathActionParser, MathPromptBuilder)

__all__ = [
    "BadToolCall",
    "Grade",
    "MathActionParser",
    "MathPromptBuilder",
    "MathTIREnv",
    "ToolCall",
    "compare",
    "extract_answer",
    "extract_boxed",
    "find_tool_calls",
    "grade",
    "last_tool_call",
    "parse_number",
    "tool_instructions",
]
