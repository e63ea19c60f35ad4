// GGUF reader/writer: round trips of every metadata value type and several tensor types (from memory
// and through the file system), an independent byte-level encoder the writer must match, a corpus of
// broken files that must each fail with their own message, a truncation sweep and a bit-flip sweep.
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "test_support.h"

using namespace towers;

// ---- allocation tracking: the largest single request while g_track is set ----------------------
// The replacement new/delete pair is malloc/free on purpose; GCC cannot see that they match.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
std::atomic<bool> g_track{false};
std::atomic<size_t> g_largest{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_track.load(std::memory_order_relaxed)) {
    size_t prev = g_largest.load(std::memory_order_relaxed);
    while (n > prev && !g_largest.compare_exchange_weak(prev, n)) {
    }
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

static_assert(std::endian::native == std::endian::little, "the test encoder writes host order");

// Raw value type tags (GgufValueType) for hand encoding.
enum VT : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STR = 8, ARR = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
// Raw tensor type ids (GgmlType).
enum TT : uint32_t { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14 };

// ---- a tiny little-endian byte builder ----------------------------------------------------------
struct Bytes {
  std::vector<uint8_t> b;
  template <class T>
  Bytes& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof v);
    b.insert(b.end(), tmp, tmp + sizeof v);
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(const std::vector<uint8_t>& v) {
    b.insert(b.end(), v.begin(), v.end());
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
  Bytes& pad_to(uint64_t align) {
    b.resize((b.size() + align - 1) / align * align, 0);
    return *this;
  }
};

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// ---- an independent GGUF encoder ----------------------------------------------------------------
struct Kv {
  std::string key;
  uint32_t type;
  std::vector<uint8_t> payload;  // bytes after the type tag
};
template <class T>
Kv kv_scalar(std::string key, uint32_t type, T v) {
  Bytes p;
  p.put(v);
  return {std::move(key), type, p.b};
}
Kv kv_str(std::string key, std::string_view s) {
  Bytes p;
  p.str(s);
  return {std::move(key), STR, p.b};
}
template <class T>
Kv kv_array(std::string key, uint32_t elem, const std::vector<T>& xs) {
  Bytes p;
  p.u32(elem).u64(xs.size());
  for (const T& x : xs) p.put(x);
  return {std::move(key), ARR, p.b};
}
Kv kv_str_array(std::string key, const std::vector<std::string>& xs) {
  Bytes p;
  p.u32(STR).u64(xs.size());
  for (const auto& x : xs) p.str(x);
  return {std::move(key), ARR, p.b};
}

struct TensorSpec {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> dims;
  std::vector<uint8_t> bytes;
  std::optional<uint64_t> offset = std::nullopt;  // default: packed, each padded to the alignment
};

struct Layout {
  size_t kv_begin = 0, ti_begin = 0, data_begin = 0;
  std::vector<size_t> kv_at, ti_at;  // where each KV / tensor info starts
  std::vector<uint64_t> offsets;     // tensor offsets relative to the data section
  size_t required = 0;               // end of the last tensor's bytes (before its padding)
};

struct FileSpec {
  uint32_t version = 3;
  uint64_t alignment = 32;  // layout only: add a general.alignment KV to tell the reader
  std::vector<Kv> kvs;
  std::vector<TensorSpec> tensors;
  std::optional<uint64_t> n_tensors, n_kv;  // override the counts in the header
  bool pad_end = true;

  std::vector<uint8_t> build(Layout* out = nullptr) const {
    Layout l;
    Bytes b;
    b.b = {'G', 'G', 'U', 'F'};
    b.u32(version).u64(n_tensors.value_or(tensors.size())).u64(n_kv.value_or(kvs.size()));
    l.kv_begin = b.b.size();
    for (const auto& kv : kvs) {
      l.kv_at.push_back(b.b.size());
      b.str(kv.key).u32(kv.type).raw(kv.payload);
    }
    l.ti_begin = b.b.size();
    uint64_t next = 0;
    for (const auto& t : tensors) {
      l.ti_at.push_back(b.b.size());
      uint64_t off = t.offset.value_or(next);
      l.offsets.push_back(off);
      next = round_up(next + t.bytes.size(), alignment);
      b.str(t.name).u32(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) b.u64(d);
      b.u32(t.type).u64(off);
    }
    b.pad_to(alignment);
    l.data_begin = b.b.size();
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (k) b.pad_to(alignment);
      b.raw(tensors[k].bytes);
      l.required = b.b.size();
    }
    if (pad_end) b.pad_to(alignment);
    if (out) *out = l;
    return b.b;
  }
};

// Deterministic, varied bytes.
std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 12345;
  for (auto& c : v) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// The tensors of the round-trip files: nbytes written out by hand from the block geometry.
struct TensorCase {
  const char* name;
  uint32_t type;
  GgmlType gtype;
  std::vector<uint64_t> dims;
  uint64_t nbytes;
};
const std::vector<TensorCase>& tensor_cases() {
  static const std::vector<TensorCase> cases = {
      {"token_embd.weight", T_F32, GgmlType::F32, {4, 3}, 4 * 3 * 4},
      {"norm.f16", T_F16, GgmlType::F16, {8, 2}, 8 * 2 * 2},
      {"blk.0.q4_0", T_Q4_0, GgmlType::Q4_0, {64, 2}, 2 * 2 * 18},
      {"blk.0.q8_0", T_Q8_0, GgmlType::Q8_0, {32, 3}, 3 * 34},
      {"blk.0.q4_k", T_Q4_K, GgmlType::Q4_K, {256, 2}, 2 * 144},
      {"blk.0.q6_k", T_Q6_K, GgmlType::Q6_K, {256}, 210},
      {"x.f32.4d", T_F32, GgmlType::F32, {2, 3, 1, 2}, 12 * 4},
  };
  return cases;
}

std::vector<TensorSpec> tensor_specs() {
  std::vector<TensorSpec> out;
  uint32_t seed = 1;
  for (const auto& c : tensor_cases()) out.push_back({c.name, c.type, c.dims, pattern(c.nbytes, seed++)});
  return out;
}

// Checks tensors against tensor_cases(): shape, type, offset, size, content, alignment.
void check_tensors(const GgufFile& f, const uint8_t* base, uint64_t alignment) {
  const auto& cases = tensor_cases();
  REQUIRE(f.tensors().size() == cases.size());
  CHECK(f.alignment() == alignment);
  CHECK(f.data_offset() % alignment == 0);
  uint64_t expect_off = 0;
  uint32_t seed = 1;
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto& c = cases[k];
    const GgufTensorInfo& t = f.tensors()[k];
    INFO("tensor " << c.name);
    CHECK(t.name == c.name);
    CHECK(f.find_tensor(c.name) == &t);
    CHECK(t.type == c.gtype);
    REQUIRE(t.n_dims == c.dims.size());
    uint64_t n = 1;
    std::string shape = "[";
    for (size_t d = 0; d < 4; ++d) {
      uint64_t want = d < c.dims.size() ? c.dims[d] : 1;
      CHECK(t.ne[d] == want);
      n *= want;
      if (d < c.dims.size()) shape += (d ? ", " : "") + std::to_string(want);
    }
    CHECK(t.shape_string() == shape + "]");
    CHECK(t.n_elements() == n);
    CHECK(t.nbytes == c.nbytes);
    CHECK(t.offset == expect_off);
    CHECK(t.offset % alignment == 0);
    CHECK(t.data == base + f.data_offset() + t.offset);
    CHECK(static_cast<uint64_t>(t.data - base) % alignment == 0);
    auto want = pattern(c.nbytes, seed++);
    CHECK(std::memcmp(t.data, want.data(), want.size()) == 0);
    expect_off = round_up(expect_off + c.nbytes, alignment);
  }
  CHECK(f.find_tensor("missing") == nullptr);
}

// ---- the writer's file: only the types it has setters for --------------------------------------
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

GgufWriter make_writer(uint32_t alignment) {
  GgufWriter w;
  w.set_u8("t.u8", 200);
  w.set_i32("t.i32", -123456789);
  w.set_u32("t.u32", 4000000000u);
  w.set_u64("t.u64", kU64Max);
  w.set_f32("t.f32", -3.25f);
  w.set_bool("t.bool.true", true);
  w.set_bool("t.bool.false", false);
  w.set_string("t.str", "h\xc3\xa9llo\nworld");
  w.set_string("t.str.empty", "");
  w.set_string_array("t.arr.str", {"a", "", "ccc"});
  w.set_f32_array("t.arr.f32", {1.5f, -2.0f, 0.25f});
  w.set_i32_array("t.arr.i32", {-1, 0, std::numeric_limits<int32_t>::max(),
                                std::numeric_limits<int32_t>::min()});
  w.set_string_array("t.arr.str.empty", {});
  w.set_f32_array("t.arr.f32.empty", {});
  w.set_i32_array("t.arr.i32.empty", {});
  w.set_u32("t.overwritten", 1);
  w.set_u32("t.overwritten", 2);  // same key again: replaced, not duplicated
  w.set_alignment(alignment);
  for (auto& t : tensor_specs()) {
    w.add_tensor_bytes(t.name, static_cast<GgmlType>(t.type), t.dims, t.bytes);
  }
  return w;
}

// The same content through the independent encoder (the writer appends general.alignment last).
FileSpec writer_equivalent(uint32_t alignment) {
  FileSpec s;
  s.alignment = alignment;
  s.kvs = {
      kv_scalar<uint8_t>("t.u8", U8, 200),
      kv_scalar<int32_t>("t.i32", I32, -123456789),
      kv_scalar<uint32_t>("t.u32", U32, 4000000000u),
      kv_scalar<uint64_t>("t.u64", U64, kU64Max),
      kv_scalar<float>("t.f32", F32, -3.25f),
      kv_scalar<uint8_t>("t.bool.true", BOOL, 1),
      kv_scalar<uint8_t>("t.bool.false", BOOL, 0),
      kv_str("t.str", "h\xc3\xa9llo\nworld"),
      kv_str("t.str.empty", ""),
      kv_str_array("t.arr.str", {"a", "", "ccc"}),
      kv_array<float>("t.arr.f32", F32, {1.5f, -2.0f, 0.25f}),
      kv_array<int32_t>("t.arr.i32", I32, {-1, 0, std::numeric_limits<int32_t>::max(),
                                           std::numeric_limits<int32_t>::min()}),
      kv_str_array("t.arr.str.empty", {}),
      kv_array<float>("t.arr.f32.empty", F32, {}),
      kv_array<int32_t>("t.arr.i32.empty", I32, {}),
      kv_scalar<uint32_t>("t.overwritten", U32, 2),
  };
  if (alignment != 32) s.kvs.push_back(kv_scalar<uint32_t>("general.alignment", U32, alignment));
  s.tensors = tensor_specs();
  return s;
}

template <class T>
std::vector<T> packed(const GgufValue& v) {
  std::vector<T> out(v.count);
  if (v.count) std::memcpy(out.data(), v.data, v.count * sizeof(T));
  return out;
}

void check_writer_values(const GgufFile& f) {
  const GgufValue* v = f.find("t.u8");
  REQUIRE(v);
  CHECK(v->type == GgufValueType::UINT8);
  CHECK(v->u == 200);
  CHECK(v->to_display() == "200");
  CHECK(f.get_int("t.u8") == 200);

  v = f.find("t.i32");
  REQUIRE(v);
  CHECK(v->type == GgufValueType::INT32);
  CHECK(v->i == -123456789);
  CHECK(v->to_display() == "-123456789");
  CHECK(f.get_int("t.i32") == -123456789);

  v = f.find("t.u32");
  REQUIRE(v);
  CHECK(v->type == GgufValueType::UINT32);
  CHECK(v->u == 4000000000u);
  CHECK(f.get_int("t.u32") == 4000000000ll);
  CHECK(v->to_display() == "4000000000");

  v = f.find("t.u64");
  REQUIRE(v);
  CHECK(v->type == GgufValueType::UINT64);
  CHECK(v->u == kU64Max);
  CHECK(v->to_display() == "18446744073709551615");

  v = f.find("t.f32");
  REQUIRE(v);
  CHECK(v->type == GgufValueType::FLOAT32);
  CHECK(v->f == -3.25);
  CHECK(f.get_float("t.f32") == -3.25);
  CHECK(v->to_display() == "-3.25");

  CHECK(f.find("t.bool.true")->type == GgufValueType::BOOL);
  CHECK(f.get_bool("t.bool.true") == true);
  CHECK(f.get_bool("t.bool.false") == false);
  CHECK(f.find("t.bool.true")->to_display() == "true");
  CHECK(f.find("t.bool.false")->to_display() == "false");

  CHECK(f.get_string("t.str") == std::string_view("h\xc3\xa9llo\nworld"));
  CHECK(f.find("t.str")->to_display() == "\"h\xc3\xa9llo\\nworld\"");
  CHECK(f.get_string("t.str.empty") == std::string_view(""));

  const auto* sa = f.get_string_array("t.arr.str");
  REQUIRE(sa);
  CHECK(*sa == std::vector<std::string_view>{"a", "", "ccc"});
  CHECK(f.find("t.arr.str")->count == 3);
  CHECK(f.find("t.arr.str")->elem_type == GgufValueType::STRING);
  CHECK(f.find("t.arr.str")->to_display() == "[str x 3] \"a\", \"\", \"ccc\"");

  v = f.find("t.arr.f32");
  REQUIRE(v);
  CHECK(v->type == GgufValueType::ARRAY);
  CHECK(v->elem_type == GgufValueType::FLOAT32);
  CHECK(packed<float>(*v) == std::vector<float>{1.5f, -2.0f, 0.25f});
  CHECK(f.get_f32_array("t.arr.f32") == std::vector<float>{1.5f, -2.0f, 0.25f});

  const std::vector<int32_t> ints = {-1, 0, std::numeric_limits<int32_t>::max(),
                                     std::numeric_limits<int32_t>::min()};
  v = f.find("t.arr.i32");
  REQUIRE(v);
  CHECK(v->elem_type == GgufValueType::INT32);
  CHECK(packed<int32_t>(*v) == ints);
  CHECK(f.get_i32_array("t.arr.i32") == ints);

  for (const char* k : {"t.arr.str.empty", "t.arr.f32.empty", "t.arr.i32.empty"}) {
    INFO(k);
    v = f.find(k);
    REQUIRE(v);
    CHECK(v->type == GgufValueType::ARRAY);
    CHECK(v->count == 0);
    CHECK(v->strings.empty());
  }
  CHECK(f.get_string_array("t.arr.str.empty")->empty());
  CHECK(f.get_f32_array("t.arr.f32.empty") == std::vector<float>{});
  CHECK(f.get_i32_array("t.arr.i32.empty") == std::vector<int32_t>{});
  CHECK(f.find("t.arr.f32.empty")->to_display() == "[f32 x 0]");
  CHECK(f.get_int("t.overwritten") == 2);
}

// ---- the all-types file: every value type, hand encoded -----------------------------------------
FileSpec all_types_spec(uint32_t version, uint32_t alignment) {
  FileSpec s;
  s.version = version;
  s.alignment = alignment;
  s.kvs = {
      kv_scalar<uint8_t>("v.u8", U8, 255),
      kv_scalar<int8_t>("v.i8", I8, -128),
      kv_scalar<uint16_t>("v.u16", U16, 65535),
      kv_scalar<int16_t>("v.i16", I16, -32768),
      kv_scalar<uint32_t>("v.u32", U32, 0xDEADBEEFu),
      kv_scalar<int32_t>("v.i32", I32, std::numeric_limits<int32_t>::min()),
      kv_scalar<float>("v.f32", F32, 1e-3f),
      kv_scalar<uint8_t>("v.bool", BOOL, 1),
      kv_str("v.str", "tokenizer.ggml.model = llama"),
      // general.alignment in the middle: it applies to all tensors whatever its position.
      kv_scalar<uint32_t>("general.alignment", U32, alignment),
      kv_scalar<uint64_t>("v.u64", U64, 0x0123456789ABCDEFull),
      kv_scalar<int64_t>("v.i64", I64, std::numeric_limits<int64_t>::min()),
      kv_scalar<double>("v.f64", F64, 3.141592653589793),
      kv_array<uint8_t>("a.u8", U8, {0, 1, 255}),
      kv_array<int8_t>("a.i8", I8, {-128, 0, 127}),
      kv_array<uint16_t>("a.u16", U16, {0, 65535}),
      kv_array<int16_t>("a.i16", I16, {-32768, 32767}),
      kv_array<uint32_t>("a.u32", U32, {7, 0xFFFFFFFFu}),
      kv_array<int32_t>("a.i32", I32, {-7, 7}),
      kv_array<float>("a.f32", F32, {0.5f, -0.0f, 1e30f}),
      kv_array<uint8_t>("a.bool", BOOL, {1, 0, 0, 1}),
      kv_str_array("a.str", {"<unk>", "<s>", "</s>", "\xe2\x96\x81the", std::string("nul\0in", 6)}),
      kv_array<uint64_t>("a.u64", U64, {0, kU64Max}),
      kv_array<int64_t>("a.i64", I64, {std::numeric_limits<int64_t>::min(), 42}),
      kv_array<double>("a.f64", F64, {2.5, -1e300}),
      kv_array<uint8_t>("a.empty.u8", U8, {}),
      kv_array<uint8_t>("a.empty.bool", BOOL, {}),
      kv_array<double>("a.empty.f64", F64, {}),
      kv_str_array("a.empty.str", {}),
      kv_str("v.str.empty", ""),
  };
  s.tensors = tensor_specs();
  return s;
}

void check_all_types(const GgufFile& f, uint32_t version) {
  CHECK(f.version() == version);
  REQUIRE(f.metadata().size() == 30);
  // Order is the file order.
  CHECK(f.metadata()[0].key == "v.u8");
  CHECK(f.metadata()[9].key == "general.alignment");
  CHECK(f.metadata()[29].key == "v.str.empty");

  auto scalar = [&](const char* key, GgufValueType t) -> const GgufValue& {
    const GgufValue* v = f.find(key);
    REQUIRE_MESSAGE(v, key);
    CHECK_MESSAGE(v->type == t, key);
    return *v;
  };
  CHECK(scalar("v.u8", GgufValueType::UINT8).u == 255);
  CHECK(scalar("v.i8", GgufValueType::INT8).i == -128);
  CHECK(scalar("v.u16", GgufValueType::UINT16).u == 65535);
  CHECK(scalar("v.i16", GgufValueType::INT16).i == -32768);
  CHECK(scalar("v.u32", GgufValueType::UINT32).u == 0xDEADBEEFu);
  CHECK(scalar("v.i32", GgufValueType::INT32).i == std::numeric_limits<int32_t>::min());
  CHECK(scalar("v.f32", GgufValueType::FLOAT32).f == static_cast<double>(1e-3f));
  CHECK(scalar("v.bool", GgufValueType::BOOL).u == 1);
  CHECK(scalar("v.str", GgufValueType::STRING).str == "tokenizer.ggml.model = llama");
  CHECK(scalar("v.u64", GgufValueType::UINT64).u == 0x0123456789ABCDEFull);
  CHECK(scalar("v.i64", GgufValueType::INT64).i == std::numeric_limits<int64_t>::min());
  CHECK(scalar("v.f64", GgufValueType::FLOAT64).f == 3.141592653589793);
  CHECK(scalar("v.str.empty", GgufValueType::STRING).str.empty());

  CHECK(f.find("v.i8")->to_display() == "-128");
  CHECK(f.find("v.u16")->to_display() == "65535");
  CHECK(f.find("v.i16")->to_display() == "-32768");
  CHECK(f.find("v.i64")->to_display() == "-9223372036854775808");
  CHECK(f.find("v.u64")->to_display() == "81985529216486895");
  CHECK(f.find("v.f64")->to_display() == "3.14159");
  CHECK(f.get_int("v.i8") == -128);
  CHECK(f.get_int("v.u16") == 65535);
  CHECK(f.get_int("v.i64") == std::numeric_limits<int64_t>::min());
  CHECK(f.get_float("v.f64") == 3.141592653589793);
  CHECK(f.get_float("v.i16") == -32768.0);
  CHECK(f.get_bool("v.bool") == true);
  CHECK(f.get_int("general.alignment") == static_cast<int64_t>(f.alignment()));

  auto array = [&](const char* key, GgufValueType elem, uint64_t count) -> const GgufValue& {
    const GgufValue* v = f.find(key);
    REQUIRE_MESSAGE(v, key);
    CHECK_MESSAGE(v->type == GgufValueType::ARRAY, key);
    CHECK_MESSAGE(v->elem_type == elem, key);
    CHECK_MESSAGE(v->count == count, key);
    return *v;
  };
  CHECK(packed<uint8_t>(array("a.u8", GgufValueType::UINT8, 3)) == std::vector<uint8_t>{0, 1, 255});
  CHECK(packed<int8_t>(array("a.i8", GgufValueType::INT8, 3)) == std::vector<int8_t>{-128, 0, 127});
  CHECK(packed<uint16_t>(array("a.u16", GgufValueType::UINT16, 2)) == std::vector<uint16_t>{0, 65535});
  CHECK(packed<int16_t>(array("a.i16", GgufValueType::INT16, 2)) == std::vector<int16_t>{-32768, 32767});
  CHECK(packed<uint32_t>(array("a.u32", GgufValueType::UINT32, 2)) ==
        std::vector<uint32_t>{7, 0xFFFFFFFFu});
  CHECK(packed<int32_t>(array("a.i32", GgufValueType::INT32, 2)) == std::vector<int32_t>{-7, 7});
  auto f32s = packed<float>(array("a.f32", GgufValueType::FLOAT32, 3));
  CHECK(f32s[0] == 0.5f);
  CHECK(std::signbit(f32s[1]));
  CHECK(f32s[2] == 1e30f);
  CHECK(packed<uint8_t>(array("a.bool", GgufValueType::BOOL, 4)) == std::vector<uint8_t>{1, 0, 0, 1});
  CHECK(packed<uint64_t>(array("a.u64", GgufValueType::UINT64, 2)) == std::vector<uint64_t>{0, kU64Max});
  CHECK(packed<int64_t>(array("a.i64", GgufValueType::INT64, 2)) ==
        std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 42});
  CHECK(packed<double>(array("a.f64", GgufValueType::FLOAT64, 2)) == std::vector<double>{2.5, -1e300});
  const auto& strs = array("a.str", GgufValueType::STRING, 5).strings;
  CHECK(strs == std::vector<std::string_view>{"<unk>", "<s>", "</s>", "\xe2\x96\x81the",
                                              std::string_view("nul\0in", 6)});
  CHECK(array("a.empty.u8", GgufValueType::UINT8, 0).to_display() == "[u8 x 0]");
  CHECK(array("a.empty.bool", GgufValueType::BOOL, 0).to_display() == "[bool x 0]");
  CHECK(array("a.empty.f64", GgufValueType::FLOAT64, 0).to_display() == "[f64 x 0]");
  CHECK(array("a.empty.str", GgufValueType::STRING, 0).strings.empty());
  CHECK(f.get_string_array("a.empty.str")->empty());

  // Element-wise conversions of every numeric element type.
  CHECK(f.get_i32_array("a.u8") == std::vector<int32_t>{0, 1, 255});
  CHECK(f.get_i32_array("a.i8") == std::vector<int32_t>{-128, 0, 127});
  CHECK(f.get_i32_array("a.u16") == std::vector<int32_t>{0, 65535});
  CHECK(f.get_i32_array("a.i16") == std::vector<int32_t>{-32768, 32767});
  CHECK(f.get_i32_array("a.bool") == std::vector<int32_t>{1, 0, 0, 1});
  CHECK(f.get_f32_array("a.f64") == std::vector<float>{2.5f, -std::numeric_limits<float>::infinity()});
  CHECK(f.get_f32_array("a.i64") ==
        std::vector<float>{-9223372036854775808.0f, 42.0f});
  // Out-of-range values saturate instead of being undefined behaviour.
  CHECK(f.get_i32_array("a.u32") == std::vector<int32_t>{7, std::numeric_limits<int32_t>::max()});
  CHECK(f.get_i32_array("a.u64") == std::vector<int32_t>{0, std::numeric_limits<int32_t>::max()});
  CHECK(f.get_i32_array("a.f32") ==
        std::vector<int32_t>{0, 0, std::numeric_limits<int32_t>::max()});
  CHECK(f.find("a.u8")->to_display() == "[u8 x 3] 0, 1, 255");
  CHECK(f.find("a.bool")->to_display(2) == "[bool x 4] 1, 0, …");

  // Typed getters refuse the wrong kinds.
  CHECK_FALSE(f.get_int("v.str"));
  CHECK_FALSE(f.get_int("v.f32"));
  CHECK_FALSE(f.get_int("a.u8"));
  CHECK_FALSE(f.get_string("v.u8"));
  CHECK_FALSE(f.get_float("a.f32"));
  CHECK_FALSE(f.get_bool("v.str"));
  CHECK(f.get_string_array("a.u8") == nullptr);
  CHECK_FALSE(f.get_f32_array("a.str"));
  CHECK_FALSE(f.get_i32_array("v.u32"));
  CHECK_FALSE(f.get_int("missing"));
  CHECK(f.find("missing") == nullptr);
}

std::filesystem::path tmp_path(const std::string& name) { return test::temp_dir() / name; }

void write_file(const std::filesystem::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream o(p, std::ios::binary | std::ios::trunc);
  o.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(o.good());
}

// Parses a copy of bytes in an exactly-sized heap buffer.
Result<std::shared_ptr<GgufFile>> parse(const std::vector<uint8_t>& bytes) {
  return GgufFile::from_memory(bytes.data(), bytes.size());
}

// Touches everything a successful parse exposes and checks it stays inside the buffer.
void walk(const GgufFile& f, const uint8_t* base, size_t size) {
  for (const auto& kv : f.metadata()) {
    CHECK(reinterpret_cast<const uint8_t*>(kv.key.data()) >= base);
    CHECK(reinterpret_cast<const uint8_t*>(kv.key.data()) + kv.key.size() <= base + size);
    (void)kv.value.to_display();
    if (kv.value.is_number()) {
      (void)kv.value.as_int();
      (void)kv.value.as_double();
    }
    (void)f.get_f32_array(kv.key);
    (void)f.get_i32_array(kv.key);
  }
  for (const auto& t : f.tensors()) {
    REQUIRE(t.nbytes > 0);
    REQUIRE(t.data >= base);
    REQUIRE(t.data + t.nbytes <= base + size);
    volatile uint8_t sink = t.data[0];
    sink = t.data[t.nbytes - 1];
    (void)sink;
  }
}

// ---- broken files -------------------------------------------------------------------------------
FileSpec one_tensor(uint32_t type, std::vector<uint64_t> dims, size_t nbytes) {
  FileSpec s;
  s.kvs = {kv_str("general.architecture", "llama")};
  s.tensors = {{"w", type, std::move(dims), pattern(nbytes, 9)}};
  return s;
}

std::vector<uint8_t> truncated(std::vector<uint8_t> b, size_t n) {
  REQUIRE(n < b.size());
  b.resize(n);
  return b;
}

struct Broken {
  std::string name;
  std::vector<uint8_t> bytes;
  std::vector<std::string> expect;  // substrings of the message
  bool has_offset = true;           // the message must say "offset"
};

std::vector<Broken> broken_corpus() {
  std::vector<Broken> out;
  auto add = [&](std::string name, std::vector<uint8_t> b, std::vector<std::string> expect,
                 bool has_offset = true) {
    out.push_back({std::move(name), std::move(b), std::move(expect), has_offset});
  };
  const auto u64max = kU64Max;
  const uint64_t p60 = uint64_t{1} << 60, p63 = uint64_t{1} << 63;

  // A valid base with one KV of each shape and one tensor, plus its layout. The long first string
  // keeps enough bytes after the header that truncations further on get past the count checks.
  FileSpec base;
  base.kvs = {kv_str("a.pad", std::string(200, 'p')), kv_scalar<uint32_t>("a.u32", U32, 7),
              kv_str("a.str", "hello world"),
              kv_array<float>("a.arr", F32, {1, 2, 3, 4, 5, 6, 7, 8})};
  base.tensors = {{"w", T_F32, {8, 2}, pattern(64, 3)}};
  Layout L;
  const auto good = base.build(&L);
  REQUIRE(parse(good).ok());

  add("empty file", {}, {"file too short to be GGUF (0 bytes)"}, false);
  add("three bytes", {'G', 'G', 'U'}, {"file too short to be GGUF (3 bytes)"}, false);
  {
    auto b = good;
    b[0] = 'g';
    add("wrong magic", b, {"bad magic", "offset 0"});
  }
  {
    FileSpec s = base;
    s.version = 1;
    add("version 1", s.build(), {"unsupported GGUF version 1 ", "supported: 2, 3", "offset 4"});
    s.version = 99;
    add("version 99", s.build(), {"unsupported GGUF version 99 ", "offset 4"});
  }
  add("truncated in version", truncated(good, 6), {"file truncated while reading version", "offset 4"});
  add("truncated in tensor count", truncated(good, 11),
      {"file truncated while reading tensor count", "(need 8 bytes, 3 left)", "offset 8"});
  FileSpec no_tensors = base;  // (a tensor count of 1 would not fit in 20 bytes)
  no_tensors.tensors.clear();
  add("truncated in metadata count", truncated(no_tensors.build(), 20),
      {"file truncated while reading metadata count", "offset 16"});
  add("truncated in key length", truncated(good, L.kv_at[2] + 3),
      {"file truncated while reading metadata key", "offset " + std::to_string(L.kv_at[2])});
  add("truncated in key", truncated(good, L.kv_at[2] + 8 + 2),
      {"metadata key length 5 runs past the end of the file (2 bytes left)",
       "offset " + std::to_string(L.kv_at[2])});
  add("truncated in value type", truncated(good, L.kv_at[1] + 8 + 5 + 2),
      {"file truncated while reading metadata value type"});
  add("truncated in u32 value", truncated(good, L.kv_at[1] + 8 + 5 + 4 + 1),
      {"file truncated while reading u32 value", "(key 'a.u32')",
       "offset " + std::to_string(L.kv_at[1] + 17)});
  add("truncated in string value", truncated(good, L.kv_at[2] + 8 + 5 + 4 + 8 + 4),
      {"string value length 11 runs past the end of the file (4 bytes left)", "(key 'a.str')"});
  add("truncated in array header", truncated(good, L.kv_at[3] + 8 + 5 + 4 + 4 + 3),
      {"file truncated while reading array length", "(key 'a.arr')"});
  add("truncated in array data", truncated(good, L.kv_at[3] + 8 + 5 + 4 + 4 + 8 + 10),
      {"array of 8 f32 runs past the end of the file", "(key 'a.arr')"});
  add("truncated in tensor name", truncated(good, L.ti_at[0] + 8),
      {"tensor name length 1 runs past the end of the file"});
  add("truncated in tensor dims", truncated(good, L.ti_at[0] + 8 + 1 + 4 + 8 + 2),
      {"file truncated while reading tensor dimension (need 8 bytes, 2 left)"});
  add("truncated in tensor type", truncated(good, L.ti_at[0] + 8 + 1 + 4 + 16 + 1),
      {"file truncated while reading tensor type"});
  add("truncated in tensor offset", truncated(good, L.ti_at[0] + 8 + 1 + 4 + 16 + 4 + 7),
      {"file truncated while reading tensor data offset"});
  add("truncated before data section", truncated(good, L.data_begin - 1),
      {"file truncated before the tensor data section"});
  add("truncated in tensor data", truncated(good, L.data_begin + 40),
      {"tensor 'w' data [" + std::to_string(L.data_begin) + ", +64) lies outside the file (size " +
           std::to_string(L.data_begin + 40) + ")",
       "offset " + std::to_string(L.data_begin)});
  {
    FileSpec s = base;
    s.n_tensors = p60;
    add("absurd tensor count", s.build(), {"tensor count 1152921504606846976 cannot fit in the file"});
    s = base;
    s.n_kv = p60;
    add("absurd metadata count", s.build(),
        {"metadata count 1152921504606846976 cannot fit in the file", "offset 16"});
    s = base;
    s.n_kv = 5;  // one more than present: runs into the tensor infos, fails there
    // The 4th "key" is the tensor name 'w' with n_dims 2 read as a u16 type tag; the tensor info
    // then starts inside the dimensions and its name length is absurd.
    add("metadata count one too many", s.build(),
        {"tensor name length 562949953421312 exceeds the limit of 65535",
         "offset " + std::to_string(L.ti_at[0] + 15)});
  }
  {
    FileSpec s;
    s.kvs = {{"big.str", STR, Bytes().u64(p63).str("x").b}};
    add("string length 2^63", s.build(),
        {"string value length 9223372036854775808 runs past the end", "(key 'big.str')"});
    s.kvs = {{"k", STR, Bytes().u64(u64max).b}};
    add("string length 2^64-1", s.build(), {"string value length 18446744073709551615 runs past"});
    Bytes b;
    b.b = {'G', 'G', 'U', 'F'};
    b.u32(3).u64(0).u64(1).u64(p63).zeros(64);
    add("key length 2^63", b.b, {"metadata key length 9223372036854775808 exceeds the limit of 65535"});
    b.b = {'G', 'G', 'U', 'F'};
    b.u32(3).u64(0).u64(1).u64(0).u32(U8).u8(0).zeros(16);
    add("empty key", b.b, {"empty metadata key", "offset 24"});
  }
  {
    FileSpec s;
    s.kvs = {{"arr", ARR, Bytes().u32(U64).u64(uint64_t{1} << 62).u64(1).b}};
    add("array count overflowing count*8", s.build(),
        {"array of 4611686018427387904 u64 runs past the end of the file", "(key 'arr')"});
    s.kvs = {{"arr", ARR, Bytes().u32(STR).u64(u64max).u64(1).b}};
    add("string array count 2^64-1", s.build(),
        {"string array length 18446744073709551615 cannot fit in the"});
    s.kvs = {{"arr", ARR, Bytes().u32(STR).u64(2).str("ok").u64(p63).b}};
    add("string array element length 2^63", s.build(),
        {"string array element length 9223372036854775808 runs past the end"});
    s.kvs = {{"arr", ARR, Bytes().u32(ARR).u64(1).u32(U8).u64(1).u8(0).b}};
    add("nested arrays", s.build(), {"nested arrays are not supported", "(key 'arr')"});
    s.kvs = {{"arr", ARR, Bytes().u32(77).u64(0).b}};
    add("unknown array element type", s.build(), {"unknown array element type 77"});
    s.kvs = {{"arr", ARR, Bytes().u32(BOOL).u64(3).u8(1).u8(0).u8(7).b}};
    add("bool array element 7", s.build(), {"bool array element is neither 0 nor 1"});
    s.kvs = {{"odd", 13, Bytes().u64(0).b}};
    add("unknown value type 13", s.build(), {"unknown metadata value type 13", "(key 'odd')"});
    s.kvs = {{"flag", BOOL, Bytes().u8(2).b}};
    add("bool value 2", s.build(), {"bool value 2 is neither 0 nor 1", "(key 'flag')"});
    s.kvs = {kv_scalar<uint32_t>("dup.key", U32, 1), kv_scalar<uint32_t>("dup.key", U32, 2)};
    add("duplicate key", s.build(), {"duplicate metadata key 'dup.key'"});
  }
  {
    FileSpec s = base;
    s.kvs.push_back(kv_scalar<uint32_t>("general.alignment", U32, 3));
    add("alignment 3", s.build(), {"general.alignment must be a power of two", "got 3"});
    s.kvs.back() = kv_scalar<uint32_t>("general.alignment", U32, 0);
    add("alignment 0", s.build(), {"general.alignment must be a power of two", "got 0"});
    s.kvs.back() = kv_str("general.alignment", "32");
    add("alignment as a string", s.build(), {"general.alignment must be a power of two", "got \"32\""});
    s.kvs.back() = kv_scalar<uint64_t>("general.alignment", U64, uint64_t{1} << 40);
    add("alignment 2^40", s.build(), {"general.alignment must be a power of two", "got 1099511627776"});
  }
  {
    auto s = one_tensor(99, {32}, 128);
    add("unknown tensor type", s.build(),
        {"tensor 'w' has unknown tensor type 99", "(supported: ", "F32", "Q8_0", "Q4_K", "Q6_K"});
    s = one_tensor(T_F32, {}, 0);
    add("n_dims 0", s.build(), {"tensor 'w' has 0 dimensions (supported: 1 to 4)"});
    s = one_tensor(T_F32, {1, 1, 1, 1, 2}, 8);
    add("n_dims 5", s.build(), {"tensor 'w' has 5 dimensions"});
    s = one_tensor(T_F32, {4, 0}, 0);
    add("zero dimension", s.build(), {"tensor 'w' dimension 1 is 0 (must be 1 to 2^40)"});
    s = one_tensor(T_F32, {4, 1, (uint64_t{1} << 40) + 1}, 0);
    add("dimension above 2^40", s.build(), {"tensor 'w' dimension 2 is 1099511627777"});
    s = one_tensor(T_F32, {uint64_t{1} << 40, uint64_t{1} << 40}, 0);
    add("element count overflows", s.build(), {"tensor 'w' element count overflows"});
    s = one_tensor(T_F32, {uint64_t{1} << 40, uint64_t{1} << 22}, 0);
    add("byte size overflows", s.build(), {"tensor 'w' byte size overflows"});
    s = one_tensor(T_Q4_0, {33}, 18);
    add("row length not a block multiple", s.build(),
        {"tensor 'w' row length 33 is not a multiple of the Q4_0 block size 32"});
    s = one_tensor(T_Q4_K, {128, 2}, 144);
    add("row length below a K block", s.build(), {"row length 128 is not a multiple of the Q4_K block size 256"});
    s = one_tensor(T_F32, {8}, 32);
    s.tensors[0].offset = 5;
    add("tensor offset not aligned", s.build(), {"tensor 'w' data offset 5 is not a multiple of the alignment 32"});
    s.tensors[0].offset = 1 << 20;
    add("tensor offset past the end", s.build(), {"tensor 'w' data [", "+32) lies outside the file"});
    s.tensors[0].offset = u64max - 31;
    add("tensor offset near 2^64", s.build(), {"tensor 'w' data [", "lies outside the file"});
    s = one_tensor(T_F32, {16}, 32);  // 64 bytes needed, 32 present
    add("tensor data past the end", s.build(), {"tensor 'w' data [", "+64) lies outside the file"});
    s = one_tensor(T_F32, {8}, 32);
    s.tensors.push_back({"w", T_F32, {8}, pattern(32, 4)});
    add("duplicate tensor name", s.build(), {"duplicate tensor name 'w'"});
    s = one_tensor(T_F32, {8}, 32);
    s.tensors[0].name = std::string(70000, 'n');
    add("tensor name too long", s.build(), {"tensor name length 70000 exceeds the limit of 65535"});
  }
  return out;
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

}  // namespace

// -------------------------------------------------------------------------------------------------

TEST_CASE("writer output equals an independent encoding and round-trips through memory and disk") {
  for (uint32_t alignment : {32u, 64u, 1u, 256u}) {
    CAPTURE(alignment);
    GgufWriter w = make_writer(alignment);
    auto bytes = w.to_bytes();
    CHECK(bytes == writer_equivalent(alignment).build());
    CHECK(bytes.size() % alignment == 0);

    auto r = GgufFile::from_memory(bytes.data(), bytes.size());
    REQUIRE_MESSAGE(r.ok(), r.error());
    const GgufFile& f = **r;
    CHECK(f.version() == 3);
    CHECK(f.path() == "<memory>");
    CHECK(f.file_size() == bytes.size());
    CHECK(f.metadata().size() == 16 + (alignment != 32 ? 1 : 0));
    check_writer_values(f);
    check_tensors(f, bytes.data(), alignment);

    auto path = tmp_path("gguf_writer_" + std::to_string(alignment) + ".gguf");
    REQUIRE(w.write(path.string()).ok());
    for (const auto& e : std::filesystem::directory_iterator(path.parent_path()))
      CHECK_MESSAGE(e.path().filename().string().find(path.filename().string() + ".tmp") != 0,
                    "temporary left behind: " << e.path());
    CHECK(std::filesystem::file_size(path) == bytes.size());
    auto o = GgufFile::open(path.string());
    REQUIRE_MESSAGE(o.ok(), o.error());
    const GgufFile& g = **o;
    CHECK(g.path() == path.string());
    check_writer_values(g);
    const uint8_t* base = g.tensors().front().data - g.data_offset() - g.tensors().front().offset;
    check_tensors(g, base, alignment);
    // The mapping is page-aligned, so tensor data is aligned in memory, not only in the file.
    for (const auto& t : g.tensors()) CHECK(reinterpret_cast<uintptr_t>(t.data) % alignment == 0);
    std::filesystem::remove(path);
  }
}

TEST_CASE("every metadata value type round-trips (hand encoded), versions 2 and 3, memory and disk") {
  for (uint32_t version : {3u, 2u}) {
    for (uint32_t alignment : {64u, 32u, 128u}) {
      CAPTURE(version);
      CAPTURE(alignment);
      Layout L;
      auto bytes = all_types_spec(version, alignment).build(&L);
      auto r = parse(bytes);
      REQUIRE_MESSAGE(r.ok(), r.error());
      CHECK((*r)->data_offset() == L.data_begin);
      check_all_types(**r, version);
      check_tensors(**r, bytes.data(), alignment);
      walk(**r, bytes.data(), bytes.size());

      auto path = tmp_path("gguf_all_types.gguf");
      write_file(path, bytes);
      auto o = GgufFile::open(path.string());
      REQUIRE_MESSAGE(o.ok(), o.error());
      check_all_types(**o, version);
      for (const auto& t : (*o)->tensors()) CHECK(reinterpret_cast<uintptr_t>(t.data) % alignment == 0);
      std::filesystem::remove(path);
    }
  }
}

TEST_CASE("files without tensors or without metadata load") {
  FileSpec s;
  auto bytes = s.build();
  CHECK(bytes.size() == 32);  // 24-byte header padded to the default alignment
  auto r = parse(bytes);
  REQUIRE_MESSAGE(r.ok(), r.error());
  CHECK((*r)->metadata().empty());
  CHECK((*r)->tensors().empty());
  CHECK((*r)->alignment() == 32);

  s.pad_end = false;
  bytes = s.build();
  bytes.resize(24);  // the bare header, no padding: nothing is missing
  r = parse(bytes);
  REQUIRE_MESSAGE(r.ok(), r.error());

  s.kvs = {kv_str("general.name", "x")};
  bytes = s.build();  // from_memory borrows the bytes: keep them alive while r is used
  r = parse(bytes);
  REQUIRE_MESSAGE(r.ok(), r.error());
  CHECK((*r)->get_string("general.name") == "x");

  FileSpec t;
  t.tensors = {{"only", T_Q8_0, {32}, pattern(34, 5)}};
  bytes = t.build();
  r = parse(bytes);
  REQUIRE_MESSAGE(r.ok(), r.error());
  CHECK((*r)->metadata().empty());
  CHECK((*r)->tensors().size() == 1);
  CHECK((*r)->tensors()[0].nbytes == 34);
}

TEST_CASE("broken files each fail with their own message") {
  auto corpus = broken_corpus();
  CHECK(corpus.size() >= 15);
  std::set<std::string> messages;
  for (const auto& b : corpus) {
    INFO("case: " << b.name);
    auto r = parse(b.bytes);
    REQUIRE_FALSE(r.ok());
    const std::string& msg = r.error();
    INFO("message: " << msg);
    CHECK_FALSE(msg.empty());
    for (const auto& e : b.expect) CHECK_MESSAGE(contains(msg, e), "expected: " << e);
    if (b.has_offset) CHECK(contains(msg, "offset"));
    CHECK_MESSAGE(messages.insert(msg).second, "message shared with another case");
  }
  // The same bytes through a file: the message is prefixed with the path.
  auto path = tmp_path("gguf_broken.gguf");
  write_file(path, corpus[2].bytes);
  auto o = GgufFile::open(path.string());
  REQUIRE_FALSE(o.ok());
  CHECK(o.error().rfind(path.string() + ": ", 0) == 0);
  CHECK(contains(o.error(), "bad magic"));
  write_file(path, {});
  o = GgufFile::open(path.string());
  REQUIRE_FALSE(o.ok());
  CHECK(contains(o.error(), path.string()));
  CHECK(contains(o.error(), "file too short to be GGUF (0 bytes)"));
  std::filesystem::remove(path);
}

TEST_CASE("absurd counts fail fast without large allocations") {
  auto largest_during = [](const std::vector<uint8_t>& bytes, std::string* msg) {
    g_largest = 0;
    g_track = true;
    auto r = GgufFile::from_memory(bytes.data(), bytes.size());
    g_track = false;
    *msg = r.ok() ? std::string() : r.error();
    return g_largest.load();
  };
  std::string msg;
  // 2^60 entries claimed by a tiny file: rejected from the header alone.
  for (int which = 0; which < 2; ++which) {
    Bytes b;
    b.b = {'G', 'G', 'U', 'F'};
    b.u32(3).u64(which == 0 ? uint64_t{1} << 60 : 0).u64(which == 1 ? uint64_t{1} << 60 : 0).zeros(32);
    size_t largest = largest_during(b.b, &msg);
    CHECK(contains(msg, "cannot fit in the file"));
    CHECK(largest < 4096);
  }
  // The largest counts a 1 MiB file could hold, followed by garbage: the reader must not reserve
  // memory for all of them before finding the first entry is bad (that is what a count edited in a
  // multi-gigabyte model would do).
  const size_t size = 1 << 20;
  {
    Bytes b;
    b.b = {'G', 'G', 'U', 'F'};
    b.u32(3).u64(0).u64((size - 24) / 13).zeros(size - 24);  // keys of length 0
    size_t largest = largest_during(b.b, &msg);
    CHECK(contains(msg, "empty metadata key"));
    CHECK(largest < size / 8);
  }
  {
    Bytes b;
    b.b = {'G', 'G', 'U', 'F'};
    b.u32(3).u64((size - 24) / 24).u64(0);
    b.u64(1).u8('t').u32(0);  // first tensor: 0 dimensions
    b.zeros(size - b.b.size());
    size_t largest = largest_during(b.b, &msg);
    CHECK(contains(msg, "has 0 dimensions"));
    CHECK(largest < size / 8);
  }
  {
    Bytes b;
    b.b = {'G', 'G', 'U', 'F'};
    b.u32(3).u64(0).u64(1).str("arr").u32(ARR).u32(STR).u64((size - 60) / 8);
    b.u64(uint64_t{1} << 62);  // first element: absurd length
    b.zeros(size - b.b.size());
    size_t largest = largest_during(b.b, &msg);
    CHECK(contains(msg, "string array element length 4611686018427387904 runs past the end"));
    CHECK(largest < size / 8);
  }
}

TEST_CASE("truncation sweep: every prefix fails cleanly or holds everything needed") {
  Layout L;
  FileSpec s = all_types_spec(3, 64);
  s.tensors.resize(3);  // keep it small: ~1 KiB of header, a few hundred bytes of data
  const auto bytes = s.build(&L);
  REQUIRE(L.required < bytes.size());  // the last tensor's padding can be cut off
  size_t ok = 0, failed = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    auto r = parse(prefix);
    if (r.ok()) {
      ++ok;
      CHECK_MESSAGE(n >= L.required, "prefix of " << n << " bytes loaded");
      walk(**r, prefix.data(), prefix.size());
    } else {
      ++failed;
      CHECK_MESSAGE(n < L.required, "prefix of " << n << " bytes failed: " << r.error());
      CHECK_FALSE(r.error().empty());
      if (n >= 4) CHECK_MESSAGE(contains(r.error(), "offset"), r.error());
    }
  }
  CHECK(ok == bytes.size() - L.required);
  CHECK(failed == L.required);
}

TEST_CASE("bit-flip sweep over the header never crashes") {
  Layout L;
  FileSpec s = all_types_spec(3, 32);
  auto bytes = s.build(&L);
  size_t ok = 0, failed = 0;
  std::vector<uint8_t> copy(bytes);
  for (size_t bit = 0; bit < L.data_begin * 8; ++bit) {
    copy[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    auto r = parse(copy);
    if (r.ok()) {
      ++ok;
      walk(**r, copy.data(), copy.size());
    } else {
      ++failed;
      REQUIRE_FALSE(r.error().empty());
      CHECK_MESSAGE(contains(r.error(), "offset"), r.error());
    }
    copy[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  MESSAGE(ok << " flips still load, " << failed << " fail");
  CHECK(failed > 0);
  CHECK(ok > 0);  // e.g. flips inside string contents
}

TEST_CASE("open errors name the path") {
  auto missing = (test::temp_dir() / "no_such_dir" / "model.gguf").string();
  auto r = GgufFile::open(missing);
  REQUIRE_FALSE(r.ok());
  CHECK(contains(r.error(), missing));
  CHECK(contains(r.error(), "cannot open"));
  CHECK(contains(r.error(), "No such file or directory"));

  auto dir = test::temp_dir().string();
  r = GgufFile::open(dir);
  REQUIRE_FALSE(r.ok());
  CHECK(contains(r.error(), dir));
  CHECK(contains(r.error(), "not a regular file"));

  GgufWriter w;
  auto bad = w.write((test::temp_dir() / "no_such_dir" / "out.gguf").string());
  REQUIRE_FALSE(bad.ok());
  CHECK(contains(bad.message(), "no_such_dir/out.gguf.tmp"));
  CHECK(contains(bad.message(), "cannot create"));
}

TEST_CASE("the shared stories260K model parses and every prefix of its header fails cleanly") {
  auto p = test::shared_file("models/stories260K.gguf");
  if (p.empty()) return;
  auto r = GgufFile::open(p.string());
  REQUIRE_MESSAGE(r.ok(), r.error());
  const GgufFile& f = **r;
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(!f.tensors().empty());
  std::ifstream in(p, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() == f.file_size());
  auto m = parse(bytes);
  REQUIRE(m.ok());
  walk(**m, bytes.data(), bytes.size());
  // Sampled prefixes (every 97th byte of the header) all fail with a message.
  for (size_t n = 0; n < f.data_offset(); n += 97) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    auto q = parse(prefix);
    REQUIRE_FALSE(q.ok());
    CHECK_FALSE(q.error().empty());
  }
}
