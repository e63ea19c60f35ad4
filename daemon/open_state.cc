#include "daemon/open_state.h"

#include <chrono>
#include <filesystem>

#include "engine/codec/codec.h"

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

  PoolOptions po;
  po.depth = cfg.depth;
  po.model_fingerprint = st->fingerprint;
  if (options.serving) {
    po.ram_budget_bytes = cfg.policy.ram_budget_bytes;
    po.disk_budget_bytes = cfg.disk_budget_bytes;
    po.eviction = cfg.policy.eviction;
    po.pin_fan_out = cfg.pin_fan_out;
    if (cfg.warm_tier) {
      po.store_dir = cfg.state_dir / "segments";
      std::error_code ec;
      std::filesystem::create_directories(po.store_dir, ec);
      if (ec) return Status::IOError("cannot create " + po.store_dir.string() + ": " + ec.message());
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
