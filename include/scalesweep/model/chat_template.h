// Chat templates (layer `model`): a model's Jinja chat template recognized by its text and
// rendered here, the way transformers' tokenizer.apply_chat_template renders it.
//
// Jinja itself is not implemented (no maintained C++ Jinja is packaged in Debian). A template
// is accepted only when its text is one of the known ones below, character for character
// (a newline inside a string literal may be written as a real newline or as `\n`, and one
// trailing newline, which Jinja drops, is allowed); anything else is refused by the caller
// with supported_chat_templates(). Families:
//
//   chatml   `<|im_start|>ROLE\nCONTENT<|im_end|>\n` per message, `<|im_start|>assistant\n`
//            as the generation prompt; a default system message put first when the list has
//            none: SmolLM2-Instruct ("You are a helpful AI assistant named SmolLM, trained by
//            Hugging Face"), Qwen2-Instruct ("You are a helpful assistant."), any default
//            captured from that template text; Qwen2.5-Instruct ("You are Qwen, created by
//            Alibaba Cloud. You are a helpful assistant.", its tool branches unused); plain
//            ChatML without a default.
//   llama3   Meta-Llama-3-*-Instruct: BOS, then per message
//            `<|start_header_id|>ROLE<|end_header_id|>\n\n` + CONTENT stripped (Jinja's trim:
//            Python's str.strip) + `<|eot_id|>`;
//            `<|start_header_id|>assistant<|end_header_id|>\n\n` as the generation prompt.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace scalesweep::model {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

enum class ChatFamily { kChatMl, kLlama3 };

struct ChatTemplate {
  ChatFamily family = ChatFamily::kChatMl;
  std::string name;  // "smollm2/qwen2 chatml", "qwen2.5 chatml", "chatml", "llama3"
  // chatml: the system message the template puts first when the list does not start with one.
  std::optional<std::string> default_system;
  std::string bos_token;  // llama3: the text of BOS, which the template starts with

  // What transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt)
  // gives for this template. Throws std::invalid_argument for an empty list or a role other
  // than system/user/assistant.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
};

// The template `text` recognized, or nullopt. `bos_token` is the tokenizer's BOS text (llama3
// needs it: nullopt when it is empty).
std::optional<ChatTemplate> recognize_chat_template(std::string_view text,
                                                    const std::string& bos_token);

// One line naming the supported templates, for messages.
std::string supported_chat_templates();

}  // namespace scalesweep::model
