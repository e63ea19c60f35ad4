#include "mmapstore/eviction.h"

#include <algorithm>

namespace towers {

std::string_view to_string(EvictionPolicy p) {
  switch (p) {
    case EvictionPolicy::Lru: return "lru";
    case EvictionPolicy::Lindy: return "lindy";
    case EvictionPolicy::TokenLru: return "token-lru";
  }
  return "?";
}

std::optional<EvictionPolicy> parse_eviction_policy(std::string_view s) {
  for (EvictionPolicy p : {EvictionPolicy::Lru, EvictionPolicy::Lindy, EvictionPolicy::TokenLru}) {
    if (s == to_string(p)) return p;
  }
  return std::nullopt;
}


bool evictable(const EvictionCandidate& c, const EvictionRules& rules) {
  if (c.pinned || c.leases > 0 || c.depth < rules.pinned_levels) return false;
  if (rules.pin_fan_out > 0 && c.fan_out >= rules.pin_fan_out) return false;
  return !(rules.leaves_only && c.has_children);
}

namespace {

double seconds(EvictionClock::duration d) { return std::chrono::duration<double>(d).count(); }

// Higher leaves earlier.
double leave_score(const EvictionCandidate& c, const EvictionRules& rules) {
  const double idle = std::max(0.0, seconds(rules.now - c.last_used));
  switch (rules.policy) {
    case EvictionPolicy::Lru: return idle;
    case EvictionPolicy::TokenLru: return idle * static_cast<double>(std::max<int64_t>(c.tokens, 1));
    case EvictionPolicy::Lindy: {
      const bool own = c.lineage == 0;
      const double uses = static_cast<double>(std::max<uint64_t>(own ? c.uses : c.lineage_uses, 1));
      const double age =
          std::max(0.0, seconds(c.last_used - (own ? c.created : c.lineage_born))) + seconds(rules.lindy_prior_age);
      const double alive = age + idle > 0 ? age / (age + idle) : 1.0;
      return -uses * alive;
    }
  }
  return 0;
}

// The evictable candidates, first to leave first.
std::vector<const EvictionCandidate*> ranked(std::span<const EvictionCandidate> candidates, const EvictionRules& rules) {
  std::vector<std::pair<double, const EvictionCandidate*>> scored;
  for (const EvictionCandidate& c : candidates) {
    if (evictable(c, rules)) scored.emplace_back(leave_score(c, rules), &c);
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    if (a.second->bytes != b.second->bytes) return a.second->bytes > b.second->bytes;
    return a.second->id < b.second->id;
  });
  std::vector<const EvictionCandidate*> out;
  out.reserve(scored.size());
  for (const auto& s : scored) out.push_back(s.second);
  return out;
}

}  // namespace

std::vector<SegmentId> eviction_order(std::span<const EvictionCandidate> candidates, const EvictionRules& rules) {
  std::vector<SegmentId> order;
  for (const EvictionCandidate* c : ranked(candidates, rules)) order.push_back(c->id);
  return order;
}

std::vector<SegmentId> choose_victims(std::span<const EvictionCandidate> candidates, const EvictionRules& rules,
                                      size_t bytes_to_free) {
  std::vector<SegmentId> victims;
  size_t freed = 0;
  for (const EvictionCandidate* c : ranked(candidates, rules)) {
    if (freed >= bytes_to_free) break;
    victims.push_back(c->id);
    freed += c->bytes;
  }
  return victims;
}

}  // namespace towers
