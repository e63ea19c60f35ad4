#include "engine/gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_set>

namespace towers {
namespace {

constexpr uint64_t kMaxKeyBytes = 65535;  // GGUF spec limit on key length
constexpr uint32_t kMaxDims = 4;
// Counts are only bounded by the file size; never reserve more than this up front (a count edited
// in a multi-GB file must not turn into a tens-of-GB allocation). Vectors grow with real entries.
constexpr uint64_t kMaxReserve = 1024;


bool known_value_type(uint32_t t) { return t <= 12; }

std::string hex_offset(uint64_t off) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "offset %" PRIu64, off);
  return buf;
}

// Bounds-checked little-endian cursor over the file bytes.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size) : base_(base), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  Status error(const std::string& what) const { return error_at(pos_, what); }
  Status error_at(uint64_t at, const std::string& what) const {
    return Status::Error(what + " at " + hex_offset(at));
  }

  template <class T>
  Status read(T* out, const char* what) {
    if (remaining() < sizeof(T)) {
      return error(std::string("file truncated while reading ") + what + " (need " +
                   std::to_string(sizeof(T)) + " bytes, " + std::to_string(remaining()) + " left)");
    }
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status read_string(std::string_view* out, const char* what, uint64_t max_len) {
    uint64_t start = pos_;
    uint64_t len = 0;
    if (auto s = read(&len, what); !s) return s;
    if (len > max_len) {
      return error_at(start, std::string(what) + " length " + std::to_string(len) +
                                 " exceeds the limit of " + std::to_string(max_len) + " bytes");
    }
    if (len > remaining()) {
      return error_at(start, std::string(what) + " length " + std::to_string(len) +
                                 " runs past the end of the file (" + std::to_string(remaining()) +
                                 " bytes left)");
    }
    *out = std::string_view(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }
  Status skip_bytes(uint64_t n, const char* what) {
    if (n > remaining()) return error(std::string("file truncated inside ") + what);
    pos_ += n;
    return Status::Ok();
  }
  const uint8_t* here() const { return base_ + pos_; }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

Status read_scalar(Cursor& c, GgufValueType t, GgufValue* v) {
  switch (t) {
    case GgufValueType::UINT8: { uint8_t x; if (auto s = c.read(&x, "u8 value"); !s) return s; v->u = x; return Status::Ok(); }
    case GgufValueType::INT8: { int8_t x; if (auto s = c.read(&x, "i8 value"); !s) return s; v->i = x; return Status::Ok(); }
    case GgufValueType::UINT16: { uint16_t x; if (auto s = c.read(&x, "u16 value"); !s) return s; v->u = x; return Status::Ok(); }
    case GgufValueType::INT16: { int16_t x; if (auto s = c.read(&x, "i16 value"); !s) return s; v->i = x; return Status::Ok(); }
    case GgufValueType::UINT32: { uint32_t x; if (auto s = c.read(&x, "u32 value"); !s) return s; v->u = x; return Status::Ok(); }
    case GgufValueType::INT32: { int32_t x; if (auto s = c.read(&x, "i32 value"); !s) return s; v->i = x; return Status::Ok(); }
    case GgufValueType::UINT64: { uint64_t x; if (auto s = c.read(&x, "u64 value"); !s) return s; v->u = x; return Status::Ok(); }
    case GgufValueType::INT64: { int64_t x; if (auto s = c.read(&x, "i64 value"); !s) return s; v->i = x; return Status::Ok(); }
    case GgufValueType::FLOAT32: { float x; if (auto s = c.read(&x, "f32 value"); !s) return s; v->f = x; return Status::Ok(); }
    case GgufValueType::FLOAT64: { double x; if (auto s = c.read(&x, "f64 value"); !s) return s; v->f = x; return Status::Ok(); }
    case GgufValueType::BOOL: {
      uint64_t at = c.pos();
      uint8_t x;
      if (auto s = c.read(&x, "bool value"); !s) return s;
      if (x > 1) return c.error_at(at, "bool value " + std::to_string(x) + " is neither 0 nor 1");
      v->u = x;
      return Status::Ok();
    }
    default: return c.error("internal: not a scalar type");
  }
}

Status read_value(Cursor& c, uint32_t raw_type, GgufValue* v, uint64_t type_at) {
  if (!known_value_type(raw_type)) {
    return c.error_at(type_at, "unknown metadata value type " + std::to_string(raw_type));
  }
  v->type = static_cast<GgufValueType>(raw_type);
  if (v->type == GgufValueType::STRING) {
    return c.read_string(&v->str, "string value", std::numeric_limits<uint64_t>::max());
  }
  if (v->type != GgufValueType::ARRAY) return read_scalar(c, v->type, v);

  uint64_t elem_at = c.pos();
  uint32_t elem_raw = 0;
  if (auto s = c.read(&elem_raw, "array element type"); !s) return s;
  if (!known_value_type(elem_raw)) {
    return c.error_at(elem_at, "unknown array element type " + std::to_string(elem_raw));
  }
  v->elem_type = static_cast<GgufValueType>(elem_raw);
  if (v->elem_type == GgufValueType::ARRAY) {
    return c.error_at(elem_at, "nested arrays are not supported");
  }
  uint64_t count_at = c.pos();
  if (auto s = c.read(&v->count, "array length"); !s) return s;
  if (v->elem_type == GgufValueType::STRING) {
    // Each string needs at least its 8-byte length: bound the count before reserving.
    if (v->count > c.remaining() / 8) {
      return c.error_at(count_at, "string array length " + std::to_string(v->count) +
                                      " cannot fit in the " + std::to_string(c.remaining()) +
                                      " bytes left");
    }
    v->strings.reserve(std::min<uint64_t>(v->count, kMaxReserve));
    for (uint64_t k = 0; k < v->count; ++k) {
      std::string_view sv;
      if (auto s = c.read_string(&sv, "string array element", std::numeric_limits<uint64_t>::max());
          !s) {
        return s;
      }
      v->strings.push_back(sv);
    }
    return Status::Ok();
  }
  uint64_t esz = gguf_scalar_size(v->elem_type);
  if (v->count > c.remaining() / esz) {
    return c.error_at(count_at, "array of " + std::to_string(v->count) + " " +
                                    std::string(gguf_value_type_name(v->elem_type)) +
                                    " runs past the end of the file");
  }
  v->data = c.here();
  if (v->elem_type == GgufValueType::BOOL) {
    for (uint64_t k = 0; k < v->count; ++k) {
      if (v->data[k] > 1) return c.error_at(c.pos() + k, "bool array element is neither 0 nor 1");
    }
  }
  return c.skip_bytes(v->count * esz, "array");
}

template <class T>
T load_le(const uint8_t* p) {
  T x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

double array_elem_as_double(const GgufValue& v, uint64_t k) {
  const uint8_t* p = v.data + k * gguf_scalar_size(v.elem_type);
  switch (v.elem_type) {
    case GgufValueType::UINT8: return load_le<uint8_t>(p);
    case GgufValueType::INT8: return load_le<int8_t>(p);
    case GgufValueType::UINT16: return load_le<uint16_t>(p);
    case GgufValueType::INT16: return load_le<int16_t>(p);
    case GgufValueType::UINT32: return load_le<uint32_t>(p);
    case GgufValueType::INT32: return load_le<int32_t>(p);
    case GgufValueType::UINT64: return static_cast<double>(load_le<uint64_t>(p));
    case GgufValueType::INT64: return static_cast<double>(load_le<int64_t>(p));
    case GgufValueType::FLOAT32: return load_le<float>(p);
    case GgufValueType::FLOAT64: return load_le<double>(p);
    case GgufValueType::BOOL: return load_le<uint8_t>(p);
    default: return 0;
  }
}

// Float to integer without undefined behaviour: NaN gives 0, out-of-range values saturate.
template <class I>
I saturate(double x) {
  if (std::isnan(x)) return 0;
  if (x <= static_cast<double>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (x >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(x);
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

uint64_t gguf_scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16: case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32: case GgufValueType::INT32: case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64: case GgufValueType::INT64: case GgufValueType::FLOAT64: return 8;
    default: return 0;
  }
}

std::string_view gguf_value_type_name(GgufValueType t) {
  static constexpr std::string_view names[] = {"u8",   "i8",  "u16",    "i16", "u32", "i32", "f32",
                                               "bool", "str", "array",  "u64", "i64", "f64"};
  auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : std::string_view("?");
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::UINT16:
    case GgufValueType::INT16: case GgufValueType::UINT32: case GgufValueType::INT32:
    case GgufValueType::UINT64: case GgufValueType::INT64: return true;
    default: return false;
  }
}
bool GgufValue::is_number() const {
  return is_integer() || type == GgufValueType::FLOAT32 || type == GgufValueType::FLOAT64 ||
         type == GgufValueType::BOOL;
}
int64_t GgufValue::as_int() const {
  switch (type) {
    case GgufValueType::INT8: case GgufValueType::INT16: case GgufValueType::INT32:
    case GgufValueType::INT64: return i;
    case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: return saturate<int64_t>(f);
    default: return static_cast<int64_t>(u);
  }
}
double GgufValue::as_double() const {
  switch (type) {
    case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: return f;
    case GgufValueType::INT8: case GgufValueType::INT16: case GgufValueType::INT32:
    case GgufValueType::INT64: return static_cast<double>(i);
    default: return static_cast<double>(u);
  }
}

std::string GgufValue::to_display(size_t max_items) const {
  auto clip = [](std::string_view s) {
    std::string out;
    for (char ch : s.substr(0, 60)) out += (ch == '\n') ? std::string("\\n") : std::string(1, ch);
    if (s.size() > 60) out += "…(" + std::to_string(s.size()) + " bytes)";
    return out;
  };
  switch (type) {
    case GgufValueType::STRING: return "\"" + clip(str) + "\"";
    case GgufValueType::BOOL: return u ? "true" : "false";
    case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", f);
      return buf;
    }
    case GgufValueType::ARRAY: {
      std::string out = "[" + std::string(gguf_value_type_name(elem_type)) + " x " +
                        std::to_string(count) + "]";
      if (count == 0) return out;
      out += " ";
      for (uint64_t k = 0; k < count && k < max_items; ++k) {
        if (k) out += ", ";
        if (elem_type == GgufValueType::STRING) {
          out += "\"" + clip(strings[k]) + "\"";
        } else {
          char buf[64];
          std::snprintf(buf, sizeof buf, "%g", array_elem_as_double(*this, k));
          out += buf;
        }
      }
      if (count > max_items) out += ", …";
      return out;
    }
    case GgufValueType::INT8: case GgufValueType::INT16: case GgufValueType::INT32:
    case GgufValueType::INT64: return std::to_string(i);
    default: return std::to_string(u);
  }
}

std::string GgufTensorInfo::shape_string() const {
  std::string s = "[";
  for (uint32_t d = 0; d < n_dims; ++d) s += (d ? ", " : "") + std::to_string(ne[d]);
  return s + "]";
}

GgufFile::~GgufFile() {
  if (mapped_ && base_) munmap(const_cast<uint8_t*>(base_), size_);
}

Result<std::shared_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Status::Error(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Error(path + ": not a regular file");
  }
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return Status::Error(path + ": mmap failed: " + std::strerror(e));
    }
    f->base_ = static_cast<const uint8_t*>(p);
    f->mapped_ = true;
  }
  ::close(fd);
  if (auto s = f->parse(); !s) return Status::Error(path + ": " + s.message());
  return f;
}

Result<std::shared_ptr<GgufFile>> GgufFile::from_memory(const uint8_t* data, size_t size) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = "<memory>";
  f->base_ = data;
  f->size_ = size;
  if (auto s = f->parse(); !s) return s;
  return f;
}

Status GgufFile::parse() {
  Cursor c(base_, size_);
  if (size_ < 4) return Status::Error("file too short to be GGUF (" + std::to_string(size_) + " bytes)");
  if (std::memcmp(base_, "GGUF", 4) != 0) {
    return Status::Error("bad magic (not a GGUF file) at offset 0");
  }
  c.skip_bytes(4, "magic");
  uint64_t at = c.pos();
  if (auto s = c.read(&version_, "version"); !s) return s;
  if (version_ != 2 && version_ != 3) {
    return c.error_at(at, "unsupported GGUF version " + std::to_string(version_) +
                              " (supported: 2, 3)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  at = c.pos();
  if (auto s = c.read(&n_tensors, "tensor count"); !s) return s;
  // A tensor info takes at least 8 (name len) + 4 + 4 + 8 bytes; a KV at least 8 + 4 + 1.
  if (n_tensors > c.remaining() / 24) {
    return c.error_at(at, "tensor count " + std::to_string(n_tensors) + " cannot fit in the file");
  }
  at = c.pos();
  if (auto s = c.read(&n_kv, "metadata count"); !s) return s;
  if (n_kv > c.remaining() / 13) {
    return c.error_at(at, "metadata count " + std::to_string(n_kv) + " cannot fit in the file");
  }

  kv_.reserve(std::min<uint64_t>(n_kv, kMaxReserve));
  std::unordered_set<std::string_view> keys;
  for (uint64_t k = 0; k < n_kv; ++k) {
    GgufKV kv;
    uint64_t key_at = c.pos();
    if (auto s = c.read_string(&kv.key, "metadata key", kMaxKeyBytes); !s) return s;
    if (kv.key.empty()) return c.error_at(key_at, "empty metadata key");
    if (!keys.insert(kv.key).second) {
      return c.error_at(key_at, "duplicate metadata key '" + std::string(kv.key) + "'");
    }
    uint64_t type_at = c.pos();
    uint32_t raw_type = 0;
    if (auto s = c.read(&raw_type, "metadata value type"); !s) return s;
    if (auto s = read_value(c, raw_type, &kv.value, type_at); !s) {
      return Status::Error(s.message() + " (key '" + std::string(kv.key) + "')");
    }
    if (kv.key == "general.alignment") {
      const GgufValue& a = kv.value;
      if (!a.is_integer() || a.as_int() <= 0 || (a.as_int() & (a.as_int() - 1)) != 0 ||
          a.as_int() > (1 << 20)) {
        return c.error_at(type_at, "general.alignment must be a power of two integer ≤ 1 MiB, got " +
                                       a.to_display());
      }
      alignment_ = static_cast<uint64_t>(a.as_int());
    }
    kv_.push_back(std::move(kv));
  }

  tensors_.reserve(std::min<uint64_t>(n_tensors, kMaxReserve));
  std::unordered_set<std::string_view> names;
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensorInfo ti;
    uint64_t name_at = c.pos();
    if (auto s = c.read_string(&ti.name, "tensor name", kMaxKeyBytes); !s) return s;
    if (!names.insert(ti.name).second) {
      return c.error_at(name_at, "duplicate tensor name '" + std::string(ti.name) + "'");
    }
    const std::string tname = "tensor '" + std::string(ti.name) + "'";
    at = c.pos();
    if (auto s = c.read(&ti.n_dims, "tensor dimension count"); !s) return s;
    if (ti.n_dims == 0 || ti.n_dims > kMaxDims) {
      return c.error_at(at, tname + " has " + std::to_string(ti.n_dims) +
                                " dimensions (supported: 1 to 4)");
    }
    for (uint32_t d = 0; d < ti.n_dims; ++d) {
      at = c.pos();
      if (auto s = c.read(&ti.ne[d], "tensor dimension"); !s) return s;
      if (ti.ne[d] == 0 || ti.ne[d] > (uint64_t{1} << 40)) {
        return c.error_at(at, tname + " dimension " + std::to_string(d) + " is " +
                                  std::to_string(ti.ne[d]) + " (must be 1 to 2^40)");
      }
    }
    at = c.pos();
    uint32_t raw_type = 0;
    if (auto s = c.read(&raw_type, "tensor type"); !s) return s;
    auto tr = ggml_type_traits(raw_type);
    if (!tr) {
      return c.error_at(at, tname + " has unknown tensor type " + std::to_string(raw_type) +
                                " (supported: " + std::string(supported_ggml_types()) + ")");
    }
    ti.type = static_cast<GgmlType>(raw_type);
    if (ti.ne[0] % tr->block_elems != 0) {
      return c.error_at(at, tname + " row length " + std::to_string(ti.ne[0]) +
                                " is not a multiple of the " + std::string(tr->name) +
                                " block size " + std::to_string(tr->block_elems));
    }
    uint64_t n = 1;
    for (uint32_t d = 0; d < ti.n_dims; ++d) {
      if (mul_overflows(n, ti.ne[d], &n)) return c.error_at(at, tname + " element count overflows");
    }
    if (mul_overflows(n / tr->block_elems, tr->block_bytes, &ti.nbytes)) {
      return c.error_at(at, tname + " byte size overflows");
    }
    at = c.pos();
    if (auto s = c.read(&ti.offset, "tensor data offset"); !s) return s;
    if (ti.offset % alignment_ != 0) {
      return c.error_at(at, tname + " data offset " + std::to_string(ti.offset) +
                                " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    tensors_.push_back(ti);
  }

  uint64_t end_of_infos = c.pos();
  data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_offset_ > size_) {
    return c.error_at(end_of_infos, "file truncated before the tensor data section");
  }
  uint64_t data_size = size_ >= data_offset_ ? size_ - data_offset_ : 0;
  for (auto& ti : tensors_) {
    if (ti.offset > data_size || ti.nbytes > data_size - ti.offset) {
      return Status::Error("tensor '" + std::string(ti.name) + "' data [" +
                           std::to_string(data_offset_ + ti.offset) + ", +" +
                           std::to_string(ti.nbytes) + ") lies outside the file (size " +
                           std::to_string(size_) + ") at " + hex_offset(data_offset_ + ti.offset));
    }
    ti.data = base_ + data_offset_ + ti.offset;
  }
  return Status::Ok();
}

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const auto& kv : kv_) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

std::optional<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::STRING) return std::nullopt;
  return v->str;
}
std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || !(v->is_integer() || v->type == GgufValueType::BOOL)) return std::nullopt;
  return v->as_int();
}
std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || !v->is_number()) return std::nullopt;
  return v->as_double();
}
std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || !(v->type == GgufValueType::BOOL || v->is_integer())) return std::nullopt;
  return v->as_int() != 0;
}
const std::vector<std::string_view>* GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::ARRAY || v->elem_type != GgufValueType::STRING) return nullptr;
  return &v->strings;
}
std::optional<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::ARRAY || v->elem_type == GgufValueType::STRING) return std::nullopt;
  std::vector<float> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) out[k] = static_cast<float>(array_elem_as_double(*v, k));
  return out;
}
std::optional<std::vector<int32_t>> GgufFile::get_i32_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::ARRAY || v->elem_type == GgufValueType::STRING) return std::nullopt;
  std::vector<int32_t> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) out[k] = saturate<int32_t>(array_elem_as_double(*v, k));
  return out;
}
const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// ---------------------------------------------------------------- writer

namespace {
template <class T>
void append(std::vector<uint8_t>& b, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}
void append_str(std::vector<uint8_t>& b, std::string_view s) {
  append<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
}  // namespace

void GgufWriter::put(std::string key, GgufValueType type, std::vector<uint8_t> payload) {
  for (auto& e : entries_) {
    if (e.key == key) {
      e.type = type;
      e.payload = std::move(payload);
      return;
    }
  }
  entries_.push_back({std::move(key), type, std::move(payload)});
}

void GgufWriter::set_u8(std::string k, uint8_t v) { std::vector<uint8_t> b; append(b, v); put(std::move(k), GgufValueType::UINT8, b); }
void GgufWriter::set_i32(std::string k, int32_t v) { std::vector<uint8_t> b; append(b, v); put(std::move(k), GgufValueType::INT32, b); }
void GgufWriter::set_u32(std::string k, uint32_t v) { std::vector<uint8_t> b; append(b, v); put(std::move(k), GgufValueType::UINT32, b); }
void GgufWriter::set_u64(std::string k, uint64_t v) { std::vector<uint8_t> b; append(b, v); put(std::move(k), GgufValueType::UINT64, b); }
void GgufWriter::set_f32(std::string k, float v) { std::vector<uint8_t> b; append(b, v); put(std::move(k), GgufValueType::FLOAT32, b); }
void GgufWriter::set_bool(std::string k, bool v) { std::vector<uint8_t> b; append<uint8_t>(b, v ? 1 : 0); put(std::move(k), GgufValueType::BOOL, b); }
void GgufWriter::set_string(std::string k, std::string v) { std::vector<uint8_t> b; append_str(b, v); put(std::move(k), GgufValueType::STRING, b); }

void GgufWriter::set_string_array(std::string k, std::vector<std::string> v) {
  std::vector<uint8_t> b;
  append<uint32_t>(b, static_cast<uint32_t>(GgufValueType::STRING));
  append<uint64_t>(b, v.size());
  for (const auto& s : v) append_str(b, s);
  put(std::move(k), GgufValueType::ARRAY, std::move(b));
}
void GgufWriter::set_f32_array(std::string k, std::vector<float> v) {
  std::vector<uint8_t> b;
  append<uint32_t>(b, static_cast<uint32_t>(GgufValueType::FLOAT32));
  append<uint64_t>(b, v.size());
  for (float x : v) append(b, x);
  put(std::move(k), GgufValueType::ARRAY, std::move(b));
}
void GgufWriter::set_i32_array(std::string k, std::vector<int32_t> v) {
  std::vector<uint8_t> b;
  append<uint32_t>(b, static_cast<uint32_t>(GgufValueType::INT32));
  append<uint64_t>(b, v.size());
  for (int32_t x : v) append(b, x);
  put(std::move(k), GgufValueType::ARRAY, std::move(b));
}

void GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> dims, Fill fill) {
  uint64_t rows = 1;
  for (size_t d = 1; d < dims.size(); ++d) rows *= dims[d];
  uint64_t nbytes = row_bytes(type, dims.empty() ? 0 : dims[0]) * rows;
  tensors_.push_back({std::move(name), type, std::move(dims), nbytes, std::move(fill)});
}

void GgufWriter::add_tensor_bytes(std::string name, GgmlType type, std::vector<uint64_t> dims,
                                  std::vector<uint8_t> bytes) {
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  add_tensor(std::move(name), type, std::move(dims), [shared](uint8_t* dst, size_t n) {
    std::memcpy(dst, shared->data(), std::min(n, shared->size()));
  });
}

std::vector<uint8_t> GgufWriter::header() const {
  std::vector<uint8_t> b;
  b.insert(b.end(), {'G', 'G', 'U', 'F'});
  append<uint32_t>(b, 3);
  append<uint64_t>(b, tensors_.size());
  bool has_alignment = false;
  for (const auto& e : entries_) has_alignment |= e.key == "general.alignment";
  append<uint64_t>(b, entries_.size() + (alignment_ != 32 && !has_alignment ? 1 : 0));
  for (const auto& e : entries_) {
    append_str(b, e.key);
    append<uint32_t>(b, static_cast<uint32_t>(e.type));
    b.insert(b.end(), e.payload.begin(), e.payload.end());
  }
  if (alignment_ != 32 && !has_alignment) {
    append_str(b, "general.alignment");
    append<uint32_t>(b, static_cast<uint32_t>(GgufValueType::UINT32));
    append<uint32_t>(b, alignment_);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    append_str(b, t.name);
    append<uint32_t>(b, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) append<uint64_t>(b, d);
    append<uint32_t>(b, static_cast<uint32_t>(t.type));
    append<uint64_t>(b, offset);
    offset += (t.nbytes + alignment_ - 1) / alignment_ * alignment_;
  }
  b.resize((b.size() + alignment_ - 1) / alignment_ * alignment_, 0);
  return b;
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  std::vector<uint8_t> b = header();
  for (const auto& t : tensors_) {
    size_t at = b.size();
    b.resize(at + (t.nbytes + alignment_ - 1) / alignment_ * alignment_, 0);
    if (t.fill) t.fill(b.data() + at, t.nbytes);
  }
  return b;
}

Status GgufWriter::write(const std::string& path) const {
  // A unique temporary name: two writers of the same path (parallel tests, two `model synth` runs) must
  // never truncate each other's half-written file; the rename makes whichever finishes last win whole.
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = mkstemp(tmp.data());
  if (fd < 0) return Status::Error(path + ".tmp: cannot create: " + std::strerror(errno));
  fchmod(fd, 0644);
  FILE* f = fdopen(fd, "wb");
  if (!f) {
    const int e = errno;
    close(fd);
    std::remove(tmp.c_str());
    return Status::Error(tmp + ": cannot open: " + std::strerror(e));
  }
  auto fail = [&](const std::string& what) {
    int e = errno;
    std::fclose(f);
    std::remove(tmp.c_str());
    return Status::Error(tmp + ": " + what + ": " + std::strerror(e));
  };
  std::vector<uint8_t> h = header();
  if (std::fwrite(h.data(), 1, h.size(), f) != h.size()) return fail("write failed");
  std::vector<uint8_t> buf;
  for (const auto& t : tensors_) {
    size_t padded = (t.nbytes + alignment_ - 1) / alignment_ * alignment_;
    buf.assign(padded, 0);
    if (t.fill) t.fill(buf.data(), t.nbytes);
    if (std::fwrite(buf.data(), 1, padded, f) != padded) return fail("write failed");
  }
  if (std::fflush(f) != 0 || fsync(fileno(f)) != 0) return fail("flush failed");
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    return Status::Error(tmp + ": close failed: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::Error(path + ": rename failed: " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace towers
