// The API's JSON form of the catalog's views (GET /v1/segments/{name}, /v1/sessions/{id}, lists),
// shared by the daemon and towerctl's offline verbs so both print the same fields.
#pragma once
#include <nlohmann/json.hpp>

#include "daemon/catalog.h"

namespace towers::daemon {

nlohmann::json segment_json(const SegmentView& s);
nlohmann::json session_json(const SessionView& s);
// {"object":"list","data":[...]}
nlohmann::json segments_json(const std::vector<SegmentView>& list);
nlohmann::json sessions_json(const std::vector<SessionView>& list);

}  // namespace towers::daemon
