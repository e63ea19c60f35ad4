// GGUF v2/v3 files: a validating reader over mmap, and a streaming writer.
// Every count, length, shape and offset is checked before use; a malformed file gives a Status that
// names the problem and the byte offset where it was found, never a crash or a huge allocation.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/ggml_type.h"
#include "engine/base/status.h"

namespace towers {

enum class GgufValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view gguf_value_type_name(GgufValueType t);
// Bytes of one value of a fixed-size type; 0 for STRING, ARRAY and unknown types.
uint64_t gguf_scalar_size(GgufValueType t);

// One metadata value. Strings and array elements point into the mapped file (valid while the
// GgufFile lives). Nested arrays are rejected by the reader (no real model uses them).
struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  uint64_t u = 0;                 // unsigned integers and bool
  int64_t i = 0;                  // signed integers
  double f = 0;                   // floats
  std::string_view str;           // STRING
  GgufValueType elem_type = GgufValueType::UINT8;  // ARRAY
  uint64_t count = 0;             // ARRAY: number of elements
  const uint8_t* data = nullptr;  // ARRAY of numbers/bools: packed little-endian elements
  std::vector<std::string_view> strings;  // ARRAY of STRING

  bool is_integer() const;
  bool is_number() const;  // integer, float or bool
  // Numeric value converted; only meaningful when is_number().
  int64_t as_int() const;
  double as_double() const;
  std::string to_display(size_t max_items = 8) const;  // short human-readable form
};

struct GgufKV {
  std::string_view key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string_view name;
  uint32_t n_dims = 0;
  uint64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the fastest-varying (row length)
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;            // relative to the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping
  uint64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;
};

class GgufFile {
 public:
  // Maps and validates a file. The error names the file, the problem and the offset.
  static Result<std::shared_ptr<GgufFile>> open(const std::string& path);
  // Validates bytes owned by the caller (kept alive by the caller); used by tests and the fuzzer.
  static Result<std::shared_ptr<GgufFile>> from_memory(const uint8_t* data, size_t size);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return size_; }
  const std::string& path() const { return path_; }
  // True when the bytes are a read-only mapping of a file (open), false for from_memory.
  bool mapped() const { return mapped_; }

  const std::vector<GgufKV>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  // Typed getters: nullopt when the key is absent or of a non-convertible type.
  std::optional<std::string_view> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;    // any integer or bool
  std::optional<double> get_float(std::string_view key) const;  // any number
  std::optional<bool> get_bool(std::string_view key) const;
  const std::vector<std::string_view>* get_string_array(std::string_view key) const;
  // Numeric arrays converted element by element; nullopt when absent or not numeric.
  std::optional<std::vector<float>> get_f32_array(std::string_view key) const;
  std::optional<std::vector<int32_t>> get_i32_array(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  Status parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKV> kv_;
  std::vector<GgufTensorInfo> tensors_;
};

// Builds a GGUF v3 file. Metadata is kept in memory; tensor data is produced by a callback at write
// time so multi-gigabyte synthetic models never sit in RAM whole.
class GgufWriter {
 public:
  using Fill = std::function<void(uint8_t* dst, size_t nbytes)>;

  void set_u8(std::string key, uint8_t v);
  void set_i32(std::string key, int32_t v);
  void set_u32(std::string key, uint32_t v);
  void set_u64(std::string key, uint64_t v);
  void set_f32(std::string key, float v);
  void set_bool(std::string key, bool v);
  void set_string(std::string key, std::string v);
  void set_string_array(std::string key, std::vector<std::string> v);
  void set_f32_array(std::string key, std::vector<float> v);
  void set_i32_array(std::string key, std::vector<int32_t> v);
  // dims: ne[0] first (row length). fill writes exactly row_bytes(type, ne0) * rows bytes.
  void add_tensor(std::string name, GgmlType type, std::vector<uint64_t> dims, Fill fill);
  void add_tensor_bytes(std::string name, GgmlType type, std::vector<uint64_t> dims,
                        std::vector<uint8_t> bytes);
  void set_alignment(uint32_t a) { alignment_ = a; }

  Status write(const std::string& path) const;  // writes path.tmp, fsyncs, renames
  std::vector<uint8_t> to_bytes() const;        // whole file in memory (tests)

 private:
  struct Entry {
    std::string key;
    GgufValueType type;
    std::vector<uint8_t> payload;  // encoded value (after the type tag)
  };
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> dims;
    uint64_t nbytes;
    Fill fill;
  };
  void put(std::string key, GgufValueType type, std::vector<uint8_t> payload);
  std::vector<uint8_t> header() const;  // everything before the data section, padded
  uint32_t alignment_ = 32;
  std::vector<Entry> entries_;
  std::vector<Tensor> tensors_;
};

}  // namespace towers
