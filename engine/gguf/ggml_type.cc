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
    case GgmlType::Q5_1: return NameSupport{"Q5_1", true};
    case GgmlType::Q8_0: return NameSupport{"Q8_0", true};
    case GgmlType::Q8_1: return NameSupport{"Q8_1", false};
    case GgmlType::Q2_K: return NameSupport{"Q2_K", true};
    case GgmlType::Q3_K: return NameSupport{"Q3_K", true};
    case GgmlType::Q4_K: return NameSupport{"Q4_K", true};
    case GgmlType::Q5_K: return NameSupport{"Q5_K", true};
    case GgmlType::Q6_K: return NameSupport{"Q6_K", true};
    case GgmlType::Q8_K: return NameSupport{"Q8_K", false};
    case GgmlType::BF16: return NameSupport{"BF16", true};
    case GgmlType::IQ4_NL: return NameSupport{"IQ4_NL", true};
    case GgmlType::IQ4_XS: return NameSupport{"IQ4_XS", true};
    // Known, sized (simd/ggml_blocks.h) and refused by name: the lattice codebooks of IQ1/IQ2/IQ3, the
    // ternary TQ formats, and the integer and f64 types (never model weights).
    case GgmlType::IQ2_XXS: return NameSupport{"IQ2_XXS", false};
    case GgmlType::IQ2_XS: return NameSupport{"IQ2_XS", false};
    case GgmlType::IQ2_S: return NameSupport{"IQ2_S", false};
    case GgmlType::IQ3_XXS: return NameSupport{"IQ3_XXS", false};
    case GgmlType::IQ3_S: return NameSupport{"IQ3_S", false};
    case GgmlType::IQ1_S: return NameSupport{"IQ1_S", false};
    case GgmlType::IQ1_M: return NameSupport{"IQ1_M", false};
    case GgmlType::TQ1_0: return NameSupport{"TQ1_0", false};
    case GgmlType::TQ2_0: return NameSupport{"TQ2_0", false};
    case GgmlType::I8: return NameSupport{"I8", false};
    case GgmlType::I16: return NameSupport{"I16", false};
    case GgmlType::I32: return NameSupport{"I32", false};
    case GgmlType::I64: return NameSupport{"I64", false};
    case GgmlType::F64: return NameSupport{"F64", false};
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
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";
}

}  // namespace towers
