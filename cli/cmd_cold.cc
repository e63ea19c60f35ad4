// towerctl compress | thaw: move hierarchy segments between RAM and the cold tier of a running towerd.
#include <cstdio>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/table.h"

namespace towers::cli {

using json = nlohmann::json;

namespace {

struct ColdOpts {
  ClientOptions client;
  std::string segment;
  double idle_for = -1;
};

void print_segment(const json& s) {
  const json& p = s.contains("pool") ? s["pool"] : json(nullptr);
  if (p.is_null()) {
    std::printf("%s: no KV in the pool\n", s.value("name", "").c_str());
    return;
  }
  std::printf("%s: %s, %s KV (%s)\n", s.value("name", "").c_str(), p.value("tier", "").c_str(),
              format_bytes(p.value("kv_bytes", uint64_t{0})).c_str(), p.value("format", "").c_str());
}

}  // namespace

void add_cold(CLI::App& app) {
  auto o = std::make_shared<ColdOpts>();
  auto* c = app.add_subcommand("compress", "Move segments of a running towerd to the cold tier (arithmetic-coded tokens).");
  c->footer(
      "Examples:\n"
      "  towerctl compress storyteller          # one hierarchy segment, now\n"
      "  towerctl compress --idle-for 3600      # every segment (and transcript) unused for an hour\n"
      "A cold segment keeps only its tokens, coded against the model's own predictions (a few bits per\n"
      "token); the next request that needs it thaws it with one prefill, to the same KV bytes.\n"
      "Pinned segments (levels in [pool] pin_levels, or many children) and segments in use stay hot.\n");
  c->add_option("segment", o->segment, "hierarchy segment name");
  c->add_option("--idle-for", o->idle_for, "instead: every segment idle at least this many seconds")->check(CLI::NonNegativeNumber);
  add_client_options(c, o->client, true);
  c->callback([o] {
    run_client([&] {
      if (o->segment.empty() == (o->idle_for < 0)) throw ClientError("give a segment name or --idle-for SECONDS (one of them)");
      HttpClient http = client_for(o->client, 3600);
      json r = o->segment.empty() ? call(http, "POST", "/v1/compress", {{"idle_seconds", o->idle_for}})
                                  : call(http, "POST", "/v1/segments/" + url_part(o->segment) + "/compress", json::object());
      if (o->client.json) return print_json(r);
      if (o->segment.empty()) {
        std::printf("compressed %s segment(s); since start: %s segments, %s tokens in %s\n",
                    std::to_string(r.value("compressed", 0)).c_str(), std::to_string(r.value("total_compressed", 0)).c_str(),
                    std::to_string(r.value("tokens", 0)).c_str(), format_bytes(r.value("coded_bytes", uint64_t{0})).c_str());
      } else {
        print_segment(r);
      }
    });
  });

  auto t = std::make_shared<ColdOpts>();
  auto* th = app.add_subcommand("thaw", "Bring a cold or warm segment of a running towerd back to RAM now.");
  th->footer(
      "Example:\n"
      "  towerctl thaw storyteller\n"
      "Requests thaw what they need on their own; this does it ahead of time (one prefill).\n");
  th->add_option("segment", t->segment, "hierarchy segment name")->required();
  add_client_options(th, t->client, true);
  th->callback([t] {
    run_client([&] {
      HttpClient http = client_for(t->client, 3600);
      json r = call(http, "POST", "/v1/segments/" + url_part(t->segment) + "/thaw", json::object());
      if (t->client.json) return print_json(r);
      print_segment(r);
    });
  });
}

}  // namespace towers::cli
