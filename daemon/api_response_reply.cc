#include "daemon/api_response_reply.h"

#include "daemon/api_reply.h"

namespace towers::daemon::api {

using json = nlohmann::json;

namespace {

// Whether the reply was cut short: OpenAI's "incomplete" (only max_output_tokens is a reason it names).
bool cut_short(FinishReason reason) { return openai_finish_reason(reason) == "length"; }

json output_text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
}

}  // namespace

std::string response_item_id(const std::string& response_id) {
  const std::string_view prefix = "resp_";
  return "msg_" + (response_id.starts_with(prefix) ? response_id.substr(prefix.size()) : response_id);
}

json response_message_item(const std::string& response_id, std::string_view status, const std::string& text) {
  return {{"id", response_item_id(response_id)},
          {"type", "message"},
          {"status", status},
          {"role", "assistant"},
          {"content", status == "in_progress" ? json::array() : json::array({output_text_part(text)})}};
}

namespace {
// What follows "resp_" in a response id (the session and turn, or a store:false response's hex).
std::string response_suffix(const std::string& response_id) {
  const std::string_view prefix = "resp_";
  return response_id.starts_with(prefix) ? response_id.substr(prefix.size()) : response_id;
}
}  // namespace

json response_function_call_item(const std::string& response_id, size_t k, const std::string& name,
                                  const std::string& arguments, std::string_view status) {
  const std::string suffix = response_suffix(response_id) + "_" + std::to_string(k);
  return {{"id", "fc_" + suffix}, {"type", "function_call"}, {"status", status},
          {"call_id", "call_" + suffix}, {"name", name}, {"arguments", arguments}};
}

json response_output(const std::string& response_id, std::string_view status, const std::string& text,
                     std::optional<ToolFormat> format) {
  if (!format) return json::array({response_message_item(response_id, status, text)});
  auto parsed = parse_tool_reply(*format, text, /*as_streamed=*/true);
  if (!parsed.ok()) return json::array({response_message_item(response_id, status, text)});
  json out = json::array();
  if (!parsed->content.empty() || parsed->tool_calls.empty()) {
    out.push_back(response_message_item(response_id, status, parsed->content));
  }
  for (size_t k = 0; k < parsed->tool_calls.size(); ++k) {
    out.push_back(response_function_call_item(response_id, k, parsed->tool_calls[k].name, parsed->tool_calls[k].arguments, status));
  }
  return out;
}

json response_object(const json& base, std::string_view status, json output, json usage) {
  json r = base;
  r["object"] = "response";
  r["status"] = status;
  r["output"] = std::move(output);
  r["usage"] = std::move(usage);
  r["error"] = nullptr;
  r["incomplete_details"] = status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr);
  return r;
}

ResponseReply::ResponseReply(const GenParams& params, size_t prompt_tokens, json base)
    : stream_(params.stream), prompt_tokens_(prompt_tokens), seed_(params.sampling.seed), base_(std::move(base)),
      tool_format_(params.tool_format) {
  if (tool_format_ && stream_) parser_ = std::make_unique<ToolCallParser>(*tool_format_, true);
}

const std::string& ResponseReply::id() const { return base_["id"].get_ref<const std::string&>(); }

std::string ResponseReply::event(std::string_view type, json data) {
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  return "event: " + std::string(type) + "\ndata: " + dump(data) + "\n\n";
}

std::string ResponseReply::start_events() {
  const json in_progress = response_object(base_, "in_progress", json::array(), nullptr);
  std::string out = event("response.created", {{"response", in_progress}});
  out += event("response.in_progress", {{"response", in_progress}});
  if (!parser_) out += open_message();  // with tools, once content comes
  return out;
}

std::string ResponseReply::open_message() {
  message_ = item_open_ = true;
  std::string out = event("response.output_item.added",
                          {{"output_index", 0}, {"item", response_message_item(id(), "in_progress", "")}});
  return out + event("response.content_part.added", {{"item_id", response_item_id(id())},
                                                     {"output_index", 0},
                                                     {"content_index", 0},
                                                     {"part", output_text_part("")}});
}

std::string ResponseReply::message_done(const json& item, const std::string& text) {
  std::string out = event("response.output_text.done", {{"item_id", item["id"]},
                                                        {"output_index", 0},
                                                        {"content_index", 0},
                                                        {"text", text},
                                                        {"logprobs", json::array()}});
  out += event("response.content_part.done",
               {{"item_id", item["id"]}, {"output_index", 0}, {"content_index", 0}, {"part", item["content"][0]}});
  return out + event("response.output_item.done", {{"output_index", 0}, {"item", item}});
}

std::string ResponseReply::close_open_item() {
  if (!item_open_) return {};
  item_open_ = false;
  if (calls_.empty()) return message_done(response_message_item(id(), "completed", content_), content_);
  const size_t k = calls_.size() - 1;
  const size_t index = k + (message_ ? 1 : 0);
  const json item = response_function_call_item(id(), k, calls_[k].first, calls_[k].second, "completed");
  std::string out = event("response.function_call_arguments.done",
                          {{"item_id", item["id"]}, {"output_index", index}, {"arguments", calls_[k].second}});
  return out + event("response.output_item.done", {{"output_index", index}, {"item", item}});
}

std::string ResponseReply::tool_events(const std::vector<ToolCallParser::Event>& events) {
  std::string out;
  for (const auto& ev : events) {
    if (ev.kind == ToolCallParser::Event::Kind::Content) {
      if (!calls_.empty() || ev.text.empty()) continue;  // (only whitespace can follow the calls)
      if (!message_) out += open_message();
      content_ += ev.text;
      out += event("response.output_text.delta", {{"item_id", response_item_id(id())},
                                                  {"output_index", 0},
                                                  {"content_index", 0},
                                                  {"delta", ev.text},
                                                  {"logprobs", json::array()}});
    } else if (ev.kind == ToolCallParser::Event::Kind::CallStart) {
      out += close_open_item();
      calls_.push_back({ev.text, ""});
      item_open_ = true;
      const size_t k = calls_.size() - 1;
      out += event("response.output_item.added",
                   {{"output_index", k + (message_ ? 1 : 0)}, {"item", response_function_call_item(id(), k, ev.text, "", "in_progress")}});
    } else if (!calls_.empty()) {
      const size_t k = calls_.size() - 1;
      calls_[k].second += ev.text;
      out += event("response.function_call_arguments.delta",
                   {{"item_id", response_function_call_item(id(), k, "", "", "")["id"]},
                    {"output_index", k + (message_ ? 1 : 0)},
                    {"delta", ev.text}});
    }
  }
  return out;
}

std::string ResponseReply::add(std::string_view text) {
  text_.append(text);
  if (!stream_ || text.empty()) return {};
  if (parser_) return tool_events(parser_->feed(text));
  return event("response.output_text.delta", {{"item_id", response_item_id(id())},
                                              {"output_index", 0},
                                              {"content_index", 0},
                                              {"delta", text},
                                              {"logprobs", json::array()}});
}

json ResponseReply::usage(const GenOutcome& o) const {
  json u = {{"input_tokens", prompt_tokens_},
            {"input_tokens_details", {{"cached_tokens", o.cached_tokens}}},
            {"output_tokens", o.tokens.size()},
            {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", prompt_tokens_ + o.tokens.size()}};
  if (dropped_turns_) {
    // The session reached the context: its oldest turns were left out of this prompt (and of it).
    u["dropped_turns"] = dropped_turns_;
    u["dropped_tokens"] = dropped_tokens_;
  }
  return u;
}

json ResponseReply::whole(const GenOutcome& o) const {
  const std::string_view status = cut_short(o.finish_reason) ? "incomplete" : "completed";
  json r = response_object(base_, status, response_output(id(), status, text_, tool_format_), usage(o));
  r["towers"] = towers_timings(o, seed_);
  return r;
}

std::string ResponseReply::end_events(const GenOutcome& o) {
  const json done = whole(o);
  if (parser_) {
    // What the parser held back, then the open item's end (an empty message when nothing came).
    auto rest = parser_->finish();
    std::string out = rest.ok() ? tool_events(rest.value()) : std::string();
    if (!message_ && calls_.empty()) out += open_message();
    out += close_open_item();
    return out + event(done["status"] == "completed" ? "response.completed" : "response.incomplete", {{"response", done}});
  }
  const std::string out = message_done(done["output"][0], text_);
  return out + event(done["status"] == "completed" ? "response.completed" : "response.incomplete", {{"response", done}});
}

}  // namespace towers::daemon::api
