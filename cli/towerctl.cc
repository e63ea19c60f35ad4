// towerctl: the Towers command-line tool. Offline verbs work on a GGUF file directly; client verbs
// talk to a running towerd over its Unix socket.
#include <cstdio>
#include <iostream>

#include "cli/commands.h"

namespace towers::cli {
int fail(const std::string& message) {
  std::fprintf(stderr, "towerctl: %s\n", message.c_str());
  return 1;
}
}  // namespace towers::cli

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
      "  towerctl pool\n"
      "  towerctl policy set --eviction lindy --ram-budget 2G\n"
      "  towerctl segments add acme --level platform --text \"You work for Acme.\"\n"
      "  towerctl sessions create --bot helper\n"
      "  towerctl chat --session ID\n"
      "  towerctl compress --idle-for 3600      (cold tier; towerctl thaw NAME brings one back)\n"
      "`towerctl VERB --help` explains a verb with examples."};
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
