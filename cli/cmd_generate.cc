// towerctl generate: run a model on a prompt and print the continuation as it is produced.
#include <cstdio>

#include "cli/commands.h"
#include "engine/text/chat_template.h"
#include "engine/generate/generate.h"
#include "engine/text/tokenizer.h"

namespace towers::cli {

void add_generate(CLI::App& app) {
  struct Opts {
    std::string model, prompt, system;
    int max_tokens = 256;
    int threads = 0;
    int ctx = 0;
    bool chat = false, verbose = false, no_bos = false;
    std::string template_name;
    GenerateOptions gen;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "generate",
      "Generate text from a prompt with a GGUF model, streaming it to stdout.\n"
      "  towerctl generate -m stories260K.gguf -p \"Once upon a time\" --temperature 0\n"
      "  towerctl generate -m llama.gguf --chat -p \"Why is the sky blue?\"\n"
      "With --chat the prompt is a user message wrapped in the model's chat template.");
  cmd->add_option("-m,--model", o->model, "GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text (\"\" starts from BOS alone)")->required();
  cmd->add_option("-n,--max-tokens", o->max_tokens, "Most tokens to generate")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--temperature", o->gen.sampling.temperature, "Sampling temperature; 0 = greedy")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", o->gen.sampling.top_k, "Keep the k most likely tokens (0 = all)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--top-p", o->gen.sampling.top_p, "Nucleus sampling mass (1 = off)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", o->gen.sampling.min_p, "Drop tokens below min-p × the top probability")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", o->gen.sampling.repeat_penalty, "Penalty for recent tokens (1 = off)")
      ->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--repeat-last-n", o->gen.sampling.repeat_last_n, "How many recent tokens the penalty sees")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-s,--seed", o->gen.sampling.seed, "Random seed (same seed, same text)");
  cmd->add_option("--stop", o->gen.stop, "Stop string (repeatable); not printed");
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0 = all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("-c,--ctx", o->ctx, "Context size in tokens (0 = prompt + max-tokens, capped by the model's)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_flag("--chat", o->chat, "Wrap the prompt in the model's chat template as a user message");
  cmd->add_option("--system", o->system, "System message (with --chat)");
  cmd->add_option("--template", o->template_name,
                  "Chat template family instead of the detected one: " + chat_family_names());
  cmd->add_flag("--no-bos", o->no_bos, "Do not prepend BOS to a plain prompt");
  cmd->add_flag("-v,--verbose", o->verbose, "Print token counts and prefill/decode speed to stderr");
  cmd->callback([o] {
    auto loaded = Model::load(o->model);
    if (!loaded) std::exit(fail(loaded.error()));
    const Model& model = **loaded;
    const Tokenizer& tok = model.tokenizer();

    std::vector<int32_t> prompt;
    if (o->chat) {
      ChatFamily family = detect_chat_family(tok.chat_template());
      if (!o->template_name.empty()) {
        auto f = chat_family_from_name(o->template_name);
        if (!f) std::exit(fail(f.error()));
        family = *f;
      }
      std::vector<ChatMessage> messages;
      if (!o->system.empty()) messages.push_back({"system", o->system});
      messages.push_back({"user", o->prompt});
      ChatTemplateTokens special{tok.bos() >= 0 ? std::string(tok.token_text(tok.bos())) : "",
                                 tok.eos() >= 0 ? std::string(tok.token_text(tok.eos())) : ""};
      auto text = apply_chat_template(family, messages, special, /*add_generation_prompt=*/true);
      if (!text) std::exit(fail(text.error()));
      // The template writes BOS itself where the model expects one.
      prompt = tok.encode(*text, /*add_bos=*/false, /*parse_special=*/true);
      for (const auto& s : chat_stop_strings(family)) o->gen.stop.push_back(s);
    } else {
      prompt = tok.encode(o->prompt, tok.add_bos_default() && !o->no_bos, /*parse_special=*/false);
    }
    if (prompt.empty()) std::exit(fail("the prompt is empty and the model has no BOS token to start from"));

    int ctx = o->ctx > 0 ? o->ctx : static_cast<int>(prompt.size()) + o->max_tokens;
    ctx = std::min(ctx, model.config().n_ctx_train);
    if (static_cast<int>(prompt.size()) >= ctx) {
      std::exit(fail("prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context of " +
                     std::to_string(ctx) + " tokens"));
    }
    ThreadPool pool(o->threads);
    Forward forward(model, pool);
    DenseKvCache cache(model.config(), ctx);
    o->gen.max_tokens = o->max_tokens;
    auto r = generate(forward, cache, tok, prompt, o->gen, [](std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::printf("\n");
    std::fflush(stdout);
    if (!r) std::exit(fail(r.error()));
    if (o->verbose) {
      const int n = static_cast<int>(r->tokens.size());
      std::fprintf(stderr,
                   "prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s (%.1f tok/s); "
                   "finish: %s; threads %d\n",
                   r->prompt_tokens, r->prefill_seconds, r->prompt_tokens / std::max(1e-9, r->prefill_seconds),
                   n, r->decode_seconds, n / std::max(1e-9, r->decode_seconds), std::string(to_string(r->finish_reason)).c_str(),
                   pool.size());
    }
  });
}

}  // namespace towers::cli
