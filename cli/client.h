// What the verbs that talk to a running towerd share: the --socket/--timeout/--json options, calling
// an endpoint (a daemon error becomes one line and a non-zero exit), and printing helpers.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli/http_client.h"

namespace towers::cli {

struct ClientOptions {
  std::string socket;
  double timeout_s = -1;  // -1: the verb's default
  bool json = false;      // print the daemon's JSON instead of the readable form
};

// Adds --socket (default $TOWERD_SOCKET, else /run/towerd/towerd.sock) and --timeout to a verb;
// with_json also adds --json.
void add_client_options(CLI::App* cmd, ClientOptions& o, bool with_json);

// The client for a verb, with its default timeout unless --timeout was given.
HttpClient client_for(const ClientOptions& o, double default_timeout_s);

// Calls an endpoint and returns its JSON; a status >= 400 throws ClientError with the daemon's
// message ("segment \"x\" does not exist (404)").
nlohmann::json call(HttpClient& c, const std::string& method, const std::string& target,
                    const nlohmann::json& body = nullptr);
// The ClientError for an error reply (JSON error body or not).
ClientError reply_error(const HttpReply& r);

// Runs a verb's body: ClientError (and JSON surprises) print "towerctl: ..." and exit 1.
void run_client(const std::function<void()>& body);

// Percent-encodes a name for a URL path segment.
std::string url_part(const std::string& s);

// The segments of GET /v1/segments ("data") in hierarchy order (each parent before its children),
// with their depth (0 = platform).
std::vector<std::pair<int, const nlohmann::json*>> hierarchy_order(const nlohmann::json& segments);

// Prints JSON indented, for --json.
void print_json(const nlohmann::json& j);

}  // namespace towers::cli
