"""Chat templates with tools for the tests, written from the formats' published descriptions (no hub
download is possible here), and tokenizers to render them with.

* ``QWEN25_LIKE``: ChatML with Hermes tools as Qwen2.5 writes them: a system turn (a default one when
  the chat has none) listing the tools inside ``<tools></tools>``, calls as
  ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``, consecutive tool results grouped in
  one user turn of ``<tool_response>`` blocks.
* ``QWEN3_LIKE``: the same tool markup, plus Qwen3's reasoning rules: the assistant turns after the
  last user query keep a ``<think>...</think>`` block (the last turn always, an empty one included),
  earlier turns lose theirs; so the rendering is not append-only.
* ``LLAMA31_LIKE``: Llama 3.1 JSON tool calling: header tokens, the tools listed in the first user
  message, a call written as ``{"name": ..., "parameters": ...}``, one call per message, tool results
  in ``ipython`` turns.
"""

from __future__ import annotations

QWEN25_LIKE = r"""
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0]['role'] == 'system' -%}
        {{- messages[0]['content'] -}}
    {%- else -%}
        {{- 'You are a helpful assistant.' -}}
    {%- endif -%}
    {{- '\n\n# Tools\n\nYou may call functions. Their signatures are inside <tools></tools>:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nWrite each call as a JSON object with "name" and "arguments" inside <tool_call></tool_call> tags.<|im_end|>\n' -}}
{%- elif messages[0]['role'] == 'system' -%}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' -}}
{%- else -%}
    {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'system' and loop.first -%}
    {%- elif message.role == 'assistant' and message.tool_calls -%}
        {{- '<|im_start|>assistant' -}}
        {%- if message.content -%}
            {{- '\n' + message.content -}}
        {%- endif -%}
        {%- for call in message.tool_calls -%}
            {%- set function = call.function if call.function is defined else call -%}
            {{- '\n<tool_call>\n{"name": "' + function.name + '", "arguments": ' -}}
            {{- function.arguments if function.arguments is string else function.arguments | tojson -}}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

QWEN3_LIKE = r"""
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0]['role'] == 'system' -%}
        {{- messages[0]['content'] + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nYou may call functions. Their signatures are inside <tools></tools>:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nWrite each call as a JSON object with "name" and "arguments" inside <tool_call></tool_call> tags.<|im_end|>\n' -}}
{%- elif messages[0]['role'] == 'system' -%}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(last_query=-1) -%}
{%- for message in messages -%}
    {%- if message.role == 'user' and not message.content.startswith('<tool_response>') -%}
        {%- set ns.last_query = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
    {%- if message.role == 'system' and loop.first -%}
    {%- elif message.role == 'assistant' -%}
        {%- set content = message.content or '' -%}
        {%- set reasoning = '' -%}
        {%- if message.reasoning_content is defined and message.reasoning_content -%}
            {%- set reasoning = message.reasoning_content -%}
        {%- elif '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
            {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' -}}
        {%- endif -%}
        {{- content -}}
        {%- if message.tool_calls -%}
            {%- for call in message.tool_calls -%}
                {%- set function = call.function if call.function is defined else call -%}
                {%- if content or not loop.first -%}
                    {{- '\n' -}}
                {%- endif -%}
                {{- '<tool_call>\n{"name": "' + function.name + '", "arguments": ' -}}
                {{- function.arguments if function.arguments is string else function.arguments | tojson -}}
                {{- '}\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
"""

LLAMA31_SPECIALS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>")

LLAMA31_LIKE = r"""
{{- '<|begin_of_text|>' -}}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set system = messages[0]['content'] -%}
    {%- set rest = messages[1:] -%}
{%- else -%}
    {%- set system = '' -%}
    {%- set rest = messages -%}
{%- endif -%}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
{%- if tools -%}
    {{- 'Environment: ipython\n' -}}
{%- endif -%}
{{- 'Cutting Knowledge Date: December 2023\n\n' + system + '<|eot_id|>' -}}
{%- set ns = namespace(tools_written=false) -%}
{%- for message in rest -%}
    {%- if message.role == 'user' and tools and not ns.tools_written -%}
        {%- set ns.tools_written = true -%}
        {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
        {{- 'Given the following functions, respond with a JSON function call in the format {"name": function name, "parameters": dictionary of argument name and its value}.\n\n' -}}
        {%- for tool in tools -%}
            {{- (tool | tojson(indent=4)) + '\n\n' -}}
        {%- endfor -%}
        {{- message.content + '<|eot_id|>' -}}
    {%- elif message.role == 'assistant' and message.tool_calls -%}
        {%- if message.tool_calls | length != 1 -%}
            {{- raise_exception('This model only supports single tool-calls at once!') -}}
        {%- endif -%}
        {%- set function = message.tool_calls[0].function -%}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + function.name + '", "parameters": ' + (function.arguments | tojson) + '}<|eot_id|>' -}}
    {%- elif message.role == 'tool' or message.role == 'ipython' -%}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' -}}
        {{- (message.content if message.content is string else message.content | tojson) + '<|eot_id|>' -}}
    {%- else -%}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content + '<|eot_id|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
"""

# the tiny model's template before tools (what scripts/build_tiny_tokenizer.py wrote), and
# SmolLM2-135M-Instruct's own template, as its GGUF ships it: tool-free chats must render as these do
TINY_TEMPLATE_BEFORE_TOOLS = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SMOLLM2_OWN_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokenizer_with(template: str | None = None, specials: tuple[str, ...] = ()):
    """The tiny tokenizer, with ``template`` as its chat template and ``specials`` added as special tokens."""
    from tokenizers import AddedToken

    from streamrl.policy.tiny import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    if specials:
        tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in specials], special_tokens=True)
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer
