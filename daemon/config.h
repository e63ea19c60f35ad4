// towerd's configuration: every key of etc/towerd.toml, its default and its checks (config.cc reads
// the file through one table of keys, each spelled once). The file is strict: an unknown key, a wrong
// type or an out-of-range value is an error that names the key.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "daemon/budget.h"
#include "daemon/level.h"
#include "engine/model/segment.h"
#include "engine/base/status.h"
#include "mmapstore/segment_pool.h"

namespace towers::daemon {

struct PolicyConfig {                // [policy]: the part SIGHUP reloads
  EvictionPolicy eviction = EvictionPolicy::Lru;
  // Resident segment KV and request tails; a share is of MemAvailable once the model is loaded.
  BudgetSetting ram_budget = BudgetSetting::share(50);
};

// The fewest repaired tokens a modular placement may use: below it top-1 agreement with exact
// recomputation falls under 98 % on the models measured (docs/towers.md, "Edited parents").
inline constexpr int kMinRepairTokens = 16;

// [model] tail_format = "auto": f16 tails where an f32 tail would cost at least this much a token
// (8B-class models and up: a 32k prompt would take 8 GiB in f32), f32 below it, where RAM is not what
// limits a prompt and f32 stays the exact path (docs/numerics.md, "Lease tails").
inline constexpr size_t kAutoF16TailBytes = 128 << 10;

struct Config {
  // [model]
  std::string model_path;
  int threads = 0;                   // 0 = all cores
  std::string chat_template;         // "" = detected from the model
  std::vector<std::string> aliases;  // other names a request's "model" may give (besides the file's)
  bool onednn_prefill = false;       // steps of >= Forward::onednn_min_tokens_for tokens through oneDNN
  bool int8_attention = true;        // and their attention in int8 (Forward::set_int8_attention)
  // Lease tails (a request's KV before it is sealed): f32 or f16. With tail_format_auto (the default,
  // "auto") open_state picks once the model is loaded (resolve_for_model).
  KvQuant tail_format = KvQuant::F32;
  bool tail_format_auto = true;
  // [server]
  std::string socket_path = "/run/towerd/towerd.sock";
  std::string socket_group;          // "" = the daemon's group
  unsigned socket_mode = 0660;
  std::string tcp_listen;            // "host:port" on loopback, "" = off (parse_listen_address)
  std::vector<uint32_t> allowed_uids, allowed_gids;  // besides the socket group's members
  std::vector<std::string> allowed_origins;          // TCP: Origin headers accepted
  std::string api_key_file;          // TCP: bearer token required when set
  int io_threads = 2;                // threads running every connection
  int max_connections = 256;
  int max_connections_per_uid = 64;  // all TCP peers together count as one uid
  int header_timeout_s = 10;         // a request header must arrive whole within this
  int body_timeout_s = 30;           // and its body within this after the header
  int idle_timeout_s = 60;           // an idle keep-alive connection closes after this
  // [state]
  std::filesystem::path state_dir = "/var/lib/towerd";
  uint64_t compact_bytes = 64ull << 20;  // compact the log beyond this size when half of it is dead
  bool warm_tier = true;             // keep segments in files under <state_dir>/segments (the store)
  // Segment files; beyond it the least recently used go cold. A share is of the state file system's
  // free space plus the segment files already there (so that a restart does not shrink it).
  BudgetSetting disk_budget = BudgetSetting::share(50);
  bool uring_writes = true;          // segment files written in io_uring batches (docs/store.md, "io_uring")
  // [pool]
  DepthPolicy depth;
  size_t pin_fan_out = 8;
  std::vector<Level> pin_levels = {Level::Platform, Level::Community};
  // [cold]
  bool cold_enabled = true;          // background compressor: idle segments -> arithmetic-coded tokens
  int cold_idle_seconds = 600;       // the youngest a segment may go cold at (over the disk budget; with
                                     // no disk budget, unused this long -> cold)
  int cold_scan_seconds = 30;        // how often the compressor looks
  int cold_chunk = 256;              // tokens per independently decodable chunk of a coded segment
  std::string cold_coder;            // GGUF of a smaller model of the same vocabulary that codes; "" = the serving model
  // [modular]: an edit of a segment with children places them on the new text modularly
  // (docs/towers.md, "Modular towers in the daemon")
  struct Modular {
    bool enabled = true;             // false: an edit recomputes the subtree on next use
    int repair_tokens = 16;          // first tokens of each placed segment prefilled in the new context
    bool background_exact = true;    // then recompute each exactly in the background and swap it in
  } modular;
  // [policy]
  PolicyConfig policy;
  // [limits]
  size_t max_body_bytes = 1 << 20;
  int max_prompt_tokens = 0;         // 0 = the model's context
  bool overflow_truncate = true;     // a session past the context drops its oldest turns ("truncate")
                                     // instead of refusing the message ("error")
  int max_tokens = 2048;             // largest max_tokens a request may ask for
  int default_max_tokens = 256;
  double request_timeout_s = 300;
  int queue_length = 64;
  int max_sessions = 10000;
  int max_segment_chars = 256 * 1024;
  int max_batch = 8;                 // sequences decoded together in one step
  int prefill_chunk = 256;           // prompt tokens evaluated per step (beside the decodes)
  double decode_slowdown = 1.3;     // beside decodes, a step takes at most this many times their time alone
  int prompt_cache_segments = 256;   // sealed prompts of session-less requests kept for reuse

  std::filesystem::path source;      // the file it came from ("" = defaults only)
};

// Reads a TOML file over the defaults into *config (untouched on an error). The error (InvalidArgument)
// names the file, the key and the problem: "towerd.toml: limits.max_batch: must be in [1, 1024], got 0".
Status load_config(const std::filesystem::path& path, Config* config);
// Every key load_config reads, as "section.key" (etc/towerd.toml documents each).
std::vector<std::string> config_keys();
// Only the [policy] section (SIGHUP).
Result<PolicyConfig> load_policy(const std::filesystem::path& path);
// Checks that need every key (e.g. default_max_tokens <= max_tokens) and a model path.
Status validate(const Config& config);

// tcp_listen / --listen: "127.0.0.1:8080", "localhost:8080", "[::1]:8080". Loopback only; the
// port is 1-65535, digits only.
struct ListenAddress {
  std::string host;  // an address: "127.0.0.1", "::1"
  uint16_t port = 0;
};
Result<ListenAddress> parse_listen_address(std::string_view text);

// "2G", "512M", "1.5GiB", "0", "1048576" → bytes.
std::optional<uint64_t> parse_size(std::string_view text);
std::string format_size(uint64_t bytes);  // "1.5 GiB"
std::optional<KvQuant> parse_kv_format(std::string_view name);  // q4 q6 q8 f16 f32

// What [model] tail_format = "auto" takes for a model: f16 where kv_bytes_per_token(f32) >=
// kAutoF16TailBytes, else f32.
KvQuant auto_tail_format(const ModelConfig& model);
// Settles the settings that depend on the model, once it is loaded: tail_format = "auto".
void resolve_for_model(Config& c, const ModelConfig& model);

}  // namespace towers::daemon
