// Chat templates recognized by their text and rendered as transformers renders them
// (scalesweep/model/chat_template.h).
#include "scalesweep/model/chat_template.h"

#include <algorithm>
#include <stdexcept>

namespace scalesweep::model {
namespace {

// Pattern characters: kNl matches a newline inside a Jinja string literal, written either as
// a real newline or as the escape `\n`; kSlot captures a default system message (up to the
// literal text that follows it; no quote or backslash inside).
constexpr char kNl = '\x01';
constexpr char kSlot = '\x02';

// SmolLM2-Instruct's template (its GGUF `tokenizer.chat_template`, tokenizer_config.json
// `chat_template`), also Qwen2-Instruct's with its own default system message.
constexpr std::string_view kChatMlDefaultSystem =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\x01\x02<|im_end|>\x01' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\x01' + message['content'] + '<|im_end|>' + "
    "'\x01'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\x01' }}"
    "{% endif %}";

// Plain ChatML (transformers' chat-templating documentation).
constexpr std::string_view kChatMl =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\x01' + message['content'] + '<|im_end|>' + "
    "'\x01'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\x01' }}"
    "{% endif %}";

// Meta-Llama-3-8B-Instruct / 70B-Instruct tokenizer_config.json `chat_template`.
constexpr std::string_view kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\x01\x01'+ "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\x01\x01' }}"
    "{% endif %}";

// Qwen2.5-*-Instruct tokenizer_config.json `chat_template` (with its tool branches), as
// written there: `\n` escapes inside the string literals become kNl below.
constexpr std::string_view kQwen25 = R"JINJA({%- if tools %}
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
constexpr std::string_view kQwen25System =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

std::string nl_pattern(std::string_view text) {
  std::string p(text);
  while (!p.empty() && p.back() == '\n') p.pop_back();
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\' && i + 1 < p.size() && p[i + 1] == 'n') {
      out += kNl;
      ++i;
    } else {
      out += p[i];
    }
  }
  return out;
}

// Whether `t` is `p` (see kNl, kSlot), allowing one trailing newline in `t` (Jinja drops it).
bool matches(std::string_view t, std::string_view p, std::string* slot) {
  size_t i = 0, j = 0;
  while (j < p.size()) {
    if (p[j] == kNl) {
      if (i < t.size() && t[i] == '\n') {
        i += 1;
      } else if (t.substr(i, 2) == "\\n") {
        i += 2;
      } else {
        return false;
      }
      ++j;
    } else if (p[j] == kSlot) {
      // The slot ends where the pattern's next literal run (up to the next marker) begins.
      size_t k = j + 1;
      while (k < p.size() && p[k] != kNl && p[k] != kSlot) ++k;
      const std::string_view next = p.substr(j + 1, k - j - 1);
      const size_t end = next.empty() ? std::string_view::npos : t.find(next, i);
      if (end == std::string_view::npos) return false;
      const std::string_view s = t.substr(i, end - i);
      if (s.find('\'') != std::string_view::npos || s.find('\\') != std::string_view::npos)
        return false;
      if (slot) *slot = std::string(s);
      i = end;
      ++j;
    } else {
      if (i >= t.size() || t[i] != p[j]) return false;
      ++i;
      ++j;
    }
  }
  return i == t.size() || (i + 1 == t.size() && t[i] == '\n');
}

// Python's str.isspace() on one UTF-8 character at s[i]: its length, 0 when not whitespace.
size_t space_len(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f)) return 1;
  auto is = [&](std::string_view u) { return s.compare(i, u.size(), u) == 0 ? u.size() : 0; };
  // U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
  for (std::string_view u : {"\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80", "\xe2\x80\xa8", "\xe2\x80\xa9",
                             "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80"})
    if (size_t n = is(u)) return n;
  if (i + 2 < s.size() && c == 0xe2 && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
      static_cast<unsigned char>(s[i + 2]) >= 0x80 && static_cast<unsigned char>(s[i + 2]) <= 0x8a)
    return 3;
  return 0;
}

// Jinja's `trim` filter: Python's str.strip().
std::string py_strip(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    const size_t n = space_len(s, b);
    if (n == 0) break;
    b += n;
  }
  // From the right: find the end of the last non-space character.
  size_t e = b, i = b;
  while (i < s.size()) {
    const size_t n = space_len(s, i);
    if (n > 0) {
      i += n;
    } else {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      i += c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
      e = std::min(i, s.size());
    }
  }
  return std::string(s.substr(b, e - b));
}

void check_roles(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) throw std::invalid_argument("chat template: no messages");
  for (const ChatMessage& m : messages)
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      throw std::invalid_argument("chat template: role \"" + m.role +
                                  "\" (supported: system, user, assistant)");
}

}  // namespace

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  check_roles(messages);
  std::string out;
  switch (family) {
    case ChatFamily::kChatMl:
      if (default_system && messages[0].role != "system")
        out += "<|im_start|>system\n" + *default_system + "<|im_end|>\n";
      for (const ChatMessage& m : messages)
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatFamily::kLlama3:
      out += bos_token;
      for (const ChatMessage& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + py_strip(m.content) +
               "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
  }
  return out;
}

std::optional<ChatTemplate> recognize_chat_template(std::string_view text,
                                                    const std::string& bos_token) {
  ChatTemplate t;
  std::string slot;
  if (matches(text, kChatMlDefaultSystem, &slot)) {
    t.name = "chatml (default system message \"" + slot + "\")";
    t.default_system = slot;
    return t;
  }
  if (matches(text, kChatMl, nullptr)) {
    t.name = "chatml";
    return t;
  }
  static const std::string qwen25 = nl_pattern(kQwen25);
  if (matches(text, qwen25, nullptr)) {
    t.name = "qwen2.5 chatml";
    t.default_system = std::string(kQwen25System);
    return t;
  }
  if (matches(text, kLlama3, nullptr) && !bos_token.empty()) {
    t.family = ChatFamily::kLlama3;
    t.name = "llama3";
    t.bos_token = bos_token;
    return t;
  }
  return std::nullopt;
}

std::string supported_chat_templates() {
  return "ChatML (SmolLM2-Instruct, Qwen2-Instruct, Qwen2.5-Instruct, plain ChatML) and "
         "Llama-3 (Meta-Llama-3-Instruct), recognized by their exact template text";
}

}  // namespace scalesweep::model
