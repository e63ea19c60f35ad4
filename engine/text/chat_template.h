// Chat prompts without a Jinja engine: the chat family is detected from the model's
// `tokenizer.chat_template` text by characteristic markers, and each family's format is written out by
// hand so that, for plain system/user/assistant conversations (no tools), the result is byte for byte
// what Hugging Face's `apply_chat_template` (Jinja2 with trim_blocks and lstrip_blocks) renders.
//
// Which template each family follows (message = role + content; "trim" = Python str.strip()):
//   Llama3   meta-llama/Meta-Llama-3-8B-Instruct:
//              bos (before the first message only) + for each m: "<|start_header_id|>" + role +
//              "<|end_header_id|>\n\n" + trim(content) + "<|eot_id|>"; generation prompt
//              "<|start_header_id|>assistant<|end_header_id|>\n\n".
//              Llama 3.1/3.2/3.3 templates use the same turns but always open with a system block that
//              starts "Cutting Knowledge Date: December 2023\nToday Date: <date>\n\n"; that preamble is
//              NOT reproduced (as llama.cpp's built-in llama3 format does not either).
//   ChatML   Qwen/Qwen2.5-Instruct without tools (the generic ChatML of OpenHermes etc. is the same):
//              "<|im_start|>" + role + "\n" + content + "<|im_end|>\n"; prompt "<|im_start|>assistant\n".
//              No BOS. Qwen2.5 inserts a default system message when the first message is not a system
//              one: get it with chat_template_default_system() and prepend it yourself.
//              (Qwen3's templates, which handle thinking, are the family Qwen3.)
//   Qwen3    Qwen/Qwen3-0.6B ... Qwen3-32B, Qwen3-30B-A3B (templates with `enable_thinking`), without tools:
//              ChatML (no default system message), but an assistant message's reasoning is dropped:
//              when its content holds "</think>", only the text after the last "</think>" is kept, its
//              leading newlines removed (the template does so for every assistant turn before the last
//              user message; a trailing assistant turn after it keeps "<think>\n" + reasoning +
//              "\n</think>\n\n" + answer). Thinking off (ChatOptions::enable_thinking = false, as
//              `enable_thinking=False` in the template) appends "<think>\n\n</think>\n\n" to the
//              generation prompt: an empty reasoning block, so the model answers at once.
//   Phi3     microsoft/Phi-3.5-mini-instruct (and the Phi-3 templates since mid-2024): per message
//              "<|" + role + "|>\n" + content + "<|end|>\n", a system message only when not empty;
//              prompt "<|assistant|>\n", without it the template ends with eos. (The first Phi-3-mini
//              template also wrote bos first and dropped system messages; the vocab adds BOS itself.)
//   Phi4     microsoft/phi-4: "<|im_start|>" + role + "<|im_sep|>" + content + "<|im_end|>"; prompt
//              "<|im_start|>assistant<|im_sep|>" (as llama.cpp's phi4 format; the published template
//              is not in shared/, so only that format is checked).
//   Llama2   meta-llama/Llama-2-7b-chat-hf: per user turn bos + "[INST] " + strip(content) + " [/INST]",
//              the first user turn's content being "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + user when
//              there is a system message; assistant turns " " + strip(content) + " " + eos.
//              The template has no generation prompt (add_generation_prompt changes nothing).
//   Mistral  mistralai/Mistral-7B-Instruct-v0.2 as published since mid-2024 (the "v1" template that
//              accepts a leading system message): bos, then per user turn " [INST] " + content +
//              " [/INST]" (first one: system + "\n\n" + content), assistant " " + content + eos.
//              No generation prompt. (The first v0.2 template, "[INST] u [/INST]a</s>" without the
//              leading spaces and without system support, is not reproduced.)
//   MistralNemo mistralai/Mistral-Nemo-Instruct-2407 (tekken, "v3-tekken"): bos, per user turn
//              "[INST]" + content + "[/INST]", assistant content + eos, no spaces, no trimming, no
//              generation prompt. The published template puts "system\n\n" in front of the LAST user
//              message; we put it in front of the first (as llama.cpp's built-in mistral-v3-tekken
//              does): the same text for one user message, and a prefix that does not move every turn
//              for more (towers share prefixes; a moving system text would void every cached one).
//   MistralV7 Mistral Small 3.x (v7-tekken, templates with [SYSTEM_PROMPT]): bos, then system
//              "[SYSTEM_PROMPT]" + content + "[/SYSTEM_PROMPT]", user "[INST]" + content + "[/INST]",
//              assistant content + eos; no generation prompt. The default system message some of those
//              templates insert is not (prepend it yourself); Mistral Large 2411's spaced v7 is not
//              reproduced.
//   Zephyr   HuggingFaceH4/zephyr-7b-beta (also TinyLlama-1.1B-Chat):
//              "<|" + role + "|>\n" + content + eos + "\n"; prompt "<|assistant|>\n" (only after at
//              least one message, as in the template). No BOS.
//   Gemma    google/gemma-2-2b-it / gemma-2-9b-it and google/gemma-3-*-it (the same turns; Gemma 3's
//              template folds a system message as described below): bos + "<start_of_turn>" + (user|model) + "\n" +
//              trim(content) + "<end_of_turn>\n"; prompt "<start_of_turn>model\n". Gemma 2 rejects a
//              system message; we fold it in the way gemma-3's template does: system content + "\n\n"
//              in front of the first user turn's (trimmed) content.
//   Plain    no template / unknown template: "System: ...\nUser: ...\nAssistant: ...\n" lines and the
//              prompt "Assistant:" (no trailing space, so BPE models start their answer with " word").
//
// Role order: Llama2, Mistral, MistralNemo, MistralV7 and Gemma require an optional leading system
// message followed by strictly alternating user/assistant turns starting with user (their templates
// raise otherwise); the others accept any order. Roles other than "system", "user", "assistant" are an error everywhere, except
// Llama3's "ipython" (Llama 3.1's tool-result turn; engine/constrained/tool_format.h renders tool messages so).
// Tools, tool calls and tool results: engine/constrained/tool_format.h turns them into messages for these formats.
//
// BOS: Llama3, Llama2, Mistral, MistralNemo, MistralV7 and Gemma emit tokens.bos as text; tokenize such prompts with special
// tokens parsed and without adding another BOS (chat_template_emits_bos()). Empty tokens.bos/eos emit
// nothing.
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/status.h"

namespace towers {

enum class ChatFamily { Llama3, ChatML, Qwen3, Llama2, Mistral, MistralNemo, MistralV7, Zephyr, Gemma, Phi3, Phi4, Plain };

// Lower-case names: "llama3", "chatml", "qwen3", "llama2", "mistral", "mistral-nemo", "mistral-v7",
// "zephyr", "gemma", "phi3", "phi4", "plain".
std::string_view chat_family_name(ChatFamily family);
// Inverse of chat_family_name, case-insensitive; also accepts "llama-3", "qwen", "llama-2", "gemma2",
// "gemma3", "mistral-v3-tekken", "phi-3", "phi-4".
Result<ChatFamily> chat_family_from_name(std::string_view name);
// "llama3, chatml, ..." for help texts and error messages.
std::string chat_family_names();

// Detection by markers, first match wins:
//   <|start_header_id|> → Llama3; <|im_start|> with <|im_sep|> → Phi4, with enable_thinking → Qwen3,
//   else ChatML; <start_of_turn> → Gemma; [INST] with [SYSTEM_PROMPT] → MistralV7, with <<SYS>> →
//   Llama2, with a literal "[INST]" (double quotes, no spaces) → MistralNemo, else Mistral;
//   <|assistant|> with <|end|> → Phi3; <|user|> with </s> or eos_token → Zephyr; anything else → Plain.
ChatFamily detect_chat_family(std::string_view jinja_template);
// The configured family (a name for chat_family_from_name) or, when `configured` is empty, the one
// detected from the template.
Result<ChatFamily> chat_family_for(std::string_view jinja_template, std::string_view configured);

// The system message a template inserts when the conversation has none (Qwen2.5's "You are Qwen,
// created by Alibaba Cloud. You are a helpful assistant."), or "" when it inserts none.
std::string chat_template_default_system(std::string_view jinja_template);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// Texts of the BOS and EOS pieces, e.g. "<s>"/"</s>" or "<|begin_of_text|>"/"<|end_of_text|>".
struct ChatTemplateTokens {
  std::string bos, eos;
};

// Per-request switches the templates read (llama-server's `chat_template_kwargs`).
struct ChatOptions {
  bool enable_thinking = true;  // Qwen3: false closes an empty reasoning block in the generation prompt
};

// The prompt text for `messages`; add_generation_prompt appends the opening of an assistant turn
// (ignored by Llama2 and the Mistral families, whose templates always end after "[/INST]").
Result<std::string> apply_chat_template(ChatFamily family, std::span<const ChatMessage> messages,
                                        const ChatTemplateTokens& tokens, bool add_generation_prompt,
                                        const ChatOptions& options = {});

// What the family's template writes for a message's content: trimmed (Llama3, Llama2, Gemma), an
// assistant's reasoning dropped (Qwen3: the text after the last "</think>", leading newlines removed),
// else as is. apply_chat_template writes history turns so; callers that place contents themselves
// (daemon/prompt.h) use it too.
std::string chat_rendered_content(ChatFamily family, std::string_view role, std::string_view content);

// Template text appended after the generation prompt when thinking is off: Qwen3
// "<think>\n\n</think>\n\n", "" for the others (they have no switch).
std::string_view chat_thinking_off_suffix(ChatFamily family);

// Whether the family's format starts with (or contains) the BOS text itself.
bool chat_template_emits_bos(ChatFamily family);

// Strings that end an assistant turn, to use as stop strings on the generated text:
//   Llama3 "<|eot_id|>", ChatML/Qwen3/Phi4 "<|im_end|>", Llama2/Mistral/MistralNemo/MistralV7/Zephyr
//   "</s>", Gemma "<end_of_turn>", Phi3 "<|end|>", Plain "\nUser:" and "\nSystem:". (End-of-generation token ids should be checked as ids too.)
std::vector<std::string> chat_stop_strings(ChatFamily family);

}  // namespace towers
