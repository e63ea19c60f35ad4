// towerctl sessions ls|show|create|rm (/v1/sessions).
#include <cstdio>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/table.h"

namespace towers::cli {

using json = nlohmann::json;

namespace {

void print_list(const json& data) {
  if (data.empty()) {
    std::printf("no sessions yet; create one with: towerctl sessions create --bot BOT\n");
    return;
  }
  Table t({"ID", "BOT", ">MESSAGES", ">TOKENS", "UPDATED"});
  for (const auto& s : data) {
    t.row({s.value("id", ""), s.value("bot", ""), std::to_string(s.value("messages", 0)),
           std::to_string(s.value("transcript_tokens", 0)), format_ago(s.value("updated", int64_t{0}))});
  }
  std::printf("%s", t.str().c_str());
}

void print_session(const json& s) {
  std::printf("id        %s\n", s.value("id", "").c_str());
  std::printf("bot       %s\n", s.value("bot", "").c_str());
  std::printf("created   %s\n", format_ago(s.value("created", int64_t{0})).c_str());
  std::printf("updated   %s\n", format_ago(s.value("updated", int64_t{0})).c_str());
  std::printf("messages  %d (%d transcript tokens)\n", s.value("messages", 0), s.value("transcript_tokens", 0));
  std::printf("cache     %s%s\n", s.value("warm", false) ? "warm (its KV is in RAM)" : "cold (rebuilt on the next message)",
              s.value("busy", false) ? "; generating a reply now" : "");
  if (s.contains("transcript") && !s["transcript"].empty()) {
    std::printf("\n");
    for (const auto& m : s["transcript"]) {
      std::printf("%s: %s\n", m.value("role", "").c_str(), m.value("content", "").c_str());
    }
  }
}

struct IdOpts {
  ClientOptions client;
  std::string id, bot;
};

}  // namespace

void add_sessions(CLI::App& app) {
  auto* cmd = app.add_subcommand("sessions", "List, show, create and remove chat sessions.");
  cmd->footer(
      "Examples:\n"
      "  towerctl sessions create --bot helper            # prints the new session's id\n"
      "  towerctl sessions create --bot helper --id alice\n"
      "  towerctl sessions ls\n"
      "  towerctl sessions show alice                     # with the transcript\n"
      "  towerctl chat --session alice\n"
      "  towerctl sessions rm alice\n"
      "A session is a bot's tower plus its own transcript; it survives towerd restarts.\n");
  cmd->require_subcommand(1);

  auto lo = std::make_shared<ClientOptions>();
  auto* ls = cmd->add_subcommand("ls", "List sessions.\n  towerctl sessions ls [--json]");
  add_client_options(ls, *lo, true);
  ls->callback([lo] {
    run_client([&] {
      HttpClient c = client_for(*lo, 30);
      json r = call(c, "GET", "/v1/sessions");
      lo->json ? print_json(r) : print_list(r["data"]);
    });
  });

  auto so = std::make_shared<IdOpts>();
  auto* show = cmd->add_subcommand("show", "Show a session and its transcript.\n  towerctl sessions show ID");
  show->add_option("ID", so->id, "Session id")->required();
  add_client_options(show, so->client, true);
  show->callback([so] {
    run_client([&] {
      HttpClient c = client_for(so->client, 30);
      json r = call(c, "GET", "/v1/sessions/" + url_part(so->id) + "?transcript=1");
      so->client.json ? print_json(r) : print_session(r);
    });
  });

  auto co = std::make_shared<IdOpts>();
  auto* create = cmd->add_subcommand("create", "Create a session for a bot; prints its id.\n"
                                               "  id=$(towerctl sessions create --bot helper)");
  create->add_option("--bot", co->bot, "The bot segment the session talks to")->required();
  create->add_option("--id", co->id, "The session id (default: a random one)");
  add_client_options(create, co->client, true);
  create->callback([co] {
    run_client([&] {
      HttpClient c = client_for(co->client, 30);
      json body = {{"bot", co->bot}};
      if (!co->id.empty()) body["id"] = co->id;
      json r = call(c, "POST", "/v1/sessions", body);
      if (co->client.json) return print_json(r);
      std::printf("%s\n", r.value("id", "").c_str());
    });
  });

  auto ro = std::make_shared<IdOpts>();
  auto* rm = cmd->add_subcommand("rm", "Remove a session and its transcript.\n  towerctl sessions rm ID");
  rm->add_option("ID", ro->id, "Session id")->required();
  add_client_options(rm, ro->client, false);
  rm->callback([ro] {
    run_client([&] {
      HttpClient c = client_for(ro->client, 30);
      call(c, "DELETE", "/v1/sessions/" + url_part(ro->id));
      std::printf("removed session \"%s\"\n", ro->id.c_str());
    });
  });
}

}  // namespace towers::cli
