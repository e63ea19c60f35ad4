#include "daemon/open_state.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "engine/codec/codec.h"
#include "simd/onednn_matmul.h"
#include "simd/ops.h"

namespace towers::daemon {

namespace {
double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string fingerprint_hex(uint64_t f) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(f));
  return buf;
}

// The cold packs' records decode only with the model that coded them; `<cold_dir>/coder` names its
// fingerprint (packs from before the file existed were coded by the serving model). With another
// coder configured, the packs are set aside whole (renamed, not deleted): the sessions at rest in them
// are recomputed from the log's tokens on their next message, and new packs start with the new coder.
Status check_cold_coder(const std::filesystem::path& cold_dir, uint64_t coder, uint64_t serving, size_t sessions_at_rest,
                        std::vector<std::string>* warnings) {
  const std::filesystem::path marker = cold_dir / "coder";
  std::error_code ec;
  bool packs = false;  // any file but the marker
  for (auto it = std::filesystem::directory_iterator(cold_dir, ec); !ec && it != std::filesystem::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name != "coder" && name != "coder.tmp") packs = true;
  }
  ec.clear();
  uint64_t coded_by = serving;
  if (std::ifstream in(marker); in) {
    std::string hex;
    in >> hex;
    coded_by = std::strtoull(hex.c_str(), nullptr, 16);
  }
  if (packs && coded_by != coder && sessions_at_rest > 0) {
    // Their transcripts exist nowhere else: only the coder that wrote the records can read them.
    return Status::InvalidArgument("invalid config: cold.coder: " + std::to_string(sessions_at_rest) +
                                   " session(s) are at rest in " + cold_dir.string() + ", coded by model " +
                                   fingerprint_hex(coded_by) + ", and only that model can decode them; the coder now is " +
                                   fingerprint_hex(coder) + ". Start with [cold] coder set to the model that coded them.");
  }
  if (packs && coded_by != coder) {
    auto aside = cold_dir.parent_path() / ("cold.coded-by-" + fingerprint_hex(coded_by));
    for (int k = 2; std::filesystem::exists(aside, ec); ++k)  // set aside before, by a switch back and forth
      aside = cold_dir.parent_path() / ("cold.coded-by-" + fingerprint_hex(coded_by) + "." + std::to_string(k));
    std::filesystem::rename(cold_dir, aside, ec);
    if (ec) return Status::IOError("cannot set aside " + cold_dir.string() + " (coded by another model): " + ec.message());
    warnings->push_back("cold.coder: the cold packs were coded by model " + fingerprint_hex(coded_by) + ", not by the coder " +
                        fingerprint_hex(coder) + "; set aside as " + aside.string() +
                        " (delete it when no longer needed): their sessions are recomputed on their next message");
  } else if (packs && std::filesystem::exists(marker, ec)) {
    return Status::Ok();
  }
  std::filesystem::create_directories(cold_dir, ec);
  if (ec) return Status::IOError("cannot create " + cold_dir.string() + ": " + ec.message());
  const auto tmp = cold_dir / "coder.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << fingerprint_hex(coder) << "\n";
    if (!out.flush()) return Status::IOError("cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, marker, ec);
  if (ec) return Status::IOError("cannot write " + marker.string() + ": " + ec.message());
  return Status::Ok();
}
}  // namespace

Result<std::unique_ptr<OpenState>> open_state(Config& cfg, const OpenOptions& options,
                                              std::vector<std::string>* warnings) {
  auto st = std::make_unique<OpenState>();
  std::vector<Record> records;
  auto store = StateStore::open(cfg.state_dir, records, *warnings);
  if (!store.ok()) return store.status().prefixed("cannot open the state: ");
  st->store = std::move(store.value());
  st->records = records.size();

  const auto t_load = std::chrono::steady_clock::now();
  auto loaded = Model::load(cfg.model_path);
  if (!loaded.ok()) return loaded.status().prefixed("cannot load the model: ");
  st->model = std::move(loaded.value());
  const Model& m = *st->model;
  resolve_for_model(cfg, m.config());
  auto family = chat_family_for(m.tokenizer().chat_template(), cfg.chat_template);
  if (!family.ok()) return Status::InvalidArgument("invalid config: model.chat_template: " + family.error());
  st->family = family.value();
  st->threads = std::make_unique<ThreadPool>(options.threads);
  const auto t_fingerprint = std::chrono::steady_clock::now();
  st->fingerprint = model_fingerprint(m, st->threads.get());
  st->load_seconds = seconds_between(t_load, t_fingerprint);
  st->fingerprint_seconds = seconds_between(t_fingerprint, std::chrono::steady_clock::now());
  // The fingerprint read every tensor byte back into memory; a server keeps only the packed copies.
  if (options.serving) m.release_packed_sources();
  st->coder_fingerprint = st->fingerprint;
  if (!cfg.cold_coder.empty()) {
    auto coder = Model::load(cfg.cold_coder);
    if (!coder.ok()) return coder.status().prefixed("cannot load the cold tier's coder ([cold] coder): ");
    if (Status s = check_same_vocabulary(m, *coder.value()); !s.ok())
      return Status::InvalidArgument("invalid config: cold.coder: " + cfg.cold_coder + " cannot code this model's tokens: " + s.message());
    st->coder = std::move(coder.value());
    st->coder_fingerprint = model_fingerprint(*st->coder, st->threads.get());
    if (options.serving) st->coder->release_packed_sources();
  }
  st->forward = std::make_unique<Forward>(m, *st->threads);
  st->prefill_kernels = "fast (packed int8 dot products, simd target " + std::string(simd::target_name()) + ")";
  if (options.serving && cfg.onednn_prefill) {
    // The int8 copies stay resident beside the packed ones: only when they fit in half of what the
    // machine has free now (the KV pool's budget is the operator's; this keeps the weights from
    // pushing it into swap).
    const size_t need = st->model->int8_copy_bytes_needed(), avail = mem_available_bytes();
    if (!simd::onednn_available()) {
      warnings->push_back(std::string("model.onednn_prefill: ") + simd::onednn_describe() + "; prefill stays on the fast kernels");
    } else if (need > avail / 2) {
      warnings->push_back("model.onednn_prefill: the int8 copies need " + std::to_string(need >> 20) + " MiB, more than half of "
                          "MemAvailable (" + std::to_string(avail >> 20) + " MiB); prefill stays on the fast kernels");
    } else if (Status s = st->model->build_int8_copies(*st->threads); !s.ok()) {
      warnings->push_back("model.onednn_prefill: " + s.message() + "; prefill stays on the fast kernels");
    } else {
      const int min_tokens = Forward::onednn_min_tokens_for(*st->model);
      st->forward->set_onednn_min_tokens(min_tokens);
      st->forward->set_int8_attention(cfg.int8_attention ? Forward::Int8Attention::Full : Forward::Int8Attention::Off);
      const std::string attention = st->forward->int8_attention_for(min_tokens)
                                        ? "int8 attention on whole blocks of F32/F16 rows (AVX-512 VNNI)"
                                        : cfg.int8_attention ? "exact attention (int8 attention needs AVX-512 VNNI)"
                                                             : "exact attention (model.int8_attention = false)";
      st->prefill_kernels = std::string(simd::onednn_describe()) + " for steps of >= " + std::to_string(min_tokens) +
                            " tokens (int8 copies " + std::to_string(st->model->int8_copy_bytes() >> 20) + " MiB, " +
                            (st->model->int8_copies_packed() ? "packed in oneDNN's layout" : "plain rows") + "; " +
                            attention + "), else " + st->prefill_kernels;
    }
  }

  // Sessions at rest hold their transcripts only in the cold packs' records (daemon/catalog.h): a
  // start that could not read them (another model, no segment store) is refused, never served empty.
  size_t resting = 0;
  {
    std::map<std::string, bool> at_rest;  // session -> its last record is a session_rest
    uint64_t written_with = st->fingerprint;
    for (const Record& r : records) {
      if (const auto* h = std::get_if<record::Header>(&r)) written_with = h->fingerprint;
      else if (const auto* x = std::get_if<record::SessionRest>(&r)) at_rest[x->id] = true;
      else if (const auto* x = std::get_if<record::SessionSnapshot>(&r)) at_rest[x->id] = false;
      else if (const auto* x = std::get_if<record::SessionCreate>(&r)) at_rest[x->id] = false;
      else if (const auto* x = std::get_if<record::SessionDelete>(&r)) at_rest.erase(x->id);
    }
    for (const auto& [id, rest] : at_rest) resting += rest;
    if (resting > 0 && written_with != st->fingerprint && options.serving) {
      return Status::InvalidArgument("model.path: " + std::to_string(resting) + " session(s) in " + cfg.state_dir.string() +
                                     " are at rest, their transcripts only in records coded for model " +
                                     fingerprint_hex(written_with) + ", not this one (" + fingerprint_hex(st->fingerprint) +
                                     "); start with the model they were written with");
    }
    if (resting > 0 && options.serving && !cfg.warm_tier) {
      return Status::InvalidArgument("state.warm_tier = false: " + std::to_string(resting) +
                                     " session(s) are at rest in the segment store's cold packs, which it turns off");
    }
  }

  PoolOptions po;
  po.depth = cfg.depth;
  po.tail_format = cfg.tail_format;
  po.model_fingerprint = st->fingerprint;
  if (options.serving) {
    // Measured after the model is loaded and fingerprinted: its pages are no longer available.
    st->ram_budget = size_ram_budget(cfg.policy.ram_budget, 0);
    po.ram_budget_bytes = st->ram_budget.bytes;
    po.eviction = cfg.policy.eviction;
    po.pin_fan_out = cfg.pin_fan_out;
    if (cfg.warm_tier) {
      po.store_dir = cfg.state_dir / "segments";
      std::error_code ec;
      std::filesystem::create_directories(po.store_dir, ec);
      if (ec) return Status::IOError("cannot create " + po.store_dir.string() + ": " + ec.message());
      if (Status s = check_cold_coder(po.store_dir / "cold", st->coder_fingerprint, st->fingerprint, resting, warnings); !s.ok())
        return s;
      const uint64_t base = cfg.disk_budget.percent > 0 ? free_disk_bytes(po.store_dir) + file_bytes_under(po.store_dir) : 0;
      st->disk_budget = size_budget(cfg.disk_budget, base, "the free disk space plus the segment files");
      po.disk_budget_bytes = st->disk_budget.bytes;
      po.uring_writes = cfg.uring_writes;
    }
  }
  st->pool = std::make_unique<SegmentPool>(m, *st->forward, po);
  st->prompts = std::make_unique<PromptBuilder>(m.tokenizer(), st->family);
  st->catalog = std::make_unique<Catalog>(m, *st->pool, *st->prompts, *st->store, cfg, st->fingerprint,
                                          st->coder_fingerprint);
  for (const auto& r : records) {
    if (Status s = st->catalog->apply(r); !s.ok()) warnings->push_back(s.message());
  }
  return st;
}

}  // namespace towers::daemon
