// The levels of the segment hierarchy, top first: a platform's segments come before its communities',
// a community's before its bots'. Spelled "platform", "community", "bot" in the API, the config and
// the state log.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace towers::daemon {

enum class Level : uint8_t { Platform = 0, Community = 1, Bot = 2 };
inline constexpr Level kLevels[] = {Level::Platform, Level::Community, Level::Bot};

inline std::string_view to_string(Level level) {
  switch (level) {
    case Level::Platform: return "platform";
    case Level::Community: return "community";
    case Level::Bot: return "bot";
  }
  return "?";
}

inline std::optional<Level> parse_level(std::string_view text) {
  for (Level l : kLevels) {
    if (to_string(l) == text) return l;
  }
  return std::nullopt;
}

}  // namespace towers::daemon
