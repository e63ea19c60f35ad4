#include "engine/ggml_type.h"

namespace towers {

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw) {
  switch (raw) {
    case 0: return GgmlTypeTraits{"F32", 1, 4, true};
    case 1: return GgmlTypeTraits{"F16", 1, 2, true};
    case 2: return GgmlTypeTraits{"Q4_0", 32, 18, true};
    case 3: return GgmlTypeTraits{"Q4_1", 32, 20, true};
    case 6: return GgmlTypeTraits{"Q5_0", 32, 22, true};
    case 7: return GgmlTypeTraits{"Q5_1", 32, 24, false};
    case 8: return GgmlTypeTraits{"Q8_0", 32, 34, true};
    case 9: return GgmlTypeTraits{"Q8_1", 32, 36, false};
    case 10: return GgmlTypeTraits{"Q2_K", 256, 84, false};
    case 11: return GgmlTypeTraits{"Q3_K", 256, 110, false};
    case 12: return GgmlTypeTraits{"Q4_K", 256, 144, true};
    case 13: return GgmlTypeTraits{"Q5_K", 256, 176, true};
    case 14: return GgmlTypeTraits{"Q6_K", 256, 210, true};
    case 15: return GgmlTypeTraits{"Q8_K", 256, 292, false};
    case 30: return GgmlTypeTraits{"BF16", 1, 2, true};
    default: return std::nullopt;
  }
}

std::string_view ggml_type_name(GgmlType t) {
  auto tr = ggml_type_traits(static_cast<uint32_t>(t));
  return tr ? tr->name : std::string_view("unknown");
}

std::string_view supported_ggml_types() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K";
}

}  // namespace towers
