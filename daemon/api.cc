// Request dispatch through the route table (daemon/routes.h), the shared JSON helpers, and the
// operator endpoints (docs/api.md, "Routes"): /healthz, /v1/pool, /v1/policy (runtime eviction and
// RAM budget; SIGHUP rereads the file's [policy]) and /metrics.
#include <algorithm>

#include "daemon/api_responses.h"
#include "daemon/log.h"
#include "daemon/metrics_text.h"
#include "daemon/routes.h"
#include "daemon/service.h"
#include "daemon/ui_page.h"

namespace towers::daemon {

using json = nlohmann::json;

namespace api {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(HttpResponder& out, int status, const json& j) { out.send(status, "application/json", dump(j) + "\n"); }

ApiStatus reply(HttpResponder& out, const json& j) {
  send_json(out, 200, j);
  return {};
}

void send_error(HttpResponder& out, const ApiStatus& e) {
  if (out.responded()) return;
  const ErrorReply r = error_reply(e);
  std::vector<std::pair<std::string, std::string>> headers;
  if (r.retry_after > 0) headers.push_back({"Retry-After", std::to_string(r.retry_after)});
  out.send(r.http_status, "application/json", dump(r.body) + "\n", headers);
}

namespace {
// The job that runs `work` later and sends its error if it returns one.
std::function<void()> answering(HttpResponder& out, Answer work) {
  return [out = out.shared_from_this(), work = std::move(work)] {
    if (ApiStatus e = work(*out); !e.ok()) send_error(*out, e);
  };
}
}  // namespace

ApiStatus answer_offloaded(Service& svc, HttpResponder& out, Answer work) {
  svc.offload->post(answering(out, std::move(work)));
  return {};
}

ApiStatus wrong_method(std::string_view allowed) {
  return ApiStatus(Status::InvalidArgument("use " + std::string(allowed)), "", "method_not_allowed");
}

bool asks_transcript(const HttpRequest& req) {
  return req.query.find("transcript=1") != std::string::npos || req.query.find("transcript=true") != std::string::npos;
}

ApiStatus parse_body(const HttpRequest& req, json* body) {
  if (req.body.empty()) return Status::InvalidArgument("the request body is empty; a JSON object is expected");
  try {
    *body = json::parse(req.body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e6666 (api_fuzz)
    std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos || what.find("utf-8") != std::string::npos) {
      return Status::InvalidArgument("the body is not valid UTF-8 JSON: " + what);
    }
    return Status::InvalidArgument("malformed JSON: " + what);
  }
  if (!body->is_object()) return Status::InvalidArgument("the body must be a JSON object");
  return {};
}

ApiStatus string_field(const json& body, const char* key, bool required, std::string* out) {
  out->clear();
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) {
    return required ? invalid_field(key, std::string("\"") + key + "\" is required") : ApiStatus();
  }
  if (!it->is_string()) return invalid_field(key, std::string("\"") + key + "\" must be a string");
  *out = it->get<std::string>();
  return {};
}

ApiStatus known_fields(const json& body, std::initializer_list<std::string_view> known) {
  for (const auto& [k, v] : body.items()) {
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    std::string list;
    for (std::string_view f : known) list += (list.empty() ? "" : ", ") + std::string(f);
    return ApiStatus(Status::InvalidArgument("unknown field \"" + k + "\" (this endpoint takes " + list + ")"), k,
                     "unknown_parameter");
  }
  return {};
}

namespace {

json pool_json(Service& svc) {
  PoolStats st = svc.pool.stats();
  auto list = svc.pool.list();
  json by_depth = json::array();
  auto at = [](const std::map<size_t, size_t>& m, size_t d) { return m.count(d) ? m.at(d) : size_t{0}; };
  for (const auto& [d, n] : st.count_by_depth) {
    by_depth.push_back({{"depth", d}, {"segments", n}, {"bytes", at(st.bytes_by_depth, d)},
                        {"resident_bytes", at(st.resident_by_depth, d)},
                        {"mapped_not_resident_bytes", at(st.mapped_by_depth, d)}, {"disk_bytes", at(st.disk_by_depth, d)}});
  }
  json by_kind = json::object();
  for (const auto& s : list) {
    std::string kind = s.label.substr(0, s.label.find(':'));
    if (kind.empty()) kind = "other";
    json& k = by_kind[kind];
    if (k.is_null()) k = {{"segments", 0}, {"bytes", 0}, {"tokens", 0}, {"hot", 0}, {"warm", 0}, {"cold", 0}};
    k["segments"] = k["segments"].get<size_t>() + 1;
    k["bytes"] = k["bytes"].get<size_t>() + s.kv_bytes;
    k["tokens"] = k["tokens"].get<size_t>() + static_cast<size_t>(s.length);
    std::string tier(to_string(s.tier));
    k[tier] = k[tier].get<size_t>() + 1;
  }
  auto m = svc.metrics.snapshot();
  const size_t sessions = svc.catalog.session_count(), warm = svc.catalog.warm_sessions();
  // Every token the model prefilled, and why (Scheduler::prefilled).
  json prefill_by_cause = json::object();
  uint64_t prefilled = 0;
  const auto by_cause = svc.scheduler.prefilled();
  for (int c = 0; c < kPrefillCauses; ++c) {
    prefill_by_cause[std::string(to_string(static_cast<PrefillCause>(c)))] = by_cause[static_cast<size_t>(c)];
    prefilled += by_cause[static_cast<size_t>(c)];
  }
  PoolOptions po = svc.pool.options();
  json batches = json::object();
  for (const auto& [n, c] : m.batch_sizes) batches[std::to_string(n)] = c;
  json compressor = nullptr;  // the cold tier's background coder (null: disabled)
  if (svc.compressor) {
    const Compressor::Stats cs = svc.compressor->stats();
    compressor = {{"scans", cs.scans},       {"compressed", cs.compressed}, {"skipped", cs.skipped},
                  {"failed", cs.failed},     {"tokens", cs.tokens},         {"coded_bytes", cs.coded_bytes},
                  {"seconds", cs.seconds},   {"last_error", cs.last_error}};
  }
  return {
      {"segments", st.segments},
      {"compressor", compressor},
      {"kv_bytes", st.kv_bytes},
      {"hot", {{"segments", st.hot_segments}, {"bytes", st.hot_bytes}}},
      {"warm", {{"segments", st.warm_segments}, {"bytes", st.warm_bytes}}},
      {"cold", {{"segments", st.cold_segments}, {"bytes", st.cold_bytes}}},
      {"at_rest", {{"segments", st.at_rest_segments}, {"bytes", st.at_rest_bytes}, {"wakes", st.wakes},
                   {"wake_tokens", st.wake_tokens}, {"wake_errors", st.wake_errors},
                   {"packed", {{"segments", st.packed_segments}, {"record_bytes", st.pack_record_bytes},
                               {"disk_bytes", st.pack_disk_bytes}, {"dead_bytes", st.pack_dead_bytes},
                               {"error", st.pack_error}}}}},
      {"modular", {{"segments", st.modular_segments},
                   {"placements_pending", st.placements_pending},
                   {"exact_rebuilds", svc.scheduler.exact_rebuilds()}}},
      {"memory", {{"resident_bytes", st.resident_bytes}, {"segment_bytes", st.hot_bytes}, {"tail_bytes", st.tail_bytes},
                  {"unwritten_bytes", st.owned_bytes}}},
      {"disk", {{"bytes", st.disk_bytes}, {"files_written", st.files_written}, {"write_errors", st.write_errors},
                {"write_error", st.write_error}}},
      {"by_depth", by_depth},
      {"by_kind", by_kind},
      {"bytes_by_format", st.bytes_by_format},
      {"trie_bytes", st.trie_bytes},
      {"token_bytes", st.token_bytes},
      {"entry_bytes", st.entry_bytes},
      {"leases", st.leases},
      {"hits", st.lease_hits},
      {"misses", st.leases - st.lease_hits},
      {"cached_tokens", st.cached_tokens},
      {"prefill_tokens", prefilled},
      {"prefill_tokens_by_cause", prefill_by_cause},
      {"evictions", st.evictions},
      {"page_ins", st.page_ins},
      {"page_outs", st.page_outs},
      {"page_in_error", st.page_in_error},
      {"sessions", {{"total", sessions}, {"warm", warm}, {"cold", sessions - warm}}},
      {"hierarchy_segments", svc.catalog.segment_count()},
      {"policy", {{"eviction", std::string(to_string(po.eviction))}, {"ram_budget", po.ram_budget_bytes},
                  {"ram_budget_rule", svc.budget_rules.ram()}, {"disk_budget", po.disk_budget_bytes},
                  {"disk_budget_rule", svc.budget_rules.disk()}}},
      {"requests", m.requests},
      {"latency_ms", {{"p50", m.latency_p50 * 1000}, {"p99", m.latency_p99 * 1000}}},
      {"first_token_ms", {{"p50", m.ttft_p50 * 1000}, {"p99", m.ttft_p99 * 1000}}},
      {"scheduler", {{"queued", svc.scheduler.queued()}, {"active", svc.scheduler.active()}, {"steps", m.steps},
                     {"batch_sizes", batches}, {"max_batch_seen", m.max_batch_seen}}},
      {"tokens", {{"prompt", m.prompt_tokens}, {"cached", m.cached_tokens}, {"completion", m.completion_tokens}}},
  };
}

}  // namespace

ApiStatus handle_policy(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string&) {
  if (req.method == "PUT" || req.method == "POST") {
    json b;
    if (ApiStatus e = parse_body(req, &b); !e.ok()) return e;
    if (ApiStatus e = known_fields(b, {"eviction", "ram_budget"}); !e.ok()) return e;
    std::optional<EvictionPolicy> ev;
    std::optional<BudgetSetting> budget;
    if (b.contains("eviction")) {
      if (!b["eviction"].is_string() || !(ev = parse_eviction_policy(b["eviction"].get<std::string>()))) {
        return invalid_field("eviction", "\"eviction\" must be " + std::string(kEvictionPolicyNames));
      }
    }
    if (b.contains("ram_budget")) {
      if (b["ram_budget"].is_number_unsigned()) budget = BudgetSetting{b["ram_budget"].get<uint64_t>(), 0};
      else if (b["ram_budget"].is_string()) budget = BudgetSetting::parse(b["ram_budget"].get<std::string>());
      if (!budget)
        return invalid_field("ram_budget", "\"ram_budget\" must be a byte count, a size such as \"2G\", a share of "
                                           "MemAvailable such as \"40%\", or 0 (unlimited)");
    }
    if (ev) svc.pool.set_eviction(*ev);
    if (budget) {
      const SizedBudget ram = size_ram_budget(*budget, svc.pool.stats().resident_bytes);
      svc.pool.set_ram_budget(ram.bytes);
      svc.budget_rules.set_ram(ram.rule);
    }
    svc.scheduler.post([&pool = svc.pool] { pool.enforce_budget(); });
    PoolOptions po = svc.pool.options();
    log_info("policy set: eviction " + std::string(to_string(po.eviction)) + ", RAM budget " +
             SizedBudget{po.ram_budget_bytes, svc.budget_rules.ram()}.text());
  }
  PoolOptions po = svc.pool.options();
  return reply(out, {{"eviction", std::string(to_string(po.eviction))}, {"ram_budget", po.ram_budget_bytes},
                       {"ram_budget_text", po.ram_budget_bytes ? format_size(po.ram_budget_bytes) : "unlimited"},
                       {"ram_budget_rule", svc.budget_rules.ram()}, {"pin_fan_out", po.pin_fan_out}});
}

ApiStatus handle_healthz(Service& svc, const HttpRequest&, HttpResponder& out, const std::string&) {
  const char* status = svc.stopping ? "stopping" : svc.ready ? "ok" : "starting";
  json j = {{"status", status}, {"model", svc.model_id}, {"queued", svc.scheduler.queued()},
            {"active", svc.scheduler.active()}, {"sessions", svc.catalog.session_count()},
            {"segments", svc.catalog.segment_count()},
            {"uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - svc.started).count()}};
  send_json(out, svc.ready && !svc.stopping ? 200 : 503, j);
  return {};
}

// The page is served while starting too (it shows "offline" until the API answers). Its script is
// inline and it loads nothing from elsewhere: the policy says so to the browser.
ApiStatus handle_ui(Service&, const HttpRequest&, HttpResponder& out, const std::string&) {
  out.send(200, "text/html; charset=utf-8", std::string(ui_page_html()),
           {{"Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                        "img-src 'self' data:; frame-ancestors 'none'"},
            {"X-Content-Type-Options", "nosniff"},
            {"Cache-Control", "no-cache"}});
  return {};
}

ApiStatus handle_pool(Service& svc, const HttpRequest&, HttpResponder& out, const std::string&) {
  return reply(out, pool_json(svc));
}

ApiStatus handle_metrics(Service& svc, const HttpRequest&, HttpResponder& out, const std::string&) {
  out.send(200, "text/plain; version=0.0.4; charset=utf-8", metrics_text(svc));
  return {};
}

namespace {
// 405's "use GET, PUT or DELETE" from the route's "GET PUT DELETE".
ApiStatus not_allowed(const Route& route) {
  const std::vector<std::string_view> methods = methods_of(route);
  std::string allowed;
  for (size_t i = 0; i < methods.size(); ++i) {
    allowed += std::string(i == 0 ? "" : i + 1 == methods.size() ? " or " : ", ") + std::string(methods[i]);
  }
  return wrong_method(allowed);
}

// The sessions at rest this request needs awake (daemon/catalog.h, "Sessions at rest"): the one
// whose turn or messages it asks for, or those below a segment it edits.
std::vector<std::string> sessions_to_wake(Service& svc, const Route& route, const HttpRequest& req, const std::string& param) {
  std::vector<std::string> out;
  auto add = [&](const std::string& id) {
    if (!id.empty() && svc.catalog.at_rest(id)) out.push_back(id);
  };
  const std::string_view pattern = route.pattern;
  if (pattern == "/v1/sessions/{id}/messages" || pattern == "/v1/sessions/{id}/transcript") {
    add(param);
  } else if (pattern == "/v1/sessions/{id}" && req.method == "GET") {
    if (asks_transcript(req)) add(param);
  } else if (pattern == "/v1/responses/{id}" && req.method == "GET") {
    if (auto ref = parse_response_id(param)) add(ref->session);
  } else if (pattern == "/v1/segments/{name}" && req.method == "PUT") {
    out = svc.catalog.sessions_at_rest_below(param);
  } else if (pattern == "/v1/chat/completions" || pattern == "/v1/completions" || pattern == "/v1/responses") {
    json b;
    try {
      b = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    } catch (const json::exception&) {  // out_of_range for a number like 1e6666: the handler answers it
      return out;
    }
    if (!b.is_object()) return out;
    if (auto it = b.find("session"); it != b.end() && it->is_string()) add(it->get<std::string>());
    if (auto it = b.find("previous_response_id"); it != b.end() && it->is_string()) {
      if (auto ref = parse_response_id(it->get<std::string>())) add(ref->session);
    }
    // Input items that name an earlier reply (item_reference, function_call(_output)): their sessions.
    if (auto it = b.find("input"); it != b.end() && it->is_array()) {
      for (const json& item : *it) {
        if (!item.is_object()) continue;
        if (auto id = item.find("id"); id != item.end() && id->is_string()) {
          if (auto ref = parse_item_id(id->get<std::string>())) add(ref->session);
        }
        if (auto id = item.find("call_id"); id != item.end() && id->is_string()) {
          if (auto ref = parse_call_id(id->get<std::string>())) add(ref->session);
        }
      }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  return out;
}

// Routes the request through the route table (daemon/routes.h).
ApiStatus dispatch(Service& svc, const HttpRequest& req, HttpResponder& out) {
  std::string param;
  const Route* route = match_route(req.path, &param);
  if (!route) return ApiStatus(Status::NotFound("no such endpoint: " + req.method + " " + req.path), "", "endpoint_not_found");
  if (!svc.ready && route->handler != handle_healthz && route->handler != handle_ui) {
    return Status::Unavailable("the daemon is starting (restoring its state); retry shortly");
  }
  if (!route_allows(*route, req.method)) return not_allowed(*route);
  std::vector<std::string> wake = sessions_to_wake(svc, *route, req, param);
  if (wake.empty()) return route->handler(svc, req, out, param);
  // Decoding takes seconds on a real model: never on an I/O thread.
  auto woken_then_handled = [&svc, route, req, param, wake = std::move(wake)](HttpResponder& o) -> ApiStatus {
    for (const std::string& id : wake) {
      if (Status st = svc.catalog.wake_session(id); !st.ok()) {
        log_warn(st.message());
        return st.code() == Status::Code::kNotFound ? ApiStatus(st, "", "session_not_found") : ApiStatus(st);
      }
    }
    return route->handler(svc, req, o, param);
  };
  if (!svc.offload) return woken_then_handled(out);
  return answer_offloaded(svc, out, std::move(woken_then_handled));
}
}  // namespace

}  // namespace api

void handle_request(Service& svc, const HttpRequest& req, HttpResponder& out) {
  const ApiStatus st = api::dispatch(svc, req, out);
  // Ok without an answer yet: it comes later (a generation, model work); a responder dropped
  // unanswered sends a 500 (daemon/http_server.h).
  if (!st.ok()) {
    const int status = error_reply(st).http_status;
    api::send_error(out, st);
    const std::string line = req.method + " " + req.path + ": " + std::to_string(status) + " " + st.status.message();
    if (status >= 500) log_warn(line);
    else log_debug(line);
  }
}

}  // namespace towers::daemon
