// oneDNN's int8 GEMM for prefill (see onednn_matmul.h). Built with oneDNN when TOWERS_HAVE_ONEDNN is
// defined (CMake option TOWERS_ONEDNN); otherwise every entry point says "not available".
#include "simd/onednn_matmul.h"
#include "simd/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#ifdef TOWERS_HAVE_ONEDNN
#include <omp.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace towers::simd {

namespace {

// Symmetric quantization of one group: scale = max|v| / qmax, q = round-to-nearest-even(v / scale).
void quantize_groups(const float* v, int8_t* q, float* scales, size_t k, size_t group, int qmax) {
  for (size_t g = 0; g < k / group; ++g) scales[g] = quantize_symmetric_f32(v + g * group, q + g * group, group, qmax);
}

}  // namespace

void onednn_quantize_weights(const float* w, int8_t* q, float* scales, size_t k, size_t group) {
  quantize_groups(w, q, scales, k, group, kOnednnWeightMax);
}

void onednn_quantize_act(const float* x, int8_t* q, float* scales, size_t k, size_t group) {
  quantize_groups(x, q, scales, k, group, kOnednnActMax);
}

#ifdef TOWERS_HAVE_ONEDNN

namespace {

using dt = dnnl::memory::data_type;
using dim = dnnl::memory::dim;

// int32 sums of one group: src [M x group] s8 (row stride k) times weights [group x rows] s8 (rows k
// apart) into dst [M x rows] s32. M is a run-time dimension, so one primitive serves every token count.
struct GroupGemm {
  dnnl::memory::desc src, wei, dst, scratchpad;
  dnnl::matmul mm;
};

struct PackedGemm;

// Our pool's threads run these primitives at once: each passes its own scratchpad (by default oneDNN
// shares one global scratchpad between primitives, and brgemm uses it: two threads garbled it).
dnnl::primitive_attr own_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// This thread's scratchpad for a primitive whose scratchpad is `desc` (64-aligned, grown as needed).
dnnl::memory thread_scratchpad(const dnnl::memory::desc& desc, const dnnl::engine& eng) {
  thread_local std::vector<uint8_t> bytes;
  bytes.resize(desc.get_size() + 64);
  return dnnl::memory(desc, eng, bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64);
}

struct Runtime {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::string describe;
  bool ok = false;
  std::mutex mu;
  std::map<std::tuple<size_t, size_t, size_t>, std::shared_ptr<const GroupGemm>> cache;  // (rows, k, group)
  std::map<std::pair<size_t, size_t>, std::shared_ptr<const PackedGemm>> packed;         // (rows, k)

  std::shared_ptr<const PackedGemm> get_packed(size_t rows, size_t k);

  std::shared_ptr<const GroupGemm> get(size_t rows, size_t k, size_t group) {
    std::lock_guard lock(mu);
    auto& slot = cache[{rows, k, group}];
    if (!slot) {
      auto g = std::make_shared<GroupGemm>();
      const dim M = DNNL_RUNTIME_DIM_VAL, K = dim(group), N = dim(rows);
      g->src = dnnl::memory::desc({M, K}, dt::s8, dnnl::memory::dims{dim(k), 1});
      g->wei = dnnl::memory::desc({K, N}, dt::s8, dnnl::memory::dims{1, dim(k)});
      g->dst = dnnl::memory::desc({M, N}, dt::s32, dnnl::memory::dims{N, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(g->src, g->wei, g->dst), own_scratchpad(), eng);
      g->scratchpad = pd.scratchpad_desc();
      g->mm = dnnl::matmul(pd);
      slot = std::move(g);
    }
    return slot;
  }
};

// A slice of rows packed into oneDNN's layout, multiplied on fixed tiles of tokens: with a fixed M and
// weights in the layout it chose, oneDNN picks its VNNI/AMX kernels (brgemm). Steps of at least
// kOnednnTileRows tokens take tiles of that many; shorter ones tiles of kSmallTile (the same weight
// layout, checked), so that a 20-token step is not padded to 64.
constexpr size_t kSmallTile = 16;

struct Tile {
  dnnl::memory::desc src, dst, scratchpad;
  dnnl::matmul mm;
  size_t tokens = 0;  // 0: this tile size is not available
};

struct PackedGemm {
  dnnl::memory::desc wei;
  Tile big, small;
  bool packs = false;  // oneDNN chose a layout of its own (else: keep plain rows)
  size_t bytes = 0;    // the slice's blob, rounded up to 64
  const Tile& tile_for(size_t M) const { return M >= big.tokens || small.tokens == 0 ? big : small; }
};

// The tile's primitive; returns the weight layout oneDNN chose for it.
dnnl::memory::desc make_tile(const dnnl::engine& eng, size_t tokens, size_t rows, size_t k, Tile& t) {
  const dim M = dim(tokens), K = dim(k), N = dim(rows);
  t.src = dnnl::memory::desc({M, K}, dt::s8, dnnl::memory::dims{K, 1});
  t.dst = dnnl::memory::desc({M, N}, dt::s32, dnnl::memory::dims{N, 1});
  dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(t.src, dnnl::memory::desc({K, N}, dt::s8, dnnl::memory::format_tag::any), t.dst),
      own_scratchpad(), eng);
  t.scratchpad = pd.scratchpad_desc();
  t.mm = dnnl::matmul(pd);
  t.tokens = tokens;
  return pd.weights_desc();
}

std::shared_ptr<const PackedGemm> make_packed(const dnnl::engine& eng, size_t rows, size_t k) {
  auto g = std::make_shared<PackedGemm>();
  const dnnl::memory::desc plain({dim(k), dim(rows)}, dt::s8, dnnl::memory::dims{1, dim(k)});
  try {
    g->wei = make_tile(eng, kOnednnTileRows, rows, k, g->big);
    g->packs = g->wei != plain;
    g->bytes = (g->wei.get_size() + 63) / 64 * 64;
  } catch (const dnnl::error&) {
    g->packs = false;
    return g;
  }
  try {
    if (make_tile(eng, kSmallTile, rows, k, g->small) != g->wei) g->small = Tile{};
  } catch (const dnnl::error&) {
    g->small = Tile{};
  }
  return g;
}

Runtime& runtime() {
  static Runtime* rt = [] {
    auto* r = new Runtime;  // never destroyed: worker threads may still run at exit
    const dnnl::version_t* v = dnnl::version();
    char ver[64];
    std::snprintf(ver, sizeof ver, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
    try {
      dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(dnnl::memory::desc({64, 256}, dt::s8, dnnl::memory::format_tag::ab),
                             dnnl::memory::desc({256, 64}, dt::s8, dnnl::memory::format_tag::ba),
                             dnnl::memory::desc({64, 64}, dt::s32, dnnl::memory::format_tag::ab)),
          r->eng);
      r->describe = std::string(ver) + " (" + pd.impl_info_str() + ")";
      r->ok = true;
    } catch (const dnnl::error& e) {
      r->describe = std::string(ver) + ": no int8 matmul on this CPU (" + e.what() + ")";
    }
    return r;
  }();
  return *rt;
}

std::shared_ptr<const PackedGemm> Runtime::get_packed(size_t rows, size_t k) {
  std::lock_guard lock(mu);
  auto& slot = packed[{rows, k}];
  if (!slot) slot = make_packed(eng, rows, k);
  return slot;
}

// The slices of a packed matrix: all but the last are kOnednnSliceRows rows, so they are alike.
size_t slice_rows(size_t rows, size_t slice) {
  return std::min(kOnednnSliceRows, rows - slice * kOnednnSliceRows);
}
size_t slice_offset(size_t k, size_t slice) {
  return slice == 0 ? 0 : slice * runtime().get_packed(kOnednnSliceRows, k)->bytes;
}

// dst (+)= float(isum) * (a_scale * w_scale) for one group; the first group writes.
void apply_group(const int32_t* isum, size_t M, size_t rows, const float* act_scales, size_t groups, size_t g,
                 const float* w_scales, float* y, size_t ldy) {
  for (size_t m = 0; m < M; ++m) {
    const float as = act_scales[m * groups + g];
    const int32_t* s = isum + m * rows;
    float* out = y + m * ldy;
    if (groups == 1) {
      scale_i32_f32(s, as, w_scales, out, rows);
    } else if (g == 0) {
      for (size_t n = 0; n < rows; ++n) out[n] = static_cast<float>(s[n]) * (as * w_scales[n * groups]);
    } else {
      for (size_t n = 0; n < rows; ++n) out[n] += static_cast<float>(s[n]) * (as * w_scales[n * groups + g]);
    }
  }
}

// The groups of rows [0, rows) of w, in order, on the calling thread's OpenMP setting.
void run_groups(const int8_t* w, const float* w_scales, size_t rows, const int8_t* act, const float* act_scales,
                size_t M, size_t k, size_t group, float* y, size_t ldy) {
  Runtime& rt = runtime();
  const std::shared_ptr<const GroupGemm> gg = rt.get(rows, k, group);
  thread_local dnnl::stream strm(rt.eng);
  thread_local std::vector<int32_t> isum;
  isum.resize(M * rows);
  dnnl::memory pad = thread_scratchpad(gg->scratchpad, rt.eng);
  const dim Md = dim(M), Kd = dim(group), Nd = dim(rows);
  const dnnl::memory::desc src({Md, Kd}, dt::s8, dnnl::memory::dims{dim(k), 1});
  const dnnl::memory::desc dst({Md, Nd}, dt::s32, dnnl::memory::dims{Nd, 1});
  const size_t groups = k / group;
  for (size_t g = 0; g < groups; ++g) {
    dnnl::memory a(src, rt.eng, const_cast<int8_t*>(act + g * group));
    dnnl::memory b(gg->wei, rt.eng, const_cast<int8_t*>(w + g * group));
    dnnl::memory c(dst, rt.eng, isum.data());
    gg->mm.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, pad}});
    strm.wait();
    apply_group(isum.data(), M, rows, act_scales, groups, g, w_scales, y, ldy);
  }
}

}  // namespace

bool onednn_available() { return runtime().ok; }
const char* onednn_describe() { return runtime().describe.c_str(); }

bool onednn_gemm(const int8_t* w, const float* w_scales, size_t n0, size_t n1, const int8_t* act,
                 const float* act_scales, size_t M, size_t k, size_t group, float* y, size_t ldy) {
  if (!onednn_available() || n1 <= n0 || M == 0) return false;
  // Our pool's threads are the parallelism: oneDNN's OpenMP runs this call inline on this thread
  // (the setting is per thread; a second OpenMP team would fight the pool for the cores).
  omp_set_num_threads(1);
  const size_t groups = k / group;
  run_groups(w + n0 * k, w_scales + n0 * groups, n1 - n0, act, act_scales, M, k, group, y + n0, ldy);
  return true;
}

size_t onednn_packed_bytes(size_t rows, size_t k) {
  if (!onednn_available() || rows == 0 || k == 0) return 0;
  const size_t slices = (rows + kOnednnSliceRows - 1) / kOnednnSliceRows;
  size_t total = 0;
  for (size_t i = 0; i < slices; ++i) {
    const std::shared_ptr<const PackedGemm> g = runtime().get_packed(slice_rows(rows, i), k);
    if (!g->packs) return 0;
    total += g->bytes;
  }
  return total;
}

bool onednn_pack_weights(const int8_t* w, size_t rows, size_t k, uint8_t* out) {
  if (onednn_packed_bytes(rows, k) == 0) return false;
  Runtime& rt = runtime();
  dnnl::stream strm(rt.eng);
  const size_t slices = (rows + kOnednnSliceRows - 1) / kOnednnSliceRows;
  for (size_t i = 0; i < slices; ++i) {
    const size_t n = slice_rows(rows, i);
    const std::shared_ptr<const PackedGemm> g = rt.get_packed(n, k);
    const dnnl::memory::desc plain({dim(k), dim(n)}, dt::s8, dnnl::memory::dims{1, dim(k)});
    dnnl::memory from(plain, rt.eng, const_cast<int8_t*>(w + i * kOnednnSliceRows * k));
    dnnl::memory to(g->wei, rt.eng, out + slice_offset(k, i));
    dnnl::reorder(from, to).execute(strm, from, to);
    strm.wait();
  }
  return true;
}

bool onednn_gemm_packed(const uint8_t* packed, size_t rows, size_t slice, const float* w_scales, const int8_t* act,
                        const float* act_scales, size_t M, size_t k, float* y, size_t ldy) {
  if (!onednn_available() || M == 0 || slice * kOnednnSliceRows >= rows) return false;
  omp_set_num_threads(1);  // as onednn_gemm: our pool is the parallelism
  Runtime& rt = runtime();
  const size_t r0 = slice * kOnednnSliceRows, n = slice_rows(rows, slice);
  const std::shared_ptr<const PackedGemm> g = rt.get_packed(n, k);
  if (!g->packs) return false;
  const Tile& tile = g->tile_for(M);
  const size_t kTile = tile.tokens;
  thread_local dnnl::stream strm(rt.eng);
  thread_local std::vector<int32_t> isum;
  thread_local std::vector<int8_t> padded;  // fewer than kTile tokens: their rows, then zeros
  isum.resize(kTile * n);
  dnnl::memory pad = thread_scratchpad(tile.scratchpad, rt.eng);
  dnnl::memory b(g->wei, rt.eng, const_cast<uint8_t*>(packed + slice_offset(k, slice)));
  dnnl::memory c(tile.dst, rt.eng, isum.data());
  // Tiles of kTile tokens; the last one ends at M and overlaps the one before it (its sums for the
  // overlapping tokens are the same exact integers): no padding, one primitive for every M >= kTile.
  for (size_t done = 0; done < M;) {
    const int8_t* a = nullptr;
    size_t start = 0;
    if (M < kTile) {
      padded.assign(kTile * k, 0);
      std::copy(act, act + M * k, padded.begin());
      a = padded.data();
    } else {
      start = std::min(done, M - kTile);
      a = act + start * k;
    }
    dnnl::memory src(tile.src, rt.eng, const_cast<int8_t*>(a));
    tile.mm.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, pad}});
    strm.wait();
    const size_t end = std::min(start + kTile, M);
    apply_group(isum.data() + (done - start) * n, end - done, n, act_scales + done, 1, 0, w_scales + r0,
                y + done * ldy + r0, ldy);
    done = end;
  }
  return true;
}

bool onednn_gemm_omp(const int8_t* w, const float* w_scales, size_t n, const int8_t* act, const float* act_scales,
                     size_t M, size_t k, size_t group, float* y, size_t ldy, int threads) {
  if (!onednn_available() || n == 0 || M == 0) return false;
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  run_groups(w, w_scales, n, act, act_scales, M, k, group, y, ldy);
  omp_set_num_threads(before);
  return true;
}

#else  // !TOWERS_HAVE_ONEDNN

bool onednn_available() { return false; }
const char* onednn_describe() { return "oneDNN: not in this build (TOWERS_ONEDNN off or libdnnl-dev absent)"; }
bool onednn_gemm(const int8_t*, const float*, size_t, size_t, const int8_t*, const float*, size_t, size_t, size_t,
                 float*, size_t) {
  return false;
}
bool onednn_gemm_omp(const int8_t*, const float*, size_t, const int8_t*, const float*, size_t, size_t, size_t, float*,
                     size_t, int) {
  return false;
}
size_t onednn_packed_bytes(size_t, size_t) { return 0; }
bool onednn_pack_weights(const int8_t*, size_t, size_t, uint8_t*) { return false; }
bool onednn_gemm_packed(const uint8_t*, size_t, size_t, const float*, const int8_t*, const float*, size_t, size_t, float*,
                        size_t) {
  return false;
}

#endif

}  // namespace towers::simd
