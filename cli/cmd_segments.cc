// towerctl segments ls|show|add|rm: the platform → community → bot hierarchy (/v1/segments).
#include <chrono>
#include <cstdio>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/segment_library.h"
#include "cli/table.h"

namespace towers::cli {

using json = nlohmann::json;

namespace {

// Whether the KV is exact, or a modular placement after an edit above it, and how far its exact
// rebuild has come.
std::string exactness(const json& pool) {
  if (!pool.is_object()) return "-";
  if (!pool.value("modular", false)) return "exact";
  if (!pool.contains("exact_progress")) return "modular";
  const double p = pool.value("exact_progress", 0.0);
  return p > 0 ? "rebuilding " + std::to_string(static_cast<int>(p * 100)) + "%" : "modular, rebuild queued";
}

std::string pool_summary(const json& pool) {
  if (!pool.is_object()) return "not built (prefilled on next use)";
  char buf[200];
  std::snprintf(buf, sizeof buf, "depth %d, %s%s, %s, %s, %s, %llu hits, %d in use", pool.value("depth", 0),
                pool.value("tier", "").c_str(), pool.value("pinned", false) ? " (pinned)" : "",
                pool.value("format", "").c_str(), format_bytes(pool.value("kv_bytes", uint64_t{0})).c_str(),
                exactness(pool).c_str(), static_cast<unsigned long long>(pool.value("hits", uint64_t{0})),
                pool.value("refcount", 0));
  return buf;
}

void print_list(const json& data) {
  Table t({"NAME", "LEVEL", ">TOKENS", ">KV", "TIER", "KV IS", ">SESSIONS", "UPDATED"});
  for (const auto& [depth, s] : hierarchy_order(data)) {
    const json& pool = (*s)["pool"];
    t.row({std::string(2 * depth, ' ') + s->value("name", ""), s->value("level", ""),
           std::to_string(s->value("tokens", 0)),
           pool.is_object() ? format_bytes(pool.value("kv_bytes", uint64_t{0})) : "-",
           pool.is_object() ? pool.value("tier", "") : "-", exactness(pool), std::to_string(s->value("sessions", 0)),
           format_ago(s->value("updated", int64_t{0}))});
  }
  if (t.rows() == 0) {
    std::printf("no segments yet; define one with: towerctl segments add NAME --level platform --text \"...\"\n");
    return;
  }
  std::printf("%s", t.str().c_str());
}

void print_segment(const json& s) {
  std::string children;
  for (const auto& c : s["children"]) children += (children.empty() ? "" : ", ") + c.get<std::string>();
  std::printf("name      %s\n", s.value("name", "").c_str());
  std::printf("level     %s\n", s.value("level", "").c_str());
  std::printf("parent    %s\n", s.value("parent", "").empty() ? "-" : s.value("parent", "").c_str());
  std::printf("children  %s\n", children.empty() ? "-" : children.c_str());
  std::printf("sessions  %d\n", s.value("sessions", 0));
  std::printf("tokens    %d\n", s.value("tokens", 0));
  std::printf("pool      %s\n", pool_summary(s["pool"]).c_str());
  std::printf("updated   %s\n", format_ago(s.value("updated", int64_t{0})).c_str());
  std::printf("text:\n%s\n", s.value("text", "").c_str());
}

struct AddOpts {
  ClientOptions client;
  std::string name, level, parent, text, file, library, dir;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

json put(HttpClient& c, const SegmentSpec& s) {
  json body = {{"level", s.level}, {"text", s.text}};
  if (!s.parent.empty()) body["parent"] = s.parent;
  return call(c, "PUT", "/v1/segments/" + url_part(s.name), body);
}

void add_many(AddOpts& o) {
  std::vector<SegmentSpec> specs =
      upload_order(o.dir.empty() ? load_library_file(o.library) : load_library_dir(o.dir));
  HttpClient c = client_for(o.client, 600);
  const auto t_all = std::chrono::steady_clock::now();
  const std::string n = std::to_string(specs.size());
  size_t tokens = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SegmentSpec& s = specs[i];
    std::printf("[%zu/%s] %s:%s ... ", i + 1, n.c_str(), s.level.c_str(), s.name.c_str());
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    json r;
    try {
      r = put(c, s);
    } catch (const ClientError& e) {
      std::printf("failed\n");
      throw ClientError(s.name + " (" + s.source + "): " + e.what() + "; " + std::to_string(i) + " of " + n +
                        " segments were defined before it");
    }
    tokens += r.value("tokens", size_t{0});
    std::printf("%.1f s (%d tokens)\n", seconds_since(t0), r.value("tokens", 0));
  }
  std::printf("defined %s segments (%zu tokens) in %.1f s\n", n.c_str(), tokens, seconds_since(t_all));
}

void add_one(AddOpts& o) {
  if (o.name.empty()) throw ClientError("segments add: give NAME (or --library FILE / --from-dir DIR)");
  if (o.level.empty()) throw ClientError("segments add: --level platform|community|bot is required");
  if (o.text.empty() == o.file.empty()) throw ClientError("segments add: give exactly one of --text and --file");
  SegmentSpec s{o.name, o.level, o.parent, o.file.empty() ? o.text : read_text_file(o.file), o.file};
  HttpClient c = client_for(o.client, 600);
  const auto t0 = std::chrono::steady_clock::now();
  json r = put(c, s);
  if (o.client.json) return print_json(r);
  std::printf("%s segment \"%s\": %d tokens, %s, %.1f s\n", s.level.c_str(), s.name.c_str(), r.value("tokens", 0),
              pool_summary(r["pool"]).c_str(), seconds_since(t0));
}

}  // namespace

void add_segments(CLI::App& app) {
  auto* cmd = app.add_subcommand("segments", "List, show, define and remove hierarchy segments (platform → community → bot).");
  cmd->footer(
      "Examples:\n"
      "  towerctl segments add acme --level platform --text \"You work for Acme Corp. Be brief.\"\n"
      "  towerctl segments add support --level community --parent acme --file support.txt\n"
      "  towerctl segments add helper --level bot --parent support --text \"Your name is Hal.\"\n"
      "  towerctl segments add --library bots.toml      # many at once, with progress\n"
      "  towerctl segments ls\n"
      "  towerctl segments show helper\n"
      "  towerctl segments rm helper\n"
      "  towerctl segments link helper --parent sales   # the same bot under a second community\n"
      "A bot's system prompt is platform + community + bot text; each level's KV cache is computed once\n"
      "and shared by everything below it. Sessions are created for bots (towerctl sessions create).\n");
  cmd->require_subcommand(1);

  auto lo = std::make_shared<ClientOptions>();
  auto* ls = cmd->add_subcommand("ls", "List segments as a tree with tokens, KV bytes, tier and whether the KV is exact.\n"
                                       "  towerctl segments ls\n"
                                       "KV IS: exact; modular (placed from its KV before an edit above it, an approximation:\n"
                                       "docs/towers.md); rebuilding N% (its exact KV is being computed in the background).");
  add_client_options(ls, *lo, true);
  ls->callback([lo] {
    run_client([&] {
      HttpClient c = client_for(*lo, 30);
      json r = call(c, "GET", "/v1/segments");
      lo->json ? print_json(r) : print_list(r["data"]);
    });
  });

  struct NameOpts {
    ClientOptions client;
    std::string name;
  };
  auto so = std::make_shared<NameOpts>();
  auto* show = cmd->add_subcommand("show", "Show one segment: level, parent, children, sessions, pool state, text.\n"
                                           "  towerctl segments show helper");
  show->add_option("NAME", so->name, "Segment name")->required();
  add_client_options(show, so->client, true);
  show->callback([so] {
    run_client([&] {
      HttpClient c = client_for(so->client, 30);
      json r = call(c, "GET", "/v1/segments/" + url_part(so->name));
      so->client.json ? print_json(r) : print_segment(r);
    });
  });

  auto ao = std::make_shared<AddOpts>();
  auto* add = cmd->add_subcommand(
      "add",
      "Define or replace a segment and prefill its KV cache. Replacing one places everything below it on\n"
      "the new text at once (modular: [modular] in towerd.toml), then recomputes it exactly in the background.\n"
      "  towerctl segments add NAME --level LEVEL [--parent P] (--text T | --file F)\n"
      "  towerctl segments add --library FILE.toml|FILE.json\n"
      "  towerctl segments add --from-dir DIR\n"
      "A library lists segments as [[segment]] tables (name, level, parent, text or file); a directory\n"
      "mirrors the hierarchy: DIR/acme.txt (platform), DIR/acme/support.txt (community),\n"
      "DIR/acme/support/helper.txt (bot). Parents are defined before their children.");
  add->add_option("NAME", ao->name, "Segment name: letters, digits, '-', '_', '.' (up to 64)");
  add->add_option("--level", ao->level, "platform, community or bot")->check(CLI::IsMember({"platform", "community", "bot"}));
  add->add_option("--parent", ao->parent, "The parent segment (a community's is a platform; a bot's a community or platform)");
  add->add_option("--text", ao->text, "The segment's text");
  add->add_option("--file", ao->file, "Read the text from this file ('-' = stdin)");
  auto* lib = add->add_option("--library", ao->library, "Define every segment of a TOML or JSON library file");
  auto* dir = add->add_option("--from-dir", ao->dir, "Define every segment of a directory tree of .txt/.md files");
  lib->excludes(dir);
  add_client_options(add, ao->client, true);
  add->callback([ao] {
    run_client([&] {
      if (!ao->library.empty() || !ao->dir.empty()) {
        if (!ao->name.empty() || !ao->text.empty() || !ao->file.empty() || !ao->level.empty() || !ao->parent.empty()) {
          throw ClientError("segments add: --library/--from-dir define everything; drop NAME, --level, --parent, --text, --file");
        }
        return add_many(*ao);
      }
      add_one(*ao);
    });
  });

  struct LinkOpts {
    ClientOptions client;
    std::string source, parent, as;
  };
  auto lk = std::make_shared<LinkOpts>();
  auto* link = cmd->add_subcommand(
      "link",
      "Put a bot (or community) under another parent too: a new segment with the same text, placed from\n"
      "the original's KV at once (modular: its first tokens recomputed, the rest moved), then recomputed\n"
      "exactly in the background. Later edits of either one do not change the other.\n"
      "  towerctl segments link helper --parent sales [--as helper-sales]");
  link->add_option("SOURCE", lk->source, "The segment to link")->required();
  link->add_option("--parent", lk->parent, "Its second parent")->required();
  link->add_option("--as", lk->as, "The new segment's name (default SOURCE.PARENT)");
  add_client_options(link, lk->client, true);
  link->callback([lk] {
    run_client([&] {
      HttpClient c = client_for(lk->client, 600);
      json body = {{"parent", lk->parent}};
      if (!lk->as.empty()) body["name"] = lk->as;
      const auto t0 = std::chrono::steady_clock::now();
      json r = call(c, "POST", "/v1/segments/" + url_part(lk->source) + "/link", body);
      if (lk->client.json) return print_json(r);
      std::printf("%s segment \"%s\" under \"%s\": %d tokens, %s, %.1f s\n", r.value("level", "").c_str(),
                  r.value("name", "").c_str(), lk->parent.c_str(), r.value("tokens", 0), pool_summary(r["pool"]).c_str(),
                  seconds_since(t0));
    });
  });

  auto ro = std::make_shared<NameOpts>();
  auto* rm = cmd->add_subcommand("rm", "Remove a segment; refused while it has child segments or sessions.\n"
                                       "  towerctl segments rm helper");
  rm->add_option("NAME", ro->name, "Segment name")->required();
  add_client_options(rm, ro->client, false);
  rm->callback([ro] {
    run_client([&] {
      HttpClient c = client_for(ro->client, 60);
      call(c, "DELETE", "/v1/segments/" + url_part(ro->name));
      std::printf("removed segment \"%s\"\n", ro->name.c_str());
    });
  });
}

}  // namespace towers::cli
