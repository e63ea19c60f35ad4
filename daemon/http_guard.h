// Who may talk to towerd, decided before a request runs.
//
// PeerPolicy: a Unix-socket peer (SO_PEERCRED uid and gid, read at accept time) is allowed when it
// is root, the daemon's own uid, one of allowed_uids, or when its primary gid or any supplementary
// group of its uid (getgrouplist, cached a few seconds per uid) is the socket's group or one of
// allowed_gids. The socket's group is in because its members already pass the file mode: what
// the file system lets in, the daemon serves.
//
// check_tcp_request: the loopback TCP listener has no peer credentials, and a web page in a local
// browser can reach it (CSRF, DNS rebinding). So a TCP request must name a loopback Host, carry no
// Origin unless it is in allowed_origins, send POST/PUT/PATCH bodies as application/json, and,
// when an API key is set, carry "Authorization: Bearer KEY". A CORS preflight from an allowed
// origin is answered before the key is asked for (browsers send none with it).
#pragma once
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/api_error.h"
#include "engine/base/status.h"

namespace towers::daemon {

class PeerPolicy {
 public:
  // socket_gid: the group that owns the socket file (-1: the daemon's effective gid).
  PeerPolicy(std::vector<uint32_t> allowed_uids, std::vector<uint32_t> allowed_gids, int socket_gid);
  bool allowed(uint32_t uid, uint32_t gid);
  // The groups of uid (primary gid first); just {gid} when the uid has no passwd entry.
  static std::vector<uint32_t> groups_of(uint32_t uid, uint32_t gid);

 private:
  struct Cached {
    std::chrono::steady_clock::time_point until;
    uint32_t gid;
    std::vector<uint32_t> groups;
  };
  uint32_t self_uid_;
  std::vector<uint32_t> uids_, gids_;  // gids_ includes the socket's group
  std::mutex mu_;
  std::map<uint32_t, Cached> cache_;
};

// What a TCP request shows before its body is read.
struct TcpRequestView {
  std::string_view method, host, origin, authorization, content_type;
  bool has_body = false;
};
// Ok, or why the request is refused (403 permission_denied, 401 invalid_api_key, 415
// unsupported_media_type: daemon/api_error.h).
ApiStatus check_tcp_request(const TcpRequestView& r, const std::vector<std::string>& allowed_origins,
                            std::string_view api_key);

// "localhost", "127.0.0.1", "[::1]", with or without a port.
bool is_loopback_host(std::string_view host_header);

// CORS on the TCP listener, for a web page on an allowed origin: its requests' replies carry
// Access-Control-Allow-Origin (and Vary: Origin), and its preflights (OPTIONS with
// Access-Control-Request-Method) are answered 204 with the methods and headers towerd takes. A
// request from another origin is refused (403 origin_not_allowed) before it runs, preflight or not.
using HeaderList = std::vector<std::pair<std::string, std::string>>;
bool origin_allowed(std::string_view origin, const std::vector<std::string>& allowed_origins);
HeaderList cors_reply_headers(std::string_view origin);
// requested_headers: the preflight's Access-Control-Request-Headers (allowed as asked: towerd reads
// only the headers it knows).
HeaderList cors_preflight_headers(std::string_view origin, std::string_view requested_headers);

// The API key: the file's first line, trimmed; an error if it is missing, empty, or readable by
// other users.
Result<std::string> load_api_key(const std::filesystem::path& path);

}  // namespace towers::daemon
