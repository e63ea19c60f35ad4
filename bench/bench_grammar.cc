// Constrained decoding cost per step: the token mask of a grammar state on the stories260K (512,
// SentencePiece) and Llama 3 (128k, byte-level BPE) vocabularies.
//   bench_grammar [--shared DIR]
// For each vocabulary and grammar it replays the tokens of a reply (a JSON text tokenized) and times,
// per step:
//   cold  mask from a fresh automaton (every new state walks the vocabulary trie),
//   warm  the same steps again on that automaton (states seen before: cached masks),
//   apply setting the disallowed logits to -infinity (the part paid on every step),
//   brute the baseline: every token's bytes run through the matcher one by one (transitions cached,
//         as in the trie walk), i.e. vocab x token length work per step.
// Times are this thread's CPU time (the machine is shared; wall time would count other jobs), best of
// 3 rounds (cold: a fresh automaton each round).
// Last lines (stable format), one per vocabulary and grammar:
//   bench_grammar vocab=V grammar=G n_vocab=N trie_nodes=T cold_ms=A warm_ms=B apply_ms=C brute_ms=D
#include <algorithm>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "engine/gguf/gguf.h"
#include "engine/constrained/grammar_matcher.h"
#include "engine/constrained/json_schema.h"
#include "engine/generate/sampler.h"
#include "engine/text/tokenizer.h"
#include "engine/text/vocab_import.h"

using namespace towers;

namespace {

double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "bench_grammar: %s\n", msg.c_str());
  return 1;
}

struct Vocab {
  std::string name;
  std::shared_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

Result<Vocab> open_vocab(const std::string& name, const std::string& gguf) {
  auto f = GgufFile::open(gguf);
  if (!f.ok()) return f.status();
  auto t = Tokenizer::from_gguf(**f);
  if (!t.ok()) return t.status();
  return Vocab{name, *f, std::move(*t)};
}

struct Step {
  double cold_ms, warm_ms, apply_ms, brute_ms;
  size_t states, automaton_bytes;
};

// Per-step costs along the tokens of `text` (a reply the model could write), averaged.
Step replay(const Tokenizer& tok, std::shared_ptr<const TokenTrie> trie, std::shared_ptr<const Grammar> g,
            const std::string& text, int* steps) {
  const std::vector<int32_t> seq = tok.encode(text, /*add_bos=*/false, /*parse_special=*/false);
  *steps = int(seq.size());
  const double n = double(std::max<size_t>(seq.size(), 1));
  Step r{1e30, 1e30, 1e30, 0, 0, 0};
  std::shared_ptr<GrammarAutomaton> automaton;
  auto run = [&](GrammarConstraint c) {
    const double t0 = cpu_s();
    for (int32_t id : seq) {
      if (!c.allowed_tokens().ok() || !c.accept(id).ok()) {
        std::fprintf(stderr, "bench_grammar: the grammar rejects its own sample text\n");
        std::exit(1);
      }
    }
    return (cpu_s() - t0) * 1e3 / n;
  };
  for (int round = 0; round < 3; ++round) {
    automaton = std::make_shared<GrammarAutomaton>(g, trie);
    r.cold_ms = std::min(r.cold_ms, run(GrammarConstraint(automaton)));
    r.warm_ms = std::min(r.warm_ms, run(GrammarConstraint(automaton)));
  }
  r.states = automaton->state_count();
  r.automaton_bytes = automaton->memory_bytes();
  for (int round = 0; round < 3; ++round) {
    GrammarConstraint c(automaton);
    std::vector<float> logits(size_t(tok.n_vocab()), 0.5f);
    double total = 0;
    for (int32_t id : seq) {
      const double t0 = cpu_s();
      (void)c.mask_logits(logits);
      total += cpu_s() - t0;
      (void)c.accept(id);
    }
    r.apply_ms = std::min(r.apply_ms, total * 1e3 / n);
  }
  {
    // Baseline on the already-warm automaton (its transitions are cached too).
    int32_t state = automaton->initial_state();
    double total = 0;
    for (size_t i = 0; i < seq.size(); ++i) {
      const double t0 = cpu_s();
      size_t allowed = 0;
      for (int32_t id = 0; id < tok.n_vocab(); ++id) {
        auto s = automaton->advance(state, trie->piece(id));
        allowed += s.ok() && *s != GrammarAutomaton::kDead && !trie->piece(id).empty();
      }
      total += cpu_s() - t0;
      if (allowed == 0) std::fprintf(stderr, "  (no token allowed at step %zu)\n", i);
      std::string_view p = trie->piece(seq[i]);
      if (i == 0 && trie->strip_first_space() && !p.empty() && p[0] == ' ') p.remove_prefix(1);
      state = *automaton->advance(state, p);
    }
    r.brute_ms = total * 1e3 / n;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shared = TOWERS_SHARED_DEFAULT;
  if (const char* env = std::getenv("TOWERS_SHARED"); env && *env) shared = env;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("bench_grammar [--shared DIR]: ms per masked step of constrained decoding\n");
      return 0;
    }
    if (i + 1 >= argc) return fail("missing value after " + a);
    if (a == "--shared") shared = argv[++i];
    else return fail("unknown option " + a);
  }
  std::vector<Vocab> vocabs;
  if (auto v = open_vocab("stories260K", shared + "/models/stories260K.gguf"); v.ok()) vocabs.push_back(std::move(*v));
  else std::fprintf(stderr, "skipping stories260K: %s\n", v.error().c_str());
  {
    const std::string json = shared + "/tokenizers/llama3.tokenizer.json";
    const std::string gguf = (std::filesystem::temp_directory_path() / "bench_grammar-llama3.gguf").string();
    GgufWriter w;
    auto n = add_hf_bpe_tokenizer(w, json, HfVocabOptions{});
    if (n.ok() && w.write(gguf).ok()) {
      if (auto v = open_vocab("llama3", gguf); v.ok()) vocabs.push_back(std::move(*v));
    } else {
      std::fprintf(stderr, "skipping llama3: %s\n", n.ok() ? "cannot write the vocab GGUF" : n.error().c_str());
    }
  }
  if (vocabs.empty()) return fail("no vocabulary found under " + shared);

  struct Case {
    const char* name;
    std::string gbnf, text;
  };
  const Case cases[] = {
      {"json_object", json_object_gbnf(),
       R"({"title": "The Old Man and the Sea", "year": 1952, "tags": ["novel", "fishing", "Cuba"], "rating": 4.5,
 "meta": {"pages": 127, "language": "English", "translated": true, "note": null}})"},
      {"person",
       *json_schema_to_gbnf(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
           "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
           "required": ["name", "age", "tags"], "additionalProperties": false})"),
       R"({"name": "Ada Lovelace, Countess of Lovelace", "age": 36, "tags": ["mathematics", "poetry", "engines"]})"},
  };
  std::vector<std::string> lines;
  for (const Vocab& v : vocabs) {
    const double t0 = cpu_s();
    auto trie = TokenTrie::from_tokenizer(*v.tok);
    const double build_ms = (cpu_s() - t0) * 1e3;
    std::printf("%s: %d tokens, trie of %zu nodes (%.1f MB) built in %.1f ms\n", v.name.c_str(), v.tok->n_vocab(),
                trie->nodes().size(), double(trie->memory_bytes()) / 1e6, build_ms);
    for (const Case& c : cases) {
      auto g = Grammar::parse(c.gbnf);
      if (!g.ok()) return fail(g.error());
      int done = 0;
      const Step s = replay(*v.tok, trie, *g, c.text, &done);
      const char* gname = c.name;
      std::printf("  %-12s %4d steps: cold %.3f ms/step, warm %.4f, apply %.4f, brute force %.3f (%.0fx the cold trie walk); "
                  "%zu states, %.1f MB\n",
                  gname, done, s.cold_ms, s.warm_ms, s.apply_ms, s.brute_ms, s.brute_ms / std::max(s.cold_ms, 1e-9),
                  s.states, double(s.automaton_bytes) / 1e6);
      char line[256];
      std::snprintf(line, sizeof line,
                    "bench_grammar vocab=%s grammar=%s n_vocab=%d trie_nodes=%zu cold_ms=%.3f warm_ms=%.4f apply_ms=%.4f "
                    "brute_ms=%.3f",
                    v.name.c_str(), gname, v.tok->n_vocab(), trie->nodes().size(), s.cold_ms, s.warm_ms, s.apply_ms,
                    s.brute_ms);
      lines.push_back(line);
    }
  }
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  return 0;
}
