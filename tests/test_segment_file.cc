// Segment files: exact round trips through a mapped file in every format, the open-time checks
// against what the record log says, every flipped byte and truncation refused, and the writer's two
// ways of writing (posix, io_uring) giving the same files.
#include <fstream>
#include <random>

#include "engine/model/forward.h"
#include "fault_injection_fs.h"
#include "mmapstore/segment_file.h"
#include "mmapstore/segment_writer.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace towers;

namespace {

struct Tiny {
  std::unique_ptr<Model> model = test::synth_tiny("segfile", "f16");
};

std::vector<int32_t> tokens_for(const Model& model, int n, int seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> toks(n);
  for (auto& t : toks) t = static_cast<int32_t>(rng() % model.config().n_vocab);
  return toks;
}

std::shared_ptr<const Segment> make_segment(const Model& model, KvQuant format, int n, int32_t first_pos) {
  ThreadPool pool(1);
  Forward fwd(model, pool, Kernels::Reference);
  DenseKvCache cache(model.config(), n, first_pos);
  auto toks = tokens_for(model, n, n);
  std::vector<float> logits;
  REQUIRE(fwd.eval(cache, toks, Logits::Last, logits).ok());
  return Segment::from_cache(model.config(), cache, 0, toks, format, 77, 5);
}

constexpr uint64_t kFingerprint = 0x1234abcd5678ef90ull;
constexpr uint64_t kContext = 0xc0ffee;

std::filesystem::path write_bytes(const std::string& name, std::span<const uint8_t> bytes) {
  auto p = test::temp_dir() / name;
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(bytes.data()),
                                                              static_cast<std::streamsize>(bytes.size()));
  return p;
}

// Opened and fully checked (header at open, payload by verify), as a page-in does.
Status open_and_verify(const std::filesystem::path& p, const ModelConfig& c, const SegmentExpect* expect = nullptr) {
  auto f = SegmentFile::open(p, c, kFingerprint, expect);
  if (!f.ok()) return f.status();
  return f.value()->verify();
}

}  // namespace

TEST_CASE("segments round-trip through a mapped file exactly, in every format, read in place") {
  Tiny t;
  for (KvQuant f : {KvQuant::F32, KvQuant::F16, KvQuant::Q8, KvQuant::Q6, KvQuant::Q4}) {
    CAPTURE(simd::kv_quant_name(f));
    auto seg = make_segment(*t.model, f, 9, 3);
    auto path = test::temp_dir() / (std::string("seg-") + simd::kv_quant_name(f) + ".tws");
    REQUIRE(write_segment_file(posix_fs(), *seg, path, kFingerprint, kContext).ok());
    CHECK(!std::filesystem::exists(path.string() + ".tmp"));
    CHECK(std::filesystem::file_size(path) == encode_segment(*seg, kFingerprint, kContext).size());
    auto file = SegmentFile::open(path, t.model->config(), kFingerprint);
    REQUIRE_MESSAGE(file.ok(), file.error());
    REQUIRE(file.value()->verify().ok());
    CHECK(file.value()->header().context_xxh3 == kContext);
    auto back = file.value()->segment(t.model->config());
    REQUIRE_MESSAGE(back.ok(), back.error());
    const Segment& b = *back.value();
    CHECK(b.id() == 77);
    CHECK(b.parent() == 5);
    CHECK(b.computed_pos() == 3);
    CHECK(b.format() == f);
    CHECK(b.tokens() == seg->tokens());
    CHECK(test::to_vec(b.k_bytes()) == test::to_vec(seg->k_bytes()));
    CHECK(test::to_vec(b.v_bytes()) == test::to_vec(seg->v_bytes()));
    CHECK(test::to_vec(b.k_scales()) == test::to_vec(seg->k_scales()));
    CHECK(b.key_row(1, 4) == seg->key_row(1, 4));
    // In place: the segment's bytes are the mapping's, 64-byte aligned sections.
    const auto* base = reinterpret_cast<const uint8_t*>(file.value()->tokens().data()) - sizeof(segment_format::Header);
    CHECK(b.k_bytes().data() == base + file.value()->header().k_offset);
    CHECK(reinterpret_cast<uintptr_t>(b.v_bytes().data()) % segment_format::kSectionAlign == 0);
    // The mapping outlives the file object: the segment keeps it.
    file.value().reset();
    CHECK(b.key_row(1, 4) == seg->key_row(1, 4));
  }
}

TEST_CASE("opening checks the header against the record log: id, parent chain, tokens, format") {
  Tiny t;
  auto seg = make_segment(*t.model, KvQuant::Q8, 6, 3);
  auto path = test::temp_dir() / "expect.tws";
  REQUIRE(write_segment_file(posix_fs(), *seg, path, kFingerprint, kContext).ok());
  SegmentExpect ex;
  ex.id = 77;
  ex.parent = 5;
  ex.computed_pos = 3;
  ex.tokens = seg->tokens();
  ex.context_xxh3 = kContext;
  ex.format = KvQuant::Q8;
  CHECK(SegmentFile::open(path, t.model->config(), kFingerprint, &ex).ok());
  auto refused = [&](SegmentExpect e, const std::string& why) {
    auto f = SegmentFile::open(path, t.model->config(), kFingerprint, &e);
    REQUIRE(!f.ok());
    CHECK(f.status().is_corruption());
    CHECK_MESSAGE(f.error().find(why) != std::string::npos, f.error());
  };
  auto e = ex;
  e.id = 78;
  refused(e, "not 78");
  e = ex;
  e.parent = 6;
  refused(e, "another parent chain");
  e = ex;
  e.context_xxh3 = kContext + 1;
  refused(e, "another parent chain");
  e = ex;
  e.computed_pos = 4;
  refused(e, "another parent chain");
  auto other_tokens = seg->tokens();
  other_tokens[2] ^= 1;
  e = ex;
  e.tokens = other_tokens;
  refused(e, "other tokens");
  e = ex;
  e.format = KvQuant::Q4;
  refused(e, "another KV format");
  auto wrong = SegmentFile::open(path, t.model->config(), kFingerprint + 1);
  REQUIRE(!wrong.ok());
  CHECK(wrong.error().find("another model") != std::string::npos);
  ModelConfig other = t.model->config();
  other.n_layer += 1;
  CHECK(!SegmentFile::open(path, other, kFingerprint).ok());
  auto missing = SegmentFile::open(test::temp_dir() / "no-such-segment.tws", t.model->config(), kFingerprint);
  CHECK(missing.status().is_not_found());
}

TEST_CASE("every flipped byte and every truncation is refused") {
  Tiny t;
  auto seg = make_segment(*t.model, KvQuant::Q4, 3, 0);
  const auto good = encode_segment(*seg, kFingerprint, kContext);
  const auto path = write_bytes("flip.tws", good);
  REQUIRE(open_and_verify(path, t.model->config()).ok());
  int refused = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= 0x10;
    write_bytes("flip.tws", bad);
    Status st = open_and_verify(path, t.model->config());
    // Bytes in the zero padding between sections are covered by the payload checksum too.
    refused += !st.ok() && st.is_corruption();
  }
  CHECK(refused == static_cast<int>(good.size()));
  for (size_t n = 0; n < good.size(); ++n) {
    write_bytes("flip.tws", std::span(good).first(n));
    CHECK(!open_and_verify(path, t.model->config()).ok());
  }
  auto longer = good;
  longer.push_back(0);
  write_bytes("flip.tws", longer);
  CHECK(!open_and_verify(path, t.model->config()).ok());
}

TEST_CASE("populate, release and residency of a mapping") {
  Tiny t;
  auto seg = make_segment(*t.model, KvQuant::F32, 40, 0);
  auto path = test::temp_dir() / "resident.tws";
  REQUIRE(write_segment_file(posix_fs(), *seg, path, kFingerprint, kContext).ok());
  auto f = SegmentFile::open(path, t.model->config(), kFingerprint);
  REQUIRE(f.ok());
  f.value()->populate();
  CHECK(f.value()->resident_bytes() == f.value()->file_bytes());  // just written: in the page cache
  f.value()->release();  // drops this mapping's pages; the file's bytes are unchanged
  REQUIRE(f.value()->verify().ok());
}

TEST_CASE("the segment writer's io_uring batches write the same files as its posix writes") {
  Tiny t;
  std::vector<std::shared_ptr<const Segment>> segs;
  for (int i = 0; i < 5; ++i) segs.push_back(make_segment(*t.model, i % 2 ? KvQuant::Q8 : KvQuant::F16, 7 + i * 9, i));
  std::vector<std::vector<uint8_t>> bytes_by_io[2];
  for (auto io : {SegmentWriter::Io::Posix, SegmentWriter::Io::Uring}) {
    const auto dir = test::fresh_dir(io == SegmentWriter::Io::Uring ? "writer_uring" : "writer_posix");
    std::vector<Status> done;
    {
      SegmentWriter w(posix_fs(), kFingerprint, [&](const SegmentWriter::Job&, const Status& st) { done.push_back(st); }, io);
      if (io == SegmentWriter::Io::Uring && w.io() != io) {
        MESSAGE("io_uring not used here: " << w.io_note());
        CHECK(!w.io_note().empty());
        return;
      }
      for (size_t i = 0; i < segs.size(); ++i) w.submit({segs[i], dir / ("seg-" + std::to_string(i) + ".tws"), kContext, 0});
      w.flush();
    }
    REQUIRE(done.size() == segs.size());
    for (size_t i = 0; i < segs.size(); ++i) {
      CHECK(done[i].ok());
      const auto path = dir / ("seg-" + std::to_string(i) + ".tws");
      CHECK(!std::filesystem::exists(path.string() + ".tmp"));
      REQUIRE(open_and_verify(path, t.model->config()).ok());
      std::ifstream in(path, std::ios::binary);
      bytes_by_io[io == SegmentWriter::Io::Uring].emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  CHECK(bytes_by_io[0] == bytes_by_io[1]);
  // Through a file seam other than the real one, io_uring is not used, and the writer says why.
  test::FaultInjectionFS seam;
  SegmentWriter w(seam, kFingerprint, [](const SegmentWriter::Job&, const Status&) {}, SegmentWriter::Io::Uring);
  CHECK(w.io() == SegmentWriter::Io::Posix);
  CHECK(w.io_note().find("file seam") != std::string::npos);
}
