// Attention kernels at long context: one layer's attention for 1 query token (decode) against n cached
// rows, Llama-3.2-1B shapes (32 query heads, 8 KV heads, head_dim 64), every KV format, single thread.
// Prints ns per cached row (for the whole layer: all heads) for
//   old:  the loop Forward::attention had before kv_attend (per query head: kv_dot_many over a block
//         of 128, scalar scale/max and std::exp per score, kv_accumulate),
//   turns: kv_attend as it was before the group kernels (the query heads of a KV head take turns on
//         each block of 128: kv_dot_many, softmax_block, kv_accumulate per head; rebuilt here from the
//         public kernels),
//   new:  simd::kv_attend (kv_dot_group / kv_accumulate_group: each K/V vector decoded once for the
//         group's query heads; bit-identical to "turns").
// "hot": one layer's cache, the same every call (small n stays in L2/L3); "cold": rotating over 16
// layers' caches (at most 512 MiB), as a decode step reads them.
//   bench_attention [seconds_per_measurement] [n_head n_head_kv head_dim]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "simd/attention.h"
#include "bench/timing.h"
#include "simd/kv_quant.h"
#include "simd/ops.h"

using namespace towers::simd;

namespace {

template <class Fn>
double time_it(double secs, Fn&& fn) {
  return towers::bench::best_seconds_per_call(secs, 15, fn);
}

struct Shape {
  int n_head, n_kv, hd;
};

// One layer's K and V for n rows: row r holds every KV head's vector (row_bytes apart), as a span.
struct LayerKv {
  std::vector<uint8_t> k, v;
};

// The previous Forward::attention inner loop, for one query head over one span.
void attend_old(KvQuant q, const float* qv, const uint8_t* k, const uint8_t* v, size_t stride, int n, int hd,
                float scale, float* out) {
  constexpr int kBlock = 128;
  float scores[kBlock], probs[kBlock], acc[kKvMaxDim];
  float m = -INFINITY, l = 0.0f;
  std::fill(acc, acc + hd, 0.0f);
  for (int j0 = 0; j0 < n; j0 += kBlock) {
    const int nb = std::min(kBlock, n - j0);
    kv_dot_many(q, qv, k + size_t(j0) * stride, stride, nb, hd, scores);
    float bmax = -INFINITY;
    for (int j = 0; j < nb; ++j) {
      scores[j] *= scale;
      bmax = std::max(bmax, scores[j]);
    }
    if (bmax > m) {
      const float c = std::exp(m - bmax);
      for (int e = 0; e < hd; ++e) acc[e] *= c;
      l *= c;
      m = bmax;
    }
    for (int j = 0; j < nb; ++j) {
      probs[j] = std::exp(scores[j] - m);
      l += probs[j];
    }
    kv_accumulate(q, probs, v + size_t(j0) * stride, stride, nb, hd, acc);
  }
  for (int e = 0; e < hd; ++e) out[e] = acc[e] / l;
}

void layer_old(KvQuant q, const Shape& s, const float* qv, const LayerKv& kv, int n, float* out) {
  const size_t vb = kv_vec_bytes(q, s.hd), row = vb * s.n_kv;
  const int group = s.n_head / s.n_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  for (int h = 0; h < s.n_head; ++h) {
    const int kvh = h / group;
    attend_old(q, qv + size_t(h) * s.hd, kv.k.data() + kvh * vb, kv.v.data() + kvh * vb, row, n, s.hd, scale,
               out + size_t(h) * s.hd);
  }
}

// kv_attend before the group kernels: per block, the group's queries one after the other.
void attend_turns(KvQuant q, const float* qv, int n_q, const uint8_t* k, const uint8_t* v, size_t stride, int n,
                  int dim, float scale, float* m, float* l, float* acc) {
  float s[kAttnBlock];
  for (int j0 = 0; j0 < n; j0 += kAttnBlock) {
    const int nb = std::min(kAttnBlock, n - j0);
    for (int g = 0; g < n_q; ++g) {
      kv_dot_many(q, qv + size_t(g) * dim, k + size_t(j0) * stride, stride, nb, dim, s);
      const float c = softmax_block(s, nb, scale, m + g, l + g, s);
      float* a = acc + size_t(g) * dim;
      if (c != 1.0f) {
        for (int e = 0; e < dim; ++e) a[e] *= c;
      }
      kv_accumulate(q, s, v + size_t(j0) * stride, stride, nb, dim, a);
    }
  }
}

template <bool kTurns>
void layer_attend(KvQuant q, const Shape& s, const float* qv, const LayerKv& kv, int n, float* out) {
  const size_t vb = kv_vec_bytes(q, s.hd), row = vb * s.n_kv;
  const int group = s.n_head / s.n_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  float m[64], l[64];
  std::vector<float> acc(size_t(group) * s.hd);
  for (int kvh = 0; kvh < s.n_kv; ++kvh) {
    std::fill(m, m + group, -INFINITY);
    std::fill(l, l + group, 0.0f);
    std::fill(acc.begin(), acc.end(), 0.0f);
    if constexpr (kTurns) {
      attend_turns(q, qv + size_t(kvh) * group * s.hd, group, kv.k.data() + kvh * vb, kv.v.data() + kvh * vb, row,
                   n, s.hd, scale, m, l, acc.data());
    } else {
      kv_attend(q, qv + size_t(kvh) * group * s.hd, group, kv.k.data() + kvh * vb, kv.v.data() + kvh * vb, row, n,
                s.hd, scale, m, l, acc.data());
    }
    for (int g = 0; g < group; ++g) {
      for (int e = 0; e < s.hd; ++e) out[(size_t(kvh) * group + g) * s.hd + e] = acc[size_t(g) * s.hd + e] / l[g];
    }
  }
}

void layer_turns(KvQuant q, const Shape& s, const float* qv, const LayerKv& kv, int n, float* out) {
  layer_attend<true>(q, s, qv, kv, n, out);
}
void layer_new(KvQuant q, const Shape& s, const float* qv, const LayerKv& kv, int n, float* out) {
  layer_attend<false>(q, s, qv, kv, n, out);
}

volatile float g_sink;

}  // namespace

int main(int argc, char** argv) {
  const double secs = argc > 1 ? std::atof(argv[1]) : 1.0;
  Shape s{32, 8, 64};
  if (argc > 4) s = {std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4])};
  const KvQuant formats[] = {KvQuant::F32, KvQuant::F16, KvQuant::Q8, KvQuant::Q6, KvQuant::Q4};
  const int lengths[] = {512, 1024, 2048, 4096};
  std::printf("Highway target: %s; one layer, 1 query token, %d heads / %d KV heads, head_dim %d, 1 thread\n",
              target_name(), s.n_head, s.n_kv, s.hd);
  std::printf("ns per cached row (whole layer); x = turns / new\n");
  std::printf("%-4s %5s | %8s %9s %8s %5s | %8s %9s %8s %5s | %s\n", "fmt", "n", "old hot", "turns hot",
              "new hot", "x", "old cold", "turns cold", "new cold", "x", "max |new-old| / max |old|, new==turns");
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> qv(size_t(s.n_head) * s.hd), out_old(qv.size()), out_new(qv.size()), out_turns(qv.size());
  for (float& x : qv) x = nd(rng);
  for (KvQuant q : formats) {
    const size_t vb = kv_vec_bytes(q, s.hd), row = vb * s.n_kv;
    for (int n : lengths) {
      const size_t layer_bytes = 2 * row * n;
      const int layers = static_cast<int>(std::clamp<size_t>((512u << 20) / layer_bytes, 1, 16));
      std::vector<LayerKv> kv(layers);
      std::vector<float> x(s.hd);
      for (int L = 0; L < layers; ++L) {
        kv[L].k.resize(row * n);
        kv[L].v.resize(row * n);
        for (int r = 0; r < n; ++r) {
          for (int h = 0; h < s.n_kv; ++h) {
            for (float& e : x) e = nd(rng);
            kv_quantize(q, x.data(), kv[L].k.data() + r * row + h * vb, s.hd);
            for (float& e : x) e = nd(rng);
            kv_quantize(q, x.data(), kv[L].v.data() + r * row + h * vb, s.hd);
          }
        }
      }
      layer_old(q, s, qv.data(), kv[0], n, out_old.data());
      layer_new(q, s, qv.data(), kv[0], n, out_new.data());
      layer_turns(q, s, qv.data(), kv[0], n, out_turns.data());
      const bool same = std::memcmp(out_new.data(), out_turns.data(), out_new.size() * sizeof(float)) == 0;
      double diff = 0, mag = 0;
      for (size_t i = 0; i < qv.size(); ++i) {
        diff = std::max(diff, double(std::fabs(out_new[i] - out_old[i])));
        mag = std::max(mag, double(std::fabs(out_old[i])));
      }
      const double oh = time_it(secs, [&] {
        layer_old(q, s, qv.data(), kv[0], n, out_old.data());
        g_sink = out_old[0];
      });
      const double nh = time_it(secs, [&] {
        layer_new(q, s, qv.data(), kv[0], n, out_new.data());
        g_sink = out_new[0];
      });
      const double th = time_it(secs, [&] {
        layer_turns(q, s, qv.data(), kv[0], n, out_turns.data());
        g_sink = out_turns[0];
      });
      int li = 0;
      const double oc = time_it(secs, [&] {
        layer_old(q, s, qv.data(), kv[li], n, out_old.data());
        li = (li + 1) % layers;
        g_sink = out_old[0];
      });
      li = 0;
      const double tc = time_it(secs, [&] {
        layer_turns(q, s, qv.data(), kv[li], n, out_turns.data());
        li = (li + 1) % layers;
        g_sink = out_turns[0];
      });
      li = 0;
      const double nc = time_it(secs, [&] {
        layer_new(q, s, qv.data(), kv[li], n, out_new.data());
        li = (li + 1) % layers;
        g_sink = out_new[0];
      });
      std::printf("%-4s %5d | %8.1f %9.1f %8.1f %5.2f | %8.1f %9.1f %8.1f %5.2f | %.2e %s  (%d layers, %.1f MiB each)\n",
                  kv_quant_name(q), n, oh * 1e9 / n, th * 1e9 / n, nh * 1e9 / n, th / nh, oc * 1e9 / n,
                  tc * 1e9 / n, nc * 1e9 / n, tc / nc, diff / mag, same ? "yes" : "NO", layers,
                  layer_bytes / 1048576.0);
      std::fflush(stdout);
    }
  }
  return 0;
}
