// towerctl perplexity: mean negative log-likelihood of a text file under a model.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "engine/model/forward.h"
#include "engine/generate/perplexity.h"
#include "engine/text/tokenizer.h"

namespace towers::cli {

void add_perplexity(CLI::App& app) {
  struct Opts {
    std::string model, file;
    int threads = 0;
    int ctx = 0;
    int batch = 512;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("perplexity",
                                 "Score a text file: tokenize (BOS first), evaluate, report the model's "
                                 "negative log-likelihood.\nThe last line is exactly:\n"
                                 "  tokens N predicted P nll_nats X bits_per_token Y total_bits Z\n"
                                 "where X is the mean NLL per predicted token in nats, Y the same in bits, "
                                 "Z the total in bits.\nTexts longer than the context are scored in "
                                 "consecutive windows of --ctx tokens (each window restarts the cache).");
  cmd->add_option("-m,--model", o->model, "GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-f,--file", o->file, "Text file to score")->required()->check(CLI::ExistingFile);
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0 = all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("-c,--ctx", o->ctx, "Window size in tokens (0 = the model's training context)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-b,--batch", o->batch, "Tokens per forward call")->check(CLI::Range(1, 1 << 16));
  cmd->callback([o] {
    auto model = Model::load(o->model);
    if (!model) std::exit(fail(model.error()));
    std::ifstream in(o->file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) std::exit(fail(o->file + ": cannot read"));
    ThreadPool pool(o->threads);
    PerplexityOptions popt;
    popt.window = o->ctx;
    popt.batch = o->batch;
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
