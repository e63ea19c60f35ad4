// towerd: the Towers daemon. Loads one model, restores its state, serves the HTTP API on a Unix
// socket until SIGTERM. See etc/towerd.toml for every setting and README.md ("Running towerd").
#include <grp.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <mutex>
#include <optional>

#include "daemon/catalog.h"
#include "daemon/config.h"
#include "daemon/http_guard.h"
#include "daemon/http_server.h"
#include "daemon/log.h"
#include "daemon/notify.h"
#include "daemon/open_state.h"
#include "daemon/routes.h"
#include "daemon/scheduler.h"
#include "daemon/service.h"
#include "daemon/state_store.h"
#include "daemon/version.h"
#include "engine/text/chat_template.h"
#include "engine/text/tokenizer.h"
#include "engine/codec/codec.h"
#include "mmapstore/compressor.h"
#include "mmapstore/segment_file.h"

using namespace towers;
using namespace towers::daemon;

namespace {

int die(int code, const std::string& message) {
  std::fprintf(stderr, "towerd: %s\n", message.c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, model, socket, state_dir, listen;
  int threads = -1;
  bool debug = false;
  CLI::App app{
      "towerd — serves local LLM chat to many sessions from one CPU model, keeping shared prompt\n"
      "segments (platform → community → bot) in memory once.\n\n"
      "  towerd --config /etc/towerd/towerd.toml\n"
      "  towerd --model model.gguf --socket /tmp/towerd.sock --state-dir /tmp/towerd-state\n\n"
      "API (HTTP/1.1 on the Unix socket; try: curl --unix-socket SOCK http://localhost/healthz):\n"
      "  POST /v1/chat/completions   OpenAI-compatible, \"stream\": true gives SSE; extra fields \"session\", \"bot\"\n"
      "  GET  /v1/models, /v1/pool, /v1/policy (PUT to change), /metrics, /healthz\n"
      "  /v1/segments[/NAME], /v1/sessions[/ID[/messages|/transcript]]   the Towers API\n"
      "Signals: SIGTERM stops gracefully, SIGHUP re-reads the [policy] section of the config.\n"
      "Flags override the config file; every key is documented in etc/towerd.toml."};
  app.add_option("-c,--config", config_path, "TOML config file (etc/towerd.toml documents every key)");
  app.add_option("-m,--model", model, "GGUF model file (model.path)");
  app.add_option("-s,--socket", socket, "Unix socket path (server.socket, default /run/towerd/towerd.sock)");
  app.add_option("--listen", listen,
                 "Also serve HTTP on this loopback TCP address, e.g. 127.0.0.1:8080 (server.tcp_listen). TCP has no "
                 "peer credentials: set server.api_key_file to require a bearer token");
  app.add_option("--state-dir", state_dir, "Where segment definitions and transcripts live (state.dir, default /var/lib/towerd)");
  app.add_option("-t,--threads", threads, "Worker threads for the model (model.threads; 0 = all cores)")->check(CLI::Range(0, 1024));
  app.add_flag("--debug", debug, "Also log every refused request");
  app.set_version_flag("-V,--version", version_text("towerd"), "Print the version, git commit and SIMD target, then exit");
  CLI11_PARSE(app, argc, argv);
  set_log_debug(debug);

  Config cfg;
  if (!config_path.empty()) {
    if (Status st = load_config(config_path, &cfg); !st.ok()) return die(2, "invalid config: " + st.message());
  }
  if (!model.empty()) cfg.model_path = model;
  if (!socket.empty()) cfg.socket_path = socket;
  if (!state_dir.empty()) cfg.state_dir = state_dir;
  if (!listen.empty()) {
    if (auto a = parse_listen_address(listen); !a.ok()) return die(2, "--listen: " + a.error());
    cfg.tcp_listen = listen;
  }
  if (threads >= 0) cfg.threads = threads;
  if (Status st = validate(cfg); !st.ok()) return die(2, "invalid config: " + st.message());
  int socket_gid = -1;
  if (!cfg.socket_group.empty()) {
    struct group* g = ::getgrnam(cfg.socket_group.c_str());
    if (!g) return die(2, "invalid config: server.socket_group: no group named \"" + cfg.socket_group + "\"");
    socket_gid = static_cast<int>(g->gr_gid);
  }
  HttpServerOptions ho;
  ho.socket_path = cfg.socket_path;
  ho.socket_mode = cfg.socket_mode;
  ho.socket_gid = socket_gid;
  if (!cfg.tcp_listen.empty()) {
    const ListenAddress a = parse_listen_address(cfg.tcp_listen).value();  // validate() checked it
    ho.tcp_host = a.host;
    ho.tcp_port = a.port;
  }
  if (!cfg.api_key_file.empty()) {
    auto key = load_api_key(cfg.api_key_file);
    if (!key.ok()) return die(2, "invalid config: server.api_key_file: " + key.error());
    ho.api_key = key.value();
  }
  ho.allowed_uids = cfg.allowed_uids;
  ho.allowed_gids = cfg.allowed_gids;
  ho.allowed_origins = cfg.allowed_origins;
  ho.max_body_bytes = cfg.max_body_bytes;
  ho.io_threads = cfg.io_threads;
  ho.max_connections = cfg.max_connections;
  ho.max_connections_per_uid = cfg.max_connections_per_uid;
  ho.header_timeout = std::chrono::seconds(cfg.header_timeout_s);
  ho.body_timeout = std::chrono::seconds(cfg.body_timeout_s);
  ho.idle_timeout = std::chrono::seconds(cfg.idle_timeout_s);

  // Signals are taken synchronously by the main thread; block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  StartupNotifier starting;  // EXTEND_TIMEOUT_USEC to systemd while the start below works
  // The state directory's lock comes before anything touches it (a second towerd is refused there).
  std::vector<std::string> warnings;
  OpenOptions oo;
  oo.threads = cfg.threads;
  oo.serving = true;
  log_info("opening the state in " + cfg.state_dir.string() + " and loading model " + cfg.model_path);
  auto opened = open_state(cfg, oo, &warnings);
  for (const auto& w : warnings) log_warn(w);
  if (!opened.ok()) return die(opened.status().is_invalid_argument() ? 2 : 1, opened.error());
  OpenState& state = *opened.value();
  const Model& m = *state.model;
  ThreadPool& threads_pool = *state.threads;
  Forward& forward = *state.forward;
  SegmentPool& pool = *state.pool;
  PromptBuilder& prompts = *state.prompts;
  Catalog& catalog = *state.catalog;
  StateStore& store = *state.store;
  Metrics metrics;
  ForwardStep model_step(forward);
  // The cold tier's coder: [cold] coder (a smaller model of the same vocabulary) or the serving model.
  const Model& coder = state.coder ? *state.coder : m;
  // Waking a session at rest decodes its coded records: on the scheduler's waker thread with a
  // Forward of its own (one thread, over the coder), never on the model thread, so the streams go on
  // meanwhile. Declared before the scheduler, whose waker uses it until the scheduler is destroyed.
  ThreadPool wake_threads(1);
  Forward wake_forward(coder, wake_threads);
  // The pool's other callers of wake() (a build or a thaw that finds its segment at rest) pass the
  // serving model's Forward; with a coder of its own they decode on this one, one at a time.
  ThreadPool spare_coder_threads(1);
  std::optional<Forward> spare_coder_forward;
  if (state.coder) spare_coder_forward.emplace(coder, spare_coder_threads);
  std::mutex spare_coder_mu;
  Scheduler::Options so{cfg.max_batch, cfg.prefill_chunk, cfg.queue_length, cfg.decode_slowdown, cfg.modular.background_exact};
  // With a disk budget and the cold tier on, the compressor codes idle segments down to the budget.
  const bool budget_drives_cold = cfg.cold_enabled && state.disk_budget.bytes > 0;
  if (budget_drives_cold) so.disk_budget_slack = 1.25;
  Scheduler scheduler(m, model_step, pool, metrics, so);
  if (catalog.model_changed()) {
    log_warn("the state was written with another model; transcripts will be re-tokenized from their text");
  }
  if (state.records == 0) {
    if (Status st = store.append(catalog.header()); !st.ok()) return die(1, "cannot write the state log: " + st.message());
  }
  log_info("model " + m.config().name + " (" + m.config().arch_name + ", " + std::to_string(m.config().n_layer) +
           " layers, context " + std::to_string(m.config().n_ctx_train) + ", chat template " +
           std::string(chat_family_name(state.family)) + ", " + std::to_string(threads_pool.size()) + " threads); state: " +
           std::to_string(state.records) + " records from " + store.path().string() + "; model loaded in " +
           std::to_string(state.load_seconds) + " s, fingerprinted in " + std::to_string(state.fingerprint_seconds) + " s");
  log_info("prefill kernels: " + state.prefill_kernels);
  log_info("RAM budget " + state.ram_budget.text() + "; disk budget " + state.disk_budget.text() + "; lease tails " +
           simd::kv_quant_name(cfg.tail_format) + " (" + std::to_string(kv_bytes_per_token(m.config(), cfg.tail_format)) +
           " B a token" + (cfg.tail_format_auto ? "; tail_format = \"auto\": f16 from " +
                           std::to_string(kAutoF16TailBytes >> 10) + " KiB a token in f32" : std::string()) + ")");
  log_info("segment files written by " + state.pool->segment_writes());

  // Restore: every segment from its file (header checks only) or cold; no model runs before the
  // socket opens. What must be recomputed is built in the background once it is open.
  const auto t_restore = std::chrono::steady_clock::now();
  for (const std::string& problem : pool.cold_pack_problems()) log_warn(problem);
  auto restored = catalog.restore();
  if (!restored.ok()) return die(1, "cannot restore the state: " + restored.error());
  log_info("restored " + std::to_string(catalog.segment_count()) + " segments and " +
           std::to_string(catalog.session_count()) + " sessions in " +
           std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_restore).count()) +
           " s: " + std::to_string(restored->adopted) + " segment files adopted, " + std::to_string(restored->at_rest) +
           " transcript segments at rest in the cold packs, " + std::to_string(restored->cold) + " segments to recompute" +
           (restored->sessions_cut ? ", " + std::to_string(restored->sessions_cut) + " session(s) cut at damaged records" : ""));
  catalog.maybe_compact();
  scheduler.set_waker([&pool, &wake_forward](SegmentId id) { return pool.wake(id, &wake_forward); });
  catalog.set_waker([&scheduler](SegmentId id) { return scheduler.wake(id); });
  scheduler.start();

  // The cold tier: a SCHED_IDLE thread codes idle segments' tokens and drops their KV.
  Codec codec(coder, state.coder_fingerprint);
  CodecOptions codec_options;
  codec_options.chunk = cfg.cold_chunk;
  Compressor::Options co;
  co.idle_for = std::chrono::seconds(cfg.cold_idle_seconds);
  co.scan_every = std::chrono::seconds(cfg.cold_scan_seconds);
  co.while_over_disk_budget = budget_drives_cold;
  Compressor compressor(
      pool, coder,
      [&codec, codec_options](Forward& f, std::span<const int32_t> context, std::span<const int32_t> tokens) {
        return codec.encode(f, context, tokens, codec_options);
      },
      co);
  // A cold segment's tokens come back only from its record, decoded under the segment's parents (by
  // the scheduler's waker, above).
  pool.set_cold_decoder([&](Forward& f, std::span<const int32_t> context, std::span<const uint8_t> coded) {
    if (!spare_coder_forward || &f == &wake_forward) return codec.decode(f, context, coded, codec_options);
    std::lock_guard lock(spare_coder_mu);
    return codec.decode(*spare_coder_forward, context, coded, codec_options);
  });
  if (cfg.cold_enabled) {
    compressor.start();
    log_info("cold tier: segments idle for " + std::to_string(cfg.cold_idle_seconds) + " s are coded in the background" +
             (budget_drives_cold ? " while the segment files are over the disk budget" : "") + " by " +
             (state.coder ? "the coder " + cfg.cold_coder + " (" + coder.config().name + ", " +
                                std::to_string(coder.config().n_layer) + " layers)"
                          : std::string("the serving model")));
  }

  std::string model_id = std::filesystem::path(cfg.model_path).stem().string();
  Service svc{cfg, m, pool, scheduler, catalog, metrics, prompts, model_id};
  if (cfg.cold_enabled) svc.compressor = &compressor;
  svc.budget_rules.set(state.ram_budget.rule, state.disk_budget.rule);
  svc.forward = &forward;
  Offload offload;
  svc.offload = &offload;
  ho.on_response = [&metrics](std::string_view method, std::string_view path, int status, double seconds) {
    metrics.request_done(route_label(path), method_label(method), status, seconds);
  };
  HttpServer server(ho, [&svc](const HttpRequest& req, std::shared_ptr<HttpResponder> out) {
    handle_request(svc, req, *out);
  });
  if (Status st = server.start(); !st.ok()) return die(1, st.message());
  svc.http = &server;
  svc.ready = true;
  log_info("listening on " + cfg.socket_path + (cfg.tcp_listen.empty() ? "" : " and " + cfg.tcp_listen) +
           (cfg.tcp_listen.empty() || !ho.api_key.empty() ? "" : " (TCP without server.api_key_file: any local user may connect)"));
  starting.ready("serving " + model_id);
  if (!restored->rebuild.empty()) {
    auto left = std::make_shared<std::atomic<size_t>>(restored->rebuild.size());
    log_info("recomputing " + std::to_string(restored->rebuild.size()) + " segment(s) in the background");
    for (SegmentId id : restored->rebuild) {
      scheduler.build(
          id, [left](const Status& st) {
            if (--*left == 0 && st.ok()) log_info("background recompute done");
          },
          /*background=*/true);
    }
  }

  if (!restored->exact.empty()) {
    if (cfg.modular.background_exact) {
      log_info(std::to_string(restored->exact.size()) + " segment(s) restarted modular; recomputing them exactly in the background");
      for (SegmentId id : restored->exact) scheduler.rebuild_exact(id);
    } else {
      log_info(std::to_string(restored->exact.size()) + " segment(s) restarted modular ([modular] background_exact = false)");
    }
  }

  const auto watchdog = watchdog_interval();
  const auto tick = watchdog.count() > 0 ? std::chrono::duration_cast<std::chrono::milliseconds>(watchdog / 3)
                                         : std::chrono::milliseconds(5000);
  for (;;) {
    timespec ts{static_cast<time_t>(tick.count() / 1000), static_cast<long>((tick.count() % 1000) * 1000000)};
    int sig = sigtimedwait(&sigs, nullptr, &ts);
    if (sig == SIGHUP) {
      if (cfg.source.empty()) {
        log_warn("SIGHUP: no config file to reload");
        continue;
      }
      auto p = load_policy(cfg.source);
      if (!p.ok()) {
        log_error("SIGHUP: policy not reloaded: " + p.error());
        continue;
      }
      pool.set_eviction(p->eviction);
      const SizedBudget ram = size_ram_budget(p->ram_budget, pool.stats().resident_bytes);
      pool.set_ram_budget(ram.bytes);
      svc.budget_rules.set_ram(ram.rule);
      scheduler.post([&pool] { pool.enforce_budget(); });
      log_info("SIGHUP: policy reloaded: eviction " + std::string(to_string(p->eviction)) + ", RAM budget " +
               ram.text());
      continue;
    }
    if (sig == SIGTERM || sig == SIGINT) {
      log_info(std::string(sig == SIGTERM ? "SIGTERM" : "SIGINT") + ": stopping");
      break;
    }
    // Periodic: watchdog (only while the scheduler makes progress), log compaction, and the old
    // segments of edits that nothing uses any more.
    if (watchdog.count() > 0 && scheduler.stalled_seconds() < 60) sd_notify_message("WATCHDOG=1");
    if (cfg.cold_enabled) {
      if (const size_t resting = catalog.rest_sessions()) log_info(std::to_string(resting) + " session(s) went to rest");
    }
    catalog.maybe_compact();
    catalog.collect_retired();
  }
  svc.stopping = true;
  sd_notify_message("STOPPING=1");
  server.stop_accepting();
  scheduler.shutdown(std::chrono::seconds(10));  // running replies get 10 s to finish, then are cancelled
  compressor.stop();
  const int left = server.wait_idle(std::chrono::seconds(5));
  catalog.maybe_compact();
  log_info("stopped" + (left ? " (" + std::to_string(left) + " idle connection(s) dropped)" : std::string()));
  std::fflush(stderr);
  ::_exit(0);  // connection threads may still be parked on idle keep-alive sockets
}
