// A state directory opened the one way towerd and towerctl's offline verbs share: the directory's
// lock first (a running towerd, or a second offline verb, is refused before anything is touched),
// then the model, its fingerprint, the segment pool and the catalog with every record applied.
// What differs between the two is in OpenOptions; what each does next (restore and serve, or read
// and change definitions) stays with the caller.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "daemon/catalog.h"
#include "daemon/config.h"
#include "daemon/state_store.h"
#include "engine/text/chat_template.h"
#include "engine/model/forward.h"
#include "engine/model/model.h"
#include "engine/base/thread_pool.h"
#include "mmapstore/segment_pool.h"

namespace towers::daemon {

struct OpenOptions {
  int threads = 0;  // model threads (<= 0: all)
  // Serving: the pool keeps segment files in state_dir/segments (when [state] warm_tier) under the
  // configured RAM and disk budgets, and the model's packed sources are released once fingerprinted.
  // Offline: the pool holds definitions only and maps no file.
  bool serving = false;
};

// Members in the order they are built; they refer to the ones above them, so they are destroyed in
// reverse. Not movable: hold it by the unique_ptr open_state() returns.
struct OpenState {
  std::unique_ptr<StateStore> store;
  size_t records = 0;  // how many records the log held (0: a new state directory)
  std::unique_ptr<Model> model;
  ChatFamily family{};
  std::unique_ptr<ThreadPool> threads;
  uint64_t fingerprint = 0;
  double load_seconds = 0, fingerprint_seconds = 0;  // what the start spent on each (logged)
  std::unique_ptr<Forward> forward;
  // [cold] coder: a smaller model of the same vocabulary that codes cold segments (null: the serving
  // model codes), and the fingerprint cold records must carry (the serving model's without a coder).
  std::unique_ptr<Model> coder;
  uint64_t coder_fingerprint = 0;
  std::string prefill_kernels;  // which kernels prefill steps take, for the start-up log
  SizedBudget ram_budget, disk_budget;  // as sized at start (logged, shown by /v1/pool)
  std::unique_ptr<SegmentPool> pool;
  std::unique_ptr<PromptBuilder> prompts;
  std::unique_ptr<Catalog> catalog;
};

// Settles cfg's model-dependent settings once the model is loaded (resolve_for_model).
// `warnings` gets what was wrong but not fatal (damaged records, records the catalog refused).
// Errors say what failed in words fit for the operator ("cannot open the state: ...").
Result<std::unique_ptr<OpenState>> open_state(Config& cfg, const OpenOptions& options,
                                              std::vector<std::string>* warnings);

}  // namespace towers::daemon
