#include "cli/table.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace towers::cli {

Table::Table(std::vector<std::string> headers) {
  for (auto& h : headers) {
    const bool right = !h.empty() && h[0] == '>';
    right_.push_back(right);
    headers_.push_back(right ? h.substr(1) : h);
  }
}

void Table::row(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::str() const {
  std::vector<size_t> w(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    w[c] = display_width(headers_[c]);
    for (const auto& r : rows_) w[c] = std::max(w[c], display_width(r[c]));
  }
  std::string out;
  auto emit = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(w[c] - display_width(cells[c]), ' ');
      if (c) line += "  ";
      line += right_[c] ? pad + cells[c] : cells[c] + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  emit(headers_);
  for (const auto& r : rows_) emit(r);
  return out;
}

size_t display_width(const std::string& s) {
  size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}

bool unicode_output() {
  static const bool yes = [] {
    const char* ascii = std::getenv("TOWERCTL_ASCII");
    if (ascii && *ascii && std::strcmp(ascii, "0") != 0) return false;
    for (const char* var : {"LC_ALL", "LC_CTYPE", "LANG"}) {
      const char* v = std::getenv(var);
      if (v && *v) {
        std::string s(v);
        std::transform(s.begin(), s.end(), s.begin(), ::tolower);
        return s.find("utf-8") != std::string::npos || s.find("utf8") != std::string::npos;
      }
    }
    return false;
  }();
  return yes;
}

std::string bar(double fraction, int width) {
  if (!(fraction > 0)) return "";
  fraction = std::min(fraction, 1.0);
  if (!unicode_output()) {
    int n = static_cast<int>(std::lround(fraction * width));
    return std::string(std::max(n, 1), '#');
  }
  static const char* eighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  int total = std::max(1, static_cast<int>(std::lround(fraction * width * 8)));
  std::string out;
  for (int i = 0; i < total / 8; ++i) out += "█";
  out += eighths[total % 8];
  return out;
}

std::string format_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

std::string format_duration(double seconds) {
  char buf[48];
  const long long s = static_cast<long long>(seconds);
  if (seconds < 10) std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  else if (s < 60) std::snprintf(buf, sizeof buf, "%lld s", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%lld m %02lld s", s / 60, s % 60);
  else if (s < 86400) std::snprintf(buf, sizeof buf, "%lld h %02lld m", s / 3600, s / 60 % 60);
  else std::snprintf(buf, sizeof buf, "%lld d %lld h", s / 86400, s / 3600 % 24);
  return buf;
}

std::string format_ago(int64_t t) {
  if (t <= 0) return "never";
  const double d = std::difftime(std::time(nullptr), static_cast<std::time_t>(t));
  if (d < 1) return "just now";
  if (d < 60) return std::to_string(static_cast<int>(d)) + " s ago";
  return format_duration(d) + " ago";
}

}  // namespace towers::cli
