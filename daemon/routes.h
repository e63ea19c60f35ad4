// The API's routes as metrics name them: a request's path becomes its route pattern
// ("/v1/sessions/{id}/messages"), a path no route matches becomes "other", and a method outside
// the ones the API uses becomes "other", so no caller can add label series.
#pragma once
#include <string_view>

namespace towers::daemon {

std::string_view route_label(std::string_view path);
std::string_view method_label(std::string_view method);

}  // namespace towers::daemon
