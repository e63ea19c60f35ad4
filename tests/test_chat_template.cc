// Chat templates: family detection on real Hugging Face template texts, and rendering compared with
// what Python's jinja2 renders from those templates (the expected strings below were generated that
// way; see the comment above kRendered; Gemma 2, Phi-3.5, Mistral-Nemo, Qwen3 and Mistral Small 3.2:
// tests/reference/templates/render.py wrote rendered.json).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "engine/text/chat_template.h"
#include "test_support.h"

using namespace towers;

namespace {

// tokenizer.chat_template texts as the GGUF converters store them (the JSON string decoded), written
// from the Hugging Face repositories' tokenizer_config.json:
//   meta-llama/Llama-3.1-8B-Instruct, meta-llama/Meta-Llama-3-8B-Instruct, Qwen/Qwen2.5-7B-Instruct,
//   meta-llama/Llama-2-7b-chat-hf, mistralai/Mistral-7B-Instruct-v0.2 (current and original),
//   HuggingFaceH4/zephyr-7b-beta, google/gemma-2-2b-it, microsoft/Phi-3-mini-4k-instruct, and a
//   Vicuna-style template (no special markers).
const char* const kLlama31Instruct = R"JINJA({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)JINJA";
const char* const kLlama3Instruct = R"JINJA({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %})JINJA";
const char* const kQwen25Instruct = R"JINJA({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)JINJA";
const char* const kLlama2Chat = R"JINJA({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})JINJA";
const char* const kMistral7BInstructV02 = R"JINJA({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)JINJA";
const char* const kMistral7BInstructV02Original = R"JINJA({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})JINJA";
const char* const kZephyr7BBeta = R"JINJA({% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %})JINJA";
const char* const kGemma2It = R"JINJA({{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '
' + message['content'] | trim + '<end_of_turn>
' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model
'}}{% endif %})JINJA";
const char* const kPhi3Mini = R"JINJA({% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %})JINJA";
const char* const kVicuna = R"JINJA({%- for message in messages %}{%- if message['role'] == 'system' -%}{{- '' + message['content'] + '

' -}}{%- else -%}{%- if message['role'] == 'user' -%}{{-'USER: ' + message['content'] + '
'-}}{%- else -%}{{-'ASSISTANT: ' + message['content'] + '</s>
' -}}{%- endif -%}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{-'ASSISTANT:'-}}{%- endif -%})JINJA";

struct RenderedCase {
  ChatFamily family;
  const char* conversation;
  const char* bos;
  const char* eos;
  bool add_generation_prompt;
  bool error;
  const char* expected;  // the rendering, or the template's error message
};

const std::map<std::string, std::vector<ChatMessage>> kConversations = {
    {"full", {{"system", "You are a helpful assistant"}, {"user", "Hello"}, {"assistant", "Hi there"}, {"user", "Who are you"}, {"assistant", "   I am an assistant   "}, {"user", "Another question"}}},
    {"nosys", {{"user", "Hello"}, {"assistant", "Hi there"}, {"user", "Who are you"}, {"assistant", "   I am an assistant   "}, {"user", "Another question"}}},
    {"one", {{"user", "  Hi!\n"}}},
    {"ws", {{"system", " \302\240Be brief.\343\200\200"}, {"user", "\342\200\203What?\302\240\n"}}},
    {"empty", {}},
    {"user_user", {{"user", "a"}, {"user", "b"}}},
    {"assistant_first", {{"assistant", "a"}, {"user", "b"}}},
    {"sys_late", {{"user", "a"}, {"assistant", "b"}, {"system", "c"}, {"user", "d"}}},
};

// Generated from the templates above with Python jinja2 3.1 (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, raise_exception: as transformers' apply_chat_template). error = the template raised.
// Llama3 rows come from the Meta-Llama-3 template, ChatML rows from Qwen2.5's (its default system
// message included), Gemma rows from gemma-2's. Cases where a template fails on an empty list are left out.
const RenderedCase kRendered[] = {
    {ChatFamily::Llama3, "full", "<|begin_of_text|>", "<|end_of_text|>", true, false,
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {ChatFamily::Llama3, "full", "<|begin_of_text|>", "<|end_of_text|>", false, false,
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"},
    {ChatFamily::Llama3, "nosys", "<|begin_of_text|>", "<|end_of_text|>", true, false,
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {ChatFamily::Llama3, "nosys", "<|begin_of_text|>", "<|end_of_text|>", false, false,
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"},
    {ChatFamily::Llama3, "one", "<|begin_of_text|>", "<|end_of_text|>", true, false,
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {ChatFamily::Llama3, "one", "<|begin_of_text|>", "<|end_of_text|>", false, false,
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"},
    {ChatFamily::Llama3, "ws", "<|begin_of_text|>", "<|end_of_text|>", true, false,
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {ChatFamily::Llama3, "ws", "<|begin_of_text|>", "<|end_of_text|>", false, false,
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat?<|eot_id|>"},
    {ChatFamily::Llama3, "empty", "<|begin_of_text|>", "<|end_of_text|>", true, false,
     "<|start_header_id|>assistant<|end_header_id|>\n\n"},
    {ChatFamily::Llama3, "empty", "<|begin_of_text|>", "<|end_of_text|>", false, false,
     ""},
    {ChatFamily::Llama3, "user_user", "<|begin_of_text|>", "<|end_of_text|>", true, false,
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\na<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nb<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {ChatFamily::Llama3, "user_user", "<|begin_of_text|>", "<|end_of_text|>", false, false,
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\na<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nb<|eot_id|>"},
    {ChatFamily::Llama3, "assistant_first", "<|begin_of_text|>", "<|end_of_text|>", true, false,
     "<|begin_of_text|><|start_header_id|>assistant<|end_header_id|>\n\na<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nb<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {ChatFamily::Llama3, "assistant_first", "<|begin_of_text|>", "<|end_of_text|>", false, false,
     "<|begin_of_text|><|start_header_id|>assistant<|end_header_id|>\n\na<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nb<|eot_id|>"},
    {ChatFamily::Llama3, "sys_late", "<|begin_of_text|>", "<|end_of_text|>", true, false,
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\na<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nb<|eot_id|><|start_header_id|>system<|end_header_id|>\n\nc<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nd<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {ChatFamily::Llama3, "sys_late", "<|begin_of_text|>", "<|end_of_text|>", false, false,
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\na<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nb<|eot_id|><|start_header_id|>system<|end_header_id|>\n\nc<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nd<|eot_id|>"},
    {ChatFamily::ChatML, "full", "", "", true, false,
     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n"},
    {ChatFamily::ChatML, "full", "", "", false, false,
     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n"},
    {ChatFamily::ChatML, "nosys", "", "", true, false,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n"},
    {ChatFamily::ChatML, "nosys", "", "", false, false,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n"},
    {ChatFamily::ChatML, "one", "", "", true, false,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n  Hi!\n<|im_end|>\n<|im_start|>assistant\n"},
    {ChatFamily::ChatML, "one", "", "", false, false,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n  Hi!\n<|im_end|>\n"},
    {ChatFamily::ChatML, "ws", "", "", true, false,
     "<|im_start|>system\n \302\240Be brief.\343\200\200<|im_end|>\n<|im_start|>user\n\342\200\203What?\302\240\n<|im_end|>\n<|im_start|>assistant\n"},
    {ChatFamily::ChatML, "ws", "", "", false, false,
     "<|im_start|>system\n \302\240Be brief.\343\200\200<|im_end|>\n<|im_start|>user\n\342\200\203What?\302\240\n<|im_end|>\n"},
    {ChatFamily::ChatML, "user_user", "", "", true, false,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n"},
    {ChatFamily::ChatML, "user_user", "", "", false, false,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"},
    {ChatFamily::ChatML, "assistant_first", "", "", true, false,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n"},
    {ChatFamily::ChatML, "assistant_first", "", "", false, false,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"},
    {ChatFamily::ChatML, "sys_late", "", "", true, false,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>system\nc<|im_end|>\n<|im_start|>user\nd<|im_end|>\n<|im_start|>assistant\n"},
    {ChatFamily::ChatML, "sys_late", "", "", false, false,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>system\nc<|im_end|>\n<|im_start|>user\nd<|im_end|>\n"},
    {ChatFamily::Llama2, "full", "<s>", "</s>", true, false,
     "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s><s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]"},
    {ChatFamily::Llama2, "full", "<s>", "</s>", false, false,
     "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s><s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]"},
    {ChatFamily::Llama2, "nosys", "<s>", "</s>", true, false,
     "<s>[INST] Hello [/INST] Hi there </s><s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]"},
    {ChatFamily::Llama2, "nosys", "<s>", "</s>", false, false,
     "<s>[INST] Hello [/INST] Hi there </s><s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]"},
    {ChatFamily::Llama2, "one", "<s>", "</s>", true, false,
     "<s>[INST] Hi! [/INST]"},
    {ChatFamily::Llama2, "one", "<s>", "</s>", false, false,
     "<s>[INST] Hi! [/INST]"},
    {ChatFamily::Llama2, "ws", "<s>", "</s>", true, false,
     "<s>[INST] <<SYS>>\n \302\240Be brief.\343\200\200\n<</SYS>>\n\n\342\200\203What? [/INST]"},
    {ChatFamily::Llama2, "ws", "<s>", "</s>", false, false,
     "<s>[INST] <<SYS>>\n \302\240Be brief.\343\200\200\n<</SYS>>\n\n\342\200\203What? [/INST]"},
    {ChatFamily::Llama2, "user_user", "<s>", "</s>", true, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Llama2, "user_user", "<s>", "</s>", false, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Llama2, "assistant_first", "<s>", "</s>", true, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Llama2, "assistant_first", "<s>", "</s>", false, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Llama2, "sys_late", "<s>", "</s>", true, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Llama2, "sys_late", "<s>", "</s>", false, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Mistral, "full", "<s>", "</s>", true, false,
     "<s> [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s> [INST] Another question [/INST]"},
    {ChatFamily::Mistral, "full", "<s>", "</s>", false, false,
     "<s> [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s> [INST] Another question [/INST]"},
    {ChatFamily::Mistral, "nosys", "<s>", "</s>", true, false,
     "<s> [INST] Hello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s> [INST] Another question [/INST]"},
    {ChatFamily::Mistral, "nosys", "<s>", "</s>", false, false,
     "<s> [INST] Hello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s> [INST] Another question [/INST]"},
    {ChatFamily::Mistral, "one", "<s>", "</s>", true, false,
     "<s> [INST]   Hi!\n [/INST]"},
    {ChatFamily::Mistral, "one", "<s>", "</s>", false, false,
     "<s> [INST]   Hi!\n [/INST]"},
    {ChatFamily::Mistral, "ws", "<s>", "</s>", true, false,
     "<s> [INST]  \302\240Be brief.\343\200\200\n\n\342\200\203What?\302\240\n [/INST]"},
    {ChatFamily::Mistral, "ws", "<s>", "</s>", false, false,
     "<s> [INST]  \302\240Be brief.\343\200\200\n\n\342\200\203What?\302\240\n [/INST]"},
    {ChatFamily::Mistral, "user_user", "<s>", "</s>", true, true,
     "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Mistral, "user_user", "<s>", "</s>", false, true,
     "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Mistral, "assistant_first", "<s>", "</s>", true, true,
     "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Mistral, "assistant_first", "<s>", "</s>", false, true,
     "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Mistral, "sys_late", "<s>", "</s>", true, true,
     "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Mistral, "sys_late", "<s>", "</s>", false, true,
     "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Zephyr, "full", "<s>", "</s>", true, false,
     "<|system|>\nYou are a helpful assistant</s>\n<|user|>\nHello</s>\n<|assistant|>\nHi there</s>\n<|user|>\nWho are you</s>\n<|assistant|>\n   I am an assistant   </s>\n<|user|>\nAnother question</s>\n<|assistant|>\n"},
    {ChatFamily::Zephyr, "full", "<s>", "</s>", false, false,
     "<|system|>\nYou are a helpful assistant</s>\n<|user|>\nHello</s>\n<|assistant|>\nHi there</s>\n<|user|>\nWho are you</s>\n<|assistant|>\n   I am an assistant   </s>\n<|user|>\nAnother question</s>\n"},
    {ChatFamily::Zephyr, "nosys", "<s>", "</s>", true, false,
     "<|user|>\nHello</s>\n<|assistant|>\nHi there</s>\n<|user|>\nWho are you</s>\n<|assistant|>\n   I am an assistant   </s>\n<|user|>\nAnother question</s>\n<|assistant|>\n"},
    {ChatFamily::Zephyr, "nosys", "<s>", "</s>", false, false,
     "<|user|>\nHello</s>\n<|assistant|>\nHi there</s>\n<|user|>\nWho are you</s>\n<|assistant|>\n   I am an assistant   </s>\n<|user|>\nAnother question</s>\n"},
    {ChatFamily::Zephyr, "one", "<s>", "</s>", true, false,
     "<|user|>\n  Hi!\n</s>\n<|assistant|>\n"},
    {ChatFamily::Zephyr, "one", "<s>", "</s>", false, false,
     "<|user|>\n  Hi!\n</s>\n"},
    {ChatFamily::Zephyr, "ws", "<s>", "</s>", true, false,
     "<|system|>\n \302\240Be brief.\343\200\200</s>\n<|user|>\n\342\200\203What?\302\240\n</s>\n<|assistant|>\n"},
    {ChatFamily::Zephyr, "ws", "<s>", "</s>", false, false,
     "<|system|>\n \302\240Be brief.\343\200\200</s>\n<|user|>\n\342\200\203What?\302\240\n</s>\n"},
    {ChatFamily::Zephyr, "empty", "<s>", "</s>", true, false,
     ""},
    {ChatFamily::Zephyr, "empty", "<s>", "</s>", false, false,
     ""},
    {ChatFamily::Zephyr, "user_user", "<s>", "</s>", true, false,
     "<|user|>\na</s>\n<|user|>\nb</s>\n<|assistant|>\n"},
    {ChatFamily::Zephyr, "user_user", "<s>", "</s>", false, false,
     "<|user|>\na</s>\n<|user|>\nb</s>\n"},
    {ChatFamily::Zephyr, "assistant_first", "<s>", "</s>", true, false,
     "<|assistant|>\na</s>\n<|user|>\nb</s>\n<|assistant|>\n"},
    {ChatFamily::Zephyr, "assistant_first", "<s>", "</s>", false, false,
     "<|assistant|>\na</s>\n<|user|>\nb</s>\n"},
    {ChatFamily::Zephyr, "sys_late", "<s>", "</s>", true, false,
     "<|user|>\na</s>\n<|assistant|>\nb</s>\n<|system|>\nc</s>\n<|user|>\nd</s>\n<|assistant|>\n"},
    {ChatFamily::Zephyr, "sys_late", "<s>", "</s>", false, false,
     "<|user|>\na</s>\n<|assistant|>\nb</s>\n<|system|>\nc</s>\n<|user|>\nd</s>\n"},
    {ChatFamily::Gemma, "full", "<bos>", "<eos>", true, true,
     "System role not supported"},
    {ChatFamily::Gemma, "full", "<bos>", "<eos>", false, true,
     "System role not supported"},
    {ChatFamily::Gemma, "nosys", "<bos>", "<eos>", true, false,
     "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n"},
    {ChatFamily::Gemma, "nosys", "<bos>", "<eos>", false, false,
     "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n"},
    {ChatFamily::Gemma, "one", "<bos>", "<eos>", true, false,
     "<bos><start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\n"},
    {ChatFamily::Gemma, "one", "<bos>", "<eos>", false, false,
     "<bos><start_of_turn>user\nHi!<end_of_turn>\n"},
    {ChatFamily::Gemma, "ws", "<bos>", "<eos>", true, true,
     "System role not supported"},
    {ChatFamily::Gemma, "ws", "<bos>", "<eos>", false, true,
     "System role not supported"},
    {ChatFamily::Gemma, "user_user", "<bos>", "<eos>", true, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Gemma, "user_user", "<bos>", "<eos>", false, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Gemma, "assistant_first", "<bos>", "<eos>", true, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Gemma, "assistant_first", "<bos>", "<eos>", false, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Gemma, "sys_late", "<bos>", "<eos>", true, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
    {ChatFamily::Gemma, "sys_late", "<bos>", "<eos>", false, true,
     "Conversation roles must alternate user/assistant/user/assistant/..."},
};

bool starts_with_system(const std::vector<ChatMessage>& m) { return !m.empty() && m[0].role == "system"; }

std::string render(ChatFamily f, const std::vector<ChatMessage>& m, ChatTemplateTokens t, bool gen) {
  auto r = apply_chat_template(f, m, t, gen);
  REQUIRE_MESSAGE(r.ok(), r.error());
  return *r;
}

}  // namespace

TEST_CASE("family names round-trip") {
  for (ChatFamily f : {ChatFamily::Llama3, ChatFamily::ChatML, ChatFamily::Qwen3, ChatFamily::Llama2,
                       ChatFamily::Mistral, ChatFamily::MistralNemo, ChatFamily::MistralV7, ChatFamily::Zephyr,
                       ChatFamily::Gemma, ChatFamily::Phi3, ChatFamily::Phi4, ChatFamily::Plain}) {
    auto back = chat_family_from_name(chat_family_name(f));
    REQUIRE(back.ok());
    CHECK(*back == f);
  }
  CHECK(chat_family_name(ChatFamily::ChatML) == "chatml");
  CHECK(*chat_family_from_name("Llama3") == ChatFamily::Llama3);
  CHECK(*chat_family_from_name("qwen") == ChatFamily::ChatML);
  CHECK(*chat_family_from_name("GEMMA") == ChatFamily::Gemma);
  auto bad = chat_family_from_name("alpaca");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("alpaca") != std::string::npos);
  CHECK(bad.error().find("chatml") != std::string::npos);
  CHECK(chat_family_names() ==
        "llama3, chatml, qwen3, llama2, mistral, mistral-nemo, mistral-v7, zephyr, gemma, phi3, phi4, plain");
  CHECK(*chat_family_from_name("gemma3") == ChatFamily::Gemma);
  CHECK(*chat_family_from_name("mistral-v3-tekken") == ChatFamily::MistralNemo);
  CHECK(*chat_family_from_name("Phi-3") == ChatFamily::Phi3);
}

TEST_CASE("detect the family of real templates") {
  CHECK(detect_chat_family(kLlama31Instruct) == ChatFamily::Llama3);
  CHECK(detect_chat_family(kLlama3Instruct) == ChatFamily::Llama3);
  CHECK(detect_chat_family(kQwen25Instruct) == ChatFamily::ChatML);
  CHECK(detect_chat_family(kLlama2Chat) == ChatFamily::Llama2);
  CHECK(detect_chat_family(kMistral7BInstructV02) == ChatFamily::Mistral);
  CHECK(detect_chat_family(kMistral7BInstructV02Original) == ChatFamily::Mistral);
  CHECK(detect_chat_family(kZephyr7BBeta) == ChatFamily::Zephyr);
  CHECK(detect_chat_family(kGemma2It) == ChatFamily::Gemma);
  // Phi-3 shares <|user|> with Zephyr but ends turns with <|end|>.
  CHECK(detect_chat_family(kPhi3Mini) == ChatFamily::Phi3);
  CHECK(detect_chat_family(kVicuna) == ChatFamily::Plain);
  CHECK(detect_chat_family("") == ChatFamily::Plain);
  CHECK(detect_chat_family("{{ messages }}") == ChatFamily::Plain);
  // A Zephyr-style template with a literal </s> instead of eos_token.
  CHECK(detect_chat_family("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}</s>\n{% endfor %}<|user|>") ==
        ChatFamily::Zephyr);
  // The two templates the project's synthesizer writes into its GGUFs.
  CHECK(detect_chat_family("{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + "
                           "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
                           "'<|eot_id|>' }}{%- endfor %}") == ChatFamily::Llama3);
  CHECK(detect_chat_family("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + "
                           "message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}") == ChatFamily::ChatML);
}

TEST_CASE("Qwen2.5's default system message is read from its template") {
  CHECK(chat_template_default_system(kQwen25Instruct) ==
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  // With real newlines in the literal, and with double quotes.
  CHECK(chat_template_default_system("{{- '<|im_start|>system\nBe nice.<|im_end|>\n' }}") == "Be nice.");
  CHECK(chat_template_default_system("{{- \"<|im_start|>system\\nIt's \\\"fine\\\".<|im_end|>\\n\" }}") ==
        "It's \"fine\".");
  // Templates that take the system text only from the messages insert none.
  CHECK(chat_template_default_system("{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}") == "");
  CHECK(chat_template_default_system(kLlama3Instruct) == "");
  CHECK(chat_template_default_system(kZephyr7BBeta) == "");
  CHECK(chat_template_default_system("") == "");
}

TEST_CASE("rendering equals the Jinja templates' output") {
  int compared = 0, errors = 0;
  for (const auto& c : kRendered) {
    const auto& conv = kConversations.at(c.conversation);
    INFO(chat_family_name(c.family) << " / " << std::string(c.conversation) << " / generation prompt "
                                    << c.add_generation_prompt);
    // Gemma 2 refuses system messages; we fold them into the first user turn instead (tested below).
    if (c.family == ChatFamily::Gemma && starts_with_system(conv)) continue;
    std::vector<ChatMessage> msgs = conv;
    if (c.family == ChatFamily::ChatML && !starts_with_system(conv)) {
      // Qwen2.5 adds its default system message; callers prepend it from the template.
      msgs.insert(msgs.begin(), ChatMessage{"system", chat_template_default_system(kQwen25Instruct)});
    }
    auto r = apply_chat_template(c.family, msgs, ChatTemplateTokens{c.bos, c.eos}, c.add_generation_prompt);
    if (c.error) {
      CHECK_FALSE(r.ok());
      if (!r.ok()) CHECK(!r.error().empty());
      ++errors;
    } else {
      REQUIRE_MESSAGE(r.ok(), r.error());
      CHECK(*r == c.expected);
      ++compared;
    }
  }
  CHECK(compared >= 60);
  CHECK(errors >= 10);
}

TEST_CASE("Llama 3: the spelled-out prompt") {
  const std::vector<ChatMessage> m = {{"system", "You are terse."}, {"user", "Hi"}};
  CHECK(render(ChatFamily::Llama3, m, {"<|begin_of_text|>", "<|end_of_text|>"}, true) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST_CASE("Gemma folds a system message into the first user turn") {
  const auto& full = kConversations.at("full");
  CHECK(render(ChatFamily::Gemma, full, {"<bos>", "<eos>"}, true) ==
        "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
        "<start_of_turn>model\nHi there<end_of_turn>\n"
        "<start_of_turn>user\nWho are you<end_of_turn>\n"
        "<start_of_turn>model\nI am an assistant<end_of_turn>\n"
        "<start_of_turn>user\nAnother question<end_of_turn>\n"
        "<start_of_turn>model\n");
  // The system text is kept as written, the user text trimmed (as gemma-3's template does).
  const std::vector<ChatMessage> m = {{"system", " Sys "}, {"user", "  Q  "}};
  CHECK(render(ChatFamily::Gemma, m, {"<bos>", "<eos>"}, false) ==
        "<bos><start_of_turn>user\n Sys \n\nQ<end_of_turn>\n");
  // A system message alone leaves only the generation prompt.
  const std::vector<ChatMessage> only = {{"system", "S"}};
  CHECK(render(ChatFamily::Gemma, only, {"<bos>", "<eos>"}, true) == "<bos><start_of_turn>model\n");
}

TEST_CASE("Llama 2 and Mistral ignore the generation prompt flag") {
  const std::vector<ChatMessage> m = {{"user", "Q"}};
  CHECK(render(ChatFamily::Llama2, m, {"<s>", "</s>"}, true) == "<s>[INST] Q [/INST]");
  CHECK(render(ChatFamily::Llama2, m, {"<s>", "</s>"}, false) == "<s>[INST] Q [/INST]");
  CHECK(render(ChatFamily::Mistral, m, {"<s>", "</s>"}, true) == "<s> [INST] Q [/INST]");
  // Empty BOS/EOS texts emit nothing.
  CHECK(render(ChatFamily::Mistral, m, {"", ""}, true) == " [INST] Q [/INST]");
}

TEST_CASE("errors: unknown roles and broken alternation") {
  const std::vector<ChatMessage> tool = {{"user", "a"}, {"tool", "b"}};
  for (ChatFamily f : {ChatFamily::Llama3, ChatFamily::ChatML, ChatFamily::Llama2, ChatFamily::Mistral,
                       ChatFamily::Zephyr, ChatFamily::Gemma, ChatFamily::Plain}) {
    auto r = apply_chat_template(f, tool, {}, true);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().find("'tool'") != std::string::npos);
    CHECK(r.error().find("message 1") != std::string::npos);
  }
  const std::vector<ChatMessage> uu = {{"system", "s"}, {"user", "a"}, {"user", "b"}};
  for (ChatFamily f : {ChatFamily::Llama2, ChatFamily::Mistral, ChatFamily::Gemma}) {
    auto r = apply_chat_template(f, uu, {}, true);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().find("alternat") != std::string::npos);
    CHECK(r.error().find("message 2") != std::string::npos);
  }
  // Families without the rule accept the same conversation.
  for (ChatFamily f : {ChatFamily::Llama3, ChatFamily::ChatML, ChatFamily::Zephyr, ChatFamily::Plain}) {
    CHECK(apply_chat_template(f, uu, {}, true).ok());
  }
  const std::vector<ChatMessage> late = {{"user", "a"}, {"assistant", "b"}, {"system", "c"}};
  auto r = apply_chat_template(ChatFamily::Mistral, late, {}, true);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("system") != std::string::npos);
  const std::vector<ChatMessage> empty_role = {{"", "x"}};
  CHECK_FALSE(apply_chat_template(ChatFamily::ChatML, empty_role, {}, true).ok());
}

TEST_CASE("plain transcript") {
  const std::vector<ChatMessage> m = {{"system", "Be kind."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  CHECK(render(ChatFamily::Plain, m, {"<s>", "</s>"}, true) ==
        "System: Be kind.\nUser: Hi\nAssistant: Hello!\nUser: Bye\nAssistant:");
  CHECK(render(ChatFamily::Plain, m, {}, false) == "System: Be kind.\nUser: Hi\nAssistant: Hello!\nUser: Bye\n");
  CHECK(render(ChatFamily::Plain, {}, {}, true) == "Assistant:");
}

TEST_CASE("stop strings and BOS emission per family") {
  CHECK(chat_stop_strings(ChatFamily::Llama3) == std::vector<std::string>{"<|eot_id|>"});
  CHECK(chat_stop_strings(ChatFamily::ChatML) == std::vector<std::string>{"<|im_end|>"});
  CHECK(chat_stop_strings(ChatFamily::Llama2) == std::vector<std::string>{"</s>"});
  CHECK(chat_stop_strings(ChatFamily::Mistral) == std::vector<std::string>{"</s>"});
  CHECK(chat_stop_strings(ChatFamily::Zephyr) == std::vector<std::string>{"</s>"});
  CHECK(chat_stop_strings(ChatFamily::Gemma) == std::vector<std::string>{"<end_of_turn>"});
  const auto plain = chat_stop_strings(ChatFamily::Plain);
  CHECK(std::find(plain.begin(), plain.end(), "\nUser:") != plain.end());
  CHECK(chat_template_emits_bos(ChatFamily::Llama3));
  CHECK(chat_template_emits_bos(ChatFamily::Gemma));
  CHECK_FALSE(chat_template_emits_bos(ChatFamily::ChatML));
  CHECK_FALSE(chat_template_emits_bos(ChatFamily::Zephyr));
  CHECK_FALSE(chat_template_emits_bos(ChatFamily::Plain));
}

// ------------------------------------------------- Gemma 2, Phi-3.5, Mistral-Nemo, Qwen3, Mistral Small 3.2

namespace {

const std::filesystem::path kTemplateDir = TOWERS_TEMPLATE_REFERENCE_DIR;

nlohmann::json rendered_reference() {
  std::ifstream in(kTemplateDir / "rendered.json");
  REQUIRE_MESSAGE(in.good(), "tests/reference/templates/rendered.json missing (run render.py there)");
  return nlohmann::json::parse(in);
}

std::vector<ChatMessage> messages_of(const nlohmann::json& conv) {
  std::vector<ChatMessage> m;
  for (const auto& pair : conv) m.push_back({pair.at(0).get<std::string>(), pair.at(1).get<std::string>()});
  return m;
}

size_t count_role(const std::vector<ChatMessage>& m, const std::string& role) {
  return static_cast<size_t>(std::count_if(m.begin(), m.end(), [&](const ChatMessage& x) { return x.role == role; }));
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("rendering equals the published Jinja templates of Gemma 2 and 3, Phi-3.5, Mistral-Nemo, Qwen3, Mistral Small 3.2") {
  const auto ref = rendered_reference();
  const auto& conversations = ref.at("conversations");
  std::map<std::string, int> compared, errors, deviations;  // by template file
  for (const auto& c : ref.at("cases")) {
    const std::string family_name = c.at("family"), conv_name = c.at("conversation"), file = c.at("template");
    const bool gen = c.at("add_generation_prompt"), thinking = c.at("enable_thinking");
    CAPTURE(file);
    CAPTURE(conv_name);
    CAPTURE(gen);
    CAPTURE(thinking);
    auto family = chat_family_from_name(family_name);
    REQUIRE_MESSAGE(family.ok(), family.error());
    const auto msgs = messages_of(conversations.at(conv_name));
    const bool system_first = !msgs.empty() && msgs[0].role == "system";
    // Where we depart from the template on purpose (chat_template.h says why; checked below):
    // Gemma 2's refuses a system message, we fold it in as Gemma 3's does; Mistral-Nemo keeps the
    // system text on the first user turn; Mistral Small's default system message (with today's date)
    // is not inserted.
    const bool gemma2 = file.starts_with("google-gemma-2");
    const bool deviation = (gemma2 && system_first) ||
                           (*family == ChatFamily::MistralNemo && system_first && count_role(msgs, "user") > 1) ||
                           (*family == ChatFamily::MistralV7 && !system_first && !c.contains("error"));
    if (deviation) {
      ++deviations[file];
      continue;
    }
    ChatOptions options;
    options.enable_thinking = thinking;
    auto r = apply_chat_template(*family, msgs, ChatTemplateTokens{c.at("bos"), c.at("eos")}, gen, options);
    if (c.contains("error")) {
      CHECK_FALSE(r.ok());
      ++errors[file];
    } else {
      REQUIRE_MESSAGE(r.ok(), r.error());
      CHECK(*r == c.at("expected").get<std::string>());
      ++compared[file];
    }
  }
  for (const auto& [f, n] : compared) {
    MESSAGE(f << ": " << n << " renderings equal, " << errors[f] << " refused as the template refuses, "
              << deviations[f] << " documented departures");
  }
  CHECK(compared["google-gemma-2-2b-it.jinja"] >= 10);
  CHECK(compared["google-gemma-3-4b-it.jinja"] >= 20);
  CHECK(compared["microsoft-Phi-3.5-mini-instruct.jinja"] >= 28);
  CHECK(compared["mistralai-Mistral-Nemo-Instruct-2407.jinja"] >= 10);
  CHECK(compared["Qwen-Qwen3-0.6B.jinja"] >= 50);
  CHECK(compared["mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja"] >= 8);
  CHECK(errors["mistralai-Mistral-Nemo-Instruct-2407.jinja"] >= 4);
  CHECK(errors["mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja"] >= 4);
}

TEST_CASE("Mistral-Nemo keeps the system text on the first user turn (the template moves it to the last)") {
  const std::vector<ChatMessage> m = {{"system", "S"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  CHECK(render(ChatFamily::MistralNemo, m, {"<s>", "</s>"}, true) == "<s>[INST]S\n\na[/INST]b</s>[INST]c[/INST]");
  // With one user message both places are the same (rendered.json compares those).
  const std::vector<ChatMessage> one = {{"system", "S"}, {"user", "a"}};
  CHECK(render(ChatFamily::MistralNemo, one, {"<s>", "</s>"}, false) == "<s>[INST]S\n\na[/INST]");
}

TEST_CASE("Qwen3: reasoning is dropped from the history, thinking off closes an empty block") {
  const std::vector<ChatMessage> m = {{"user", "q"}, {"assistant", "<think>\nlong\n</think>\n\nanswer"}, {"user", "r"}};
  CHECK(render(ChatFamily::Qwen3, m, {"", "<|im_end|>"}, true) ==
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nanswer<|im_end|>\n<|im_start|>user\nr<|im_end|>\n"
        "<|im_start|>assistant\n");
  ChatOptions off;
  off.enable_thinking = false;
  auto r = apply_chat_template(ChatFamily::Qwen3, m, {"", "<|im_end|>"}, true, off);
  REQUIRE(r.ok());
  CHECK(r->ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  CHECK(chat_thinking_off_suffix(ChatFamily::Qwen3) == "<think>\n\n</think>\n\n");
  CHECK(chat_thinking_off_suffix(ChatFamily::ChatML).empty());
  // The content a caller places itself is what the template writes.
  CHECK(chat_rendered_content(ChatFamily::Qwen3, "assistant", "<think>x</think>\n\ny") == "y");
  CHECK(chat_rendered_content(ChatFamily::Qwen3, "user", "<think>x</think>\n\ny") == "<think>x</think>\n\ny");
  CHECK(chat_rendered_content(ChatFamily::ChatML, "assistant", "<think>x</think>y") == "<think>x</think>y");
  CHECK(chat_rendered_content(ChatFamily::Gemma, "user", "  hi \n") == "hi");
  // Thinking off changes nothing for families without the switch.
  auto chatml = apply_chat_template(ChatFamily::ChatML, m, {"", ""}, true, off);
  REQUIRE(chatml.ok());
  CHECK(chatml->ends_with("<|im_start|>assistant\n"));
}

TEST_CASE("Phi-4 and Mistral v7 formats") {
  const std::vector<ChatMessage> m = {{"system", "S"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  // llama.cpp's phi4 format (llm_chat_apply_template): <|im_sep|> after the role, no newlines.
  CHECK(render(ChatFamily::Phi4, m, {"<|endoftext|>", "<|im_end|>"}, true) ==
        "<|im_start|>system<|im_sep|>S<|im_end|><|im_start|>user<|im_sep|>a<|im_end|>"
        "<|im_start|>assistant<|im_sep|>b<|im_end|><|im_start|>user<|im_sep|>c<|im_end|>"
        "<|im_start|>assistant<|im_sep|>");
  CHECK(render(ChatFamily::MistralV7, m, {"<s>", "</s>"}, true) ==
        "<s>[SYSTEM_PROMPT]S[/SYSTEM_PROMPT][INST]a[/INST]b</s>[INST]c[/INST]");
  CHECK(chat_stop_strings(ChatFamily::Phi3) == std::vector<std::string>{"<|end|>"});
  CHECK(chat_stop_strings(ChatFamily::Phi4) == std::vector<std::string>{"<|im_end|>"});
  CHECK(chat_stop_strings(ChatFamily::Qwen3) == std::vector<std::string>{"<|im_end|>"});
  CHECK(chat_stop_strings(ChatFamily::MistralNemo) == std::vector<std::string>{"</s>"});
  CHECK(chat_template_emits_bos(ChatFamily::MistralNemo));
  CHECK(chat_template_emits_bos(ChatFamily::MistralV7));
  CHECK_FALSE(chat_template_emits_bos(ChatFamily::Phi3));
  CHECK_FALSE(chat_template_emits_bos(ChatFamily::Qwen3));
}

TEST_CASE("detect the family of the published template files") {
  const std::pair<const char*, ChatFamily> shared_files[] = {
      {"google-gemma-2-2b-it.jinja", ChatFamily::Gemma},
      {"microsoft-Phi-3.5-mini-instruct.jinja", ChatFamily::Phi3},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ChatFamily::MistralNemo},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ChatFamily::ChatML},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ChatFamily::Llama3},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", ChatFamily::Llama3},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", ChatFamily::Llama3},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ChatFamily::ChatML},
  };
  for (const auto& entry : shared_files) {  // not a structured binding: CAPTURE's lambda (clang 14)
    const auto& file = entry.first;
    const auto& family = entry.second;
    const auto p = test::shared_file(std::string("reference/templates/") + file);
    if (p.empty()) continue;
    CAPTURE(std::string(file));
    CHECK(chat_family_name(detect_chat_family(slurp(p))) == chat_family_name(family));
  }
  CHECK(detect_chat_family(slurp(kTemplateDir / "Qwen-Qwen3-0.6B.jinja")) == ChatFamily::Qwen3);
  CHECK(detect_chat_family(slurp(kTemplateDir / "google-gemma-3-4b-it.jinja")) == ChatFamily::Gemma);
  CHECK(detect_chat_family(slurp(kTemplateDir / "mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja")) ==
        ChatFamily::MistralV7);
  // microsoft/phi-4's template marker.
  CHECK(detect_chat_family("{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}") == ChatFamily::Phi4);
}
