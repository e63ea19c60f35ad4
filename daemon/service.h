// What the HTTP handlers share: the model, the pool, the scheduler, the catalog, metrics, limits.
// handle_request routes one request (daemon/api*.cc). Handlers return an ApiStatus; every error leaves
// through send_error (daemon/api_error.h says how codes map to HTTP).
#pragma once
#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "daemon/api_error.h"
#include "daemon/catalog.h"
#include "daemon/config.h"
#include "daemon/http_server.h"
#include "daemon/metrics.h"
#include "daemon/offload.h"
#include "daemon/prompt.h"
#include "daemon/scheduler.h"
#include "engine/constrained/tool_format.h"
#include "mmapstore/compressor.h"

namespace towers::daemon {

struct Service {
  const Config& config;
  const Model& model;
  SegmentPool& pool;
  Scheduler& scheduler;
  Catalog& catalog;
  Metrics& metrics;
  const PromptBuilder& prompts;
  std::string model_id;  // what /v1/models lists (the file name without .gguf)
  // Whether a request's "model" names the served model: "" (absent), model_id, the file name, or one
  // of [model] aliases.
  bool serves(const std::string& model) const;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  BudgetRules budget_rules{};        // how the pool's budgets were sized
  Compressor* compressor = nullptr;  // the cold tier's background compressor
  Offload* offload = nullptr;        // blocking jobs that are not model steps (compress now, fsyncs)
  const HttpServer* http = nullptr;  // its connection counters, for /metrics
  // The model thread's forward pass: used only in Scheduler::run tasks (embeddings), never elsewhere.
  Forward* forward = nullptr;
  // The vocabulary as a byte trie, for constrained decoding (response_format); built on first use.
  std::shared_ptr<const TokenTrie> token_trie() const;
  mutable std::once_flag token_trie_once{};
  mutable std::shared_ptr<const TokenTrie> token_trie_{};
};

void handle_request(Service& svc, const HttpRequest& req, HttpResponder& out);

// Pieces shared by the API files.
namespace api {
// The body as a JSON object (InvalidArgument on malformed JSON or another value).
ApiStatus parse_body(const HttpRequest& req, nlohmann::json* body);
// GET /v1/sessions/{id}?transcript=1 (or =true): the summary with the messages.
bool asks_transcript(const HttpRequest& req);
void send_json(HttpResponder& out, int status, const nlohmann::json& j);
ApiStatus reply(HttpResponder& out, const nlohmann::json& j);  // 200 with j
void send_error(HttpResponder& out, const ApiStatus& e);
std::string dump(const nlohmann::json& j);
ApiStatus wrong_method(std::string_view allowed);  // 405: "use GET or PUT"
// Handlers never wait (docs/http.md): blocking work (file I/O, a record's fsync, coding a segment)
// runs on the offload thread — never the scheduler's — and answers through `out` when it is done (an
// error it returns is sent as the error reply). It returns at once.
using Answer = std::function<ApiStatus(HttpResponder& out)>;
ApiStatus answer_offloaded(Service& svc, HttpResponder& out, Answer work);
// A string field: "" when absent or null (InvalidArgument naming it when required or not a string).
ApiStatus string_field(const nlohmann::json& body, const char* key, bool required, std::string* out);
// Refuses a field not in `known` (400 unknown_parameter naming it).
ApiStatus known_fields(const nlohmann::json& body, std::initializer_list<std::string_view> known);

// chat.completion, text_completion (daemon/api_reply.h) or response (daemon/api_response_reply.h)
enum class ReplyApi { Chat, Completions, Responses };

// Sampling and limits of a generation request (OpenAI field names), validated.
struct GenParams {
  SamplerConfig sampling;
  int max_tokens = 0;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage and no choices
  int n = 1;                   // choices
  // response_format json_object / json_schema: every choice follows it (null: free text).
  std::shared_ptr<GrammarAutomaton> grammar;
  // tools with tool_choice other than "none": each choice's reply is parsed into content and
  // tool_calls in this format (engine/constrained/tool_format.h); nullopt: the reply is text.
  std::optional<ToolFormat> tool_format;
};
// "tools": [{"type": "function", "function": {"name", "description", "parameters", "strict"}}],
// "tool_choice": "none" | "auto" | "required" | {"type": "function", "function": {"name"}},
// "parallel_tool_calls": bool, parsed by parse_tools. Parameter schemas keep the client's key order
// (`ordered`: the body parsed in order, or null). With a session (`session`), a call may be asked for
// without tools: the session's are meant.
struct ToolRequest {
  std::vector<ToolDefinition> tools;
  ToolChoice choice;
  bool parallel = true;
};
ApiStatus parse_tools(const nlohmann::json& body, const nlohmann::ordered_json& ordered, bool session, ToolRequest* out);
// raw_body: the request's text, for what must keep the client's key order (a JSON schema's properties).
// api: whose "logprobs" (chat: a boolean with "top_logprobs"; completions: a count).
ApiStatus parse_gen_params(const Service& svc, const nlohmann::json& body, ReplyApi api, GenParams* params,
                           std::string_view raw_body = {});
// "model": absent, or a name of the served model (Service::serves); else 404 model_not_found.
ApiStatus check_model(const Service& svc, const nlohmann::json& body);
// Refuses n > 1 (param "n"): a session continues one transcript.
ApiStatus one_choice(const GenParams& params);
// Refuses what a generation request may not hold: a field that is neither one of `own` (the
// endpoint's, e.g. "messages") nor a generation field towerd honours or knowingly ignores (harmless
// metadata such as "user"), and a generation field towerd does not support (yet) unless it holds
// that field's neutral value. The error names the field (param).
ApiStatus check_generation_fields(const nlohmann::json& body, std::initializer_list<std::string_view> own);
// Refuses tools (param "tools") on POST /v1/sessions/ID/messages, whose message is the user's text (a
// session's tools come with its first turn on /v1/chat/completions with "session"); tool_choice and
// parallel_tool_calls there decode the reply of a session with tools.
ApiStatus no_tools_with_session(const nlohmann::json& body);

// The handlers of the route table (daemon/routes.cc), which has checked the method; path_param is what
// the route's "{...}" matched. Operator routes (daemon/api.cc):
ApiStatus handle_ui(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);  // the page
ApiStatus handle_healthz(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);
ApiStatus handle_metrics(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);
ApiStatus handle_pool(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);
ApiStatus handle_policy(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);
// OpenAI's (daemon/api_openai.cc):
ApiStatus handle_models(Service&, const HttpRequest&, HttpResponder&, const std::string& name);
ApiStatus handle_chat_completions(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);
ApiStatus handle_completions(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);
// POST /v1/embeddings (daemon/api_embeddings.cc):
ApiStatus handle_embeddings(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);
// OpenAI's Responses API on sessions (daemon/api_responses.cc):
ApiStatus handle_responses(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);
ApiStatus handle_response(Service&, const HttpRequest&, HttpResponder&, const std::string& id);
// Towers' (daemon/api_towers.cc):
ApiStatus handle_compress(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);
ApiStatus handle_segments(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);
ApiStatus handle_segment(Service&, const HttpRequest&, HttpResponder&, const std::string& name);
ApiStatus handle_segment_link(Service&, const HttpRequest&, HttpResponder&, const std::string& name);
ApiStatus handle_segment_compress(Service&, const HttpRequest&, HttpResponder&, const std::string& name);
ApiStatus handle_segment_thaw(Service&, const HttpRequest&, HttpResponder&, const std::string& name);
ApiStatus handle_sessions(Service&, const HttpRequest&, HttpResponder&, const std::string& path_param);
ApiStatus handle_session(Service&, const HttpRequest&, HttpResponder&, const std::string& id);
ApiStatus handle_session_messages(Service&, const HttpRequest&, HttpResponder&, const std::string& id);
ApiStatus handle_session_transcript(Service&, const HttpRequest&, HttpResponder&, const std::string& id);
}  // namespace api

}  // namespace towers::daemon
