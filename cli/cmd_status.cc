// towerctl status (GET /healthz) and towerctl policy get|set (GET/PUT /v1/policy).
#include <cstdio>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/table.h"

namespace towers::cli {

using json = nlohmann::json;

void add_status(CLI::App& app) {
  auto o = std::make_shared<ClientOptions>();
  auto* cmd = app.add_subcommand("status", "Is towerd up? Its model, uptime, sessions and queue.");
  cmd->footer(
      "Examples:\n"
      "  towerctl status\n"
      "  towerctl status --socket /tmp/towerd.sock --json\n"
      "Exit status 0 when towerd is ready, 1 when it is starting, stopping or unreachable.\n");
  add_client_options(cmd, *o, true);
  cmd->callback([o] {
    run_client([&] {
      HttpClient c = client_for(*o, 10);
      HttpReply r = c.request("GET", "/healthz");
      json h;
      try {
        h = json::parse(r.body);
      } catch (const json::exception&) {
        throw reply_error(r);
      }
      if (!h.contains("status")) throw reply_error(r);
      if (o->json) {
        print_json(h);
      } else {
        std::printf("towerd    %s (%s)\n", h["status"].get<std::string>().c_str(), c.socket_path().c_str());
        std::printf("model     %s\n", h.value("model", "").c_str());
        if (h.contains("uptime_s")) std::printf("uptime    %s\n", format_duration(h["uptime_s"].get<double>()).c_str());
        std::printf("segments  %zu\n", h.value("segments", size_t{0}));
        std::printf("sessions  %zu\n", h.value("sessions", size_t{0}));
        std::printf("queue     %zu waiting, %zu generating\n", h.value("queued", size_t{0}), h.value("active", size_t{0}));
      }
      std::fflush(stdout);
      if (h["status"] != "ok") std::exit(1);
    });
  });
}

namespace {
void print_policy(const json& p) {
  std::printf("eviction     %s\n", p.value("eviction", "").c_str());
  const std::string rule = p.value("ram_budget_rule", "");
  std::printf("ram budget   %s%s\n", p.value("ram_budget_text", "").c_str(),
              rule.empty() || rule == "none" ? "" : (" (" + rule + ")").c_str());
  if (p.contains("pin_fan_out")) std::printf("pin fan-out  %d\n", p["pin_fan_out"].get<int>());
}
}  // namespace

void add_policy(CLI::App& app) {
  auto* cmd = app.add_subcommand("policy", "Show or change the pool's eviction policy and RAM budget (at run time).");
  cmd->footer(
      "Examples:\n"
      "  towerctl policy get\n"
      "  towerctl policy set --eviction lindy --ram-budget 2G\n"
      "  towerctl policy set --ram-budget 40%      # of MemAvailable plus what the pool holds now\n"
      "  towerctl policy set --ram-budget 0        # unlimited\n"
      "A change lasts until towerd restarts or re-reads its config (SIGHUP, `systemctl reload towerd`);\n"
      "to keep it, also edit [policy] in the config file.\n");
  cmd->require_subcommand(1);

  auto go = std::make_shared<ClientOptions>();
  auto* get = cmd->add_subcommand("get", "Print the current policy.\n  towerctl policy get [--json]");
  add_client_options(get, *go, true);
  get->callback([go] {
    run_client([&] {
      HttpClient c = client_for(*go, 30);
      json p = call(c, "GET", "/v1/policy");
      go->json ? print_json(p) : print_policy(p);
    });
  });

  struct SetOpts {
    ClientOptions client;
    std::string eviction, budget;
  };
  auto so = std::make_shared<SetOpts>();
  auto* set = cmd->add_subcommand("set", "Change the policy; prints the policy now in force.\n"
                                         "  towerctl policy set --eviction lindy --ram-budget 512M");
  set->add_option("--eviction", so->eviction,
                  "lru: evict the least recently used segment first; lindy: the youngest lineage first (a "
                  "session's segments are as old as the session: long-lived sessions and bots stay); "
                  "token-lru: the largest idle time x tokens first")
      ->check(CLI::IsMember({"lru", "lindy", "token-lru"}));
  set->add_option("--ram-budget", so->budget,
                  "Resident segment KV, e.g. 512M, 2G, 1.5G, a byte count; a share such as 40% (of MemAvailable "
                  "plus what the pool holds now); 0 or 'unlimited' = no limit");
  add_client_options(set, so->client, true);
  set->callback([so] {
    run_client([&] {
      json body = json::object();
      if (!so->eviction.empty()) body["eviction"] = so->eviction;
      if (!so->budget.empty()) body["ram_budget"] = so->budget == "unlimited" ? std::string("0") : so->budget;
      if (body.empty()) throw ClientError("policy set: give --eviction and/or --ram-budget (see towerctl policy set --help)");
      HttpClient c = client_for(so->client, 30);
      json p = call(c, "PUT", "/v1/policy", body);
      so->client.json ? print_json(p) : print_policy(p);
    });
  });
}

}  // namespace towers::cli
