// towerctl perplexity: mean negative log-likelihood of a text file under a model, or (with
// --kl-divergence-base) the KL divergence from llama.cpp's logits of a base model.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/attention_option.h"
#include "cli/commands.h"
#include "engine/generate/kl_divergence.h"
#include "engine/generate/perplexity.h"
#include "engine/model/forward.h"
#include "engine/text/tokenizer.h"
#include "simd/onednn_matmul.h"

namespace towers::cli {
namespace {

// The statistics llama-perplexity --kl-divergence prints, then the one line scripts read.
void print_kl_divergence(const std::string& model_path, const KlDivergenceResult& r) {
  const auto nll = r.mean_nll(), nll_base = r.mean_nll_base(), kld = r.mean_kld(), p_diff = r.mean_p_diff();
  std::printf("====== Perplexity statistics ======\n");
  std::printf("Mean PPL(Q)                   : %10.6f\n", std::exp(nll.first));
  std::printf("Mean PPL(base)                : %10.6f\n", std::exp(nll_base.first));
  std::printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f\n", nll.first - nll_base.first);
  std::printf("\n====== KL divergence statistics ======\n");
  std::printf("Mean    KLD: %10.6f ± %10.6f\n", kld.first, kld.second);
  std::printf("Maximum KLD: %10.6f\n", r.kld_quantile(1.0));
  std::printf("99.9%%   KLD: %10.6f\n", r.kld_quantile(0.999));
  std::printf("99.0%%   KLD: %10.6f\n", r.kld_quantile(0.99));
  std::printf("Median  KLD: %10.6f\n", r.kld_quantile(0.5));
  std::printf("10.0%%   KLD: %10.6f\n", r.kld_quantile(0.1));
  std::printf("Minimum KLD: %10.6f\n", r.kld_quantile(0.0));
  std::printf("\n====== Token probability statistics ======\n");
  std::printf("Mean    Δp: %6.3f ± %5.3f %%\n", 100 * p_diff.first, 100 * p_diff.second);
  std::printf("RMS Δp    : %6.3f %%\n", 100 * r.rms_p_diff());
  const double top = r.same_top_share();
  const double top_unc = r.count() > 1 ? std::sqrt(top * (1 - top) / (r.count() - 1)) : 0.0;
  std::printf("Same top p: %6.3f ± %5.3f %%\n", 100 * top, 100 * top_unc);
  std::printf("kld model=%s tokens=%zu mean_kld=%.6f same_top_pct=%.3f\n",
              std::filesystem::path(model_path).stem().string().c_str(), r.count(), kld.first, 100 * top);
}

}  // namespace

void add_perplexity(CLI::App& app) {
  struct Opts {
    std::string model, file, kl_base;
    int threads = 0;
    int ctx = 0;
    int batch = 512;
    bool reference = false, onednn = false;
    std::string attention = "int8";
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("perplexity",
                                 "Score a text file: tokenize (BOS first), evaluate, report the model's "
                                 "negative log-likelihood.\nThe last line is exactly:\n"
                                 "  tokens N predicted P nll_nats X bits_per_token Y total_bits Z\n"
                                 "where X is the mean NLL per predicted token in nats, Y the same in bits, "
                                 "Z the total in bits.\nTexts longer than the context are scored in "
                                 "consecutive windows of --ctx tokens (each window restarts the cache).\n\n"
                                 "With --kl-divergence-base FILE instead of --file: FILE is what llama.cpp's\n"
                                 "  llama-perplexity -m BASE.gguf -f TEXT -c N --kl-divergence-base FILE\n"
                                 "writes (the base model's log-probabilities and the tokens it scored); the same "
                                 "tokens are evaluated with --model and the statistics llama-perplexity "
                                 "--kl-divergence prints follow, the last line exactly:\n"
                                 "  kld model=NAME tokens=N mean_kld=K same_top_pct=P\n"
                                 "(N tokens scored, K the mean KL divergence in nats, P the share of tokens "
                                 "whose most likely next token is the same, in percent). A file whose "
                                 "vocabulary or tokens do not fit the model is refused.\n"
                                 "Example: towerctl perplexity -m q4_k_m.gguf --kl-divergence-base f16.kld");
  cmd->add_option("-m,--model", o->model, "GGUF model file")->required()->check(CLI::ExistingFile);
  auto* file = cmd->add_option("-f,--file", o->file, "Text file to score")->check(CLI::ExistingFile);
  auto* kl = cmd->add_option("--kl-divergence-base", o->kl_base,
                             "llama.cpp logits file of a base model (llama-perplexity --kl-divergence-base)")
                 ->check(CLI::ExistingFile);
  file->excludes(kl);
  cmd->add_flag("--reference", o->reference,
                "With --kl-divergence-base: use the reference kernels (dequantize + f32 dot) instead of the "
                "8-bit activation ones");
  cmd->add_flag("--onednn", o->onednn,
                "With --file: forward calls of >= 16 tokens (64 where oneDNN keeps plain rows) through oneDNN's int8 "
                "GEMM, as towerd with [model] onednn_prefill = true (docs/numerics.md, \"oneDNN prefill kernels\")")
      ->excludes(kl);
  add_attention_option(cmd, &o->attention,
                       "With --onednn, the attention of those calls: int8 (the default, as towerd), int8-scores or "
                       "exact (docs/numerics.md, \"int8 prefill attention\"): what it costs in NLL on a text");
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0 = all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("-c,--ctx", o->ctx, "Window size in tokens (0 = the model's training context)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-b,--batch", o->batch, "Tokens per forward call")->check(CLI::Range(1, 1 << 16));
  cmd->callback([o] {
    if (o->file.empty() && o->kl_base.empty()) std::exit(usage_error("perplexity needs --file or --kl-divergence-base"));
    auto model = Model::load(o->model);
    if (!model) std::exit(fail(model.error()));
    if (!o->kl_base.empty()) {
      auto base = BaseLogProbsFile::open(o->kl_base);
      if (!base) std::exit(fail(base.error()));
      ThreadPool pool(o->threads);
      KlDivergenceOptions kopt;
      kopt.batch = o->batch;
      kopt.kernels = o->reference ? Kernels::Reference : Kernels::Fast;
      kopt.on_chunk = [](int chunk, int n_chunk, const KlDivergenceResult& so_far) {
        std::fprintf(stderr, "kld: chunk %d/%d  tokens %zu  mean KLD %.6f  same top %.3f %%\n", chunk + 1, n_chunk,
                     so_far.count(), so_far.mean_kld().first, 100 * so_far.same_top_share());
      };
      auto r = kl_divergence(**model, pool, *base, kopt);
      if (!r) std::exit(fail(r.error()));
      print_kl_divergence(o->model, *r);
      return;
    }
    std::ifstream in(o->file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) std::exit(fail(o->file + ": cannot read"));
    ThreadPool pool(o->threads);
    PerplexityOptions popt;
    popt.window = o->ctx;
    popt.batch = o->batch;
    if (o->onednn) {
      if (!simd::onednn_available()) std::exit(fail(std::string("--onednn: ") + simd::onednn_describe()));
      if (Status s = (*model)->build_int8_copies(pool); !s) std::exit(fail("--onednn: " + s.message()));
      const int min_tokens = Forward::onednn_min_tokens_for(**model);
      const Forward::Int8Attention attention = attention_mode(o->attention);
      popt.configure_forward = [min_tokens, attention](Forward& f) {
        f.set_onednn_min_tokens(min_tokens);
        f.set_int8_attention(attention);
      };
      std::fprintf(stderr, "%s: int8 copies %.1f MB; calls of >= %d tokens use them, attention: %s\n",
                   simd::onednn_describe(), (*model)->int8_copy_bytes() / 1e6, min_tokens,
                   o->attention.c_str());
    }
    popt.progress = [](int done, int total) {
      std::fprintf(stderr, "\rperplexity: %d/%d tokens", done, total);
      if (done == total) std::fprintf(stderr, "\n");
    };
    auto r = perplexity(**model, pool, ss.str(), popt);
    if (!r) std::exit(fail(r.error()));
    std::printf("tokens %d predicted %d nll_nats %.6f bits_per_token %.6f total_bits %.3f\n", r->tokens,
                r->predicted, r->mean_nll_nats(), r->mean_nll_nats() / std::log(2.0),
                r->total_nll_nats / std::log(2.0));
  });
}

}  // namespace towers::cli
