// The page at GET /: the towers of segments, the pool against its budget, a chat box
// (daemon/ui/index.html, embedded at build time: no files beside the binary, no CDN, no toolchain).
#pragma once
#include <string_view>

namespace towers::daemon {

std::string_view ui_page_html();

}  // namespace towers::daemon
