// towerctl: the Towers command-line tool. Offline verbs work on a GGUF file directly; client verbs
// talk to a running towerd over its Unix socket. Exit status: 0 done, 1 failed, 2 usage error.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "daemon/version.h"

namespace towers::cli {
int fail(const std::string& message) {
  std::fprintf(stderr, "towerctl: %s\n", message.c_str());
  return 1;
}
int usage_error(const std::string& message) {
  std::fprintf(stderr, "towerctl: %s\n", message.c_str());
  return 2;
}
}  // namespace towers::cli

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// After a usage error: follows argv down the verbs ("segments", then "add") to the first word that is
// no verb where one is expected, and names the verb it most likely meant. "" when there is none.
std::string unknown_verb_message(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  std::string path = "towerctl";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return "";  // an option: CLI11's own message says more
    std::vector<CLI::App*> verbs = at->get_subcommands([](CLI::App*) { return true; });
    if (verbs.empty()) return "";  // a verb's argument, not a verb
    auto it = std::find_if(verbs.begin(), verbs.end(), [&](CLI::App* v) { return v->check_name(word); });
    if (it != verbs.end()) {
      at = *it;
      path += " " + word;
      continue;
    }
    const CLI::App* best = nullptr;
    size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;  // further than this is no typo
    for (const CLI::App* v : verbs) {
      const std::string& name = v->get_name();
      const size_t d = name.rfind(word, 0) == 0 ? 1 : edit_distance(word, name);  // a prefix counts as close
      if (d < best_distance) best = v, best_distance = d;
    }
    std::string message = "unknown verb \"" + word + "\" for " + path;
    if (best) message += "; did you mean \"" + path + " " + best->get_name() + "\"?";
    std::string names;
    for (const CLI::App* v : verbs) names += (names.empty() ? "" : ", ") + v->get_name();
    return message + " (verbs: " + names + ")";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "towerctl — the Towers command-line tool.\n"
      "Offline verbs run a GGUF model in this process:\n"
      "  towerctl generate --model M.gguf --prompt \"Once upon a time\"\n"
      "  towerctl perplexity --model M.gguf --file text.txt\n"
      "  towerctl model info M.gguf\n"
      "  towerctl model synth --shape llama3.2-1b --type q4_0 -o synth.gguf\n"
      "  towerctl codec encode --model M.gguf --in text.txt --out text.tcz\n"
      "Client verbs talk to a running towerd (--socket PATH, default $TOWERD_SOCKET or\n"
      "/run/towerd/towerd.sock):\n"
      "  towerctl status\n"
      "  towerctl chat                  (a plain chat: no system prompt, history kept here)\n"
      "  towerctl pool\n"
      "  towerctl policy set --eviction lindy --ram-budget 2G\n"
      "  towerctl segments add acme --level platform --text \"You work for Acme.\"\n"
      "  towerctl sessions create --bot helper\n"
      "  towerctl chat --session ID\n"
      "  towerctl compress --idle-for 3600      (cold tier; towerctl thaw NAME brings one back)\n"
      "  towerctl ui                            (towerd's page in a browser: the towers, the pool, a chat)\n"
      "`towerctl VERB --help` explains a verb with examples. Exit status: 0 done, 1 failed, 2 usage error."};
  app.set_version_flag("-V,--version", towers::daemon::version_text("towerctl"),
                       "Print the version, git commit and SIMD target, then exit");
  app.require_subcommand(1);
  app.fallthrough();
  towers::cli::add_generate(app);
  towers::cli::add_perplexity(app);
  towers::cli::add_model(app);
  towers::cli::add_bench(app);
  towers::cli::add_codec(app);
  towers::cli::add_status(app);
  towers::cli::add_pool(app);
  towers::cli::add_policy(app);
  towers::cli::add_segments(app);
  towers::cli::add_sessions(app);
  towers::cli::add_cold(app);
  towers::cli::add_chat(app);
  towers::cli::add_ui(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
    if (std::string verb = unknown_verb_message(app, argc, argv); !verb.empty()) return towers::cli::usage_error(verb);
    app.exit(e);  // CLI11's message and "Run with --help for more information."
    return 2;
  }
  return 0;
}
