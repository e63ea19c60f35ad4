// Prefill matmuls through oneDNN's int8 GEMM (issue 26): s8 weights and s8 activations, each with one
// f32 scale per group of `group` elements along K, int32 sums from oneDNN, scales applied here. What it
// is for: the many-token steps (prefill, large batches), where oneDNN's GEMM beats our packed kernels;
// engine/ decides by shape when to call it. No oneDNN type appears here: towers_simd is built without
// oneDNN when it is absent (CMake option TOWERS_ONEDNN), and then onednn_available() is false.
//
// Arithmetic (docs/numerics.md, "oneDNN prefill kernels"): y[m][n] = sum over groups g, in order, of
// float(isum[m][n][g]) * (a_scale[m][g] * w_scale[n][g]), isum the exact int32 dot product of one group.
// The int32 sums are exact whatever oneDNN's blocking, so an output element depends only on its token's
// row and its weight row: never on M, on the row slice it was computed in, or on the thread count.
// Weights are 7-bit (-63..63): without VNNI, oneDNN's u8 x s8 kernel adds adjacent products in int16
// (vpmaddubsw), which saturates for 8-bit weights against 8-bit activations (255 * 127 * 2 > 32767).
#pragma once
#include <cstddef>
#include <cstdint>

namespace towers::simd {

// Whether this build has oneDNN and it runs on this CPU (its matmul primitive can be created).
bool onednn_available();
// "oneDNN 2.6.3 (gemm:jit, avx2)" or why it is not available; for the start-up log and benchmarks.
const char* onednn_describe();

constexpr int kOnednnWeightMax = 63;
constexpr int kOnednnActMax = 127;

// One weight row (k floats, k a multiple of group) -> k s8 in [-63, 63] and k / group scales.
void onednn_quantize_weights(const float* w, int8_t* q, float* scales, size_t k, size_t group);
// One activation row -> k s8 in [-127, 127] and k / group scales (round to nearest even).
void onednn_quantize_act(const float* x, int8_t* q, float* scales, size_t k, size_t group);

// y[m * ldy + n] = the product above for tokens m < M and weight rows n0 <= n < n1 of a matrix whose
// rows are k s8 apart (w, w_scales as onednn_quantize_weights wrote them, row after row), activations
// act[m * k ...], act_scales[m * (k / group) ...]. Runs on the calling thread only (oneDNN's OpenMP
// limited to one thread for it): callers split rows over their own pool. Thread-safe; the primitive of
// each (n1 - n0, k, group) is created once and cached. Returns false (y untouched) when not available.
bool onednn_gemm(const int8_t* w, const float* w_scales, size_t n0, size_t n1, const int8_t* act,
                 const float* act_scales, size_t M, size_t k, size_t group, float* y, size_t ldy);

// The same over all rows [0, n) in one oneDNN call on `threads` OpenMP threads (oneDNN's own split):
// the alternative to slices on our pool, kept to measure it (bench). Same results bit for bit.
bool onednn_gemm_omp(const int8_t* w, const float* w_scales, size_t n, const int8_t* act, const float* act_scales,
                     size_t M, size_t k, size_t group, float* y, size_t ldy, int threads);

// Weights packed once into oneDNN's own layout (whole-row scales only: group == k). With plain rows
// oneDNN re-packs the weights on every call and, for a run-time M, takes its generic GEMM: packed
// once, its VNNI/AMX kernels (brgemm) run on fixed tiles of kOnednnTileRows tokens: on a 1024 x 2048
// slice, one thread, AVX-512 VNNI, 2.5x at 16 tokens, 1.45x at 64, 1.16x at 512 (bench_onednn_pack).
// A matrix is packed in slices of kOnednnSliceRows rows (the last may be shorter), each slice
// a blob of its own, so that callers split the rows over their pool exactly as with plain rows. The
// int32 sums are the same exact integers, so the results equal onednn_gemm's bit for bit.
constexpr size_t kOnednnSliceRows = 1024;
constexpr size_t kOnednnTileRows = 64;
// Bytes of the packed copy of `rows` rows of k s8 weights (all its slices); 0 when this CPU's oneDNN
// has no packed layout for it (then keep plain rows and call onednn_gemm).
size_t onednn_packed_bytes(size_t rows, size_t k);
// Packs plain rows (rows x k s8, row after row) into `out` (onednn_packed_bytes(rows, k) bytes).
bool onednn_pack_weights(const int8_t* w, size_t rows, size_t k, uint8_t* out);
// As onednn_gemm for the rows of slice `slice` (rows [slice * kOnednnSliceRows, ...)) of a packed
// matrix of `rows` rows: y[m * ldy + n] for those rows n, tokens m < M (any M >= 1), w_scales and
// act_scales one per row. On the calling thread only; thread-safe.
bool onednn_gemm_packed(const uint8_t* packed, size_t rows, size_t slice, const float* w_scales, const int8_t* act,
                        const float* act_scales, size_t M, size_t k, float* y, size_t ldy);

}  // namespace towers::simd
