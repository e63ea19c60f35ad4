// The pool's budgets as the operator writes them, and how they become bytes: a size ("4G"), "0"
// (none), or a share of what this machine has ("50%": of MemAvailable for the RAM budget, of the state
// file system's free space for the disk budget). A share is sized when towerd starts (the RAM budget
// again when SIGHUP or PUT /v1/policy sets it), so the defaults fit the machine they run on.
#pragma once
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace towers::daemon {

struct BudgetSetting {
  uint64_t bytes = 0;   // a size (percent 0); 0 = no budget
  double percent = 0;   // > 0: this share of what the machine has, in (0, 100]

  static BudgetSetting share(double percent) { return {0, percent}; }
  // "4G", "512M", "123" (bytes), "0", "50%"; nullopt for anything else.
  static std::optional<BudgetSetting> parse(std::string_view text);
  std::string text() const;  // as parse() reads it
};

// A budget in bytes and how it was reached, for the log, /v1/pool and /v1/policy.
struct SizedBudget {
  uint64_t bytes = 0;  // 0 = none
  std::string rule;    // "50% of MemAvailable (20.1 GiB)", "set to 4.0 GiB", "none"
  std::string text() const;  // for the log: "10.0 GiB: 50% of MemAvailable (20.1 GiB)", or the rule alone
};

// `base` is what a share is of, named by `base_name` in the rule.
SizedBudget size_budget(const BudgetSetting& setting, uint64_t base, std::string_view base_name);

// The RAM budget: a share is of MemAvailable plus `pool_resident`, what the pool already holds (0 at
// start; when the policy is set again, the pool's own pages are the budget's to use too).
SizedBudget size_ram_budget(const BudgetSetting& setting, uint64_t pool_resident);

// How the budgets in force were sized, for /v1/pool and /v1/policy (SIGHUP and PUT /v1/policy change
// the RAM one from other threads).
class BudgetRules {
 public:
  void set(std::string ram, std::string disk);
  void set_ram(std::string ram);
  std::string ram() const;
  std::string disk() const;

 private:
  mutable std::mutex mu_;
  std::string ram_ = "none", disk_ = "none";
};

uint64_t mem_available_bytes();                                   // /proc/meminfo; 0 when unreadable
uint64_t free_disk_bytes(const std::filesystem::path& dir);       // statvfs, for unprivileged use; 0 on error
uint64_t file_bytes_under(const std::filesystem::path& dir);      // regular files, recursively; 0 on error

}  // namespace towers::daemon
