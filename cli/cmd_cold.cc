// towerctl compress | thaw: move hierarchy segments between RAM and the cold tier, on a running towerd
// (over its socket) or offline on a stopped towerd's state directory (with the daemon's own code).
#include <cstdio>
#include <ctime>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/table.h"
#include "daemon/api_views.h"
#include "daemon/config.h"
#include "daemon/open_state.h"
#include "engine/codec/codec.h"

namespace towers::cli {

using json = nlohmann::json;

namespace {

// Offline: the state directory of a stopped towerd and the model it serves.
struct OfflineOptions {
  std::string config, state_dir, model;
  int threads = 0;
  bool active() const { return !config.empty() || !state_dir.empty(); }
};

struct ColdOpts {
  ClientOptions client;
  OfflineOptions offline;
  std::string segment;
  double idle_for = -1;
};

void add_offline_options(CLI::App* c, OfflineOptions& o) {
  c->add_option("--config", o.config, "Offline: the stopped towerd's config file (model and state_dir from it)")
      ->check(CLI::ExistingFile);
  c->add_option("--state-dir", o.state_dir, "Offline: the stopped towerd's state directory");
  c->add_option("-m,--model", o.model, "Offline: the model towerd serves (with --state-dir)");
  c->add_option("-t,--threads", o.threads, "Offline: worker threads (0 = all cores)")->check(CLI::Range(0, 1024));
}

void print_segment(const json& s) {
  const json& p = s.contains("pool") ? s["pool"] : json(nullptr);
  const std::string rest = "restarts " + s.value("at_rest", std::string("hot")) +
                           (s.value("coded_bytes", uint64_t{0}) ? " (" + format_bytes(s.value("coded_bytes", uint64_t{0})) + " coded)" : "");
  if (p.is_null()) {
    std::printf("%s: no KV in the pool; %s\n", s.value("name", "").c_str(), rest.c_str());
    return;
  }
  std::printf("%s: %s, %s KV (%s); %s\n", s.value("name", "").c_str(), p.value("tier", "").c_str(),
              format_bytes(p.value("kv_bytes", uint64_t{0})).c_str(), p.value("format", "").c_str(), rest.c_str());
}

// Opens the state with the daemon's code (the directory lock refuses a running towerd), runs `work`.
template <class Work>
int with_offline_state(const OfflineOptions& o, Work work) {
  using namespace towers::daemon;
  Config cfg;
  if (!o.config.empty()) {
    if (Status st = load_config(o.config, &cfg); !st.ok()) return fail("invalid config: " + st.message());
  }
  if (!o.state_dir.empty()) cfg.state_dir = o.state_dir;
  if (!o.model.empty()) cfg.model_path = o.model;
  if (cfg.model_path.empty()) return fail("offline use needs the model: --model M.gguf (or --config with model.path)");
  if (!std::filesystem::exists(cfg.state_dir / "towerd.log")) {
    return fail("no towerd state in " + cfg.state_dir.string() + " (towerd.log is missing)");
  }
  daemon::OpenOptions oo;
  oo.threads = o.threads;
  std::vector<std::string> warnings;
  auto opened = open_state(cfg, oo, &warnings);
  if (!opened.ok()) return fail(opened.error());
  OpenState& state = *opened.value();
  if (state.catalog->model_changed()) {
    return fail("the state in " + cfg.state_dir.string() + " was written with another model than " + cfg.model_path +
                "; start towerd with this model once (it re-tokenizes) or give the right --model");
  }
  for (const auto& w : warnings) std::fprintf(stderr, "towerctl: warning: %s\n", w.c_str());
  const Model& m = *state.model;
  const uint64_t fingerprint = state.fingerprint;
  Catalog& catalog = *state.catalog;
  Forward& forward = *state.forward;
  Codec codec(m, fingerprint);
  CodecOptions copt;
  copt.chunk = cfg.cold_chunk;
  return work(catalog, codec, forward, copt);
}

int compress_offline(const ColdOpts& o) {
  return with_offline_state(o.offline, [&](daemon::Catalog& catalog, const Codec& codec, Forward& forward, CodecOptions copt) {
    std::vector<std::string> names;
    if (!o.segment.empty()) names.push_back(o.segment);
    else names = catalog.idle_segments(static_cast<int64_t>(o.idle_for), static_cast<int64_t>(std::time(nullptr)));
    int failed = 0;
    for (const auto& name : names) {
      copt.progress = progress_printer("compress " + name);
      auto bytes = catalog.encode_cold(name, codec, forward, copt);
      if (!bytes.ok()) {
        std::fprintf(stderr, "towerctl: %s: %s\n", name.c_str(), bytes.error().c_str());
        ++failed;
        continue;
      }
      auto s = catalog.segment(name);
      const size_t tokens = s.ok() ? s->tokens : 0;
      std::printf("%s: %zu tokens -> %s coded (%.2f bits/token); restarts cold\n", name.c_str(), tokens,
                  format_bytes(bytes.value()).c_str(), tokens > 0 ? 8.0 * double(bytes.value()) / double(tokens) : 0.0);
    }
    if (names.empty()) std::printf("no segment is idle that long (or all are cold already)\n");
    return failed ? 1 : 0;
  });
}

int thaw_offline(const ColdOpts& o) {
  return with_offline_state(o.offline, [&](daemon::Catalog& catalog, const Codec&, Forward&, CodecOptions) {
    if (Status st = catalog.set_hot(o.segment); !st.ok()) return fail(st.message());
    auto s = catalog.segment(o.segment);
    if (!s.ok()) return fail(s.error());
    print_segment(daemon::segment_json(s.value()));
    return 0;
  });
}

}  // namespace

void add_cold(CLI::App& app) {
  auto o = std::make_shared<ColdOpts>();
  auto* c = app.add_subcommand("compress", "Move segments to the cold tier (arithmetic-coded tokens): on a running towerd, or offline on its stopped state.");
  c->footer(
      "Examples:\n"
      "  towerctl compress storyteller          # one hierarchy segment, now\n"
      "  towerctl compress --idle-for 3600      # every segment (and transcript) unused for an hour\n"
      "  towerctl compress --config /etc/towerd/towerd.toml --idle-for 86400   # offline, towerd stopped\n"
      "  towerctl compress --state-dir /var/lib/towerd -m model.gguf storyteller\n"
      "A cold segment keeps only its tokens, coded against the model's own predictions (a few bits per\n"
      "token); the next request that needs it thaws it with one prefill, to the same KV bytes.\n"
      "Compressed hierarchy segments also restart cold: towerd starts without prefilling them.\n"
      "Running towerd: pinned segments (levels in [pool] pin_levels, or many children) and segments in\n"
      "use stay hot. Offline: a segment is idle when neither it nor any session under it changed for\n"
      "the given time; offline use refuses a state directory that a running towerd holds.\n");
  c->add_option("segment", o->segment, "hierarchy segment name");
  c->add_option("--idle-for", o->idle_for, "instead: every segment idle at least this many seconds")->check(CLI::NonNegativeNumber);
  add_client_options(c, o->client, true);
  add_offline_options(c, o->offline);
  c->callback([o] {
    if (o->segment.empty() == (o->idle_for < 0)) std::exit(usage_error("give a segment name or --idle-for SECONDS (one of them)"));
    if (o->offline.active()) std::exit(compress_offline(*o));
    run_client([&] {
      HttpClient http = client_for(o->client, 3600);
      json r = o->segment.empty() ? call(http, "POST", "/v1/compress", {{"idle_seconds", o->idle_for}})
                                  : call(http, "POST", "/v1/segments/" + url_part(o->segment) + "/compress", json::object());
      if (o->client.json) return print_json(r);
      if (o->segment.empty()) {
        std::printf("compressed %s segment(s); since start: %s segments, %s tokens in %s\n",
                    std::to_string(r.value("compressed", 0)).c_str(), std::to_string(r.value("total_compressed", 0)).c_str(),
                    std::to_string(r.value("tokens", 0)).c_str(), format_bytes(r.value("coded_bytes", uint64_t{0})).c_str());
        const json& rest = r.contains("cold_at_rest") ? r["cold_at_rest"] : json::array();
        if (!rest.empty()) std::printf("restart cold: %s\n", rest.dump().c_str());
      } else {
        print_segment(r);
      }
    });
  });

  auto t = std::make_shared<ColdOpts>();
  auto* th = app.add_subcommand("thaw", "Bring a cold or warm segment back to RAM now (running towerd), or make it restart hot (offline).");
  th->footer(
      "Examples:\n"
      "  towerctl thaw storyteller\n"
      "  towerctl thaw --config /etc/towerd/towerd.toml storyteller   # offline: it restarts hot\n"
      "Requests thaw what they need on their own; this does it ahead of time (one prefill).\n");
  th->add_option("segment", t->segment, "hierarchy segment name")->required();
  add_client_options(th, t->client, true);
  add_offline_options(th, t->offline);
  th->callback([t] {
    if (t->offline.active()) std::exit(thaw_offline(*t));
    run_client([&] {
      HttpClient http = client_for(t->client, 3600);
      json r = call(http, "POST", "/v1/segments/" + url_part(t->segment) + "/thaw", json::object());
      if (t->client.json) return print_json(r);
      print_segment(r);
    });
  });
}

}  // namespace towers::cli
