// towerctl's verbs. Each registers its subcommand on the app and runs when chosen.
#pragma once
#include <CLI/CLI.hpp>

namespace towers::cli {

void add_generate(CLI::App& app);
void add_perplexity(CLI::App& app);
void add_model(CLI::App& app);  // model info, model synth
void add_bench(CLI::App& app);

// Prints "towerctl: <message>" to stderr and returns the exit status for failures.
int fail(const std::string& message);

}  // namespace towers::cli
