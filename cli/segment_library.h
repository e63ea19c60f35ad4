// Many hierarchy segments at once, for `towerctl segments add --library FILE | --from-dir DIR`.
//
// A library file is TOML or JSON (by extension), a list of segments:
//   [[segment]]                            {"segments": [
//   name = "acme"                            {"name": "acme", "level": "platform", "text": "..."},
//   level = "platform"                       {"name": "support", "level": "community",
//   text = "You work for Acme."               "parent": "acme", "file": "support.txt"}
//   [[segment]]                            ]}
//   name = "support"
//   level = "community"
//   parent = "acme"
//   file = "support.txt"                   # instead of text; relative to the library file
//
// A directory mirrors the hierarchy: DIR/acme.txt is platform "acme", DIR/acme/support.txt its
// community "support", DIR/acme/support/helper.txt that community's bot "helper" (.txt or .md).
#pragma once
#include <string>
#include <vector>

namespace towers::cli {

struct SegmentSpec {
  std::string name, level, parent, text;
  std::string source;  // where it was defined, for messages
};

// Throws ClientError naming the file and the problem.
std::vector<SegmentSpec> load_library_file(const std::string& path);
std::vector<SegmentSpec> load_library_dir(const std::string& dir);

// Orders specs so every parent defined in the list comes before its children (platforms first);
// throws ClientError on a duplicate name or a parent cycle.
std::vector<SegmentSpec> upload_order(std::vector<SegmentSpec> specs);

// The whole file ("-" = stdin); throws ClientError.
std::string read_text_file(const std::string& path);

}  // namespace towers::cli
