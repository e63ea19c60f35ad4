// towerctl's verbs. Each registers its subcommand on the app and runs when chosen.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

namespace towers::cli {

void add_generate(CLI::App& app);
void add_perplexity(CLI::App& app);
void add_model(CLI::App& app);  // model info, model synth
void add_bench(CLI::App& app);
void add_codec(CLI::App& app);  // codec encode, codec decode, codec info
// Client verbs: they talk to a running towerd over its Unix socket (cli/client.h).
void add_status(CLI::App& app);
void add_pool(CLI::App& app);
void add_policy(CLI::App& app);    // policy get, policy set
void add_segments(CLI::App& app);  // segments ls, show, add, rm
void add_sessions(CLI::App& app);  // sessions ls, show, create, rm
void add_cold(CLI::App& app);      // compress, thaw (cold tier: a running towerd, or its stopped state)
void add_chat(CLI::App& app);
void add_ui(CLI::App& app);        // the page, through a loopback TCP port

// Print "towerctl: <message>" to stderr and return the exit status: fail() 1 (something failed),
// usage_error() 2 (the command line asks for something impossible).
int fail(const std::string& message);
int usage_error(const std::string& message);
// "\r<verb>: 12345/67890 tokens" on stderr at most five times a second, for totals worth watching.
std::function<void(int64_t, int64_t)> progress_printer(std::string verb);

}  // namespace towers::cli
