// libFuzzer target for the JSON Schema → GBNF converter (engine/constrained/json_schema.h). Input: a
// schema's JSON text. The converter either refuses it with a message or returns GBNF that the
// grammar parser compiles: a schema accepted but turned into a grammar that does not compile would
// be a 500 for the client instead of a 400.
#include "engine/constrained/grammar.h"
#include "engine/constrained/json_schema.h"
#include "fuzz/fuzz_support.h"

using namespace towers;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "json_schema_fuzz";
  auto gbnf = json_schema_to_gbnf(fuzz::text_of(data, size));
  if (!gbnf.ok()) {
    if (gbnf.error().empty()) fuzz::die(kTarget, "a refused schema without a message");
    if (!gbnf.status().is_invalid_argument()) fuzz::die(kTarget, "not the client's error: " + gbnf.error());
    return 0;
  }
  auto g = Grammar::parse(*gbnf);
  if (!g.ok()) fuzz::die(kTarget, "the schema's grammar does not compile: " + g.error() + "\n" + *gbnf);
  return 0;
}
