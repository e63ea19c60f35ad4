// The Towers API's handlers: hierarchy segments (define, link, compress, thaw, delete) and sessions
// (create, message, transcript, delete). daemon/routes.cc routes to them; docs/api.md ("Routes") lists
// each route with its body. A segment's compress also makes it restart cold (its coded bytes go to the
// state log); a thaw makes it restart hot.
#include "daemon/api_views.h"
#include "daemon/service.h"
#include "daemon/turns.h"

namespace towers::daemon::api {

using json = nlohmann::json;

namespace {

ApiStatus segment_error(Status st) { return not_found_as(std::move(st), "segment_not_found"); }
ApiStatus session_error(Status st) { return not_found_as(std::move(st), "session_not_found"); }

// A segment as the API shows it: the catalog's view plus how far the scheduler's exact rebuild of a
// modular one has come.
SegmentView with_progress(Service& svc, SegmentView v) {
  if (v.pool && v.pool->modular) v.exact_progress = svc.scheduler.exact_progress(v.pool->id);
  return v;
}

json segment_reply(Service& svc, SegmentView v) { return segment_json(with_progress(svc, std::move(v))); }

// Answers with segment `name` as it is now.
ApiStatus reply_segment(Service& svc, const std::string& name, HttpResponder& out) {
  auto seg = svc.catalog.segment(name);
  return seg.ok() ? reply(out, segment_reply(svc, seg.value())) : segment_error(seg.status());
}

// Has the scheduler compute segment `id` (and what it needs of its parent chain), then runs `then`
// on the offload thread (it may write records) and answers with it. Nothing waits meanwhile.
void after_build(Service& svc, HttpResponder& out, SegmentId id, std::function<ApiStatus(const Status&, HttpResponder&)> then) {
  svc.scheduler.build(id, [&svc, out = out.shared_from_this(), then = std::move(then)](const Status& st) {
    answer_offloaded(svc, *out, [st, then](HttpResponder& o) { return then(st, o); });
  });
}

// Defines a segment (put: the catalog call) and answers with it once its KV is computed. The
// definition's record is fsynced (offload thread); its KV is computed as scheduled work, beside the
// streams that are running; the segments below an edited one, placed modularly, are built in the
// background without the answer waiting for them.
ApiStatus define_segment(Service& svc, HttpResponder& out, std::function<Result<Catalog::Put>()> put_fn) {
  return answer_offloaded(svc, out, [&svc, put_fn = std::move(put_fn)](HttpResponder& o) -> ApiStatus {
    auto put = put_fn();
    if (!put.ok()) return not_found_as(put.status(), "segment_not_found", "parent");
    if (!put->retired.empty()) svc.scheduler.cancel_rebuilds(put->retired);
    for (SegmentId id : put->placed) svc.scheduler.build(id, nullptr, /*background=*/true);
    if (put->build == kNoSegment) return reply(o, segment_reply(svc, put->view));
    const std::string name = put->view.name;
    after_build(svc, o, put->build, [&svc, name](const Status& st, HttpResponder& o2) -> ApiStatus {
      if (!st.ok()) return st.prefixed("segment \"" + name + "\": ");
      return reply_segment(svc, name, o2);
    });
    return {};
  });
}

// PUT /v1/segments/{name} (name from the path) or POST /v1/segments (name in the body).
ApiStatus put_segment(Service& svc, const HttpRequest& req, HttpResponder& out, std::string name) {
  json b;
  if (ApiStatus e = parse_body(req, &b); !e.ok()) return e;
  const bool name_in_body = name.empty();
  if (ApiStatus e = name_in_body ? known_fields(b, {"name", "level", "parent", "text"})
                                 : known_fields(b, {"level", "parent", "text"});
      !e.ok()) {
    return e;
  }
  std::string level_name, parent, text;
  for (ApiStatus e : {name_in_body ? string_field(b, "name", true, &name) : ApiStatus(),
                      string_field(b, "level", true, &level_name), string_field(b, "parent", false, &parent),
                      string_field(b, "text", true, &text)}) {
    if (!e.ok()) return e;
  }
  auto level = parse_level(level_name);
  if (!level) return invalid_field("level", "level must be \"platform\", \"community\" or \"bot\", got \"" + level_name + "\"");
  return define_segment(svc, out, [&svc, name, level = *level, parent, text] {
    return svc.catalog.put_segment(name, level, parent, text);
  });
}

// POST /v1/segments/{name}/link: the bot (or community) under another parent, placed from its KV.
ApiStatus link_segment(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string& source) {
  json b;
  if (ApiStatus e = parse_body(req, &b); !e.ok()) return e;
  if (ApiStatus e = known_fields(b, {"parent", "name"}); !e.ok()) return e;
  std::string parent, name;
  for (ApiStatus e : {string_field(b, "parent", true, &parent), string_field(b, "name", false, &name)}) {
    if (!e.ok()) return e;
  }
  if (name.empty()) name = source + "." + parent;
  return define_segment(svc, out, [&svc, source, name, parent] { return svc.catalog.link_segment(source, name, parent); });
}

// POST /v1/segments/{name}/compress|thaw. Compress: coding on the offload thread (the compressor's
// own model). Thaw: warm files paged in on the offload thread, cold segments built by the scheduler,
// the tier recorded on the offload thread again.
ApiStatus move_tier(Service& svc, const std::string& name, const std::string& verb, HttpResponder& out) {
  auto seg = svc.catalog.segment(name);
  if (!seg.ok()) return segment_error(seg.status());
  if (!seg->pool) return Status::Conflict("segment \"" + name + "\" has no KV in the pool yet");
  const SegmentId id = seg->pool->id;
  auto failed = [name, verb](const Status& st) { return segment_error(st.prefixed(verb + " " + name + ": ")); };
  if (verb == "compress") {
    if (!svc.compressor) return Status::Conflict("the cold tier is disabled ([cold] enabled)");
    return answer_offloaded(svc, out, [&svc, id, name, failed](HttpResponder& o) {
      Status st = svc.compressor->compress(id);
      if (!st.ok()) return failed(st);
      svc.catalog.record_cold_tiers();  // it restarts cold too
      return reply_segment(svc, name, o);
    });
  }
  return answer_offloaded(svc, out, [&svc, id, name, failed](HttpResponder& o) -> ApiStatus {
    PathPlan chain = svc.pool.plan_chain(id);
    Status st = svc.pool.page_in(chain.path);  // warm segments: mapped, populated and verified here
    if (!st.ok() && !st.is_corruption()) return failed(st);  // cold ones (and bad files): computed
    after_build(svc, o, id, [&svc, name, failed](const Status& built, HttpResponder& o2) -> ApiStatus {
      Status st = built.ok() ? svc.catalog.set_hot(name) : built;
      return st.ok() ? reply_segment(svc, name, o2) : failed(st);
    });
    return {};
  });
}

// compress and thaw take no fields: an empty body or {}.
ApiStatus no_fields(const HttpRequest& req) {
  if (req.body.empty()) return {};
  json b;
  if (ApiStatus e = parse_body(req, &b); !e.ok()) return e;
  return known_fields(b, {});
}

}  // namespace

ApiStatus handle_segments(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string&) {
  if (req.method == "POST") return put_segment(svc, req, out, "");
  std::vector<SegmentView> views = svc.catalog.segments();
  for (SegmentView& v : views) v = with_progress(svc, std::move(v));
  return reply(out, segments_json(views));
}

ApiStatus handle_segment(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string& name) {
  if (req.method == "PUT") return put_segment(svc, req, out, name);
  if (req.method == "DELETE") {
    // Its record is fsynced before the answer: on the offload thread, never the scheduler's (the
    // pool refuses to remove KV a step holds; the catalog retries it later).
    return answer_offloaded(svc, out, [&svc, name](HttpResponder& o) {
      Status removed = svc.catalog.remove_segment(name);
      return removed.ok() ? reply(o, {{"deleted", name}}) : segment_error(removed);
    });
  }
  return reply_segment(svc, name, out);
}

ApiStatus handle_segment_link(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string& name) {
  return link_segment(svc, req, out, name);
}

ApiStatus handle_segment_compress(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string& name) {
  if (ApiStatus e = no_fields(req); !e.ok()) return e;
  return move_tier(svc, name, "compress", out);
}

ApiStatus handle_segment_thaw(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string& name) {
  if (ApiStatus e = no_fields(req); !e.ok()) return e;
  return move_tier(svc, name, "thaw", out);
}

ApiStatus handle_compress(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string&) {
  if (!svc.compressor) return Status::Conflict("the cold tier is disabled ([cold] enabled)");
  json b;
  if (ApiStatus e = parse_body(req, &b); !e.ok()) return e;
  if (ApiStatus e = known_fields(b, {"idle_seconds"}); !e.ok()) return e;
  if (!b.contains("idle_seconds") || !b["idle_seconds"].is_number() || b["idle_seconds"].get<double>() < 0) {
    return invalid_field("idle_seconds", "\"idle_seconds\" must be a number >= 0");
  }
  const auto idle = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(b["idle_seconds"].get<double>()));
  return answer_offloaded(svc, out, [&svc, idle](HttpResponder& o) {
    const size_t n = svc.compressor->compress_idle(idle);
    const std::vector<std::string> recorded = svc.catalog.record_cold_tiers();
    // Sessions whose every segment is now coded go to rest, and their text leaves the log at once.
    const size_t resting = svc.catalog.rest_sessions();
    if (resting > 0) svc.catalog.maybe_compact(/*now=*/true);
    auto cs = svc.compressor->stats();
    return reply(o, {{"compressed", n}, {"total_compressed", cs.compressed}, {"tokens", cs.tokens},
                     {"coded_bytes", cs.coded_bytes}, {"last_error", cs.last_error}, {"cold_at_rest", recorded},
                     {"sessions_to_rest", resting}});
  });
}

ApiStatus handle_sessions(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string&) {
  if (req.method == "GET") return reply(out, sessions_json(svc.catalog.sessions()));
  json b;
  if (ApiStatus e = parse_body(req, &b); !e.ok()) return e;
  if (ApiStatus e = known_fields(b, {"bot", "id"}); !e.ok()) return e;
  std::string bot, id;
  for (ApiStatus e : {string_field(b, "bot", true, &bot), string_field(b, "id", false, &id)}) {
    if (!e.ok()) return e;
  }
  // Absent or null: towerd picks one. Given: it is the id, so "" is not one.
  if (b.contains("id") && !b["id"].is_null() && id.empty()) {
    return invalid_field("id", "\"id\" is empty: give 1-64 characters of letters, digits, '-', '_', '.', or leave it out");
  }
  // Answered once its record is durable, from the log's completion thread: a storm of creations
  // shares its fsyncs and holds no thread while it waits.
  svc.catalog.create_session_async(bot, id, [o = out.shared_from_this()](Result<SessionView> created) {
    if (created.ok()) {
      reply(*o, session_json(created.value()));
    } else if (created.status().code() == Status::Code::kResourceExhausted) {
      send_error(*o, ApiStatus(created.status(), "", "session_limit_reached"));
    } else {
      send_error(*o, not_found_as(created.status(), "segment_not_found", "bot"));
    }
  });
  return {};
}

ApiStatus handle_session(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string& id) {
  if (req.method == "DELETE") {
    return answer_offloaded(svc, out, [&svc, id](HttpResponder& o) {
      Status st = svc.catalog.delete_session(id);
      return st.ok() ? reply(o, {{"deleted", id}}) : session_error(st);
    });
  }
  auto s = svc.catalog.session(id, asks_transcript(req));
  return s.ok() ? reply(out, session_json(s.value())) : session_error(s.status());
}

ApiStatus handle_session_transcript(Service& svc, const HttpRequest&, HttpResponder& out, const std::string& id) {
  auto s = svc.catalog.session(id, true);
  if (!s.ok()) return session_error(s.status());
  return reply(out, {{"id", id}, {"bot", s->bot}, {"messages", session_json(s.value())["transcript"]}});
}

ApiStatus handle_session_messages(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string& id) {
  json b;
  if (ApiStatus e = parse_body(req, &b); !e.ok()) return e;
  if (ApiStatus e = no_tools_with_session(b); !e.ok()) return e;
  if (ApiStatus e = check_generation_fields(b, {"content"}); !e.ok()) return e;
  std::string content;
  if (ApiStatus e = string_field(b, "content", true, &content); !e.ok()) return e;
  GenParams params;
  if (ApiStatus e = parse_gen_params(svc, b, ReplyApi::Chat, &params, req.body); !e.ok()) return e;
  // No tools here (a session's are its system block, set by its first turn on /v1/chat/completions);
  // on a session with tools, tool_choice and parallel_tool_calls decode the reply as there.
  ToolRequest tools;
  const auto ordered = nlohmann::ordered_json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (ApiStatus e = parse_tools(b, ordered, /*session=*/true, &tools); !e.ok()) return e;
  GenerationSpec spec;
  const std::vector<ToolChatMessage> message = {{"user", content, {}, ""}};
  if (ApiStatus e = session_generation(svc, id, message, tools, "", &params, &spec); !e.ok()) return e;
  spec.params = std::move(params);  // with the tool-call grammar and format session_generation set
  return run_generation(svc, out, std::move(spec));
}

}  // namespace towers::daemon::api
