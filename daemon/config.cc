#include "daemon/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cmath>
#include <cstdio>
#include <set>

namespace towers::daemon {

namespace {

struct Ctx {
  std::string file;
  std::string error;
  bool fail(const std::string& key, const std::string& msg) {
    if (error.empty()) error = file + ": " + key + ": " + msg;
    return false;
  }
};

bool get_string(Ctx& c, const toml::table& t, const std::string& sect, const char* key, std::string& out) {
  const toml::node* n = t.get(key);
  if (!n) return true;
  if (!n->is_string()) return c.fail(sect + "." + key, "expected a string");
  out = **n->as_string();
  return true;
}

bool get_int(Ctx& c, const toml::table& t, const std::string& sect, const char* key, int64_t lo, int64_t hi,
             int64_t& out) {
  const toml::node* n = t.get(key);
  if (!n) return true;
  if (!n->is_integer()) return c.fail(sect + "." + key, "expected an integer");
  int64_t v = **n->as_integer();
  if (v < lo || v > hi) {
    return c.fail(sect + "." + key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                                        std::to_string(v));
  }
  out = v;
  return true;
}

template <class T>
bool get_int_as(Ctx& c, const toml::table& t, const std::string& sect, const char* key, int64_t lo, int64_t hi,
                T& out) {
  int64_t v = static_cast<int64_t>(out);
  if (!get_int(c, t, sect, key, lo, hi, v)) return false;
  out = static_cast<T>(v);
  return true;
}

bool get_bool(Ctx& c, const toml::table& t, const std::string& sect, const char* key, bool& out) {
  const toml::node* n = t.get(key);
  if (!n) return true;
  if (!n->is_boolean()) return c.fail(sect + "." + key, "expected true or false");
  out = **n->as_boolean();
  return true;
}

bool get_size(Ctx& c, const toml::table& t, const std::string& sect, const char* key, uint64_t& out) {
  const toml::node* n = t.get(key);
  if (!n) return true;
  if (n->is_integer() && **n->as_integer() >= 0) {
    out = static_cast<uint64_t>(**n->as_integer());
    return true;
  }
  if (n->is_string()) {
    if (auto v = parse_size(**n->as_string())) {
      out = *v;
      return true;
    }
  }
  return c.fail(sect + "." + key, "expected a size such as \"4G\", \"512M\" or a byte count");
}

bool get_ids(Ctx& c, const toml::table& t, const std::string& sect, const char* key, std::vector<uint32_t>& out) {
  const toml::node* n = t.get(key);
  if (!n) return true;
  if (!n->is_array()) return c.fail(sect + "." + key, "expected an array of numeric ids");
  out.clear();
  for (const auto& e : *n->as_array()) {
    if (!e.is_integer() || **e.as_integer() < 0 || **e.as_integer() > 0xFFFFFFFFll) {
      return c.fail(sect + "." + key, "expected an array of numeric ids");
    }
    out.push_back(static_cast<uint32_t>(**e.as_integer()));
  }
  return true;
}

bool get_strings(Ctx& c, const toml::table& t, const std::string& sect, const char* key, std::vector<std::string>& out) {
  const toml::node* n = t.get(key);
  if (!n) return true;
  if (!n->is_array()) return c.fail(sect + "." + key, "expected an array of strings");
  out.clear();
  for (const auto& e : *n->as_array()) {
    if (!e.is_string()) return c.fail(sect + "." + key, "expected an array of strings");
    out.push_back(**e.as_string());
  }
  return true;
}

// An Origin header value: scheme://host[:port], nothing after.
bool is_origin(std::string_view o) {
  const size_t sep = o.find("://");
  if (sep == std::string_view::npos || sep == 0 || sep + 3 >= o.size()) return false;
  for (char ch : o.substr(0, sep)) {
    if (!std::isalpha(static_cast<unsigned char>(ch))) return false;
  }
  for (char ch : o.substr(sep + 3)) {
    if (ch == '/' || ch == '?' || ch == '#' || ch == ' ' || ch == '"' || static_cast<unsigned char>(ch) < 0x21) return false;
  }
  return true;
}

bool check_keys(Ctx& c, const toml::table& t, const std::string& sect, std::set<std::string> known) {
  for (const auto& [k, v] : t) {
    if (!known.count(std::string(k.str()))) {
      return c.fail(sect.empty() ? std::string(k.str()) : sect + "." + std::string(k.str()), "unknown key");
    }
    if (sect.empty() && !v.is_table()) return c.fail(std::string(k.str()), "expected a [section]");
  }
  return true;
}

const toml::table* section(const toml::table& root, const char* name) {
  const toml::node* n = root.get(name);
  return n ? n->as_table() : nullptr;
}

bool read_policy(Ctx& c, const toml::table& root, PolicyConfig& p) {
  const toml::table* t = section(root, "policy");
  if (!t) return true;
  if (!check_keys(c, *t, "policy", {"eviction", "ram_budget"})) return false;
  std::string ev(to_string(p.eviction));
  if (!get_string(c, *t, "policy", "eviction", ev)) return false;
  auto e = parse_eviction_policy(ev);
  if (!e) return c.fail("policy.eviction", "expected " + std::string(kEvictionPolicyNames) + ", got \"" + ev + "\"");
  p.eviction = *e;
  uint64_t budget = p.ram_budget_bytes;
  if (!get_size(c, *t, "policy", "ram_budget", budget)) return false;
  p.ram_budget_bytes = budget;
  return true;
}

Result<toml::table> parse(const std::filesystem::path& path) {
  try {
    return toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    return Status::Error(path.string() + ":" + std::to_string(src.begin.line) + ":" +
                         std::to_string(src.begin.column) + ": " + std::string(e.description()));
  }
}

}  // namespace

Result<ListenAddress> parse_listen_address(std::string_view text) {
  const std::string quoted = "\"" + std::string(text) + "\"";
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    return Status::InvalidArgument("expected HOST:PORT such as \"127.0.0.1:8080\", got " + quoted);
  }
  std::string host(text.substr(0, colon));
  const std::string_view port = text.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  else if (host.find(':') != std::string::npos) {
    return Status::InvalidArgument("an IPv6 address needs brackets, as in \"[::1]:8080\"; got " + quoted);
  }
  if (host == "localhost") host = "127.0.0.1";
  boost::system::error_code ec;
  const auto addr = boost::asio::ip::make_address(host, ec);
  if (ec || !addr.is_loopback()) {
    return Status::InvalidArgument("the address must be loopback (127.0.0.1, localhost, [::1]): there is no peer "
                                   "check on TCP; got " + quoted);
  }
  unsigned long value = 0;
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  if (digits) value = std::stoul(std::string(port));
  if (!digits || value < 1 || value > 65535) {
    return Status::InvalidArgument("the port must be a number from 1 to 65535; got " + quoted);
  }
  return ListenAddress{addr.to_string(), static_cast<uint16_t>(value)};
}

std::optional<uint64_t> parse_size(std::string_view text) {
  std::string s(text);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(v) || v < 0) return std::nullopt;
  std::string unit(end);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double mul = 1;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mul = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mul = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") mul = 1024.0 * 1024 * 1024 * 1024;
  else return std::nullopt;
  const double bytes = v * mul;
  if (bytes > 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

std::string format_size(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::optional<KvQuant> parse_kv_format(std::string_view name) {
  for (KvQuant q : {KvQuant::F32, KvQuant::F16, KvQuant::Q8, KvQuant::Q6, KvQuant::Q4}) {
    if (name == simd::kv_quant_name(q)) return q;
  }
  return std::nullopt;
}

Result<PolicyConfig> load_policy(const std::filesystem::path& path) {
  auto root = parse(path);
  if (!root.ok()) return root.status();
  Ctx c{path.string(), ""};
  PolicyConfig p;
  if (!read_policy(c, root.value(), p)) return Status::Error(c.error);
  return p;
}

Result<Config> load_config(const std::filesystem::path& path) {
  Config cfg;
  cfg.source = path;
  auto parsed = parse(path);
  if (!parsed.ok()) return parsed.status();
  const toml::table& root = parsed.value();
  Ctx c{path.string(), ""};
  bool ok = check_keys(c, root, "", {"model", "server", "state", "pool", "cold", "modular", "policy", "limits"});
  if (ok) {
    if (const toml::table* t = section(root, "model")) {
      ok = check_keys(c, *t, "model", {"path", "threads", "chat_template", "aliases"}) &&
           get_string(c, *t, "model", "path", cfg.model_path) &&
           get_int_as(c, *t, "model", "threads", 0, 1024, cfg.threads) &&
           get_string(c, *t, "model", "chat_template", cfg.chat_template);
      if (ok) {
        if (const toml::node* n = t->get("aliases")) {
          if (!n->is_array()) ok = c.fail("model.aliases", "expected an array of model names");
          for (const auto& e : ok ? *n->as_array() : toml::array{}) {
            if (!e.is_string() || e.as_string()->get().empty() || e.as_string()->get().size() > 256) {
              ok = c.fail("model.aliases", "entries must be non-empty strings of at most 256 bytes");
              break;
            }
            cfg.aliases.push_back(**e.as_string());
          }
        }
      }
    }
  }
  if (ok) {
    if (const toml::table* t = section(root, "server")) {
      std::string mode = "0660";
      ok = check_keys(c, *t, "server",
                      {"socket", "socket_group", "socket_mode", "tcp_listen", "allowed_uids", "allowed_gids",
                       "allowed_origins", "api_key_file", "io_threads", "max_connections", "max_connections_per_uid",
                       "header_timeout_seconds", "body_timeout_seconds", "idle_timeout_seconds"}) &&
           get_string(c, *t, "server", "socket", cfg.socket_path) &&
           get_string(c, *t, "server", "socket_group", cfg.socket_group) &&
           get_string(c, *t, "server", "socket_mode", mode) &&
           get_string(c, *t, "server", "tcp_listen", cfg.tcp_listen) &&
           get_ids(c, *t, "server", "allowed_uids", cfg.allowed_uids) &&
           get_ids(c, *t, "server", "allowed_gids", cfg.allowed_gids) &&
           get_strings(c, *t, "server", "allowed_origins", cfg.allowed_origins) &&
           get_string(c, *t, "server", "api_key_file", cfg.api_key_file) &&
           get_int_as(c, *t, "server", "io_threads", 1, 64, cfg.io_threads) &&
           get_int_as(c, *t, "server", "max_connections", 1, 100000, cfg.max_connections) &&
           get_int_as(c, *t, "server", "max_connections_per_uid", 1, 100000, cfg.max_connections_per_uid) &&
           get_int_as(c, *t, "server", "header_timeout_seconds", 1, 3600, cfg.header_timeout_s) &&
           get_int_as(c, *t, "server", "body_timeout_seconds", 1, 3600, cfg.body_timeout_s) &&
           get_int_as(c, *t, "server", "idle_timeout_seconds", 1, 86400, cfg.idle_timeout_s);
      for (const auto& o : cfg.allowed_origins) {
        if (ok && !is_origin(o)) {
          ok = c.fail("server.allowed_origins", "\"" + o + "\" is not an origin such as \"http://localhost:3000\" (scheme://host[:port])");
        }
      }
      if (ok && !cfg.tcp_listen.empty()) {
        if (auto a = parse_listen_address(cfg.tcp_listen); !a.ok()) ok = c.fail("server.tcp_listen", a.error());
      }
      if (ok) {
        char* end = nullptr;
        unsigned long m = std::strtoul(mode.c_str(), &end, 8);
        if (mode.empty() || *end != '\0' || m > 0777) ok = c.fail("server.socket_mode", "expected an octal mode such as \"0660\"");
        else cfg.socket_mode = static_cast<unsigned>(m);
      }
      if (ok && cfg.socket_path.empty()) ok = c.fail("server.socket", "must not be empty");
    }
  }
  if (ok) {
    if (const toml::table* t = section(root, "state")) {
      std::string dir = cfg.state_dir.string();
      ok = check_keys(c, *t, "state", {"dir", "compact_bytes", "warm_tier", "disk_budget"}) &&
           get_string(c, *t, "state", "dir", dir) && get_size(c, *t, "state", "compact_bytes", cfg.compact_bytes) &&
           get_bool(c, *t, "state", "warm_tier", cfg.warm_tier) &&
           get_size(c, *t, "state", "disk_budget", cfg.disk_budget_bytes);
      if (ok && dir.empty()) ok = c.fail("state.dir", "must not be empty");
      cfg.state_dir = dir;
    }
  }
  if (ok) {
    if (const toml::table* t = section(root, "pool")) {
      ok = check_keys(c, *t, "pool", {"formats", "transcript_format", "pin_fan_out", "pin_levels"});
      if (ok) {
        if (const toml::node* n = t->get("formats")) {
          if (!n->is_array() || n->as_array()->empty()) ok = c.fail("pool.formats", "expected a non-empty array such as [\"q4\", \"q6\", \"q8\"]");
          else {
            cfg.depth.by_depth.clear();
            for (const auto& e : *n->as_array()) {
              auto q = e.is_string() ? parse_kv_format(**e.as_string()) : std::nullopt;
              if (!q) {
                ok = c.fail("pool.formats", "each entry must be one of q4, q6, q8, f16, f32");
                break;
              }
              cfg.depth.by_depth.push_back(*q);
            }
          }
        }
      }
      if (ok) {
        std::string tf = simd::kv_quant_name(cfg.depth.transcript);
        ok = get_string(c, *t, "pool", "transcript_format", tf);
        if (ok) {
          auto q = parse_kv_format(tf);
          if (!q) ok = c.fail("pool.transcript_format", "must be one of q4, q6, q8, f16, f32");
          else cfg.depth.transcript = *q;
        }
      }
      if (ok) ok = get_int_as(c, *t, "pool", "pin_fan_out", 1, 1 << 30, cfg.pin_fan_out);
      if (ok) {
        if (const toml::node* n = t->get("pin_levels")) {
          cfg.pin_levels.clear();
          if (!n->is_array()) ok = c.fail("pool.pin_levels", "expected an array of level names");
          for (const auto& e : ok ? *n->as_array() : toml::array{}) {
            auto lv = parse_level(e.is_string() ? std::string(**e.as_string()) : "");
            if (!lv) {
              ok = c.fail("pool.pin_levels", "entries must be \"platform\", \"community\" or \"bot\"");
              break;
            }
            cfg.pin_levels.push_back(*lv);
          }
        }
      }
    }
  }
  if (ok) {
    if (const toml::table* t = section(root, "cold")) {
      ok = check_keys(c, *t, "cold", {"enabled", "idle_seconds", "scan_seconds", "chunk"}) &&
           get_bool(c, *t, "cold", "enabled", cfg.cold_enabled) &&
           get_int_as(c, *t, "cold", "idle_seconds", 0, 365 * 86400, cfg.cold_idle_seconds) &&
           get_int_as(c, *t, "cold", "scan_seconds", 1, 86400, cfg.cold_scan_seconds) &&
           get_int_as(c, *t, "cold", "chunk", 0, 1 << 20, cfg.cold_chunk);
    }
  }
  if (ok) {
    if (const toml::table* t = section(root, "modular")) {
      ok = check_keys(c, *t, "modular", {"enabled", "repair_tokens", "background_exact"}) &&
           get_bool(c, *t, "modular", "enabled", cfg.modular.enabled) &&
           get_int_as(c, *t, "modular", "repair_tokens", kMinRepairTokens, 1 << 16, cfg.modular.repair_tokens) &&
           get_bool(c, *t, "modular", "background_exact", cfg.modular.background_exact);
    }
  }
  if (ok) ok = read_policy(c, root, cfg.policy);
  if (ok) {
    if (const toml::table* t = section(root, "limits")) {
      uint64_t body = cfg.max_body_bytes;
      const toml::node* to = t->get("request_timeout_seconds");
      ok = check_keys(c, *t, "limits",
                      {"max_body_bytes", "max_prompt_tokens", "max_tokens", "default_max_tokens",
                       "request_timeout_seconds", "queue_length", "max_sessions", "max_segment_chars", "max_batch",
                       "prefill_chunk", "decode_slowdown", "prompt_cache_segments", "overflow"}) &&
           get_size(c, *t, "limits", "max_body_bytes", body) &&
           get_int_as(c, *t, "limits", "max_prompt_tokens", 0, 1 << 24, cfg.max_prompt_tokens) &&
           get_int_as(c, *t, "limits", "max_tokens", 1, 1 << 24, cfg.max_tokens) &&
           get_int_as(c, *t, "limits", "default_max_tokens", 1, 1 << 24, cfg.default_max_tokens) &&
           get_int_as(c, *t, "limits", "queue_length", 1, 1 << 20, cfg.queue_length) &&
           get_int_as(c, *t, "limits", "max_sessions", 1, 1 << 30, cfg.max_sessions) &&
           get_int_as(c, *t, "limits", "max_segment_chars", 1, 64 << 20, cfg.max_segment_chars) &&
           get_int_as(c, *t, "limits", "max_batch", 1, 1024, cfg.max_batch) &&
           get_int_as(c, *t, "limits", "prefill_chunk", 1, 1 << 16, cfg.prefill_chunk) &&
           get_int_as(c, *t, "limits", "prompt_cache_segments", 0, 1 << 20, cfg.prompt_cache_segments);
      if (ok && (body < 1024 || body > (1ull << 30))) ok = c.fail("limits.max_body_bytes", "must be between 1K and 1G");
      if (ok) {
        std::string overflow = cfg.overflow_truncate ? "truncate" : "error";
        ok = get_string(c, *t, "limits", "overflow", overflow);
        if (ok && overflow != "truncate" && overflow != "error") {
          ok = c.fail("limits.overflow", "expected \"truncate\" or \"error\", got \"" + overflow + "\"");
        }
        cfg.overflow_truncate = overflow == "truncate";
      }
      cfg.max_body_bytes = body;
      if (ok && to) {
        if (!to->is_number() || to->value<double>().value_or(0) <= 0) ok = c.fail("limits.request_timeout_seconds", "expected a positive number");
        else cfg.request_timeout_s = to->value<double>().value_or(300);
      }
      if (ok) {
        if (const toml::node* ds = t->get("decode_slowdown")) {
          const double v = ds->value<double>().value_or(0);
          if (!ds->is_number() || v < 1 || v > 100) ok = c.fail("limits.decode_slowdown", "expected a number from 1 to 100");
          else cfg.decode_slowdown = v;
        }
      }
    }
  }
  if (!ok) return Status::Error(c.error);
  return cfg;
}

Status validate(const Config& c) {
  if (c.model_path.empty()) return Status::Error("model.path: no model given (set it in the config or pass --model)");
  if (c.default_max_tokens > c.max_tokens) {
    return Status::Error("limits.default_max_tokens (" + std::to_string(c.default_max_tokens) +
                         ") exceeds limits.max_tokens (" + std::to_string(c.max_tokens) + ")");
  }
  if (!c.tcp_listen.empty()) {
    if (auto a = parse_listen_address(c.tcp_listen); !a.ok()) return Status::InvalidArgument("server.tcp_listen: " + a.error());
  }
  return Status::Ok();
}

}  // namespace towers::daemon
