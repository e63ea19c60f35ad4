// towerctl: the Towers command-line tool. Offline verbs work on a GGUF file directly.
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
      "  towerctl model synth --shape llama3.2-1b --type q4_0 -o synth.gguf"};
  app.require_subcommand(1);
  app.fallthrough();
  towers::cli::add_generate(app);
  towers::cli::add_perplexity(app);
  towers::cli::add_model(app);
  towers::cli::add_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
