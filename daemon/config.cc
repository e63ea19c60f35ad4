#include "daemon/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cmath>
#include <cstdio>
#include <functional>

namespace towers::daemon {

namespace {

// Each reader checks one value and stores it; its error says what was expected, and load_config puts
// "file: section.key: " before it.
using Reader = std::function<Status(const toml::node& value, Config& cfg)>;

Status expected(const std::string& what) { return Status::InvalidArgument(what); }

Status read_string(const toml::node& n, std::string& out) {
  if (!n.is_string()) return expected("expected a string");
  out = **n.as_string();
  return Status::Ok();
}

Status read_int(const toml::node& n, int64_t lo, int64_t hi, int64_t& out) {
  if (!n.is_integer()) return expected("expected an integer");
  const int64_t v = **n.as_integer();
  if (v < lo || v > hi) {
    return expected("must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(v));
  }
  out = v;
  return Status::Ok();
}

Status read_size(const toml::node& n, uint64_t& out) {
  if (n.is_integer() && **n.as_integer() >= 0) {
    out = static_cast<uint64_t>(**n.as_integer());
    return Status::Ok();
  }
  if (n.is_string()) {
    if (auto v = parse_size(**n.as_string())) {
      out = *v;
      return Status::Ok();
    }
  }
  return expected("expected a size such as \"4G\", \"512M\" or a byte count");
}

Status read_bool(const toml::node& n, bool& out) {
  if (!n.is_boolean()) return expected("expected true or false");
  out = **n.as_boolean();
  return Status::Ok();
}

// A field of Config (or of a part of it) that a reader writes.
template <class T>
using Field = T& (*)(Config&);

Reader string_key(Field<std::string> field) {
  return [field](const toml::node& n, Config& c) { return read_string(n, field(c)); };
}
template <class T>
Reader int_key(Field<T> field, int64_t lo, int64_t hi) {
  return [field, lo, hi](const toml::node& n, Config& c) {
    int64_t v = 0;
    Status st = read_int(n, lo, hi, v);
    if (st.ok()) field(c) = static_cast<T>(v);
    return st;
  };
}
Reader bool_key(Field<bool> field) {
  return [field](const toml::node& n, Config& c) { return read_bool(n, field(c)); };
}
Reader size_key(Field<uint64_t> field) {
  return [field](const toml::node& n, Config& c) { return read_size(n, field(c)); };
}

Status read_ids(const toml::node& n, std::vector<uint32_t>& out) {
  out.clear();
  if (!n.is_array()) return expected("expected an array of numeric ids");
  for (const auto& e : *n.as_array()) {
    if (!e.is_integer() || **e.as_integer() < 0 || **e.as_integer() > 0xFFFFFFFFll) {
      return expected("expected an array of numeric ids");
    }
    out.push_back(static_cast<uint32_t>(**e.as_integer()));
  }
  return Status::Ok();
}

Status read_strings(const toml::node& n, const std::string& what, std::vector<std::string>& out) {
  out.clear();
  if (!n.is_array()) return expected("expected an array of " + what);
  for (const auto& e : *n.as_array()) {
    if (!e.is_string()) return expected("expected an array of " + what);
    out.push_back(**e.as_string());
  }
  return Status::Ok();
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

Status read_aliases(const toml::node& n, Config& c) {
  if (!n.is_array()) return expected("expected an array of model names");
  c.aliases.clear();
  for (const auto& e : *n.as_array()) {
    if (!e.is_string() || e.as_string()->get().empty() || e.as_string()->get().size() > 256) {
      return expected("entries must be non-empty strings of at most 256 bytes");
    }
    c.aliases.push_back(**e.as_string());
  }
  return Status::Ok();
}

Status read_socket_mode(const toml::node& n, Config& c) {
  std::string mode;
  Status st = read_string(n, mode);
  char* end = nullptr;
  const unsigned long m = st.ok() ? std::strtoul(mode.c_str(), &end, 8) : 0;
  if (!st.ok() || mode.empty() || *end != '\0' || m > 0777) return expected("expected an octal mode such as \"0660\"");
  c.socket_mode = static_cast<unsigned>(m);
  return Status::Ok();
}

Status read_allowed_origins(const toml::node& n, Config& c) {
  if (Status st = read_strings(n, "strings", c.allowed_origins); !st.ok()) return st;
  for (const auto& o : c.allowed_origins) {
    if (!is_origin(o)) return expected("\"" + o + "\" is not an origin such as \"http://localhost:3000\" (scheme://host[:port])");
  }
  return Status::Ok();
}

Status read_tcp_listen(const toml::node& n, Config& c) {
  if (Status st = read_string(n, c.tcp_listen); !st.ok()) return st;
  if (c.tcp_listen.empty()) return Status::Ok();
  auto a = parse_listen_address(c.tcp_listen);
  return a.ok() ? Status::Ok() : expected(a.error());
}

Status read_non_empty(const toml::node& n, std::string& out) {
  if (Status st = read_string(n, out); !st.ok()) return st;
  return out.empty() ? expected("must not be empty") : Status::Ok();
}

Status read_formats(const toml::node& n, Config& c) {
  if (!n.is_array() || n.as_array()->empty()) return expected("expected a non-empty array such as [\"q4\", \"q6\", \"q8\"]");
  c.depth.by_depth.clear();
  for (const auto& e : *n.as_array()) {
    auto q = e.is_string() ? parse_kv_format(**e.as_string()) : std::nullopt;
    if (!q) return expected("each entry must be one of q4, q6, q8, f16, f32");
    c.depth.by_depth.push_back(*q);
  }
  return Status::Ok();
}

// One KV format by name (a segment's; lease tails: read_tail_format).
Status read_kv_format(const toml::node& n, KvQuant& out) {
  std::string name;
  if (Status st = read_string(n, name); !st.ok()) return st;
  auto q = parse_kv_format(name);
  if (!q) return expected("must be one of q4, q6, q8, f16, f32");
  out = *q;
  return Status::Ok();
}

Status read_tail_format(const toml::node& n, Config& c) {
  std::string name;
  if (Status st = read_string(n, name); !st.ok()) return st;
  c.tail_format_auto = name == "auto";
  if (c.tail_format_auto) return Status::Ok();
  auto q = parse_kv_format(name);
  if (q != KvQuant::F32 && q != KvQuant::F16) return expected("must be \"auto\", \"f32\" or \"f16\"");
  c.tail_format = *q;
  return Status::Ok();
}

Status read_pin_levels(const toml::node& n, Config& c) {
  if (!n.is_array()) return expected("expected an array of level names");
  c.pin_levels.clear();
  for (const auto& e : *n.as_array()) {
    auto lv = parse_level(e.is_string() ? std::string(**e.as_string()) : "");
    if (!lv) return expected("entries must be \"platform\", \"community\" or \"bot\"");
    c.pin_levels.push_back(*lv);
  }
  return Status::Ok();
}

Status read_eviction(const toml::node& n, Config& c) {
  std::string name;
  if (Status st = read_string(n, name); !st.ok()) return st;
  auto e = parse_eviction_policy(name);
  if (!e) return expected("expected " + std::string(kEvictionPolicyNames) + ", got \"" + name + "\"");
  c.policy.eviction = *e;
  return Status::Ok();
}

Status read_budget(const toml::node& n, BudgetSetting& out) {
  if (n.is_integer() && **n.as_integer() >= 0) {
    out = BudgetSetting{static_cast<uint64_t>(**n.as_integer()), 0};
    return Status::Ok();
  }
  if (n.is_string()) {
    if (auto b = BudgetSetting::parse(**n.as_string())) {
      out = *b;
      return Status::Ok();
    }
  }
  return expected("expected a size such as \"4G\", a share of the machine such as \"50%\", or \"0\" (none)");
}
Status read_ram_budget(const toml::node& n, Config& c) { return read_budget(n, c.policy.ram_budget); }
Status read_disk_budget(const toml::node& n, Config& c) { return read_budget(n, c.disk_budget); }

Status read_max_body_bytes(const toml::node& n, Config& c) {
  uint64_t body = 0;
  if (Status st = read_size(n, body); !st.ok()) return st;
  if (body < 1024 || body > (1ull << 30)) return expected("must be between 1K and 1G");
  c.max_body_bytes = body;
  return Status::Ok();
}

Status read_overflow(const toml::node& n, Config& c) {
  std::string overflow;
  if (Status st = read_string(n, overflow); !st.ok()) return st;
  if (overflow != "truncate" && overflow != "error") {
    return expected("expected \"truncate\" or \"error\", got \"" + overflow + "\"");
  }
  c.overflow_truncate = overflow == "truncate";
  return Status::Ok();
}

Status read_request_timeout(const toml::node& n, Config& c) {
  if (!n.is_number() || n.value<double>().value_or(0) <= 0) return expected("expected a positive number");
  c.request_timeout_s = n.value<double>().value_or(300);
  return Status::Ok();
}

Status read_decode_slowdown(const toml::node& n, Config& c) {
  const double v = n.value<double>().value_or(0);
  if (!n.is_number() || v < 1 || v > 100) return expected("expected a number from 1 to 100");
  c.decode_slowdown = v;
  return Status::Ok();
}

#define TOWERS_FIELD(expr) +[](Config& c) -> auto& { return c.expr; }

struct Key {
  std::string_view section, name;
  Reader read;
};

// Every key of etc/towerd.toml, each spelled once.
const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      {"model", "path", string_key(TOWERS_FIELD(model_path))},
      {"model", "threads", int_key<int>(TOWERS_FIELD(threads), 0, 1024)},
      {"model", "chat_template", string_key(TOWERS_FIELD(chat_template))},
      {"model", "aliases", read_aliases},
      {"model", "onednn_prefill", bool_key(TOWERS_FIELD(onednn_prefill))},
      {"model", "int8_attention", bool_key(TOWERS_FIELD(int8_attention))},
      {"model", "tail_format", read_tail_format},
      {"server", "socket", [](const toml::node& n, Config& c) { return read_non_empty(n, c.socket_path); }},
      {"server", "socket_group", string_key(TOWERS_FIELD(socket_group))},
      {"server", "socket_mode", read_socket_mode},
      {"server", "tcp_listen", read_tcp_listen},
      {"server", "allowed_uids", [](const toml::node& n, Config& c) { return read_ids(n, c.allowed_uids); }},
      {"server", "allowed_gids", [](const toml::node& n, Config& c) { return read_ids(n, c.allowed_gids); }},
      {"server", "allowed_origins", read_allowed_origins},
      {"server", "api_key_file", string_key(TOWERS_FIELD(api_key_file))},
      {"server", "io_threads", int_key<int>(TOWERS_FIELD(io_threads), 1, 64)},
      {"server", "max_connections", int_key<int>(TOWERS_FIELD(max_connections), 1, 100000)},
      {"server", "max_connections_per_uid", int_key<int>(TOWERS_FIELD(max_connections_per_uid), 1, 100000)},
      {"server", "header_timeout_seconds", int_key<int>(TOWERS_FIELD(header_timeout_s), 1, 3600)},
      {"server", "body_timeout_seconds", int_key<int>(TOWERS_FIELD(body_timeout_s), 1, 3600)},
      {"server", "idle_timeout_seconds", int_key<int>(TOWERS_FIELD(idle_timeout_s), 1, 86400)},
      {"state", "dir",
       [](const toml::node& n, Config& c) {
         std::string dir;
         Status st = read_non_empty(n, dir);
         if (st.ok()) c.state_dir = dir;
         return st;
       }},
      {"state", "compact_bytes", size_key(TOWERS_FIELD(compact_bytes))},
      {"state", "warm_tier", bool_key(TOWERS_FIELD(warm_tier))},
      {"state", "disk_budget", read_disk_budget},
      {"state", "uring_writes", bool_key(TOWERS_FIELD(uring_writes))},
      {"pool", "formats", read_formats},
      {"pool", "transcript_format",
       [](const toml::node& n, Config& c) { return read_kv_format(n, c.depth.transcript); }},
      {"pool", "pin_fan_out", int_key<size_t>(TOWERS_FIELD(pin_fan_out), 1, 1 << 30)},
      {"pool", "pin_levels", read_pin_levels},
      {"cold", "enabled", bool_key(TOWERS_FIELD(cold_enabled))},
      {"cold", "idle_seconds", int_key<int>(TOWERS_FIELD(cold_idle_seconds), 0, 365 * 86400)},
      {"cold", "scan_seconds", int_key<int>(TOWERS_FIELD(cold_scan_seconds), 1, 86400)},
      {"cold", "chunk", int_key<int>(TOWERS_FIELD(cold_chunk), 0, 1 << 20)},
      {"cold", "coder", string_key(TOWERS_FIELD(cold_coder))},
      {"modular", "enabled", bool_key(TOWERS_FIELD(modular.enabled))},
      {"modular", "repair_tokens", int_key<int>(TOWERS_FIELD(modular.repair_tokens), kMinRepairTokens, 1 << 16)},
      {"modular", "background_exact", bool_key(TOWERS_FIELD(modular.background_exact))},
      {"policy", "eviction", read_eviction},
      {"policy", "ram_budget", read_ram_budget},
      {"limits", "max_body_bytes", read_max_body_bytes},
      {"limits", "max_prompt_tokens", int_key<int>(TOWERS_FIELD(max_prompt_tokens), 0, 1 << 24)},
      {"limits", "overflow", read_overflow},
      {"limits", "max_tokens", int_key<int>(TOWERS_FIELD(max_tokens), 1, 1 << 24)},
      {"limits", "default_max_tokens", int_key<int>(TOWERS_FIELD(default_max_tokens), 1, 1 << 24)},
      {"limits", "request_timeout_seconds", read_request_timeout},
      {"limits", "queue_length", int_key<int>(TOWERS_FIELD(queue_length), 1, 1 << 20)},
      {"limits", "max_sessions", int_key<int>(TOWERS_FIELD(max_sessions), 1, 1 << 30)},
      {"limits", "max_segment_chars", int_key<int>(TOWERS_FIELD(max_segment_chars), 1, 64 << 20)},
      {"limits", "max_batch", int_key<int>(TOWERS_FIELD(max_batch), 1, 1024)},
      {"limits", "prefill_chunk", int_key<int>(TOWERS_FIELD(prefill_chunk), 1, 1 << 16)},
      {"limits", "decode_slowdown", read_decode_slowdown},
      {"limits", "prompt_cache_segments", int_key<int>(TOWERS_FIELD(prompt_cache_segments), 0, 1 << 20)},
  };
  return k;
}

#undef TOWERS_FIELD

const Key* find_key(std::string_view section, std::string_view name) {
  for (const Key& k : keys()) {
    if (k.section == section && k.name == name) return &k;
  }
  return nullptr;
}

bool known_section(std::string_view section) {
  return std::any_of(keys().begin(), keys().end(), [&](const Key& k) { return k.section == section; });
}

// Reads the sections of the file that `wanted` accepts ("" = all) over `cfg`. An unknown section or
// key, or a bad value, is an error naming the file and the key.
Status read_file(const std::filesystem::path& path, std::string_view wanted, Config& cfg) {
  toml::table root;
  try {
    root = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    return Status::InvalidArgument(path.string() + ":" + std::to_string(src.begin.line) + ":" +
                                   std::to_string(src.begin.column) + ": " + std::string(e.description()));
  }
  auto fail = [&](std::string_view key, const std::string& message) {
    return Status::InvalidArgument(path.string() + ": " + std::string(key) + ": " + message);
  };
  for (const auto& [section_key, section] : root) {
    const std::string_view name = section_key.str();
    if (!wanted.empty() && name != wanted) continue;
    if (!known_section(name)) return fail(name, "unknown key");
    if (!section.is_table()) return fail(name, "expected a [section]");
    for (const auto& [key, value] : *section.as_table()) {
      const std::string dotted = std::string(name) + "." + std::string(key.str());
      const Key* k = find_key(name, key.str());
      if (!k) return fail(dotted, "unknown key");
      if (Status st = k->read(value, cfg); !st.ok()) return fail(dotted, st.message());
    }
  }
  return Status::Ok();
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
  Config cfg;
  if (Status st = read_file(path, "policy", cfg); !st.ok()) return st;
  return cfg.policy;
}

Status load_config(const std::filesystem::path& path, Config* config) {
  Config cfg;
  cfg.source = path;
  if (Status st = read_file(path, "", cfg); !st.ok()) return st;
  *config = std::move(cfg);
  return Status::Ok();
}

std::vector<std::string> config_keys() {
  std::vector<std::string> names;
  for (const Key& k : keys()) names.push_back(std::string(k.section) + "." + std::string(k.name));
  return names;
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

KvQuant auto_tail_format(const ModelConfig& model) {
  return kv_bytes_per_token(model, KvQuant::F32) >= kAutoF16TailBytes ? KvQuant::F16 : KvQuant::F32;
}

void resolve_for_model(Config& c, const ModelConfig& model) {
  if (c.tail_format_auto) c.tail_format = auto_tail_format(model);
}

}  // namespace towers::daemon
