// towerctl bench: prefill and decode speed of a model on this machine, next to the machine's measured
// memory bandwidth and the decode roofline it implies (decode streams every weight it uses once per step:
// all of a dense model's, a mixture of experts' shared ones and chosen experts; the forward pass counts them).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "cli/attention_option.h"
#include "cli/commands.h"
#include "engine/model/forward.h"
#include "engine/base/membw.h"
#include "engine/model/segment.h"
#include "engine/text/tokenizer.h"
#include "simd/onednn_matmul.h"

namespace towers::cli {
namespace {

struct Stats {
  double median, min, max;
};
Stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

std::string dominant_type(const Model& m) {
  std::map<std::string, uint64_t> bytes;
  for (const auto& t : m.file().tensors()) bytes[std::string(ggml_type_name(t.type))] += t.nbytes;
  return std::max_element(bytes.begin(), bytes.end(), [](auto& a, auto& b) { return a.second < b.second; })
      ->first;
}

}  // namespace

void add_bench(CLI::App& app) {
  struct Opts {
    std::string model;
    int threads = 0, prompt = 512, gen = 128, runs = 5, batch = 1, context = 0, context_batch = 512;
    std::string context_format = "q8";
    bool reference = false, onednn = false;
    std::string attention = "int8";
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "bench",
      "Measure prefill (pp) and decode (tg) tokens/s: median, min and max of --runs runs, plus this "
      "machine's memory bandwidth (a STREAM-triad loop) and the decode roofline bandwidth / bytes read "
      "per token. The last line is exactly:\n"
      "  bench model=NAME type=TYPE threads=T pp=<tok/s> tg=<tok/s> roofline_tg=<tok/s> bw_gbs=<GB/s>");
  cmd->add_option("-m,--model", o->model, "GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0 = all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--prompt", o->prompt, "Prompt tokens for the prefill test")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--gen", o->gen, "Tokens for the decode test")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--runs", o->runs, "Repetitions (median reported)")->check(CLI::Range(1, 1000));
  cmd->add_option("--batch", o->batch, "Sequences decoding together: each decode step is one eval_batch of B sequences, one token each "
                  "(the daemon's load with B sessions generating at once). tg counts all B sequences' tokens, and "
                  "the roofline is B x bandwidth / bytes read per step, since one step reads the weights once")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--context", o->context,
                  "Also measure decode after N tokens of context: prefill N tokens once (in --context-batch "
                  "chunks, timed, progress on stderr) into a tower, seal it into a segment of --context-format, "
                  "then time --gen decode tokens --runs times on a tower over that segment, with the share of "
                  "time spent in attention. Printed on a line of its own (bench_context ... format=F ...) "
                  "before the last line")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--context-format", o->context_format,
                  "KV format of the --context: it is prefilled into a tower's tail, sealed into a segment of "
                  "this format (as towerd seals transcripts by default: q8; shared bases q4/q6/q8 by depth), and decode "
                  "runs on a tower over that segment")
      ->check(CLI::IsMember({"f32", "f16", "q8", "q6", "q4"}));
  cmd->add_option("--context-batch", o->context_batch, "Tokens per eval call when prefilling the --context")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_flag("--reference", o->reference, "Use the reference kernels (dequantize + f32 dot)");
  cmd->add_flag("--onednn", o->onednn,
                "Prefill steps of >= 16 tokens (64 where oneDNN keeps plain rows) through oneDNN's int8 GEMM, as towerd with [model] onednn_prefill = "
                "true: the 7-bit copies of the layer matrices are built first (time and size on stderr); decode "
                "and shorter steps keep the fast kernels (docs/numerics.md, \"oneDNN prefill kernels\")")
      ->excludes("--reference");
  add_attention_option(cmd, &o->attention,
                       "With --onednn, the attention of its steps: int8 (the default, as towerd with [model] "
                       "int8_attention = true: whole 128-row blocks of F32/F16 KV rows scored and summed with int8 "
                       "products where the CPU has AVX-512 VNNI), int8-scores (int8 scores, f32 sums) or exact (the "
                       "kernels decode uses) (docs/numerics.md, \"int8 prefill attention\")");
  cmd->callback([o] {
    auto loaded = Model::load(o->model);
    if (!loaded) std::exit(fail(loaded.error()));
    Model& model = **loaded;
    const ModelConfig& cfg = model.config();
    ThreadPool pool(o->threads);
    Forward fwd(model, pool, o->reference ? Kernels::Reference : Kernels::Fast);
    if (o->onednn) {
      if (!simd::onednn_available()) std::exit(fail(std::string("--onednn: ") + simd::onednn_describe()));
      const auto t0 = std::chrono::steady_clock::now();
      if (Status s = model.build_int8_copies(pool); !s) std::exit(fail("--onednn: " + s.message()));
      const int min_tokens = Forward::onednn_min_tokens_for(model);
      std::fprintf(stderr, "%s: int8 copies %.1f MB (%s) built in %.1f s; steps of >= %d tokens use them\n",
                   simd::onednn_describe(), model.int8_copy_bytes() / 1e6,
                   model.int8_copies_packed() ? "packed in oneDNN's layout" : "plain rows",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), min_tokens);
      fwd.set_onednn_min_tokens(min_tokens);
      fwd.set_int8_attention(attention_mode(o->attention));
      std::fprintf(stderr, "attention in those steps: %s\n",
                   !fwd.int8_attention_for(1 << 30) ? "exact kernels"
                   : o->attention == "int8"
                       ? "int8 scores and sums on whole blocks of F32/F16 rows (AVX-512 VNNI)"
                       : "int8 scores on whole blocks of F32/F16 rows (AVX-512 VNNI), f32 sums");
    }
    const int ctx = std::min(cfg.n_ctx_train, o->prompt + o->gen + 1);
    // Token ids spread over the vocabulary, fixed for reproducibility.
    std::vector<int32_t> prompt(o->prompt);
    for (int i = 0; i < o->prompt; ++i) prompt[i] = static_cast<int32_t>((i * 7919u + 13) % cfg.n_vocab);
    std::vector<float> logits;
    using clock = std::chrono::steady_clock;
    std::vector<double> pp, tg;
    // Weight bytes a decode step reads, as the forward pass counts them: every matrix once per step
    // (of a mixture of experts only the experts chosen in that step), one embedding row per token.
    uint64_t decode_bytes = 0, decode_steps = 0;
    // The bandwidth of a shared machine drifts (other tenants): a triad before every run, and the
    // best of all of them is the roofline, so a lucky decode run cannot beat an unlucky triad.
    double bw = 0;
    for (int run = 0; run < o->runs; ++run) {
      bw = std::max(bw, measure_memory_bandwidth(pool, size_t(256) << 20, 2));
      DenseKvCache cache(cfg, ctx);
      auto t0 = clock::now();
      if (auto s = fwd.eval(cache, prompt, Logits::Last, logits); !s) std::exit(fail(s.message()));
      double dt = std::chrono::duration<double>(clock::now() - t0).count();
      pp.push_back(o->prompt / dt);

      // --batch sequences decode together: one eval_batch per step, one token of each (greedy).
      const int B = o->batch;
      std::vector<DenseKvCache> dcaches;
      dcaches.reserve(B);
      std::vector<int32_t> toks(B);
      std::vector<Forward::Sequence> seqs;
      for (int b = 0; b < B; ++b) {
        dcaches.emplace_back(cfg, o->gen + 1);
        toks[b] = prompt[b % prompt.size()];
      }
      for (int b = 0; b < B; ++b) seqs.push_back({&dcaches[b], std::span<const int32_t>(&toks[b], 1)});
      const size_t V = static_cast<size_t>(cfg.n_vocab);
      fwd.reset_weight_bytes_read();
      t0 = clock::now();
      for (int i = 0; i < o->gen; ++i) {
        if (auto s = fwd.eval_batch(seqs, logits); !s) std::exit(fail(s.message()));
        for (int b = 0; b < B; ++b) {
          const float* row = logits.data() + size_t(b) * V;
          toks[b] = static_cast<int32_t>(std::max_element(row, row + V) - row);
        }
      }
      dt = std::chrono::duration<double>(clock::now() - t0).count();
      decode_bytes += fwd.weight_bytes_read(), decode_steps += o->gen;
      tg.push_back(double(B) * o->gen / dt);
      std::fprintf(stderr, "run %d/%d: pp %.1f tok/s, tg %.2f tok/s\n", run + 1, o->runs, pp.back(), tg.back());
    }
    // Decode at a long context: prefill once, then every run truncates back to the context and decodes.
    struct ContextResult {
      double pp = 0, pp_attn = 0;
      Stats tg{}, attn{};
      const char* format = "";
    } cr;
    if (o->context > 0) {
      const int n = o->context;
      if (cfg.n_ctx_train > 0 && n + o->gen + 1 > cfg.n_ctx_train) {
        std::exit(fail("--context " + std::to_string(n) + " + --gen exceeds the model's context of " +
                       std::to_string(cfg.n_ctx_train)));
      }
      std::vector<int32_t> ctx_tokens(n);
      for (int i = 0; i < n; ++i) ctx_tokens[i] = static_cast<int32_t>((i * 7919u + 13) % cfg.n_vocab);
      simd::KvQuant format = simd::KvQuant::F16;
      for (auto q : {simd::KvQuant::F32, simd::KvQuant::F16, simd::KvQuant::Q8, simd::KvQuant::Q6,
                     simd::KvQuant::Q4}) {
        if (o->context_format == simd::kv_quant_name(q)) format = q;
      }
      cr.format = simd::kv_quant_name(format);
      // What towerd runs: the context is prefilled into a tower's F32 tail, sealed into a segment of
      // the chosen format, and decoding happens on a tower over that segment (its own tail for the
      // new tokens).
      std::shared_ptr<const Segment> seg;
      fwd.set_attention_timing(true);
      fwd.reset_attention_seconds();
      auto t0 = clock::now();
      {
        Tower prefill(cfg, {}, n);
        for (int i = 0; i < n; i += o->context_batch) {
          const int m = std::min(o->context_batch, n - i);
          if (auto s = fwd.eval(prefill, std::span<const int32_t>(&ctx_tokens[i], m), Logits::Last, logits); !s) {
            std::exit(fail(s.message()));
          }
          const double el = std::chrono::duration<double>(clock::now() - t0).count();
          std::fprintf(stderr, "\rcontext prefill %d/%d tokens, %.1f tok/s, attention %.0f%%   ", i + m, n,
                       (i + m) / el, 100.0 * fwd.attention_seconds() / el);
        }
        std::fprintf(stderr, "\n");
        const double pdt = std::chrono::duration<double>(clock::now() - t0).count();
        cr.pp = n / pdt;
        cr.pp_attn = fwd.attention_seconds() / pdt;
        seg = prefill.seal_tail(ctx_tokens, format, 1);
        if (!seg) std::exit(fail("internal: sealing the context failed"));
      }
      Tower cache(cfg, {seg}, o->gen + 1);
      std::vector<double> ctg, attn;
      for (int run = 0; run < o->runs; ++run) {
        cache.truncate(n);
        fwd.reset_attention_seconds();
        int32_t tok = ctx_tokens[0];
        t0 = clock::now();
        for (int i = 0; i < o->gen; ++i) {
          if (auto s = fwd.eval(cache, std::span<const int32_t>(&tok, 1), Logits::Last, logits); !s) {
            std::exit(fail(s.message()));
          }
          tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        }
        const double dt = std::chrono::duration<double>(clock::now() - t0).count();
        ctg.push_back(o->gen / dt);
        attn.push_back(fwd.attention_seconds() / dt);
        std::fprintf(stderr, "context %d (%s) run %d/%d: tg %.2f tok/s, attention %.0f%% (%.1f ms/token)\n", n,
                     cr.format, run + 1, o->runs, ctg.back(), 100.0 * attn.back(),
                     1e3 * fwd.attention_seconds() / o->gen);
      }
      fwd.set_attention_timing(false);
      cr.tg = summarize(ctg);
      cr.attn = summarize(attn);
    }
    bw = std::max(bw, measure_memory_bandwidth(pool));
    const double bytes = double(decode_bytes) / double(decode_steps);  // per step of --batch tokens
    const double roofline = bw * 1e9 / bytes * o->batch;  // a step reads the weights once for all sequences
    Stats p = summarize(pp), g = summarize(tg);
    std::printf("prefill %d tokens: median %.1f tok/s (min %.1f, max %.1f)\n", o->prompt, p.median, p.min, p.max);
    std::printf("decode  %d tokens: median %.2f tok/s (min %.2f, max %.2f)\n", o->gen, g.median, g.min, g.max);
    std::printf("memory bandwidth %.2f GB/s (triad, %d threads, best of one before each run and one after); "
                "%.1f MB of weights read per decode step (counted by the forward pass; a mixture of experts: "
                "the chosen experts only); "
                "roofline %.2f tok/s; achieved %.0f%%\n",
                bw, pool.size(), bytes / 1e6, roofline, 100.0 * g.median / roofline);
    std::printf("packed weight copies (load-time row interleaving for the fast kernels): %.1f MB extra\n",
                model.packed_bytes() / 1e6);
    std::string name = std::filesystem::path(o->model).stem().string();
    if (o->context > 0) {
      std::printf("context %d (%s segment): prefill %.1f tok/s (attention %.0f%%); decode %d tokens: median %.2f tok/s (min %.2f, "
                  "max %.2f), attention %.0f%% (min %.0f%%, max %.0f%%) = %.1f ms/token; short-context decode "
                  "%.2f tok/s\n",
                  o->context, cr.format, cr.pp, 100.0 * cr.pp_attn, o->gen, cr.tg.median, cr.tg.min, cr.tg.max,
                  100.0 * cr.attn.median, 100.0 * cr.attn.min, 100.0 * cr.attn.max,
                  1e3 * cr.attn.median / cr.tg.median, g.median);
      std::printf("bench_context model=%s threads=%d context=%d format=%s pp=%.2f tg=%.2f tg_short=%.2f attn_share=%.3f\n",
                  name.c_str(), pool.size(), o->context, cr.format, cr.pp, cr.tg.median, g.median, cr.attn.median);
    }
    std::printf("bench model=%s type=%s threads=%d pp=%.2f tg=%.2f roofline_tg=%.2f bw_gbs=%.2f\n", name.c_str(),
                dominant_type(model).c_str(), pool.size(), p.median, g.median, roofline, bw);
  });
}

}  // namespace towers::cli
