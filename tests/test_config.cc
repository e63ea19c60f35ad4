// towerd's config file (daemon/config.h): the shipped etc/towerd.toml loads and documents every key
// the table reads; each key's bad value, an unknown key and an unknown section are errors naming them;
// an error leaves the caller's Config as it was.
#include <doctest/doctest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <unistd.h>

#include "daemon/config.h"
#include "test_support.h"

using namespace towers;
using namespace towers::daemon;

namespace {

std::filesystem::path write_toml(const std::string& name, const std::string& text) {
  const auto dir = test::temp_dir() / "config";
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("etc/towerd.toml loads, and documents every key the table reads") {
  const std::filesystem::path shipped = std::filesystem::path(TOWERS_SOURCE_DIR) / "etc/towerd.toml";
  Config cfg;
  const Status st = load_config(shipped, &cfg);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(cfg.model_path == "/var/lib/towerd/models/model.gguf");
  CHECK(cfg.socket_mode == 0660);
  CHECK(cfg.max_body_bytes == (1u << 20));
  CHECK(cfg.policy.eviction == EvictionPolicy::Lru);
  std::ifstream in(shipped);
  std::stringstream text;
  text << in.rdbuf();
  std::string section;
  std::set<std::string> documented;
  for (std::string line; std::getline(text, line);) {
    if (line.rfind('[', 0) == 0) section = line.substr(1, line.find(']') - 1);
    else if (const size_t eq = line.find(" = "); eq != std::string::npos && line[0] != '#') {
      documented.insert(section + "." + line.substr(0, line.find_first_of(" =")));
    }
  }
  for (const std::string& key : config_keys()) CHECK_MESSAGE(documented.count(key) == 1, key);
}

TEST_CASE("every key's bad value is an error naming the file and the key, and changes nothing") {
  for (const std::string& key : config_keys()) {
    CAPTURE(key);
    const size_t dot = key.find('.');
    // A table is no key's value.
    const auto path = write_toml("bad.toml", "[" + key.substr(0, dot) + "]\n" + key.substr(dot + 1) + " = { x = 1 }\n");
    Config cfg;
    cfg.max_batch = 3;
    const Status st = load_config(path, &cfg);
    REQUIRE(!st.ok());
    CHECK(st.message().find(path.string() + ": " + key + ": ") == 0);
    CHECK(cfg.max_batch == 3);
  }
}

TEST_CASE("unknown keys and sections are named, values are range-checked") {
  Config cfg;
  Status st = load_config(write_toml("a.toml", "[limits]\nmax_batchs = 2\n"), &cfg);
  CHECK(st.message().find(": limits.max_batchs: unknown key") != std::string::npos);
  st = load_config(write_toml("b.toml", "[limitz]\nmax_batch = 2\n"), &cfg);
  CHECK(st.message().find(": limitz: unknown key") != std::string::npos);
  st = load_config(write_toml("c.toml", "[limits]\nmax_batch = 0\n"), &cfg);
  CHECK(st.message().find(": limits.max_batch: must be in [1, 1024], got 0") != std::string::npos);
  st = load_config(write_toml("d.toml", "limits = 3\n"), &cfg);
  CHECK(st.message().find(": limits: expected a [section]") != std::string::npos);
  REQUIRE(load_config(write_toml("e.toml", "[limits]\nmax_batch = 4\n[policy]\nram_budget = \"2G\"\n"), &cfg).ok());
  CHECK(cfg.max_batch == 4);
  CHECK(cfg.policy.ram_budget.bytes == (2ull << 30));
  CHECK(cfg.policy.ram_budget.percent == 0);
  auto policy = load_policy(write_toml("f.toml", "[policy]\neviction = \"lindy\"\n[limits]\nmax_batch = 4\n"));
  REQUIRE(policy.ok());
  CHECK(policy->eviction == EvictionPolicy::Lindy);
}

TEST_CASE("tail_format: auto (the default) picks f16 for models whose f32 tail is >= 128 KiB a token") {
  Config cfg;
  CHECK(cfg.tail_format_auto);
  ModelConfig small, big;  // Llama-3.2-1B's KV shape (64 KiB a token in f32) and Llama-3.1-8B's (256)
  small.n_layer = 16, small.n_head_kv = 8, small.head_dim = 64;
  big.n_layer = 32, big.n_head_kv = 8, big.head_dim = 128;
  REQUIRE(kv_bytes_per_token(small, KvQuant::F32) == (64u << 10));
  REQUIRE(kv_bytes_per_token(big, KvQuant::F32) == (256u << 10));
  resolve_for_model(cfg, small);
  CHECK(cfg.tail_format == KvQuant::F32);
  resolve_for_model(cfg, big);
  CHECK(cfg.tail_format == KvQuant::F16);
  // An explicit format is kept whatever the model.
  REQUIRE(load_config(write_toml("t1.toml", "[model]\ntail_format = \"f32\"\n"), &cfg).ok());
  CHECK_FALSE(cfg.tail_format_auto);
  resolve_for_model(cfg, big);
  CHECK(cfg.tail_format == KvQuant::F32);
  REQUIRE(load_config(write_toml("t2.toml", "[model]\ntail_format = \"f16\"\n"), &cfg).ok());
  resolve_for_model(cfg, small);
  CHECK(cfg.tail_format == KvQuant::F16);
  REQUIRE(load_config(write_toml("t3.toml", "[model]\ntail_format = \"auto\"\n"), &cfg).ok());
  CHECK(cfg.tail_format_auto);
  const Status st = load_config(write_toml("t4.toml", "[model]\ntail_format = \"q8\"\n"), &cfg);
  CHECK(st.message().find("model.tail_format: must be \"auto\", \"f32\" or \"f16\"") != std::string::npos);
}

TEST_CASE("budgets: a size, none, or a share of the machine, sized with the rule that says how") {
  Config defaults;
  CHECK(defaults.policy.ram_budget.percent == 50);
  CHECK(defaults.disk_budget.percent == 50);
  Config cfg;
  REQUIRE(load_config(write_toml("budget.toml", "[policy]\nram_budget = \"30%\"\n[state]\ndisk_budget = \"0\"\n"), &cfg).ok());
  CHECK(cfg.policy.ram_budget.percent == 30);
  CHECK(cfg.disk_budget.percent == 0);
  CHECK(cfg.disk_budget.bytes == 0);
  for (const char* bad : {"\"0%\"", "\"101%\"", "\"%\"", "\"x%\"", "\"-5%\"", "\"5 %%\"", "-1", "\"lots\""}) {
    const std::string value = bad;
    CAPTURE(value);
    const Status st = load_config(write_toml("bad_budget.toml", "[state]\ndisk_budget = " + value + "\n"), &cfg);
    REQUIRE_FALSE(st.ok());
    CHECK(st.message().find("state.disk_budget: expected a size") != std::string::npos);
  }
  CHECK(BudgetSetting::parse("12.5%")->percent == 12.5);
  CHECK(BudgetSetting::parse("1K")->bytes == 1024);
  CHECK(BudgetSetting::parse("12.5%")->text() == "12.5%");

  const SizedBudget share = size_budget(BudgetSetting::share(25), 1000, "the base");
  CHECK(share.bytes == 250);
  CHECK(share.rule.find("25% of the base") == 0);
  CHECK(size_budget(BudgetSetting{4096, 0}, 1000, "the base").bytes == 4096);
  CHECK(size_budget(BudgetSetting{}, 1000, "the base").rule == "none");
  // A share of a base that could not be read is no budget (0 bytes would evict everything), and says so.
  const SizedBudget unread = size_budget(BudgetSetting::share(50), 0, "MemAvailable");
  CHECK(unread.bytes == 0);
  CHECK(unread.rule.find("could not be read") != std::string::npos);
  // This machine's: a share of MemAvailable is below it, and what the pool holds is added to it.
  const SizedBudget ram = size_ram_budget(BudgetSetting::share(50), 0);
  REQUIRE(ram.bytes > 0);
  CHECK(ram.rule.find("of MemAvailable") != std::string::npos);
  const SizedBudget held = size_ram_budget(BudgetSetting::share(50), uint64_t{64} << 30);
  CHECK(held.bytes > (uint64_t{32} << 30) - 1);
  CHECK(free_disk_bytes(std::filesystem::temp_directory_path()) > 0);
  const auto dir = std::filesystem::temp_directory_path() / ("towers_budget_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "sub");
  std::ofstream(dir / "a") << std::string(100, 'a');
  std::ofstream(dir / "sub" / "b") << std::string(23, 'b');
  CHECK(file_bytes_under(dir) == 123);
  CHECK(file_bytes_under(dir / "missing") == 0);
  std::filesystem::remove_all(dir);
}
