// Readable output for the client verbs: aligned text tables, proportional bars (Unicode blocks on a
// UTF-8 locale, '#' otherwise or with TOWERCTL_ASCII=1), byte sizes and durations.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace towers::cli {

class Table {
 public:
  // Column headers; a header starting with '>' is right-aligned (the '>' is not printed).
  explicit Table(std::vector<std::string> headers);
  void row(std::vector<std::string> cells);
  std::string str() const;  // header, rows; two spaces between columns, no trailing blanks
  size_t rows() const { return rows_.size(); }

 private:
  std::vector<std::string> headers_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

bool unicode_output();
std::string bar(double fraction, int width);       // fraction of width cells, 0..1
std::string format_bytes(uint64_t bytes);          // "0 B", "512 B", "4.0 KiB", "1.25 GiB"
std::string format_duration(double seconds);       // "45 s", "3 m 07 s", "2 h 05 m", "3 d 4 h"
std::string format_ago(int64_t unix_seconds);      // "12 s ago", "never" for 0
size_t display_width(const std::string& utf8);     // code points (the tables hold no wide characters)

}  // namespace towers::cli
