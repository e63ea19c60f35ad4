#include "cli/client.h"

#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"

namespace towers::cli {

using json = nlohmann::json;

void add_client_options(CLI::App* cmd, ClientOptions& o, bool with_json) {
  const char* env = std::getenv("TOWERD_SOCKET");
  o.socket = env && *env ? env : "/run/towerd/towerd.sock";
  cmd->add_option("--socket", o.socket, "towerd's Unix socket (default: $TOWERD_SOCKET, else /run/towerd/towerd.sock)");
  cmd->add_option("--timeout", o.timeout_s, "Seconds to wait for towerd at each step (0 = no limit)")
      ->check(CLI::Range(0.0, 1e6));
  if (with_json) cmd->add_flag("--json", o.json, "Print the daemon's JSON reply instead of the readable form");
}

HttpClient client_for(const ClientOptions& o, double default_timeout_s) {
  return HttpClient(o.socket, o.timeout_s >= 0 ? o.timeout_s : default_timeout_s);
}

ClientError reply_error(const HttpReply& r) {
  std::string message;
  try {
    json j = json::parse(r.body);
    if (j.contains("error") && j["error"].is_object() && j["error"].contains("message")) {
      message = j["error"]["message"].get<std::string>();
    }
  } catch (const std::exception&) {
  }
  if (message.empty()) {
    message = r.body;
    while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
    if (message.size() > 200) message = message.substr(0, 200) + "...";
    if (message.empty()) message = "towerd answered with an error";
  }
  std::string suffix = " (HTTP " + std::to_string(r.status);
  if (!r.retry_after.empty()) suffix += "; retry after " + r.retry_after + " s";
  return ClientError(message + suffix + ")");
}

json call(HttpClient& c, const std::string& method, const std::string& target, const json& body) {
  HttpReply r = c.request(method, target, body.is_null() ? "" : body.dump());
  if (r.status >= 400) throw reply_error(r);
  try {
    return json::parse(r.body);
  } catch (const json::parse_error& e) {
    throw ClientError("towerd's reply to " + method + " " + target + " is not JSON: " + e.what());
  }
}

void run_client(const std::function<void()>& body) {
  try {
    body();
  } catch (const ClientError& e) {
    std::fflush(stdout);
    std::exit(fail(e.what()));
  } catch (const json::exception& e) {
    std::fflush(stdout);
    std::exit(fail(std::string("unexpected reply from towerd: ") + e.what()));
  }
}

std::string url_part(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : s) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += static_cast<char>(ch);
    } else {
      out += '%';
      out += hex[ch >> 4];
      out += hex[ch & 15];
    }
  }
  return out;
}

std::vector<std::pair<int, const json*>> hierarchy_order(const json& segments) {
  std::vector<std::pair<int, const json*>> out;
  std::vector<bool> placed(segments.size(), false);
  std::function<void(const std::string&, int)> visit = [&](const std::string& parent, int depth) {
    for (size_t i = 0; i < segments.size(); ++i) {
      if (placed[i] || segments[i].value("parent", "") != parent) continue;
      placed[i] = true;
      out.push_back({depth, &segments[i]});
      visit(segments[i].value("name", ""), depth + 1);
    }
  };
  visit("", 0);
  for (size_t i = 0; i < segments.size(); ++i) {  // orphans (should not exist): at the end
    if (!placed[i]) out.push_back({0, &segments[i]});
  }
  return out;
}

void print_json(const json& j) { std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str()); }

}  // namespace towers::cli
