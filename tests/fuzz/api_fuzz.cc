// libFuzzer target for the JSON request bodies of towerd's API (daemon/api*.cc), through the one
// entry every request takes: handle_request, on a whole daemon in this process (open_state, the
// scheduler thread, the offload thread) serving a tiny synthetic model written at start-up, so no
// ../shared is needed. Input: one byte choosing the method and path (chat and legacy completions,
// segment PUT, link and compress, session create and message, policy, responses), then the body.
// Every request must get an answer (a generation is bounded by max_tokens 4), and a body the client
// wrote must never get a 5xx: whatever is wrong with it is the client's error (4xx) with a message.
#include <condition_variable>
#include <mutex>

#include "daemon/open_state.h"
#include "daemon/service.h"
#include "engine/model/synth.h"
#include "fuzz/fuzz_support.h"

using namespace towers;
using namespace towers::daemon;

namespace {
constexpr const char* kTarget = "api_fuzz";

// The answer of one request, once the handler (or a later thread) has given it.
class Answer final : public HttpResponder {
 public:
  void send(int status, std::string_view, std::string body, const Headers&) override {
    finish(status, std::move(body));
  }
  bool start_stream(int status, std::string_view) override {
    std::lock_guard lock(mu_);
    if (started_) return false;
    started_ = true;
    status_ = status;
    return true;
  }
  bool write_chunk(std::string_view data) override {
    std::lock_guard lock(mu_);
    body_.append(data);
    return true;
  }
  void end_stream() override { finish(status_, {}); }
  bool client_gone() const override { return false; }
  bool responded() const override {
    std::lock_guard lock(mu_);
    return started_ || done_;
  }
  void on_close(std::function<void()>) override {}  // the client never leaves

  // Waits for the answer; false if none came within the bound (a request left hanging).
  bool wait(int* status, std::string* body) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return done_; })) return false;
    *status = status_;
    *body = body_;
    return true;
  }

 private:
  void finish(int status, std::string body) {
    std::lock_guard lock(mu_);
    if (done_) return;
    if (!started_) status_ = status;
    started_ = done_ = true;
    body_.append(body);
    cv_.notify_all();
  }
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, done_ = false;
  int status_ = 0;
  std::string body_;
};

// towerd as daemon/main.cc wires it, without the socket, the compressor and the signals.
struct Daemon {
  std::filesystem::path dir = fuzz::scratch_path(kTarget);
  Config cfg;
  std::unique_ptr<OpenState> state;
  Metrics metrics;
  std::unique_ptr<ForwardStep> step;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Service> svc;
  Offload offload;

  Daemon() {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    SynthOptions synth;
    synth.shape = "tiny";
    synth.type = "q8_0";
    synth.out = (dir / "tiny.gguf").string();
    synth.log = [](const std::string&) {};
    if (Status st = synthesize_model(synth); !st.ok()) fuzz::die(kTarget, "cannot write the model: " + st.message());
    cfg.model_path = synth.out;
    cfg.state_dir = dir / "state";
    cfg.threads = 1;
    cfg.max_tokens = 4;
    cfg.default_max_tokens = 4;
    cfg.cold_enabled = false;
    OpenOptions oo;
    oo.threads = 1;
    oo.serving = true;
    std::vector<std::string> warnings;
    auto opened = open_state(cfg, oo, &warnings);
    if (!opened.ok()) fuzz::die(kTarget, "cannot open the state: " + opened.error());
    state = std::move(opened.value());
    step = std::make_unique<ForwardStep>(*state->forward);
    scheduler = std::make_unique<Scheduler>(*state->model, *step, *state->pool, metrics, Scheduler::Options{});
    if (Status st = state->store->append(state->catalog->header()); !st.ok()) fuzz::die(kTarget, st.message());
    if (auto r = state->catalog->restore(); !r.ok()) fuzz::die(kTarget, r.error());
    scheduler->start();
    svc.reset(new Service{cfg, *state->model, *state->pool, *scheduler, *state->catalog, metrics, *state->prompts, "tiny"});
    svc->offload = &offload;
    svc->ready = true;
  }
};

struct Route {
  const char* method;
  const char* path;
};
constexpr Route kRoutes[] = {
    {"POST", "/v1/chat/completions"},   {"POST", "/v1/completions"},       {"PUT", "/v1/segments/plat"},
    {"PUT", "/v1/segments/bot"},        {"POST", "/v1/segments/bot/link"}, {"POST", "/v1/segments/plat/compress"},
    {"POST", "/v1/sessions"},           {"POST", "/v1/sessions/s1/messages"}, {"PUT", "/v1/policy"},
    {"POST", "/v1/compress"},           {"POST", "/v1/responses"},
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Daemon daemon;
  if (size == 0) return 0;
  const Route& route = kRoutes[data[0] % std::size(kRoutes)];
  HttpRequest req;
  req.method = route.method;
  req.target = req.path = route.path;
  req.body = std::string(fuzz::text_of(data + 1, size - 1));
  req.content_type = "application/json";
  req.peer_uid = 0;
  auto answer = std::make_shared<Answer>();
  handle_request(*daemon.svc, req, *answer);
  int status = 0;
  std::string body;
  if (!answer->wait(&status, &body)) fuzz::die(kTarget, std::string("no answer to ") + route.method + " " + route.path);
  if (status >= 500) {
    fuzz::die(kTarget, std::to_string(status) + " for a client's body on " + route.method + " " + route.path + ": " + body);
  }
  return 0;
}
