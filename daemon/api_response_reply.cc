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
    : stream_(params.stream), prompt_tokens_(prompt_tokens), seed_(params.sampling.seed), base_(std::move(base)) {}

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
  out += event("response.output_item.added",
               {{"output_index", 0}, {"item", response_message_item(id(), "in_progress", "")}});
  out += event("response.content_part.added", {{"item_id", response_item_id(id())},
                                               {"output_index", 0},
                                               {"content_index", 0},
                                               {"part", output_text_part("")}});
  return out;
}

std::string ResponseReply::add(std::string_view text) {
  text_.append(text);
  if (!stream_ || text.empty()) return {};
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
  json r = response_object(base_, status, json::array({response_message_item(id(), status, text_)}), usage(o));
  r["towers"] = towers_timings(o, seed_);
  return r;
}

std::string ResponseReply::end_events(const GenOutcome& o) {
  const json done = whole(o);
  const json& item = done["output"][0];
  std::string out = event("response.output_text.done", {{"item_id", item["id"]},
                                                        {"output_index", 0},
                                                        {"content_index", 0},
                                                        {"text", text_},
                                                        {"logprobs", json::array()}});
  out += event("response.content_part.done",
               {{"item_id", item["id"]}, {"output_index", 0}, {"content_index", 0}, {"part", item["content"][0]}});
  out += event("response.output_item.done", {{"output_index", 0}, {"item", item}});
  return out + event(done["status"] == "completed" ? "response.completed" : "response.incomplete", {{"response", done}});
}

}  // namespace towers::daemon::api
