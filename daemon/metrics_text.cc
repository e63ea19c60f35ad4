#include "daemon/metrics_text.h"

#include <charconv>
#include <cmath>

#include "daemon/service.h"

namespace towers::daemon {

std::string Exposition::escape_label(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string Exposition::format_double(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // the shortest text that reads back as v
  return std::string(buf, r.ptr);
}

void Exposition::family(std::string_view name, std::string_view type, std::string_view help) {
  std::string h;
  for (char c : help) h += c == '\n' ? std::string("\\n") : c == '\\' ? std::string("\\\\") : std::string(1, c);
  out_ += "# HELP " + std::string(name) + " " + h + "\n# TYPE " + std::string(name) + " " + std::string(type) + "\n";
}

void Exposition::head(std::string_view name, Labels labels, std::string_view extra_name, std::string_view extra_value) {
  out_ += name;
  if (labels.size() == 0 && extra_name.empty()) return;
  out_ += '{';
  bool first = true;
  auto add = [&](std::string_view k, std::string_view v) {
    if (!first) out_ += ',';
    first = false;
    out_ += std::string(k) + "=\"" + escape_label(v) + "\"";
  };
  for (const auto& [k, v] : labels) add(k, v);
  if (!extra_name.empty()) add(extra_name, extra_value);
  out_ += '}';
}

void Exposition::sample(std::string_view name, Labels labels, uint64_t value) {
  head(name, labels);
  out_ += " " + std::to_string(value) + "\n";
}

void Exposition::sample(std::string_view name, Labels labels, double value) {
  head(name, labels);
  out_ += " " + format_double(value) + "\n";
}

void Exposition::histogram(std::string_view name, Labels labels, const Histogram& h) {
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= h.bounds().size(); ++i) {
    cumulative += h.counts()[i];
    head(bucket, labels, "le", i < h.bounds().size() ? format_double(h.bounds()[i]) : "+Inf");
    out_ += " " + std::to_string(cumulative) + "\n";
  }
  sample(std::string(name) + "_sum", labels, h.sum());
  sample(std::string(name) + "_count", labels, h.count());
}

void Exposition::counter(std::string_view name, std::string_view help, uint64_t value) {
  family(name, "counter", help);
  sample(name, {}, value);
}

void Exposition::gauge(std::string_view name, std::string_view help, double value) {
  family(name, "gauge", help);
  sample(name, {}, value);
}

namespace {

void pool_metrics(Exposition& e, Service& svc) {
  const PoolStats st = svc.pool.stats();
  e.family("towerd_kv_bytes", "gauge", "KV bytes of the segment pool by tier.");
  e.sample("towerd_kv_bytes", {{"tier", "hot"}}, uint64_t{st.hot_bytes});
  e.sample("towerd_kv_bytes", {{"tier", "warm"}}, uint64_t{st.warm_bytes});
  e.sample("towerd_kv_bytes", {{"tier", "cold"}}, uint64_t{st.cold_bytes});
  e.family("towerd_pool_segments", "gauge", "Segments in the pool by tier.");
  e.sample("towerd_pool_segments", {{"tier", "hot"}}, uint64_t{st.hot_segments});
  e.sample("towerd_pool_segments", {{"tier", "warm"}}, uint64_t{st.warm_segments});
  e.sample("towerd_pool_segments", {{"tier", "cold"}}, uint64_t{st.cold_segments});
  e.gauge("towerd_pool_modular_segments",
          "Segments whose KV is a modular placement (after an edit above them), not exact yet.",
          static_cast<double>(st.modular_segments));
  e.gauge("towerd_exact_rebuilds", "Exact rebuilds of modular segments queued or running.",
          static_cast<double>(svc.scheduler.exact_rebuilds()));
  e.family("towerd_pool_depth_bytes", "gauge", "KV bytes of the segment pool by depth in the tower.");
  for (const auto& [d, b] : st.bytes_by_depth) e.sample("towerd_pool_depth_bytes", {{"depth", std::to_string(d)}}, uint64_t{b});
  e.gauge("towerd_pool_trie_bytes", "Bytes of the cache trie.", static_cast<double>(st.trie_bytes));
  e.gauge("towerd_pool_token_bytes", "Bytes of token ids the cache trie holds (none for segments at rest).",
          static_cast<double>(st.token_bytes));
  e.gauge("towerd_pool_at_rest_segments", "Cold segments out of the cache trie: their coded record only.",
          static_cast<double>(st.at_rest_segments));
  e.gauge("towerd_pool_packed_segments", "Segments whose coded record is in the cold packs (on disk, not in RAM at rest).",
          static_cast<double>(st.packed_segments));
  e.gauge("towerd_pool_pack_disk_bytes", "Bytes of the cold packs and their index on disk.",
          static_cast<double>(st.pack_disk_bytes));
  e.counter("towerd_pool_wakes_total", "Segments at rest decoded back into the cache trie.", st.wakes);
  e.counter("towerd_pool_wake_errors_total", "Segments at rest whose coded record failed to decode (not served).",
            st.wake_errors);
  e.counter("towerd_pool_leases_total", "Towers assembled.", st.leases);
  e.counter("towerd_pool_lease_hits_total", "Towers that reused at least one segment.", st.lease_hits);
  e.counter("towerd_pool_cached_tokens_total", "Prompt tokens served from segments.", st.cached_tokens);
  e.counter("towerd_pool_prefill_tokens_total", "Prompt tokens left to prefill by the towers assembled.", st.prefill_tokens);
  e.family("towerd_prefill_tokens_total", "counter",
           "Tokens the model prefilled, by cause (prompt, build, thaw, modular_repair, exact_rebuild).");
  const auto prefilled = svc.scheduler.prefilled();
  for (int c = 0; c < kPrefillCauses; ++c) {
    e.sample("towerd_prefill_tokens_total", {{"cause", std::string(to_string(static_cast<PrefillCause>(c)))}},
             prefilled[static_cast<size_t>(c)]);
  }
  e.counter("towerd_pool_evictions_total", "Segments evicted.", st.evictions);
  e.counter("towerd_pool_page_ins_total", "Segments paged in from the warm tier.", st.page_ins);
  e.counter("towerd_pool_page_outs_total", "Segments paged out to the warm tier.", st.page_outs);
  const size_t sessions = svc.catalog.session_count(), warm = svc.catalog.warm_sessions();
  e.family("towerd_sessions", "gauge", "Sessions, by whether their transcript segments are resident.");
  e.sample("towerd_sessions", {{"state", "warm"}}, uint64_t{warm});
  e.sample("towerd_sessions", {{"state", "cold"}}, uint64_t{sessions - std::min(sessions, warm)});
  e.gauge("towerd_hierarchy_segments", "Hierarchy segments defined (platform, community, bot).",
          static_cast<double>(svc.catalog.segment_count()));
}

void generation_metrics(Exposition& e, Service& svc, const Metrics::Snapshot& m) {
  e.gauge("towerd_queue_length", "Generation requests waiting for the scheduler.", static_cast<double>(svc.scheduler.queued()));
  e.gauge("towerd_active_sequences", "Sequences being generated.", static_cast<double>(svc.scheduler.active()));
  e.counter("towerd_prompt_tokens_total", "Prompt tokens of finished generations (llamacpp:prompt_tokens_total).",
            m.prompt_tokens);
  e.counter("towerd_prompt_tokens_cached_total", "Prompt tokens served from segments instead of prefilled.", m.cached_tokens);
  e.counter("towerd_tokens_predicted_total", "Tokens generated (llamacpp:tokens_predicted_total).", m.completion_tokens);
  e.family("towerd_generations_total", "counter", "Finished generations by finish reason.");
  for (const auto& [reason, n] : m.finishes) e.sample("towerd_generations_total", {{"finish", reason}}, n);
  e.family("towerd_time_to_first_token_seconds", "histogram", "From a generation's arrival to its first token.");
  e.histogram("towerd_time_to_first_token_seconds", {}, m.ttft);
  e.family("towerd_inter_token_latency_seconds", "histogram", "Between two consecutive tokens of one sequence.");
  e.histogram("towerd_inter_token_latency_seconds", {}, m.inter_token);
  e.counter("towerd_steps_total", "Batched model steps.", m.steps);
  e.counter("towerd_step_tokens_total", "Tokens evaluated in model steps (prefill and decode).", m.step_tokens);
  e.counter("towerd_cancelled_sequences_total", "Sequences that ended cancelled (client gone, shutdown).",
            m.cancelled_sequences);
  e.counter("towerd_steps_after_cancel_total",
            "Model steps cancelled sequences ran after their cancel was set (a disconnect noticed).", m.steps_after_cancel);
  e.gauge("towerd_steps_after_cancel_max", "The most model steps one cancelled sequence ran after its cancel.",
          static_cast<double>(m.max_steps_after_cancel));
  e.family("towerd_rejected_total", "counter", "Generation requests refused before running.");
  for (const auto& [reason, n] : m.rejections) e.sample("towerd_rejected_total", {{"reason", reason}}, n);
}

void request_metrics(Exposition& e, const Metrics::Snapshot& m) {
  e.family("towerd_requests_total", "counter", "HTTP requests answered, by route, method and status.");
  for (const auto& [k, n] : m.by_request) {
    const auto& [route, method, status] = k;
    e.sample("towerd_requests_total", {{"route", route}, {"method", method}, {"status", std::to_string(status)}}, n);
  }
  e.family("towerd_request_duration_seconds", "histogram", "From a request's header to its response's last byte queued.");
  for (const auto& [route, h] : m.request_seconds) e.histogram("towerd_request_duration_seconds", {{"route", route}}, h);
}

void connection_metrics(Exposition& e, const HttpServerStats& h) {
  e.gauge("towerd_http_connections", "Open HTTP connections.", h.open);
  e.gauge("towerd_http_connection_limit", "Connection limit in force (server.max_connections, lowered to fit ulimit -n).",
          h.limit);
  e.counter("towerd_http_connections_accepted_total", "Connections accepted, refused ones included.", h.accepted);
  e.family("towerd_http_connections_refused_total", "counter", "Connections answered and closed at accept time.");
  e.sample("towerd_http_connections_refused_total", {{"reason", "peer"}}, h.refused_peer);
  e.sample("towerd_http_connections_refused_total", {{"reason", "limit"}}, h.refused_limit);
  e.counter("towerd_http_connections_reclaimed_total", "Idle connections closed to make room for a new one.", h.reclaimed);
  e.family("towerd_http_timeouts_total", "counter", "Connections closed for a deadline.");
  e.sample("towerd_http_timeouts_total", {{"phase", "header"}}, h.header_timeouts);
  e.sample("towerd_http_timeouts_total", {{"phase", "body"}}, h.body_timeouts);
  e.sample("towerd_http_timeouts_total", {{"phase", "idle"}}, h.idle_timeouts);
  e.counter("towerd_http_slow_readers_dropped_total", "Connections dropped for not reading their response.",
            h.dropped_slow_readers);
  e.counter("towerd_http_client_disconnects_total", "Clients gone while their response was being produced.",
            h.client_disconnects);
  e.counter("towerd_http_accept_fd_exhausted_total", "Accepts that failed for want of file descriptors.", h.fd_exhausted);
}

}  // namespace

std::string metrics_text(Service& svc) {
  const Metrics::Snapshot m = svc.metrics.snapshot();
  Exposition e;
  e.family("towerd_model_info", "gauge", "The model being served.");
  e.sample("towerd_model_info", {{"model", svc.model_id}}, uint64_t{1});
  e.gauge("towerd_uptime_seconds", "Seconds since the daemon started.",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - svc.started).count());
  pool_metrics(e, svc);
  generation_metrics(e, svc, m);
  request_metrics(e, m);
  if (svc.http) connection_metrics(e, svc.http->stats());
  return e.text();
}

}  // namespace towers::daemon
