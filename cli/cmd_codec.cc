// towerctl codec: the cold-tier codec (engine/codec/codec.h) on text files, offline.
//   encode: text -> tokens -> arithmetic-coded container (.tcz)
//   decode: container -> tokens -> the exact original bytes
//   info:   the container's header
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "engine/codec/codec.h"
#include "engine/model/forward.h"
#include "engine/text/tokenizer.h"
#include "simd/ops.h"

namespace towers::cli {

namespace {

bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return !in.bad();
}

bool write_file(const std::string& path, const void* data, size_t n) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  out.close();
  return static_cast<bool>(out);
}

std::unique_ptr<Model> load_model(const std::string& path) {
  auto model = Model::load(path);
  if (!model) std::exit(fail(model.error()));
  return std::move(model.value());
}

}  // namespace

std::function<void(int64_t, int64_t)> progress_printer(std::string verb) {
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  return [verb, last](int64_t done, int64_t total) {
    if (total < 2000) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - *last < std::chrono::milliseconds(200)) return;
    *last = now;
    std::fprintf(stderr, "\r%s: %lld/%lld tokens", verb.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total));
    if (done >= total) std::fprintf(stderr, "\n");
  };
}

void add_codec(CLI::App& app) {
  auto* codec = app.add_subcommand(
      "codec",
      "The cold-tier codec: arithmetic-code text as tokens against a model's own next-token\n"
      "probabilities (about the model's surprisal: a few bits per token), and decode it back exactly.\n"
      "  towerctl codec encode -m stories260K.gguf --in story.txt --out story.tcz\n"
      "  towerctl codec decode -m stories260K.gguf --in story.tcz --out story.txt\n"
      "  towerctl codec info story.tcz\n"
      "Decoding needs the very same model file (its fingerprint is in the container) and the same\n"
      "kind of CPU (SIMD target): otherwise it refuses, it never returns wrong text.");
  codec->require_subcommand(1);

  struct Opts {
    std::string model, in, out;
    int threads = 0;
    int chunk = 0;
    int window = 0;
    int batch = 32;
    bool reference = false;
    bool any_target = false;
  };
  auto o = std::make_shared<Opts>();

  auto* enc = codec->add_subcommand(
      "encode",
      "Tokenize a text file (no BOS; the model starts from BOS) and code its tokens.\n"
      "The text must survive tokenize + detokenize unchanged (valid UTF-8 the vocabulary can spell);\n"
      "otherwise encode refuses and names the first byte that would change.\n"
      "--chunk C restarts the coder every C tokens: each chunk is conditioned only on its own earlier\n"
      "tokens, so decode can run many chunks as one batch (faster), at the cost of the context a chunk\n"
      "no longer sees (stories260K: +3% bits at C=1024, +13% at C=256; docs/codec.md).\n"
      "--window: a model trained on shorter texts than its GGUF claims codes better with its real\n"
      "context (stories260K: --window 512 gives 1.98 bits/token, the default 2048 gives 2.39).\n"
      "The last line is exactly:\n"
      "  codec tokens=N bytes_in=I bytes_out=O record_bytes=R bits_per_token=B nll_bits=L overhead_pct=P encode_tok_s=E\n"
      "O = the file (store header, token count, context, record, CRC); R = the record alone, what the\n"
      "segment costs in a store that holds the rest once (docs/codec.md). B = 8*O/N; L = the model's own\n"
      "NLL of the same tokens in bits, under the same conditioning; P = 100*(8*O - L)/L, what the coder\n"
      "and the container cost over the ideal.");
  enc->add_option("-m,--model", o->model, "GGUF model file (the coder model)")->required()->check(CLI::ExistingFile);
  enc->add_option("-i,--in", o->in, "Text file to encode")->required()->check(CLI::ExistingFile);
  enc->add_option("-o,--out", o->out, "Container to write (.tcz)")->required();
  enc->add_option("-C,--chunk", o->chunk, "Tokens per independently decodable chunk (0 = one chunk)")
      ->check(CLI::Range(0, 1 << 26));
  enc->add_option("-w,--window", o->window,
                  "Most tokens the model attends to at once (0 = min(model context, 4096)); longer chunks "
                  "slide the window by half of it")
      ->check(CLI::Range(0, 1 << 24));
  enc->add_option("-t,--threads", o->threads, "Worker threads (0 = all cores)")->check(CLI::Range(0, 1024));
  enc->add_option("-b,--batch", o->batch, "Chunks evaluated together per step")->check(CLI::Range(1, 4096));
  enc->add_flag("--reference", o->reference, "Use the reference kernels (decode then uses them too)");
  enc->callback([o] {
    auto model = load_model(o->model);
    const Tokenizer& tok = model->tokenizer();
    std::string text;
    if (!read_file(o->in, text)) std::exit(fail(o->in + ": cannot read"));
    std::vector<int32_t> tokens = tok.encode(text, /*add_bos=*/false, /*parse_special=*/false);
    if (const std::string back = tok.decode(tokens); back != text) {
      size_t at = 0;
      while (at < back.size() && at < text.size() && back[at] == text[at]) ++at;
      std::exit(fail(o->in + ": this tokenizer does not reproduce the text exactly (first difference at byte " +
                     std::to_string(at) + " of " + std::to_string(text.size()) +
                     "): the codec stores tokens, so the round trip could not be exact. Invalid UTF-8 and "
                     "characters the vocabulary cannot spell (<unk>) cause this; refusing."));
    }
    ThreadPool pool(o->threads);
    Forward fwd(*model, pool, o->reference ? Kernels::Reference : Kernels::Fast);
    Codec codec(*model, &pool);
    CodecOptions copt;
    copt.chunk = o->chunk;
    copt.window = o->window;
    copt.batch = o->batch;
    copt.progress = progress_printer("codec encode");
    CodecStats st;
    auto bytes = codec.encode(fwd, {}, tokens, copt, &st);
    if (!bytes) std::exit(fail(bytes.error()));
    if (!write_file(o->out, bytes->data(), bytes->size())) std::exit(fail(o->out + ": cannot write"));
    const double bits = 8.0 * static_cast<double>(bytes->size());
    const double n = static_cast<double>(st.tokens);
    std::fprintf(stderr, "codec: %lld tokens in %d chunk(s), model fingerprint %016llx, %s kernels on %s\n",
                 static_cast<long long>(st.tokens), st.chunks, static_cast<unsigned long long>(codec.fingerprint()),
                 o->reference ? "reference" : "fast", simd::target_name());
    std::printf("codec tokens=%lld bytes_in=%zu bytes_out=%zu record_bytes=%zu bits_per_token=%.4f nll_bits=%.1f "
                "overhead_pct=%.3f encode_tok_s=%.1f\n",
                static_cast<long long>(st.tokens), text.size(), bytes->size(), st.record_bytes, n > 0 ? bits / n : 0.0,
                st.nll_bits,
                st.nll_bits > 0 ? 100.0 * (bits - st.nll_bits) / st.nll_bits : 0.0,
                st.seconds > 0 ? n / st.seconds : 0.0);
  });

  auto* dec = codec->add_subcommand(
      "decode",
      "Decode a container made by `codec encode` back to the exact original bytes.\n"
      "Needs the same model file; chunks are decoded --batch at a time as one batched model step.\n"
      "The last line is exactly:\n"
      "  codec decode_tok_s=D chunks=K");
  dec->add_option("-m,--model", o->model, "GGUF model file it was encoded with")->required()->check(CLI::ExistingFile);
  dec->add_option("-i,--in", o->in, "Container (.tcz)")->required()->check(CLI::ExistingFile);
  dec->add_option("-o,--out", o->out, "Text file to write")->required();
  dec->add_option("-t,--threads", o->threads, "Worker threads (0 = all cores)")->check(CLI::Range(0, 1024));
  dec->add_option("-b,--batch", o->batch, "Chunks decoded together per step")->check(CLI::Range(1, 4096));
  dec->add_flag("--any-target", o->any_target,
                "Also try a container coded on a CPU with another SIMD target (refused by default: its logits "
                "almost surely differ, and then only a 15-bit check stands between the decode and wrong text)");
  dec->callback([o] {
    std::string raw;
    if (!read_file(o->in, raw)) std::exit(fail(o->in + ": cannot read"));
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
    auto container = read_codec_container(bytes);
    if (!container) std::exit(fail(o->in + ": " + container.error()));
    auto model = load_model(o->model);
    ThreadPool pool(o->threads);
    Forward fwd(*model, pool, container->store.kernels);
    Codec codec(*model, &pool);
    CodecOptions copt;
    copt.batch = o->batch;
    copt.any_target = o->any_target;
    copt.progress = progress_printer("codec decode");
    CodecStats st;
    auto tokens = codec.decode(fwd, {}, bytes, copt, &st);
    if (!tokens) std::exit(fail(o->in + ": " + tokens.error()));
    const std::string text = model->tokenizer().decode(*tokens);
    if (!write_file(o->out, text.data(), text.size())) std::exit(fail(o->out + ": cannot write"));
    std::printf("codec decode_tok_s=%.1f chunks=%d\n",
                st.seconds > 0 ? static_cast<double>(st.tokens) / st.seconds : 0.0, st.chunks);
  });

  auto* info = codec->add_subcommand("info", "Print a container's header (no model needed).");
  info->add_option("file", o->in, "Container (.tcz)")->required()->check(CLI::ExistingFile);
  info->callback([o] {
    std::string raw;
    if (!read_file(o->in, raw)) std::exit(fail(o->in + ": cannot read"));
    auto c = read_codec_container(std::span(reinterpret_cast<const uint8_t*>(raw.data()), raw.size()));
    if (!c) std::exit(fail(o->in + ": " + c.error()));
    auto rec = read_codec_record(c->record, c->key.tokens);  // read_codec_container checked it parses
    const CodecStoreHeader& h = c->store;
    std::printf("version %d\nkernels %s\nfingerprint %016llx\ntarget_tag %u %s (this machine: %s, %u)\nwindow %d\n"
                "context_tokens %lld\ntokens %lld\nchunk %d\nchunks %zu\nfile_bytes %zu\nrecord_bytes %zu\n"
                "record_overhead_bytes %zu\nrounding %s\npacked_set %d\n",
                h.version, h.kernels == Kernels::Fast ? "fast" : "reference",
                static_cast<unsigned long long>(h.fingerprint), h.target_tag,
                codec_target_name(h.target_tag).c_str(), codec_target_name(codec_target_tag()).c_str(),
                codec_target_tag(), h.window, static_cast<long long>(c->key.context_length),
                static_cast<long long>(c->key.tokens), rec->chunk, rec->chunk_bytes.size(), raw.size(),
                c->record.size(), rec->header_bytes, h.rounding == Rounding::Ggml ? "ggml" : "f32",
                static_cast<int>(h.packed_set));
  });
}

}  // namespace towers::cli
