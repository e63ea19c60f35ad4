// What the background compressor costs the serving path: decode tokens/s of the serving forward pass
// alone, then with the compressor's work (arithmetic-coding a token stream with its own Forward, on a
// SCHED_IDLE thread — exactly what mmapstore/compressor.h runs) going on beside it, alternating, median
// of the runs (each at least a second of decoding). Also how much coding the compressor got done meanwhile.
//   bench_compressor [--model M.gguf] [--threads T] [--tokens N] [--runs R]
// Ends with: compressor serve_tok_s_alone=A serve_tok_s_with=B slowdown_pct=P compressor_tok_s=C
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "engine/codec/codec.h"
#include "engine/model/forward.h"

using namespace towers;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Greedy decodes of n tokens after a short prompt, repeated for at least a second; tokens per second.
double serve(const Model& model, Forward& fwd, int n) {
  const auto t0 = Clock::now();
  long done = 0;
  while (done == 0 || Clock::now() - t0 < std::chrono::seconds(1)) {
    DenseKvCache cache(model.config(), n + 8);
    std::vector<int32_t> tok = {1, 2, 3, 4};
    std::vector<float> logits;
    (void)fwd.eval(cache, tok, Logits::Last, logits);
    for (int i = 0; i < n; ++i, ++done) {
      int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (!fwd.eval(cache, std::span(&next, 1), Logits::Last, logits).ok()) break;
    }
  }
  return done / std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = std::string(TOWERS_SHARED_DEFAULT) + "/models/stories260K.gguf";
  int threads = 2, tokens = 200, runs = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") model_path = argv[i + 1];
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--tokens") tokens = std::atoi(argv[i + 1]);
    else if (a == "--runs") runs = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_compressor [--model M.gguf] [--threads T] [--tokens N] [--runs R]\n");
      return 2;
    }
  }
  if (tokens < 1 || runs < 1 || threads < 1) {
    std::fprintf(stderr, "bench_compressor: --tokens, --runs and --threads must be >= 1\n");
    return 2;
  }
  auto m = Model::load(model_path);
  if (!m.ok()) {
    std::fprintf(stderr, "bench_compressor: %s\n", m.error().c_str());
    return 1;
  }
  const Model& model = *m.value();
  tokens = std::min(tokens, model.config().n_ctx_train - 16);
  ThreadPool pool(threads);
  Forward fwd(model, pool);

  // The compressor's work: code a stream of segments of 128 tokens, over and over, at SCHED_IDLE.
  std::atomic<bool> run_bg{false}, stop{false};
  std::atomic<long> coded{0};
  std::thread bg([&] {
    sched_param p{};
    const bool idle = pthread_setschedparam(pthread_self(), SCHED_IDLE, &p) == 0;
    if (!idle) std::fprintf(stderr, "bench_compressor: SCHED_IDLE refused; the compressor runs at normal priority\n");
    ThreadPool one(1);
    Forward cf(model, one);
    Codec codec(model, uint64_t{1});
    std::mt19937 rng(1);
    std::vector<int32_t> seg(128);
    while (!stop.load()) {
      if (!run_bg.load()) {  // parked between measurements (costs nothing to the "alone" runs)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      for (auto& t : seg) t = static_cast<int32_t>(rng() % model.config().n_vocab);
      if (codec.encode(cf, {}, seg).ok()) coded.fetch_add(static_cast<long>(seg.size()));
    }
  });

  std::vector<double> alone, with, bg_rate;
  serve(model, fwd, std::min(tokens, 32));  // warm up
  for (int r = 0; r < runs; ++r) {
    run_bg = false;
    alone.push_back(serve(model, fwd, tokens));
    coded = 0;
    run_bg = true;
    const auto t0 = Clock::now();
    with.push_back(serve(model, fwd, tokens));
    bg_rate.push_back(coded.load() / std::chrono::duration<double>(Clock::now() - t0).count());
    run_bg = false;
    std::printf("run %d: serving alone %.1f tok/s, with compressor %.1f tok/s, compressor coded %.0f tok/s\n", r + 1,
                alone.back(), with.back(), bg_rate.back());
  }
  stop = true;
  bg.join();
  const double a = median(alone), w = median(with);
  std::printf("compressor serve_tok_s_alone=%.1f serve_tok_s_with=%.1f slowdown_pct=%.1f compressor_tok_s=%.0f\n", a, w,
              100.0 * (a - w) / a, median(bg_rate));
  return 0;
}
