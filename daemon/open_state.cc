#include "daemon/open_state.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "engine/codec/codec.h"
#include "simd/onednn_matmul.h"
#include "simd/ops.h"

namespace towers::daemon {

namespace {
double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Result<std::unique_ptr<OpenState>> open_state(const Config& cfg, const OpenOptions& options,
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
      st->forward->set_onednn_min_tokens(Forward::kOnednnMinTokens);
      st->prefill_kernels = std::string(simd::onednn_describe()) + " for steps of >= " +
                            std::to_string(Forward::kOnednnMinTokens) + " tokens (int8 copies " +
                            std::to_string(st->model->int8_copy_bytes() >> 20) + " MiB), else " + st->prefill_kernels;
    }
  }

  PoolOptions po;
  po.depth = cfg.depth;
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
      const uint64_t base = cfg.disk_budget.percent > 0 ? free_disk_bytes(po.store_dir) + file_bytes_under(po.store_dir) : 0;
      st->disk_budget = size_budget(cfg.disk_budget, base, "the free disk space plus the segment files");
      po.disk_budget_bytes = st->disk_budget.bytes;
    }
  }
  st->pool = std::make_unique<SegmentPool>(m, *st->forward, po);
  st->prompts = std::make_unique<PromptBuilder>(m.tokenizer(), st->family);
  st->catalog = std::make_unique<Catalog>(m, *st->pool, *st->prompts, *st->store, cfg, st->fingerprint);
  for (const auto& r : records) {
    if (Status s = st->catalog->apply(r); !s.ok()) warnings->push_back(s.message());
  }
  return st;
}

}  // namespace towers::daemon
