// towerd's config file (daemon/config.h): the shipped etc/towerd.toml loads and documents every key
// the table reads; each key's bad value, an unknown key and an unknown section are errors naming them;
// an error leaves the caller's Config as it was.
#include <doctest/doctest.h>

#include <fstream>
#include <set>
#include <sstream>

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
  CHECK(cfg.policy.ram_budget_bytes == (2ull << 30));
  auto policy = load_policy(write_toml("f.toml", "[policy]\neviction = \"lindy\"\n[limits]\nmax_batch = 4\n"));
  REQUIRE(policy.ok());
  CHECK(policy->eviction == EvictionPolicy::Lindy);
}
