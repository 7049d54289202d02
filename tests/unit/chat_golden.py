"""Golden vectors for the Qwen chat formats (conversation MSGS with tools=[CALC], no system message).

The strings are the official templates' renders, as recorded in the project's chat-format reference
(section 4). Shared by test_templates.py and test_bridge.py.
"""

CALC = {"type": "function", "function": {"name": "calc", "description": "Run python.", "parameters":
        {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}
CALL = {"type": "function", "function": {"name": "calc", "arguments": {"code": "print(2**10)"}}}
MSGS = [{"role": "user", "content": "2**10?"},
        {"role": "assistant", "reasoning_content": "Use code.", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "1024"},
        {"role": "assistant", "reasoning_content": "Done.", "content": "\\boxed{1024}"}]
TOOL_JSON = ('{"type": "function", "function": {"name": "calc", "description": "Run python.", "parameters": '
             '{"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}')
XML_RULES = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and "
    "do not tell the user about function calls\n</IMPORTANT>")
USER = "<|im_start|>user\n2**10?<|im_end|>\n"

# Q3-A (Qwen3 hybrid)
Q3_HEADER = ("<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
             "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" + TOOL_JSON +
             "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
             "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
             "<args-json-object>}\n</tool_call><|im_end|>\n")
Q3_BODY = (USER + "<|im_start|>assistant\n<think>\nUse code.\n</think>\n\n<tool_call>\n{\"name\": \"calc\", "
           "\"arguments\": {\"code\": \"print(2**10)\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
           "1024\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nDone.\n</think>\n\n\\boxed{1024}<|im_end|>\n")
Q3_GEN_PROMPT = Q3_HEADER + USER + "<|im_start|>assistant\n"
Q3_TARGET = ("<think>\nUse code.\n</think>\n\n<tool_call>\n{\"name\": \"calc\", \"arguments\": "
             "{\"code\": \"print(2**10)\"}}\n</tool_call><|im_end|>")
Q3_TOOL_SEGMENT = "\n<|im_start|>user\n<tool_response>\n1024\n</tool_response><|im_end|>\n<|im_start|>assistant\n"

# QC-A (Qwen3-Coder, July 2025)
QC_HEADER = ("<|im_start|>system\nYou are Qwen, a helpful AI assistant that can interact with a computer to solve "
             "tasks.\n\nYou have access to the following functions:\n\n<tools>\n<function>\n<name>calc</name>\n"
             "<description>Run python.</description>\n<parameters>\n<parameter>\n<name>code</name>\n<type>string</type>\n"
             "</parameter>\n<required>[`code`]</required>\n</parameters>\n</function>\n</tools>" + XML_RULES + "<|im_end|>\n")
QC_BODY = (USER + "<|im_start|>assistant\n<tool_call>\n<function=calc>\n<parameter=code>\nprint(2**10)\n</parameter>\n"
           "</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n1024\n</tool_response>\n<|im_end|>\n"
           "<|im_start|>assistant\n\\boxed{1024}<|im_end|>\n")
QC_GEN_PROMPT = QC_HEADER + USER + "<|im_start|>assistant\n"
QC_TARGET = "<tool_call>\n<function=calc>\n<parameter=code>\nprint(2**10)\n</parameter>\n</function>\n</tool_call><|im_end|>"
QC_TOOL_SEGMENT = "\n<|im_start|>user\n<tool_response>\n1024\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n"

# Q35-A (Qwen3.5)
Q35_HEADER = ("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n" + TOOL_JSON +
              "\n</tools>" + XML_RULES + "<|im_end|>\n")
Q35_BODY = (USER + "<|im_start|>assistant\n<think>\nUse code.\n</think>\n\n<tool_call>\n<function=calc>\n"
            "<parameter=code>\nprint(2**10)\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n"
            "<tool_response>\n1024\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nDone.\n</think>\n\n"
            "\\boxed{1024}<|im_end|>\n")
Q35_GEN_PROMPT = Q35_HEADER + USER + "<|im_start|>assistant\n<think>\n"
Q35_TARGET = ("Use code.\n</think>\n\n<tool_call>\n<function=calc>\n<parameter=code>\nprint(2**10)\n</parameter>\n"
              "</function>\n</tool_call><|im_end|>")
Q35_TOOL_SEGMENT = ("\n<|im_start|>user\n<tool_response>\n1024\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n<think>\n")
