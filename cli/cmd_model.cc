// towerctl model info|synth: describe a GGUF model; write synthetic models with real shapes.
#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "daemon/budget.h"
#include "daemon/config.h"
#include "engine/text/chat_template.h"
#include "engine/model/model.h"
#include "engine/model/segment.h"
#include "engine/model/synth.h"
#include "engine/text/tokenizer.h"
#include "simd/kv_quant.h"

namespace towers::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

// What the model costs in RAM and how many tokens of KV a RAM budget holds, by format: what towerd
// keeps under [policy] ram_budget (lease tails while a request runs: the format [model] tail_format
// gives, "auto" by default; sealed segments take the [pool] formats by depth).
void print_memory_plan(const Model& model, const daemon::BudgetSetting& setting, std::string_view as_written) {
  const ModelConfig& c = model.config();
  const daemon::SizedBudget budget = daemon::size_ram_budget(setting, 0);
  std::printf("memory plan    weights %s in the file", human_bytes(static_cast<double>(model.file().file_size())).c_str());
  if (model.packed_bytes() > 0) {
    std::printf("; packed copies for the fast kernels %s (made at load; the file pages they replace are released)",
                human_bytes(static_cast<double>(model.packed_bytes())).c_str());
  }
  std::printf("\n               RAM budget %s (the rule towerd applies at start to [policy] ram_budget = \"%s\")\n",
              budget.text().c_str(), std::string(as_written).c_str());
  std::printf("               %-6s %14s %22s\n", "format", "KV per token", "tokens in the budget");
  const KvQuant tail = daemon::auto_tail_format(c);
  for (KvQuant q : {KvQuant::F32, KvQuant::F16, KvQuant::Q8, KvQuant::Q6, KvQuant::Q4}) {
    const uint64_t per_token = kv_bytes_per_token(c, q);
    const std::string fit = budget.bytes == 0 || per_token == 0 ? "no limit" : std::to_string(budget.bytes / per_token);
    std::string note;
    if (q == tail) note = "  (request tails)";
    else if (q == KvQuant::F32 || q == KvQuant::F16) {
      note = std::string("  (request tails with [model] tail_format = \"") + simd::kv_quant_name(q) + "\")";
    }
    std::printf("               %-6s %14s %22s%s\n", simd::kv_quant_name(q), human_bytes(static_cast<double>(per_token)).c_str(),
                fit.c_str(), note.c_str());
  }
}

int model_info(const std::string& path, bool all_keys, const daemon::BudgetSetting& ram_budget,
               std::string_view ram_budget_text) {
  auto m = Model::load(path);
  if (!m) return fail(m.error());
  const Model& model = **m;
  const ModelConfig& c = model.config();
  const GgufFile& f = model.file();
  std::printf("file           %s (%s, GGUF v%u, %zu tensors, %zu metadata keys)\n", path.c_str(),
              human_bytes(static_cast<double>(f.file_size())).c_str(), f.version(), f.tensors().size(),
              f.metadata().size());
  std::printf("architecture   %s%s%s\n", c.arch_name.c_str(), c.name.empty() ? "" : "  name: ",
              c.name.c_str());
  std::printf("shape          n_embd %d, n_layer %d, n_head %d, n_head_kv %d (GQA %d), head_dim %d, n_ff %d\n",
              c.n_embd, c.n_layer, c.n_head, c.n_head_kv, c.n_head / c.n_head_kv, c.head_dim, c.n_ff);
  if (c.is_moe()) {
    std::printf("experts        %d, %d chosen per token (softmax, top-k%s), width %d%s\n", c.n_expert, c.n_expert_used,
                c.expert_weights_norm ? ", renormalised" : "", c.n_ff_exp,
                c.n_ff_shexp > 0 ? (", shared expert of width " + std::to_string(c.n_ff_shexp)).c_str() : "");
  }
  if (c.sliding_window > 0) {
    int windowed = 0;
    for (int l = 0; l < c.n_layer; ++l) windowed += c.is_swa(l);
    std::printf("window         %d tokens on %d of %d layers\n", c.sliding_window, windowed, c.n_layer);
  }
  std::printf("vocab          %d tokens, embeddings %s\n", c.n_vocab, c.tied_embeddings ? "tied" : "untied");
  std::printf("context        %d tokens (training)\n", c.n_ctx_train);
  std::printf("rope           %s, %d of %d dims, base %g%s%s\n",
              c.rope_style == RopeStyle::Neox ? "neox" : "normal", c.n_rot, c.head_dim, c.rope_base,
              c.rope_freq_factors.empty() ? "" : c.rope_ctx_orig > 0 ? ", LongRoPE factors" : ", llama3 frequency factors",
              c.rope_scale != 1.0f ? (", linear scale " + std::to_string(c.rope_scale)).c_str() : "");
  std::printf("norm           RMSNorm eps %g%s\n", c.norm_eps, c.qkv_bias ? "; Q/K/V biases" : "");

  uint64_t n_params = 0, n_bytes = 0;
  std::map<std::string_view, std::pair<int, uint64_t>> hist;  // type -> (tensors, bytes)
  for (const auto& t : f.tensors()) {
    n_params += t.n_elements();
    n_bytes += t.nbytes;
    auto& h = hist[ggml_type_name(t.type)];
    h.first += 1;
    h.second += t.nbytes;
  }
  std::printf("parameters     %.3f M, %s of weights (%.2f bits/weight)\n", n_params / 1e6,
              human_bytes(static_cast<double>(n_bytes)).c_str(),
              n_params ? 8.0 * n_bytes / n_params : 0.0);
  std::printf("tensor types  ");
  for (const auto& [name, h] : hist) {
    std::printf(" %s×%d (%s)", std::string(name).c_str(), h.first, human_bytes(double(h.second)).c_str());
  }
  std::printf("\n");
  const Tokenizer& tok = model.tokenizer();
  std::printf("tokenizer      %s; BOS %d, EOS %d, EOT %d\n", std::string(tok.kind()).c_str(), tok.bos(),
              tok.eos(), tok.eot());
  std::string_view tmpl = tok.chat_template();
  std::printf("chat template  %s%s\n", std::string(chat_family_name(detect_chat_family(tmpl))).c_str(),
              tmpl.empty() ? " (no tokenizer.chat_template; plain transcript format)" : "");
  print_memory_plan(model, ram_budget, ram_budget_text);
  if (all_keys) {
    std::printf("\nmetadata:\n");
    for (const auto& kv : f.metadata()) {
      std::printf("  %-44s %s\n", std::string(kv.key).c_str(), kv.value.to_display().c_str());
    }
    std::printf("\ntensors:\n");
    for (const auto& t : f.tensors()) {
      std::printf("  %-32s %-6s %s\n", std::string(t.name).c_str(),
                  std::string(ggml_type_name(t.type)).c_str(), t.shape_string().c_str());
    }
  }
  return 0;
}

void add_model_synth(CLI::App& model) {
  auto o = std::make_shared<SynthOptions>();
  auto* synth = model.add_subcommand(
      "synth",
      "Write a GGUF with a real model's shapes, random weights and a real tokenizer, for benchmarks.\n"
      "Tensor types follow llama.cpp's rules for the file type (e.g. q4_0 keeps the output matrix in "
      "Q6_K; q4_k_m puts attn_v/ffn_down of some layers in Q6_K).\n"
      "Shapes: " + synth_shape_names() + "\nTypes: " + synth_type_names());
  synth->add_option("--shape", o->shape, "Model shape")->required();
  synth->add_option("--type", o->type, "File type")->required();
  synth->add_option("-o,--out", o->out, "Output GGUF path")->required();
  synth->add_option("--seed", o->seed, "Seed of the random weights");
  synth->add_option("-t,--threads", o->threads, "Worker threads (0 = all cores)");
  synth->add_option("--tokenizer", o->tokenizer_path,
                    "tokenizer.json (Hugging Face) or GGUF to take the vocabulary from; default: the "
                    "shape's tokenizer from the shared data folder, else a generated byte-level vocab");
  synth->callback([o] {
    const char* env = std::getenv("TOWERS_SHARED");
    o->shared_dir = env && *env ? env : TOWERS_SHARED_DEFAULT;
    o->log = [](const std::string& line) { std::fprintf(stderr, "synth: %s\n", line.c_str()); };
    if (auto s = synthesize_model(*o); !s) std::exit(fail(s.message()));
    std::fprintf(stderr, "synth: wrote %s\n", o->out.c_str());
  });
}

}  // namespace

void add_model(CLI::App& app) {
  auto* model = app.add_subcommand("model", "Inspect or create GGUF model files");
  model->require_subcommand(1);

  auto info_path = std::make_shared<std::string>();
  auto info_all = std::make_shared<bool>(false);
  auto* info = model->add_subcommand(
      "info", "Describe a model: architecture, shapes, tensor types, tokenizer, chat template");
  info->add_option("model", *info_path, "GGUF model file")->required()->check(CLI::ExistingFile);
  info->add_flag("-a,--all", *info_all, "Also list every metadata key and every tensor");
  auto info_budget = std::make_shared<std::string>("50%");
  info->add_option("--ram-budget", *info_budget,
                   "RAM budget for the memory plan: a size (\"8G\") or a share of MemAvailable (\"50%\"), as towerd's "
                   "[policy] ram_budget")
      ->capture_default_str();
  info->callback([=] {
    auto budget = daemon::BudgetSetting::parse(*info_budget);
    if (!budget) {
      std::fprintf(stderr, "towerctl model info: --ram-budget \"%s\": expected a size such as \"8G\" or a share such as \"50%%\"\n",
                   info_budget->c_str());
      std::exit(2);
    }
    int rc = model_info(*info_path, *info_all, *budget, *info_budget);
    if (rc) std::exit(rc);
  });

  add_model_synth(*model);
}

}  // namespace towers::cli
