// towerctl chat: one message or an interactive loop over stdin lines, replies streamed as they are
// generated. With --session (or --bot, which creates one) the daemon keeps the history
// (POST /v1/sessions/ID/messages); with neither it is a plain chat whose history towerctl keeps and
// resends (POST /v1/chat/completions, stateless on the daemon's side). In the interactive loop Ctrl-C
// stops the reply being generated and returns to the prompt; Ctrl-C at the prompt or Ctrl-D ends.
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
  std::string session, bot, message, system;
  double temperature = -1;
  int max_tokens = 0;
  int64_t seed = -1;
  bool verbose = false;
};

struct Reply {
  std::string text;          // what was printed
  bool interrupted = false;  // Ctrl-C stopped it
};

// Sends one request whose reply streams back as chat-completion chunks, printing the text as it
// comes. Throws ClientError.
Reply stream_reply(HttpClient& c, const ChatOpts& o, const std::string& target, json body) {
  body["stream"] = true;
  if (o.temperature >= 0) body["temperature"] = o.temperature;
  if (o.max_tokens > 0) body["max_tokens"] = o.max_tokens;
  if (o.seed >= 0) body["seed"] = o.seed;
  std::string error;
  json usage, timings;
  Reply out;
  HttpReply r = c.stream("POST", target, body.dump(), [&](std::string_view data) {
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
      out.text += piece;
    }
  });
  if (r.interrupted) {
    clearerr(stdout);  // a write the signal cut short
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "[stopped]\n");
    out.interrupted = true;
    return out;
  }
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
  return out;
}

// One conversation: a daemon session, or a plain chat with the history kept here.
class Conversation {
 public:
  Conversation(HttpClient& c, const ChatOpts& o) : c_(c), o_(o) {
    if (!o.system.empty()) history_.push_back({{"role", "system"}, {"content", o.system}});
  }

  Reply say(const std::string& text) {
    if (!o_.session.empty()) {
      return stream_reply(c_, o_, "/v1/sessions/" + url_part(o_.session) + "/messages", {{"content", text}});
    }
    history_.push_back({{"role", "user"}, {"content", text}});
    Reply r;
    try {
      r = stream_reply(c_, o_, "/v1/chat/completions", {{"messages", history_}});
    } catch (...) {
      history_.erase(history_.end() - 1);
      throw;
    }
    // A reply stopped before its first word leaves no turn; a partial one stays, as it was shown.
    if (r.interrupted && r.text.empty()) history_.erase(history_.end() - 1);
    else history_.push_back({{"role", "assistant"}, {"content", r.text}});
    return r;
  }

 private:
  HttpClient& c_;
  const ChatOpts& o_;
  json history_ = json::array();
};

void run_chat(ChatOpts& o) {
  HttpClient c = client_for(o.client, 600);
  if (!o.bot.empty()) {
    json r = call(c, "POST", "/v1/sessions", {{"bot", o.bot}});
    o.session = r.value("id", "");
    std::fprintf(stderr, "session %s (bot %s); continue it with: towerctl chat --session %s\n", o.session.c_str(),
                 o.bot.c_str(), o.session.c_str());
  } else if (!o.session.empty()) {
    // Fail early, before the user types, when the session does not exist.
    call(c, "GET", "/v1/sessions/" + url_part(o.session));
  } else {
    call(c, "GET", "/healthz");  // likewise when towerd is not there
  }
  Conversation conversation(c, o);
  if (!o.message.empty()) {
    conversation.say(o.message);
    return;
  }
  const bool tty = isatty(STDIN_FILENO);
  if (tty) {
    std::fprintf(stderr, "chatting with %s; Ctrl-C stops a reply, Ctrl-D (or Ctrl-C here) ends\n",
                 o.session.empty() ? "towerd (a plain chat, history kept by towerctl)"
                                   : ("session " + o.session).c_str());
  }
  c.interrupt_on_sigint(true);
  std::string line;
  for (;;) {
    if (tty) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    conversation.say(line);
  }
  if (tty) std::fprintf(stderr, "\n");
}

}  // namespace

void add_chat(CLI::App& app) {
  auto o = std::make_shared<ChatOpts>();
  auto* cmd = app.add_subcommand("chat", "Chat with towerd, streaming the replies as they are generated.");
  cmd->footer(
      "Examples:\n"
      "  towerctl chat                                  # a plain chat; history kept by towerctl\n"
      "  towerctl chat --message \"Tell me a story\"      # one message, then exit\n"
      "  towerctl chat --system \"Answer in French.\"     # a plain chat with a system prompt\n"
      "  towerctl chat --bot helper                     # a new session of a bot, and its id\n"
      "  towerctl chat --session alice                  # go on with a session (towerd keeps its history)\n"
      "  echo \"Hi\" | towerctl chat --session alice      # each stdin line is a message\n"
      "Interactive: one line per message; Ctrl-C stops the reply being written and returns to the\n"
      "prompt (the part shown stays in the history); Ctrl-C at the prompt or Ctrl-D ends.\n");
  auto* sess = cmd->add_option("-s,--session", o->session, "The session to talk to");
  auto* bot = cmd->add_option("-b,--bot", o->bot, "Create a new session for this bot and talk to it");
  auto* system = cmd->add_option("--system", o->system, "System prompt of a plain chat (not with --session/--bot)");
  sess->excludes(bot);
  system->excludes(sess)->excludes(bot);
  cmd->add_option("-m,--message", o->message, "Send this one message and exit (default: read messages from stdin)");
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy; default: the daemon's)")
      ->check(CLI::Range(0.0, 2.0));
  cmd->add_option("-n,--max-tokens", o->max_tokens, "Most tokens per reply (default: the daemon's)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seed", o->seed, "Random seed for sampling")->check(CLI::NonNegativeNumber);
  cmd->add_flag("-v,--verbose", o->verbose, "Print token counts and timings of each reply to stderr");
  add_client_options(cmd, o->client, false);
  cmd->callback([o] { run_client([&] { run_chat(*o); }); });
}

}  // namespace towers::cli
