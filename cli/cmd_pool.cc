// towerctl pool: the segment pool as tables with bars (GET /v1/pool, plus GET /v1/segments for the
// hierarchy segments' rows).
#include <cstdio>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/table.h"

namespace towers::cli {

using json = nlohmann::json;

namespace {

constexpr int kBarWidth = 24;

uint64_t u64(const json& j, const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<uint64_t>() : 0; }

std::string share_bar(uint64_t part, uint64_t total) {
  return total ? bar(static_cast<double>(part) / static_cast<double>(total), kBarWidth) : "";
}

std::string pct(uint64_t part, uint64_t total) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", total ? 100.0 * static_cast<double>(part) / static_cast<double>(total) : 0.0);
  return buf;
}

void print_pool(const json& p, const json& segments) {
  const uint64_t total = u64(p, "kv_bytes");
  const json& pol = p["policy"];
  const uint64_t budget = u64(pol, "ram_budget");
  const uint64_t resident = u64(p["memory"], "resident_bytes");
  std::printf("pool: %llu segments, %s of KV (+ %s index); eviction %s, RAM budget %s\n",
              static_cast<unsigned long long>(u64(p, "segments")), format_bytes(total).c_str(),
              format_bytes(u64(p, "trie_bytes")).c_str(), pol.value("eviction", "?").c_str(),
              budget ? (format_bytes(budget) + " (" + pct(resident, budget) + " used)").c_str() : "unlimited");
  std::printf("memory: %s resident (%s segments, %s request tails, %s not yet in a file); disk: %s in segment files\n",
              format_bytes(resident).c_str(), format_bytes(u64(p["memory"], "segment_bytes")).c_str(),
              format_bytes(u64(p["memory"], "tail_bytes")).c_str(), format_bytes(u64(p["memory"], "unwritten_bytes")).c_str(),
              format_bytes(u64(p["disk"], "bytes")).c_str());
  const uint64_t disk_budget = u64(pol, "disk_budget");
  std::printf("budgets: RAM %s; disk %s\n",
              budget ? (format_bytes(budget) + ", " + pol.value("ram_budget_rule", "")).c_str() : "unlimited",
              disk_budget ? (format_bytes(disk_budget) + " (" + pct(u64(p["disk"], "bytes"), disk_budget) + " used), " +
                             pol.value("disk_budget_rule", "")).c_str()
                          : "unlimited");
  if (const json& r = p["at_rest"]; r.is_object() && u64(r, "segments") > 0) {
    std::printf("at rest: %llu segment(s), %s of coded records, no tokens in RAM (%s of token ids in the trie); %llu woken, %llu failed\n",
                static_cast<unsigned long long>(u64(r, "segments")), format_bytes(u64(r, "bytes")).c_str(),
                format_bytes(u64(p, "token_bytes")).c_str(), static_cast<unsigned long long>(u64(r, "wakes")),
                static_cast<unsigned long long>(u64(r, "wake_errors")));
  }
  const json none = json::object();
  const json& packed = p.contains("at_rest") && p["at_rest"].contains("packed") ? p["at_rest"]["packed"] : none;
  if (const json& k = packed; k.is_object() && u64(k, "segments") > 0) {
    std::printf("cold packs: %llu record(s), %s on disk with their index (%s dead)%s%s\n",
                static_cast<unsigned long long>(u64(k, "segments")), format_bytes(u64(k, "disk_bytes")).c_str(),
                format_bytes(u64(k, "dead_bytes")).c_str(), k.value("error", "").empty() ? "" : "; last error: ",
                k.value("error", "").c_str());
  }
  if (const json& m = p["modular"]; m.is_object() && u64(m, "segments") > 0) {
    std::printf("modular: %llu segment(s) placed after an edit above them, not exact yet (%llu to place, %llu exact rebuild(s) queued)\n",
                static_cast<unsigned long long>(u64(m, "segments")), static_cast<unsigned long long>(u64(m, "placements_pending")),
                static_cast<unsigned long long>(u64(m, "exact_rebuilds")));
  }
  std::printf("\n");

  Table tiers({"TIER", ">SEGMENTS", ">BYTES", ">SHARE", ""});
  for (const char* t : {"hot", "warm", "cold"}) {
    const uint64_t b = u64(p[t], "bytes");
    tiers.row({t, std::to_string(u64(p[t], "segments")), format_bytes(b), pct(b, total), share_bar(b, total)});
  }
  std::printf("%s\n", tiers.str().c_str());

  // 0 = platform, deeper = closer to a session; resident = in RAM, mapped = in a mapping whose pages the
  // kernel reclaimed, on disk = segment files.
  Table depths({">DEPTH", ">SEGMENTS", ">BYTES", ">RESIDENT", ">MAPPED", ">ON DISK", ">SHARE", ""});
  for (const auto& d : p["by_depth"]) {
    const uint64_t b = u64(d, "bytes");
    depths.row({std::to_string(d.value("depth", 0)), std::to_string(u64(d, "segments")), format_bytes(b),
                format_bytes(u64(d, "resident_bytes")), format_bytes(u64(d, "mapped_not_resident_bytes")),
                format_bytes(u64(d, "disk_bytes")), pct(b, total), share_bar(b, total)});
  }
  if (depths.rows()) std::printf("%s\n", depths.str().c_str());

  Table kinds({"KIND", ">SEGMENTS", ">TOKENS", ">BYTES", ">HOT", ">WARM", ">COLD", ""});
  for (const auto& [kind, k] : p["by_kind"].items()) {
    const uint64_t b = u64(k, "bytes");
    kinds.row({kind, std::to_string(u64(k, "segments")), std::to_string(u64(k, "tokens")), format_bytes(b),
               std::to_string(u64(k, "hot")), std::to_string(u64(k, "warm")), std::to_string(u64(k, "cold")),
               share_bar(b, total)});
  }
  if (kinds.rows()) std::printf("%s\n", kinds.str().c_str());

  Table segs({"SEGMENT", "LEVEL", ">DEPTH", "TIER", "FORMAT", ">TOKENS", ">HITS", ">BYTES", ""});
  for (const auto& [depth, s] : hierarchy_order(segments)) {
    const json& pool = (*s)["pool"];
    const bool resident = pool.is_object();
    const uint64_t b = resident ? u64(pool, "kv_bytes") : 0;
    segs.row({std::string(2 * depth, ' ') + s->value("name", ""), s->value("level", ""),
              resident ? std::to_string(pool.value("depth", 0)) : "-",
              resident ? pool.value("tier", "") + (pool.value("pinned", false) ? " (pinned)" : "") : "not built",
              resident ? pool.value("format", "") : "-", std::to_string(u64(*s, "tokens")),
              resident ? std::to_string(u64(pool, "hits")) : "-", resident ? format_bytes(b) : "-", share_bar(b, total)});
  }
  if (segs.rows()) std::printf("%s\n", segs.str().c_str());

  const uint64_t leases = u64(p, "leases"), hits = u64(p, "hits");
  std::printf("towers    %llu assembled: %llu hits, %llu misses (%s hit)\n", static_cast<unsigned long long>(leases),
              static_cast<unsigned long long>(hits), static_cast<unsigned long long>(u64(p, "misses")),
              pct(hits, leases).c_str());
  std::printf("tokens    %llu from segments, %llu prefilled; %llu evictions, %llu page-ins, %llu page-outs\n",
              static_cast<unsigned long long>(u64(p, "cached_tokens")),
              static_cast<unsigned long long>(u64(p, "prefill_tokens")),
              static_cast<unsigned long long>(u64(p, "evictions")), static_cast<unsigned long long>(u64(p, "page_ins")),
              static_cast<unsigned long long>(u64(p, "page_outs")));
  if (p.contains("prefill_tokens_by_cause") && p["prefill_tokens_by_cause"].is_object()) {
    std::string causes;
    for (const auto& [cause, n] : p["prefill_tokens_by_cause"].items()) {
      causes += (causes.empty() ? "" : ", ") + cause + " " + std::to_string(n.is_number_unsigned() ? n.get<uint64_t>() : 0);
    }
    std::printf("prefill   %s\n", causes.c_str());
  }
  const json& ss = p["sessions"];
  std::printf("sessions  %llu: %llu warm, %llu cold\n", static_cast<unsigned long long>(u64(ss, "total")),
              static_cast<unsigned long long>(u64(ss, "warm")), static_cast<unsigned long long>(u64(ss, "cold")));
  const json& lat = p["latency_ms"];
  const json& ttft = p["first_token_ms"];
  std::printf("latency   p50 %.1f ms, p99 %.1f ms; first token p50 %.1f ms, p99 %.1f ms (%llu requests)\n",
              lat.value("p50", 0.0), lat.value("p99", 0.0), ttft.value("p50", 0.0), ttft.value("p99", 0.0),
              static_cast<unsigned long long>(u64(p, "requests")));
  const json& sch = p["scheduler"];
  std::printf("queue     %llu waiting, %llu generating; %llu model steps, largest batch %llu\n",
              static_cast<unsigned long long>(u64(sch, "queued")), static_cast<unsigned long long>(u64(sch, "active")),
              static_cast<unsigned long long>(u64(sch, "steps")),
              static_cast<unsigned long long>(u64(sch, "max_batch_seen")));
}

}  // namespace

void add_pool(CLI::App& app) {
  auto o = std::make_shared<ClientOptions>();
  auto* cmd = app.add_subcommand("pool", "The segment pool: KV bytes by tier, depth and kind, every hierarchy "
                                         "segment, hits and misses, sessions, latency.");
  cmd->footer(
      "Examples:\n"
      "  towerctl pool\n"
      "  TOWERCTL_ASCII=1 towerctl pool      # '#' bars instead of Unicode blocks\n"
      "  towerctl pool --json | jq .latency_ms\n"
      "Tiers: hot = in memory (RAM, or its mapped segment file, populated), warm = in its segment file\n"
      "only (paged in before the step that needs it), cold = arithmetic-coded tokens only (rebuilt by\n"
      "prefill). Every segment has a file under <state dir>/segments once written: a restart maps them.\n"
      "A tower is a session's or request's chain of segments; a hit reused at least one of them.\n");
  add_client_options(cmd, *o, true);
  cmd->callback([o] {
    run_client([&] {
      HttpClient c = client_for(*o, 30);
      json p = call(c, "GET", "/v1/pool");
      if (o->json) return print_json(p);
      json segs = call(c, "GET", "/v1/segments");
      print_pool(p, segs["data"]);
    });
  });
}

}  // namespace towers::cli
