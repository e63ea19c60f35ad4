#include "cli/segment_library.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <toml++/toml.h>

#include "cli/http_client.h"

namespace towers::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read_text_file(const std::string& path) {
  std::ostringstream s;
  if (path == "-") {
    s << std::cin.rdbuf();
    return s.str();
  }
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw ClientError(path + " is a directory, not a text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ClientError("cannot read " + path + ": " + std::strerror(errno));
  s << in.rdbuf();
  return s.str();
}

namespace {

std::string lower_ext(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), ::tolower);
  return e;
}

json parse_toml_as_json(const std::string& path) {
  try {
    toml::table t = toml::parse_file(path);
    std::ostringstream s;
    s << toml::json_formatter{t};
    return json::parse(s.str());
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw ClientError(path + ":" + std::to_string(where.line) + ":" + std::to_string(where.column) + ": " +
                      std::string(e.description()));
  }
}

std::string field(const json& s, const char* k, const std::string& where, bool required) {
  if (!s.contains(k) || s[k].is_null()) {
    if (required) throw ClientError(where + ": \"" + k + "\" is missing");
    return "";
  }
  if (!s[k].is_string()) throw ClientError(where + ": \"" + k + "\" must be a string");
  return s[k].get<std::string>();
}

}  // namespace

std::vector<SegmentSpec> load_library_file(const std::string& path) {
  const std::string ext = lower_ext(path);
  json root;
  if (ext == ".toml") {
    root = parse_toml_as_json(path);
  } else if (ext == ".json") {
    try {
      root = json::parse(read_text_file(path));
    } catch (const json::parse_error& e) {
      throw ClientError(path + ": not valid JSON: " + e.what());
    }
  } else {
    throw ClientError(path + ": a library is a .toml or .json file (or use --from-dir DIR)");
  }
  const json* list = &root;
  for (const char* key : {"segment", "segments"}) {
    if (root.is_object() && root.contains(key)) list = &root[key];
  }
  if (!list->is_array()) {
    throw ClientError(path + ": expected a list of segments ([[segment]] tables in TOML, {\"segments\": [...]} in JSON)");
  }
  std::vector<SegmentSpec> out;
  for (size_t i = 0; i < list->size(); ++i) {
    const json& s = (*list)[i];
    const std::string where = path + ": segment " + std::to_string(i + 1);
    if (!s.is_object()) throw ClientError(where + " is not a table/object");
    SegmentSpec spec;
    spec.name = field(s, "name", where, true);
    spec.level = field(s, "level", where + " (" + spec.name + ")", true);
    spec.parent = field(s, "parent", where, false);
    const std::string file = field(s, "file", where, false);
    const bool has_text = s.contains("text");
    if (has_text == !file.empty()) throw ClientError(where + " (" + spec.name + "): give exactly one of \"text\" and \"file\"");
    if (has_text) {
      spec.text = field(s, "text", where, true);
    } else {
      fs::path f(file);
      if (f.is_relative()) f = fs::path(path).parent_path() / f;
      spec.text = read_text_file(f.string());
    }
    spec.source = where;
    out.push_back(std::move(spec));
  }
  if (out.empty()) throw ClientError(path + ": no segments in it");
  return out;
}

std::vector<SegmentSpec> load_library_dir(const std::string& dir) {
  static const char* levels[] = {"platform", "community", "bot"};
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw ClientError(dir + " is not a directory");
  std::vector<SegmentSpec> out;
  std::function<void(const fs::path&, const std::string&, int)> walk = [&](const fs::path& d, const std::string& parent,
                                                                           int depth) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string ext = lower_ext(e.path());
      if (e.is_regular_file() && (ext == ".txt" || ext == ".md")) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      if (depth > 2) throw ClientError(f.string() + ": too deep (platform/community/bot is the deepest hierarchy)");
      SegmentSpec s;
      s.name = f.stem().string();
      s.level = levels[depth];
      s.parent = parent;
      s.text = read_text_file(f.string());
      s.source = f.string();
      out.push_back(s);
      if (fs::is_directory(d / s.name)) walk(d / s.name, s.name, depth + 1);
    }
  };
  try {
    walk(dir, "", 0);
  } catch (const fs::filesystem_error& e) {
    throw ClientError(e.what());
  }
  if (out.empty()) throw ClientError(dir + ": no .txt or .md files at its top (platform segments)");
  return out;
}

std::vector<SegmentSpec> upload_order(std::vector<SegmentSpec> specs) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!index.emplace(specs[i].name, i).second) {
      throw ClientError("segment \"" + specs[i].name + "\" is defined twice (" + specs[index[specs[i].name]].source +
                        ", " + specs[i].source + ")");
    }
  }
  // Depth within the list: a parent defined here must be uploaded first.
  std::vector<int> depth(specs.size(), -1);
  std::function<int(size_t, int)> depth_of = [&](size_t i, int guard) -> int {
    if (guard > static_cast<int>(specs.size())) throw ClientError("segment \"" + specs[i].name + "\" is its own ancestor");
    if (depth[i] >= 0) return depth[i];
    auto p = index.find(specs[i].parent);
    return depth[i] = specs[i].parent.empty() || p == index.end() ? 0 : depth_of(p->second, guard + 1) + 1;
  };
  std::vector<size_t> order(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) order[i] = i, depth_of(i, 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return depth[a] < depth[b]; });
  std::vector<SegmentSpec> out;
  for (size_t i : order) out.push_back(std::move(specs[i]));
  return out;
}

}  // namespace towers::cli
