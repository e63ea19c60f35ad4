// Prefill through oneDNN against the fast kernels on a whole model (issue 26 item 1; docs/numerics.md,
// "oneDNN prefill kernels"). Builds the int8 copies, then for each prompt length times one prefill of
// each kernel set per run, alternating which goes first, so load from other processes falls on both:
// the per-run ratio is the number to read on a shared machine.
//
//   bench_prefill_onednn MODEL.gguf [threads=2] [runs=3] [prompts=64,128,512] [omp=0]
//
// omp=1: oneDNN's own OpenMP team of `threads` threads, one call per matrix, instead of row slices on
// our pool with one OpenMP thread per call (Forward::set_onednn_openmp); plain copies only: where the
// copies are packed in oneDNN's layout (this CPU has one) they always run on the pool, so omp=1 then
// measures the pool. Last line per prompt length:
//   bench_prefill_onednn prompt=N threads=T omp=0|1 pp_fast=<tok/s> pp_onednn=<tok/s> ratio=<median> min=.. max=..
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/model/forward.h"
#include "simd/onednn_matmul.h"

using namespace towers;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_prefill_onednn MODEL.gguf [threads=2] [runs=3] [prompts=64,128,512] [omp=0]\n");
    return 2;
  }
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int runs = std::max(1, argc > 3 ? std::atoi(argv[3]) : 3);
  const std::string prompts = argc > 4 ? argv[4] : "64,128,512";
  const bool omp = argc > 5 && std::atoi(argv[5]) != 0;
  auto loaded = Model::load(argv[1]);
  if (!loaded) {
    std::fprintf(stderr, "%s\n", loaded.error().c_str());
    return 1;
  }
  Model& model = **loaded;
  ThreadPool pool(threads);
  using clock = std::chrono::steady_clock;
  const auto c0 = clock::now();
  if (Status s = model.build_int8_copies(pool); !s) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  std::printf("%s; int8 copies %.1f MB built in %.2f s; %d threads, %s\n", simd::onednn_describe(),
              model.int8_copy_bytes() / 1e6, std::chrono::duration<double>(clock::now() - c0).count(), pool.size(),
              omp ? "oneDNN's OpenMP team" : "row slices on the pool, one OpenMP thread per call");
  Forward fwd(model, pool);
  fwd.set_onednn_openmp(omp);
  const ModelConfig& cfg = model.config();
  for (const char* p = prompts.c_str(); *p;) {
    const int n = static_cast<int>(std::strtol(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
    if (n <= 0) continue;
    std::vector<int32_t> prompt(n);  // token ids spread over the vocabulary, as towerctl bench's
    for (int i = 0; i < n; ++i) prompt[i] = static_cast<int32_t>((i * 7919u + 13) % cfg.n_vocab);
    std::vector<double> fast, onednn, ratio;
    std::vector<float> logits;
    for (int r = 0; r < runs; ++r) {
      double seconds[2] = {0, 0};  // [fast, oneDNN]
      for (int k = 0; k < 2; ++k) {
        const bool on = (k == 0) == (r % 2 == 1);
        fwd.set_onednn_min_tokens(on ? 1 : 0);
        DenseKvCache cache(cfg, n + 1);
        const auto t0 = clock::now();
        if (Status s = fwd.eval(cache, prompt, Logits::Last, logits); !s) {
          std::fprintf(stderr, "%s\n", s.message().c_str());
          return 1;
        }
        seconds[on] = std::chrono::duration<double>(clock::now() - t0).count();
      }
      fast.push_back(n / seconds[0]);
      onednn.push_back(n / seconds[1]);
      ratio.push_back(seconds[0] / seconds[1]);
      std::fprintf(stderr, "pp%d run %d/%d: fast %.1f tok/s, oneDNN %.1f tok/s (%.2fx)\n", n, r + 1, runs, fast.back(),
                   onednn.back(), ratio.back());
    }
    for (auto* v : {&fast, &onednn, &ratio}) std::sort(v->begin(), v->end());
    std::printf("bench_prefill_onednn prompt=%d threads=%d omp=%d pp_fast=%.2f pp_onednn=%.2f ratio=%.3f min=%.3f max=%.3f\n",
                n, pool.size(), omp ? 1 : 0, fast[runs / 2], onednn[runs / 2], ratio[runs / 2], ratio.front(),
                ratio.back());
    std::fflush(stdout);
  }
  return 0;
}
