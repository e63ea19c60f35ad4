// What the HTTP handlers share: the model, the pool, the scheduler, the catalog, metrics, limits.
// handle_request routes one request (daemon/api*.cc); every error leaves as an OpenAI-style JSON error.
#pragma once
#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "daemon/catalog.h"
#include "daemon/config.h"
#include "daemon/http_server.h"
#include "daemon/metrics.h"
#include "daemon/prompt.h"
#include "daemon/scheduler.h"
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
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  Compressor* compressor = nullptr;  // the cold tier's background compressor
};

void handle_request(Service& svc, const HttpRequest& req, HttpResponder& out);

// Pieces shared by the API files.
namespace api {
nlohmann::json parse_body(const HttpRequest& req);            // 400 on malformed JSON / not an object
void send_json(HttpResponder& out, int status, const nlohmann::json& j);
std::string dump(const nlohmann::json& j);

// Sampling and limits of a generation request (OpenAI field names), validated.
struct GenParams {
  SamplerConfig sampling;
  int max_tokens = 0;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = true;
};
GenParams parse_gen_params(const Service& svc, const nlohmann::json& body);

// Runs a generation through the scheduler and answers: a chat.completion object, or SSE
// chat.completion.chunk events ending in "data: [DONE]". prompt_estimate checks the context up front.
// on_finish runs on the scheduler thread before the lease is released (seal, record).
struct GenerationSpec {
  GenParams params;
  size_t prompt_tokens = 0;
  std::function<Result<std::vector<int32_t>>()> prepare;
  std::function<void(GenOutcome&, Lease*, const std::string& text)> on_finish;
  std::function<void()> on_rejected;  // the job never ran (queue full, shutting down, bad size)
  nlohmann::json extra;               // extra fields for the response ("session", "bot")
};
void run_generation(Service& svc, HttpResponder& out, GenerationSpec spec);

void handle_openai(Service& svc, const HttpRequest& req, HttpResponder& out, bool& handled);
void handle_towers(Service& svc, const HttpRequest& req, HttpResponder& out, bool& handled);
void handle_admin(Service& svc, const HttpRequest& req, HttpResponder& out, bool& handled);
}  // namespace api

}  // namespace towers::daemon
