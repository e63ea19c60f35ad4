// towerctl chat: talk to a session (POST /v1/sessions/ID/messages, streamed), one message or an
// interactive loop over stdin lines; --bot creates the session first.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "cli/client.h"
#include "cli/commands.h"

namespace towers::cli {

using json = nlohmann::json;

namespace {

struct ChatOpts {
  ClientOptions client;
  std::string session, bot, message;
  double temperature = -1;
  int max_tokens = 0;
  int64_t seed = -1;
  bool verbose = false;
};

// Sends one message and prints the reply as it streams in. Throws ClientError.
void turn(HttpClient& c, const ChatOpts& o, const std::string& text) {
  json body = {{"content", text}, {"stream", true}};
  if (o.temperature >= 0) body["temperature"] = o.temperature;
  if (o.max_tokens > 0) body["max_tokens"] = o.max_tokens;
  if (o.seed >= 0) body["seed"] = o.seed;
  std::string error;
  json usage, timings;
  bool printed = false;
  HttpReply r = c.stream("POST", "/v1/sessions/" + url_part(o.session) + "/messages", body.dump(), [&](std::string_view data) {
    json ev = json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (ev.is_discarded()) return;
    if (ev.contains("error")) {
      error = ev["error"].value("message", "generation failed");
      return;
    }
    if (ev.contains("usage")) usage = ev["usage"];
    if (ev.contains("towers")) timings = ev["towers"];
    if (!ev.contains("choices") || ev["choices"].empty()) return;
    const json& delta = ev["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      const std::string piece = delta["content"].get<std::string>();
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      printed |= !piece.empty();
    }
  });
  if (r.status >= 400) throw reply_error(r);
  std::printf("\n");
  std::fflush(stdout);
  if (!error.empty()) throw ClientError("the reply failed: " + error);
  if (!r.stream_done) throw ClientError("the reply ended early (towerd closed the stream without [DONE])");
  if (o.verbose && usage.is_object()) {
    std::fprintf(stderr, "[%d prompt tokens (%d cached), %d generated; first token %.0f ms, total %.0f ms, %s]\n",
                 usage.value("prompt_tokens", 0), usage["prompt_tokens_details"].value("cached_tokens", 0),
                 usage.value("completion_tokens", 0), timings.value("first_token_ms", 0.0),
                 timings.value("total_ms", 0.0), timings.value("finish", "").c_str());
  }
}

void run_chat(ChatOpts& o) {
  HttpClient c = client_for(o.client, 600);
  if (!o.bot.empty()) {
    json r = call(c, "POST", "/v1/sessions", {{"bot", o.bot}});
    o.session = r.value("id", "");
    std::fprintf(stderr, "session %s (bot %s); continue it with: towerctl chat --session %s\n", o.session.c_str(),
                 o.bot.c_str(), o.session.c_str());
  } else {
    // Fail early, before the user types, when the session does not exist.
    call(c, "GET", "/v1/sessions/" + url_part(o.session));
  }
  if (!o.message.empty()) return turn(c, o, o.message);
  const bool tty = isatty(STDIN_FILENO);
  if (tty) std::fprintf(stderr, "chatting with session %s; an empty line is skipped, Ctrl-D ends\n", o.session.c_str());
  std::string line;
  for (;;) {
    if (tty) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    turn(c, o, line);
  }
  if (tty) std::fprintf(stderr, "\n");
}

}  // namespace

void add_chat(CLI::App& app) {
  auto o = std::make_shared<ChatOpts>();
  auto* cmd = app.add_subcommand("chat", "Chat with a session, streaming the replies as they are generated.");
  cmd->footer(
      "Examples:\n"
      "  towerctl chat --session alice --message \"Tell me a story\"\n"
      "  towerctl chat --session alice                  # interactive: one line per message, Ctrl-D ends\n"
      "  towerctl chat --bot helper                     # creates a session first and prints its id\n"
      "  echo \"Hi\" | towerctl chat --session alice      # each stdin line is a message\n"
      "The session keeps the history: each message continues the conversation.\n");
  auto* sess = cmd->add_option("-s,--session", o->session, "The session to talk to");
  auto* bot = cmd->add_option("-b,--bot", o->bot, "Create a new session for this bot and talk to it");
  sess->excludes(bot);
  cmd->add_option("-m,--message", o->message, "Send this one message and exit (default: read messages from stdin)");
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy; default: the daemon's)")
      ->check(CLI::Range(0.0, 2.0));
  cmd->add_option("-n,--max-tokens", o->max_tokens, "Most tokens per reply (default: the daemon's)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seed", o->seed, "Random seed for sampling")->check(CLI::NonNegativeNumber);
  cmd->add_flag("-v,--verbose", o->verbose, "Print token counts and timings of each reply to stderr");
  add_client_options(cmd, o->client, false);
  cmd->callback([o] {
    run_client([&] {
      if (o->session.empty() && o->bot.empty()) {
        throw ClientError("chat: give --session ID (towerctl sessions ls) or --bot NAME to start a new session");
      }
      run_chat(*o);
    });
  });
}

}  // namespace towers::cli
