#include "engine/gguf/ggml_type.h"

namespace towers {

namespace {
// Name, and whether dequantize_row (engine/gguf/quant.cc) reads the type.
struct NameSupport {
  std::string_view name;
  bool supported;
};
std::optional<NameSupport> name_support(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return NameSupport{"F32", true};
    case GgmlType::F16: return NameSupport{"F16", true};
    case GgmlType::Q4_0: return NameSupport{"Q4_0", true};
    case GgmlType::Q4_1: return NameSupport{"Q4_1", true};
    case GgmlType::Q5_0: return NameSupport{"Q5_0", true};
    case GgmlType::Q5_1: return NameSupport{"Q5_1", false};
    case GgmlType::Q8_0: return NameSupport{"Q8_0", true};
    case GgmlType::Q8_1: return NameSupport{"Q8_1", false};
    case GgmlType::Q2_K: return NameSupport{"Q2_K", false};
    case GgmlType::Q3_K: return NameSupport{"Q3_K", false};
    case GgmlType::Q4_K: return NameSupport{"Q4_K", true};
    case GgmlType::Q5_K: return NameSupport{"Q5_K", true};
    case GgmlType::Q6_K: return NameSupport{"Q6_K", true};
    case GgmlType::Q8_K: return NameSupport{"Q8_K", false};
    case GgmlType::BF16: return NameSupport{"BF16", true};
  }
  return std::nullopt;
}
}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw) {
  const auto t = static_cast<GgmlType>(raw);
  const auto ns = name_support(t);
  if (!ns) return std::nullopt;
  const simd::BlockShape shape = simd::block_shape(t);
  return GgmlTypeTraits{ns->name, shape.elems, shape.bytes, ns->supported};
}

std::string_view ggml_type_name(GgmlType t) {
  auto tr = ggml_type_traits(static_cast<uint32_t>(t));
  return tr ? tr->name : std::string_view("unknown");
}

std::string_view supported_ggml_types() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K";
}

}  // namespace towers
