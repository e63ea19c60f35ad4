// Segment files (warm tier): exact round trips in every format, and every corruption refused.
#include <fstream>
#include <random>

#include "engine/forward.h"
#include "mmapstore/segment_file.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;

namespace {

struct Tiny {
  std::unique_ptr<Model> model = test::synth_tiny("segfile", "f16");
};

std::shared_ptr<const Segment> make_segment(const Model& model, KvQuant format, int n, int32_t first_pos) {
  ThreadPool pool(1);
  Forward fwd(model, pool, Kernels::Reference);
  DenseKvCache cache(model.config(), n, first_pos);
  std::mt19937 rng(n);
  std::vector<int32_t> toks(n);
  for (auto& t : toks) t = static_cast<int32_t>(rng() % model.config().n_vocab);
  std::vector<float> logits;
  REQUIRE(fwd.eval(cache, toks, Logits::Last, logits).ok());
  return Segment::from_cache(model.config(), cache, 0, toks, format, 77, 5);
}

constexpr uint64_t kFingerprint = 0x1234abcd5678ef90ull;

}  // namespace

TEST_CASE("segments round-trip through bytes and files exactly, in every format") {
  Tiny t;
  FileReader reader;
  MESSAGE("FileReader uses " << (reader.uses_io_uring() ? "io_uring" : "pread (io_uring not permitted here)"));
  for (KvQuant f : {KvQuant::F32, KvQuant::F16, KvQuant::Q8, KvQuant::Q6, KvQuant::Q4}) {
    CAPTURE(std::string(simd::kv_quant_name(f)));
    auto seg = make_segment(*t.model, f, 9, 3);
    auto bytes = encode_segment(*seg, kFingerprint);
    auto back = decode_segment(t.model->config(), bytes, kFingerprint);
    REQUIRE_MESSAGE(back.ok(), back.error());
    const Segment& b = *back.value();
    CHECK(b.id() == 77);
    CHECK(b.parent() == 5);
    CHECK(b.computed_pos() == 3);
    CHECK(b.format() == f);
    CHECK(b.tokens() == seg->tokens());
    CHECK(b.k_bytes() == seg->k_bytes());
    CHECK(b.v_bytes() == seg->v_bytes());
    CHECK(b.k_scales() == seg->k_scales());
    CHECK(b.key_row(1, 4) == seg->key_row(1, 4));

    auto path = test::temp_dir() / (std::string("seg-") + simd::kv_quant_name(f) + ".tws");
    REQUIRE(write_segment_file(*seg, path, kFingerprint).ok());
    CHECK(!std::filesystem::exists(path.string() + ".tmp"));
    auto read = read_segment_file(reader, t.model->config(), path, kFingerprint);
    REQUIRE_MESSAGE(read.ok(), read.error());
    CHECK(read.value()->v_bytes() == seg->v_bytes());
  }
}

TEST_CASE("every flipped byte and every truncation is refused, and so is another model") {
  Tiny t;
  auto seg = make_segment(*t.model, KvQuant::Q4, 3, 0);
  const auto good = encode_segment(*seg, kFingerprint);
  int refused = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= 0x10;
    refused += !decode_segment(t.model->config(), bad, kFingerprint).ok();
  }
  CHECK(refused == static_cast<int>(good.size()));
  for (size_t n = 0; n < good.size(); ++n) {
    CHECK(!decode_segment(t.model->config(), std::span(good).first(n), kFingerprint).ok());
  }
  auto wrong = decode_segment(t.model->config(), good, kFingerprint + 1);
  REQUIRE(!wrong.ok());
  CHECK(wrong.error().find("another model") != std::string::npos);
  ModelConfig other = t.model->config();
  other.n_layer += 1;
  CHECK(!decode_segment(other, good, kFingerprint).ok());
}

TEST_CASE("the reader fetches many files in one go and reports the ones it cannot read") {
  Tiny t;
  FileReader reader;
  std::vector<std::filesystem::path> paths;
  std::vector<std::vector<uint8_t>> want;
  for (int i = 0; i < 12; ++i) {
    auto seg = make_segment(*t.model, KvQuant::Q8, 2 + i, i);
    auto p = test::temp_dir() / ("many-" + std::to_string(i) + ".tws");
    REQUIRE(write_segment_file(*seg, p, kFingerprint).ok());
    paths.push_back(p);
    want.push_back(encode_segment(*seg, kFingerprint));
  }
  paths.push_back(test::temp_dir() / "no-such-segment.tws");
  auto got = reader.read_all(paths);
  REQUIRE(got.size() == paths.size());
  for (size_t i = 0; i + 1 < paths.size(); ++i) {
    REQUIRE(got[i].ok());
    CHECK(got[i].value() == want[i]);
  }
  CHECK(!got.back().ok());
  CHECK(got.back().error().find("no-such-segment") != std::string::npos);
  auto capped = reader.read_all(std::span(paths).first(1), 10);
  CHECK(!capped[0].ok());
}
