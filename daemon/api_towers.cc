// The Towers API: hierarchy segments and sessions.
//   GET    /v1/segments                 list (platform, community, bot order)
//   GET    /v1/segments/{name}
//   PUT    /v1/segments/{name}          {"level": "platform|community|bot", "parent": "...", "text": "..."}
//   POST   /v1/segments                 same, with "name" in the body
//   DELETE /v1/segments/{name}          refused (409) while it has child segments or sessions
//   POST   /v1/segments/{name}/compress move its KV to the cold tier now (arithmetic-coded tokens); it
//                                        also restarts cold (its coded bytes go to the state log)
//   POST   /v1/segments/{name}/thaw     bring it back to RAM now (one prefill); it restarts hot
//   POST   /v1/compress                 {"idle_seconds": N}: every segment idle that long goes cold
//   GET    /v1/sessions                 list
//   POST   /v1/sessions                 {"bot": "...", "id": optional}
//   GET    /v1/sessions/{id}            summary; ?transcript=1 adds the messages
//   GET    /v1/sessions/{id}/transcript
//   DELETE /v1/sessions/{id}
//   POST   /v1/sessions/{id}/messages   {"content": "...", "stream": bool, sampling fields as OpenAI}
#include "daemon/http_error.h"
#include "daemon/service.h"

namespace towers::daemon::api {

using json = nlohmann::json;

namespace {
std::string str_field(const json& b, const char* k, bool required) {
  if (!b.contains(k) || b[k].is_null()) {
    if (required) throw bad_request(std::string("\"") + k + "\" is required");
    return "";
  }
  if (!b[k].is_string()) throw bad_request(std::string("\"") + k + "\" must be a string");
  return b[k].get<std::string>();
}

// Splits "/v1/sessions/abc/messages" after the prefix into {"abc", "messages"}.
std::vector<std::string> rest_of(const std::string& path, const std::string& prefix) {
  std::vector<std::string> parts;
  std::string rest = path.substr(prefix.size());
  size_t at = 0;
  while (at <= rest.size()) {
    size_t slash = rest.find('/', at);
    if (slash == std::string::npos) slash = rest.size();
    if (slash > at) parts.push_back(rest.substr(at, slash - at));
    at = slash + 1;
  }
  return parts;
}

json run_on_scheduler(Service& svc, const std::function<json()>& fn) {
  json result;
  std::optional<HttpError> err;
  Status st = svc.scheduler.run([&] {
    try {
      result = fn();
    } catch (const HttpError& e) {
      err = e;
    }
    return Status::Ok();
  });
  if (!st.ok()) throw HttpError(503, "overloaded_error", st.message());
  if (err) throw *err;
  return result;
}
}  // namespace

void handle_towers(Service& svc, const HttpRequest& req, HttpResponder& out, bool& handled) {
  const std::string& p = req.path;
  if (p == "/v1/segments" || p.rfind("/v1/segments/", 0) == 0) {
    handled = true;
    auto parts = rest_of(p, "/v1/segments");
    if (parts.empty()) {
      if (req.method == "GET") return send_json(out, 200, svc.catalog.list_segments());
      if (req.method != "POST") throw HttpError(405, "invalid_request_error", "use GET or POST");
      json b = parse_body(req);
      const std::string name = str_field(b, "name", true), level = str_field(b, "level", true),
                        parent = str_field(b, "parent", false), text = str_field(b, "text", true);
      return send_json(out, 200, run_on_scheduler(svc, [&] { return svc.catalog.put_segment(name, level, parent, text); }));
    }
    if (parts.size() == 2 && (parts[1] == "compress" || parts[1] == "thaw")) {
      if (req.method != "POST") throw HttpError(405, "invalid_request_error", "use POST");
      const std::string name = parts[0];
      json seg = svc.catalog.segment_json(name);  // 404 for an unknown name
      if (!seg.contains("pool") || seg["pool"].is_null()) {
        throw HttpError(409, "invalid_request_error", "segment \"" + name + "\" has no KV in the pool yet");
      }
      const SegmentId id = seg["pool"]["id"].get<SegmentId>();
      Status st;
      if (parts[1] == "compress") {
        if (!svc.compressor) throw HttpError(409, "invalid_request_error", "the cold tier is disabled ([cold] enabled)");
        st = svc.compressor->compress(id);
        if (st.ok()) svc.catalog.record_cold_tiers();  // it restarts cold too
      } else {
        st = svc.scheduler.run([&] { return svc.pool.thaw(id); });
        if (st.ok()) st = svc.catalog.set_hot(name);
      }
      if (!st.ok()) throw HttpError(409, "invalid_request_error", parts[1] + " " + name + ": " + st.message());
      return send_json(out, 200, svc.catalog.segment_json(name));
    }
    if (parts.size() != 1) throw not_found("no such resource: " + p);
    const std::string name = parts[0];
    if (req.method == "GET") return send_json(out, 200, svc.catalog.segment_json(name));
    if (req.method == "PUT") {
      json b = parse_body(req);
      const std::string level = str_field(b, "level", true), parent = str_field(b, "parent", false),
                        text = str_field(b, "text", true);
      return send_json(out, 200, run_on_scheduler(svc, [&] { return svc.catalog.put_segment(name, level, parent, text); }));
    }
    if (req.method == "DELETE") {
      run_on_scheduler(svc, [&] {
        svc.catalog.remove_segment(name);
        return json();
      });
      return send_json(out, 200, {{"deleted", name}});
    }
    throw HttpError(405, "invalid_request_error", "use GET, PUT or DELETE");
  }
  if (p == "/v1/compress") {
    handled = true;
    if (req.method != "POST") throw HttpError(405, "invalid_request_error", "use POST");
    if (!svc.compressor) throw HttpError(409, "invalid_request_error", "the cold tier is disabled ([cold] enabled)");
    json b = parse_body(req);
    if (!b.contains("idle_seconds") || !b["idle_seconds"].is_number() || b["idle_seconds"].get<double>() < 0) {
      throw bad_request("\"idle_seconds\" must be a number >= 0");
    }
    const auto idle = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(b["idle_seconds"].get<double>()));
    const size_t n = svc.compressor->compress_idle(idle);
    const std::vector<std::string> recorded = svc.catalog.record_cold_tiers();
    auto cs = svc.compressor->stats();
    return send_json(out, 200, {{"compressed", n}, {"total_compressed", cs.compressed}, {"tokens", cs.tokens},
                                {"coded_bytes", cs.coded_bytes}, {"last_error", cs.last_error},
                                {"cold_at_rest", recorded}});
  }
  if (p == "/v1/sessions" || p.rfind("/v1/sessions/", 0) == 0) {
    handled = true;
    auto parts = rest_of(p, "/v1/sessions");
    if (parts.empty()) {
      if (req.method == "GET") return send_json(out, 200, svc.catalog.list_sessions());
      if (req.method != "POST") throw HttpError(405, "invalid_request_error", "use GET or POST");
      json b = parse_body(req);
      return send_json(out, 200, svc.catalog.create_session(str_field(b, "bot", true), str_field(b, "id", false)));
    }
    const std::string id = parts[0];
    if (parts.size() == 1) {
      if (req.method == "GET") {
        const bool transcript = req.query.find("transcript=1") != std::string::npos ||
                                req.query.find("transcript=true") != std::string::npos;
        return send_json(out, 200, svc.catalog.session_json(id, transcript));
      }
      if (req.method == "DELETE") {
        svc.catalog.delete_session(id);
        return send_json(out, 200, {{"deleted", id}});
      }
      throw HttpError(405, "invalid_request_error", "use GET or DELETE");
    }
    if (parts.size() == 2 && parts[1] == "transcript") {
      if (req.method != "GET") throw HttpError(405, "invalid_request_error", "use GET");
      json j = svc.catalog.session_json(id, true);
      return send_json(out, 200, {{"id", id}, {"bot", j["bot"]}, {"messages", j["transcript"]}});
    }
    if (parts.size() == 2 && parts[1] == "messages") {
      if (req.method != "POST") throw HttpError(405, "invalid_request_error", "use POST");
      json b = parse_body(req);
      const std::string content = str_field(b, "content", true);
      GenParams params = parse_gen_params(svc, b);
      auto turn = std::make_shared<Catalog::Turn>(svc.catalog.begin_turn(id, content));
      GenerationSpec spec;
      spec.params = params;
      spec.prompt_tokens = turn->prompt_estimate;
      spec.prepare = [&svc, turn] { return svc.catalog.prepare_turn(*turn); };
      spec.on_finish = [&svc, turn](GenOutcome& o, Lease* l, const std::string& text) { svc.catalog.finish_turn(*turn, o, l, text); };
      spec.on_rejected = [&svc, turn] { svc.catalog.abort_turn(turn->session); };
      spec.extra = {{"session", id}};
      return run_generation(svc, out, std::move(spec));
    }
    throw not_found("no such resource: " + p);
  }
}

}  // namespace towers::daemon::api
