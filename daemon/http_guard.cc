#include "daemon/http_guard.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <fstream>

namespace towers::daemon {

namespace {

// Group lists change rarely (usermod -aG); a few seconds of caching keeps NSS off the accept path
// of a busy client without making a change wait long.
constexpr auto kGroupCacheFor = std::chrono::seconds(5);

bool contains(const std::vector<uint32_t>& v, uint32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// Compares without an early exit, so the time taken does not tell how much of the key matched.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace

PeerPolicy::PeerPolicy(std::vector<uint32_t> allowed_uids, std::vector<uint32_t> allowed_gids, int socket_gid)
    : self_uid_(::getuid()), uids_(std::move(allowed_uids)), gids_(std::move(allowed_gids)) {
  gids_.push_back(socket_gid >= 0 ? static_cast<uint32_t>(socket_gid) : ::getegid());
}

std::vector<uint32_t> PeerPolicy::groups_of(uint32_t uid, uint32_t gid) {
  std::vector<char> buf(16384);
  passwd pw{}, *found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || !found) return {gid};
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    int n = static_cast<int>(groups.size());
    if (::getgrouplist(pw.pw_name, gid, groups.data(), &n) >= 0) {
      std::vector<uint32_t> out{gid};
      for (int i = 0; i < n; ++i) {
        if (groups[i] != gid) out.push_back(groups[i]);
      }
      return out;
    }
    groups.resize(static_cast<size_t>(std::max(n, static_cast<int>(groups.size()) * 2)));
  }
  return {gid};
}

bool PeerPolicy::allowed(uint32_t uid, uint32_t gid) {
  if (uid == 0 || uid == self_uid_ || contains(uids_, uid)) return true;
  if (contains(gids_, gid)) return true;
  const auto now = std::chrono::steady_clock::now();
  std::vector<uint32_t> groups;
  {
    std::lock_guard lock(mu_);
    auto it = cache_.find(uid);
    if (it != cache_.end() && it->second.until > now && it->second.gid == gid) groups = it->second.groups;
  }
  if (groups.empty()) {
    groups = groups_of(uid, gid);
    std::lock_guard lock(mu_);
    if (cache_.size() > 4096) cache_.clear();  // bounded: uids are few on one machine
    cache_[uid] = {now + kGroupCacheFor, gid, groups};
  }
  return std::any_of(groups.begin(), groups.end(), [&](uint32_t g) { return contains(gids_, g); });
}

bool is_loopback_host(std::string_view host) {
  host = trim(host);
  if (host.empty()) return false;
  std::string_view name = host;
  if (host.front() == '[') {  // [v6]:port
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    name = host.substr(1, close - 1);
    std::string_view rest = host.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return false;
  } else if (const size_t colon = host.find(':'); colon != std::string_view::npos) {
    name = host.substr(0, colon);
  }
  if (iequals(name, "localhost")) return true;
  boost::system::error_code ec;
  const auto addr = boost::asio::ip::make_address(std::string(name), ec);
  return !ec && addr.is_loopback();
}

bool origin_allowed(std::string_view origin, const std::vector<std::string>& allowed_origins) {
  return std::find(allowed_origins.begin(), allowed_origins.end(), trim(origin)) != allowed_origins.end();
}

HeaderList cors_reply_headers(std::string_view origin) {
  return {{"Access-Control-Allow-Origin", std::string(trim(origin))}, {"Vary", "Origin"}};
}

HeaderList cors_preflight_headers(std::string_view origin, std::string_view requested_headers) {
  HeaderList h = cors_reply_headers(origin);
  h.emplace_back("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS");
  const std::string_view asked = trim(requested_headers);
  h.emplace_back("Access-Control-Allow-Headers", asked.empty() ? "authorization, content-type" : std::string(asked));
  h.emplace_back("Access-Control-Max-Age", "600");
  return h;
}

ApiStatus check_tcp_request(const TcpRequestView& r, const std::vector<std::string>& allowed_origins,
                            std::string_view api_key) {
  if (!is_loopback_host(r.host)) {
    return ApiStatus(Status::PermissionDenied("Host \"" + std::string(r.host.substr(0, 100)) +
                                              "\" is not a loopback name; towerd's TCP listener answers only "
                                              "requests for localhost"),
                     "", "host_not_allowed");
  }
  if (!r.origin.empty() && !origin_allowed(r.origin, allowed_origins)) {
    return ApiStatus(Status::PermissionDenied("Origin \"" + std::string(r.origin.substr(0, 100)) +
                                              "\" is not allowed (server.allowed_origins); requests from web "
                                              "pages are refused"),
                     "", "origin_not_allowed");
  }
  if (!api_key.empty()) {
    std::string_view auth = trim(r.authorization);
    const bool bearer = auth.size() > 7 && iequals(auth.substr(0, 7), "Bearer ");
    if (!bearer || !same_secret(trim(auth.substr(7)), api_key)) {
      return ApiStatus(Status::PermissionDenied("this TCP listener needs \"Authorization: Bearer <key>\" with the "
                                                "key of server.api_key_file"),
                       "", "invalid_api_key");
    }
  }
  const bool writes = r.method == "POST" || r.method == "PUT" || r.method == "PATCH";
  if (writes && r.has_body) {
    std::string_view media = trim(r.content_type.substr(0, r.content_type.find(';')));
    if (!iequals(media, "application/json")) {
      return ApiStatus(Status::InvalidArgument("request bodies must be sent as Content-Type: application/json, got \"" +
                                               std::string(r.content_type.substr(0, 100)) + "\""),
                       "", "unsupported_media_type");
    }
  }
  return {};
}

Result<std::string> load_api_key(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::InvalidArgument(path.string() + ": " + std::strerror(errno));
  if (st.st_mode & S_IROTH) {
    return Status::PermissionDenied(path.string() + " is readable by every user; chmod o-r it (a key others can read protects nothing)");
  }
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return Status::InvalidArgument(path.string() + ": cannot read the key");
  std::string key(trim(line));
  if (key.size() < 16) return Status::InvalidArgument(path.string() + ": the key must be at least 16 characters");
  return key;
}

}  // namespace towers::daemon
