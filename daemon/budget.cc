#include "daemon/budget.h"

#include <sys/statvfs.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "daemon/config.h"

namespace towers::daemon {

std::optional<BudgetSetting> BudgetSetting::parse(std::string_view text) {
  if (!text.empty() && text.back() == '%') {
    const std::string number(text.substr(0, text.size() - 1));
    char* end = nullptr;
    const double p = number.empty() ? -1 : std::strtod(number.c_str(), &end);
    if (number.empty() || end != number.c_str() + number.size() || !std::isfinite(p) || p <= 0 || p > 100)
      return std::nullopt;
    return share(p);
  }
  auto size = parse_size(text);
  if (!size) return std::nullopt;
  return BudgetSetting{*size, 0};
}

std::string BudgetSetting::text() const {
  if (percent > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g%%", percent);
    return buf;
  }
  return std::to_string(bytes);
}

std::string SizedBudget::text() const { return bytes ? format_size(bytes) + ": " + rule : rule; }

SizedBudget size_budget(const BudgetSetting& setting, uint64_t base, std::string_view base_name) {
  if (setting.percent <= 0) return {setting.bytes, setting.bytes ? "set to " + format_size(setting.bytes) : "none"};
  // A share of nothing (an unreadable /proc/meminfo, say) would be a budget of 0 bytes, which means
  // none: say so rather than evict everything.
  if (base == 0) return {0, "none (" + setting.text() + " of " + std::string(base_name) + ", which could not be read)"};
  const uint64_t bytes = std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(base) * setting.percent / 100.0));
  return {bytes, setting.text() + " of " + std::string(base_name) + " (" + format_size(base) + ")"};
}

SizedBudget size_ram_budget(const BudgetSetting& setting, uint64_t pool_resident) {
  if (setting.percent <= 0) return size_budget(setting, 0, "");
  const uint64_t available = mem_available_bytes();
  if (pool_resident == 0) return size_budget(setting, available, "MemAvailable");
  return size_budget(setting, available ? available + pool_resident : 0, "MemAvailable plus the pool's resident bytes");
}

void BudgetRules::set(std::string ram, std::string disk) {
  std::lock_guard lock(mu_);
  ram_ = std::move(ram);
  disk_ = std::move(disk);
}
void BudgetRules::set_ram(std::string ram) {
  std::lock_guard lock(mu_);
  ram_ = std::move(ram);
}
std::string BudgetRules::ram() const {
  std::lock_guard lock(mu_);
  return ram_;
}
std::string BudgetRules::disk() const {
  std::lock_guard lock(mu_);
  return disk_;
}

uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return static_cast<uint64_t>(kib) << 10;
  }
  return 0;
}

uint64_t free_disk_bytes(const std::filesystem::path& dir) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return 0;
  return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
}

uint64_t file_bytes_under(const std::filesystem::path& dir) {
  std::error_code ec;
  uint64_t total = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != std::filesystem::end(it);
       it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const uint64_t size = it->file_size(size_ec);
      if (!size_ec) total += size;
    }
  }
  return total;
}

}  // namespace towers::daemon
