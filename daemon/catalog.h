// The Towers state: hierarchy segments (platform → community → bot, defined by name and text) and
// sessions (bound to a bot, with their transcript), the pool segments that hold their KV, and the
// records that make them survive a restart (daemon/state_store.h).
//
// One class, in files by what each part owns:
//   catalog.cc           the lock and what every part shares: views, counts, queueing records
//   catalog_segments.cc  the segment hierarchy: definitions, edits (modular placement), links, removal
//   catalog_sessions.cc  sessions and their turns, and session-less requests
//   catalog_records.cc   the record side: replay (apply), restore at start, compaction, the cold tier
//   catalog_rest.cc      sessions at rest: going to rest, and waking
//
// A session's context is its bot's chain of hierarchy segments followed by its transcript tokens
// (daemon/prompt.h says how text becomes tokens). After every reply the evaluated part of the
// transcript is sealed into a pool segment (transcript format) under the previous one; the token
// offsets where these segments end ("seals") and the segments' pool ids are recorded. A session holds
// only the segments its transcript uses: when its oldest turns are dropped, the segments of the
// chain it left go once the turn that left them is recorded.
//
// Every pool segment has a file in the store (mmapstore/segment_pool.h), named by its id, and the
// records name those ids. A restart (restore) adopts the files — header checks only, no model runs —
// so the socket opens after O(number of files) work; a file that fails a check is logged, its segment
// added cold and rebuilt (hierarchy segments in the background, transcripts on the session's next
// message), with the same boundaries and bytes: the next reply is the one the daemon would have
// given without the restart. A session whose transcript file cannot be used is recorded again naming
// no file for it (and the ones after it), so the next start does not find (and log) the same damage.
//
// The lock: the catalog is in-memory state. Its one mutex (a NoWaitMutex, engine/base/no_wait_lock.h)
// is held only to decide: never across a record's fsync, a compaction, a file operation, a pool call
// that does I/O or copies KV (seal, derive, remove, adopt, ...), or the model — checked at those
// places, fatal in debug builds. A change is decided and its records queued under the lock
// (StateStore::append_async: no I/O on the caller's thread, so the log's order is the order the state
// changed); the method then releases the lock, does the pool work it decided (removals, a derive),
// and waits for its records before it returns (the caller acknowledges the client then). The only
// pool calls under the lock are the in-memory ones that do no I/O and run no model: info() and
// add_cold() (a cold entry in the trie). No method runs the model: encode_cold (offline) runs it
// with the lock released; segments a request needs that are not computed yet are put in the pool
// cold and the scheduler computes them as scheduled work. docs/store.md, "Who waits for what".
//
// Tools on sessions: a session may have tool definitions (OpenAI "tools"), given by its first turn
// and fixed for its life (a request with other tools is refused; one without them keeps them). They
// are part of its system block, where the model family's tool format wants them
// (engine/constrained/tool_format.h, tools_block): Hermes at the end of the system text, so the
// session's base is its bot's parent chain, the bot's level left open (no template text after it:
// "bot-open:BOT") and the tools segment closing the block ("tools:BOT"); Llama 3 JSON at the start of
// the first user message, so the tools segment follows the bot's own segment. These two are pool
// segments keyed by their tokens under their parent, like a session-less system block: every session
// of the bot with the same tools shares them; they are not recorded (the session's `tools` is), and
// a restart puts them in cold. A turn that answers the previous reply's tool calls brings their
// results (role "tool") instead of a user message; the reply's calls are its text, as generated.
//
// Recovery never invents a conversation: turns are numbered, and a session whose replay misses a turn
// (a damaged record) is cut after the last turn before the gap (later turns dropped, the log line
// names the session); the log is then rewritten to the state served.
//
// Sessions at rest: once every transcript segment of an idle session is coded and its record is
// durable in the cold packs, rest_sessions() lets go of its text and tokens (what stays: ids, roles,
// counts, where each message sits in the detokenized transcript, the few tokens after the last seal)
// and the next compaction writes it as a session_rest record, so neither RAM nor the log holds its
// text. Whatever needs them again (a turn, its messages, an edit above its bot) first wakes it:
// wake_session decodes the records under their parents on the scheduler's waker (the caller waits,
// off the I/O threads: daemon/api.cc) and records the session whole again (a session_snapshot), so a
// turn recorded after it replays onto a whole session. docs/store.md, "Sessions at rest".
//
// Errors are Status codes, never HTTP: NotFound (no such segment or session), InvalidArgument (a bad
// name, level, parent or text), Conflict (busy, has children or sessions, exists already),
// ResourceExhausted (limits.max_sessions), IOError (the state log could not be written). The HTTP edge
// (daemon/api_error.h) maps them; daemon/api_views.h turns the views below into the API's JSON.
//
// Methods marked "scheduler thread" are called from Scheduler tasks or job hooks only; they never
// wait for the disk.
#pragma once
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "daemon/prompt.h"
#include "daemon/records.h"
#include "daemon/scheduler.h"
#include "daemon/state_store.h"
#include "engine/base/no_wait_lock.h"
#include "engine/codec/codec.h"
#include "mmapstore/segment_pool.h"

namespace towers::daemon {

struct SegmentDef {
  std::string name;
  Level level = Level::Bot;
  std::string parent, text;
  std::vector<int32_t> tokens;   // this level's tokens (computed from the text)
  SegmentId pool_id = kNoSegment;   // its pool segment (and store file); kept across text changes
  SegmentId recorded_id = kNoSegment;  // the id its last segment_put record names
  int64_t updated = 0;           // unix seconds
  // Tier at rest, set by `towerctl compress|thaw` (daemon or offline): non-empty = cold, the codec
  // container of `tokens` under the parent chain. A cold definition is put in the pool without a
  // prefill (at start or on demand) and thaws on its first lease.
  std::vector<uint8_t> coded;
  // Its KV before an edit above it (or a move to another parent), with the same tokens: the next
  // time it goes in the pool it is placed modularly from that segment ([modular] in the config).
  SegmentId modular_source = kNoSegment;
};

struct Session {
  std::string id, bot;
  int64_t created = 0, updated = 0;
  // user, assistant, user, assistant, ...; a "tool" message in a user's place holds the results of the
  // calls of the reply before it, as JSON (tool_results_json)
  std::vector<ChatMessage> messages;
  std::vector<int32_t> transcript;    // tokens after the bot's chain
  std::vector<size_t> seals;          // transcript offsets where its pool segments end, ascending
  std::vector<SegmentId> seal_ids;    // the pool segment ending at each seal (empty: not recorded)
  SegmentId tail_segment = kNoSegment;  // the pool segment ending at seals.back() (0 = not resident)
  uint64_t turns = 0;                 // completed turns (numbered 1..turns in the log)
  std::vector<size_t> turn_ends;      // transcript offset after each kept turn
  std::string tools;                  // its tool definitions (tools_json), "" none ("Tools on sessions")
  bool cut = false;                   // replay found a gap: later turns of it were dropped
  // Per seal, its segment from before an edit above the session's bot (kNoSegment: none to reuse):
  // the session's next turn places its transcript segments from them modularly ([modular]).
  std::vector<SegmentId> modular_sources;
  bool busy = false;
  // The turn in flight moved the kept transcript up (its oldest turns dropped): the segments it added.
  // They replace the recorded chain once the turn is recorded, and go if it is not.
  std::vector<SegmentId> shifted;
  // The turn whose record is queued and not durable yet: a compaction's snapshot includes it (the
  // snapshot replaces the record, which is queued before it). A pointer: every session at rest pays
  // for this member, and only a turn in flight uses it.
  std::shared_ptr<const record::SessionTurn> recording;
  // At rest ("Sessions at rest"): `messages` and `transcript` are empty; this says where they come
  // back from.
  struct Rest {
    size_t tokens = 0;             // the transcript's length
    std::vector<int32_t> tail;     // its tokens after seals.back() (the rest are in the coded records)
    std::vector<record::RestMessage> where;  // each message's place in the detokenized transcript
    std::string damaged;           // why it cannot come back ("": it can)
  };
  std::optional<Rest> rest;
  size_t message_count() const { return rest ? rest->where.size() : messages.size(); }
  size_t transcript_size() const { return rest ? rest->tokens : transcript.size(); }
};

// What the API shows of a hierarchy segment.
struct SegmentView {
  std::string name;
  Level level = Level::Bot;
  std::string parent, text;
  size_t tokens = 0;
  int64_t updated = 0;
  size_t coded_bytes = 0;              // > 0: it restarts cold (its coded tokens are in the state log)
  std::vector<std::string> children;
  size_t sessions = 0;
  std::optional<SegmentInfo> pool;     // its KV in the pool, if any
  std::optional<double> exact_progress;  // modular: how far its exact rebuild has come (the scheduler's)
};

// What the API shows of a session.
struct SessionView {
  std::string id, bot;
  int64_t created = 0, updated = 0;
  size_t messages = 0, transcript_tokens = 0;
  bool busy = false, warm = false;     // warm: its transcript segments are in RAM
  std::optional<std::vector<ChatMessage>> transcript;  // when asked for
  uint64_t turns = 0;  // completed turns, numbered 1..turns (the kept ones are the last messages / 2)
  std::string tools;   // tools_json, "" none
  std::optional<ToolFormat> tool_format;  // with tools: how its replies' calls are written
  bool at_rest = false;  // its text and tokens only in its coded records ("Sessions at rest")
};

class Catalog {
 public:
  // `fingerprint`: the serving model's; `coder_fingerprint`: the model that codes cold segments ([cold]
  // coder; 0 = the serving model).
  Catalog(const Model& model, SegmentPool& pool, const PromptBuilder& prompts, StateStore& store, const Config& config,
          uint64_t fingerprint, uint64_t coder_fingerprint = 0);

  // Startup: applies one replayed record (no model runs). An error means it was skipped (says why).
  Status apply(const Record& r);
  // The header of this model's log (written when a log is created or compacted).
  record::Header header() const;
  // Startup, after apply and before any other thread uses the catalog (it reads files, so it runs
  // without the lock): puts every segment in the pool from its file (adopt: header checks only) or,
  // when its file is missing or fails a check (logged), cold. Returns the hierarchy segments to
  // recompute in the background. Runs no model. What it repaired is recorded, once: sessions cut at
  // a damaged record or another model's log rewrite the log to the state served; a session whose
  // transcript file cannot be used gets a session_snapshot naming no file from that segment on. The
  // next start finds nothing to repair.
  struct Restored {
    size_t adopted = 0, cold = 0, sessions_cut = 0;
    size_t at_rest = 0;              // transcript segments back at rest from the cold packs
    size_t sessions_repaired = 0;    // sessions whose log named a transcript file that cannot be used
    std::vector<SegmentId> rebuild;  // hierarchy segments whose file was unusable
    std::vector<SegmentId> exact;    // segments adopted modular (hierarchy, transcripts): to rebuild exactly
  };
  Result<Restored> restore();
  size_t segment_count() const;
  size_t session_count() const;
  size_t warm_sessions() const;  // sessions whose transcript segments are resident

  // Hierarchy segments. They return once their record is durable. put_segment puts the segment
  // (and any missing parent) in the pool cold; `build` is what the scheduler must compute before
  // the segment is ready (kNoSegment: nothing, it is there already).
  // Editing a segment with children (or moving one to another parent) places every segment below
  // it modularly ([modular] enabled): `placed` lists them, parents first, for the scheduler to build
  // now (each prefills only its first repair_tokens tokens); their old segments are retired.
  struct Put {
    SegmentView view;
    SegmentId build = kNoSegment;
    std::vector<SegmentId> placed;
    std::vector<SegmentId> retired;  // its old segments and its subtree's: no exact rebuild of them
  };
  // like: a segment with the same text under another parent (a bot linked under a second community):
  // the new one is placed from its KV modularly instead of being prefilled whole.
  Result<Put> put_segment(const std::string& name, Level level, const std::string& parent, const std::string& text,
                          const std::string& like = "");
  // One bot under another parent: defines `name` under `parent` with the text and level of `source`,
  // placed from source's KV (put_segment's `like`). Later edits of either do not change the other.
  Result<Put> link_segment(const std::string& source, const std::string& name, const std::string& parent);
  Status remove_segment(const std::string& name);
  Result<SegmentView> segment(const std::string& name) const;
  std::vector<SegmentView> segments() const;  // platform, community, bot order

  // The longest prompt served: [limits] max_prompt_tokens within the model's context, and no longer
  // than the RAM budget can hold as a request's tail ([model] tail_format: the worst case, nothing cached).
  size_t prompt_limit() const;
  // What sets prompt_limit(), for the client's error: "model context 131072", "[limits]
  // max_prompt_tokens 4096", "the RAM budget of 1.0 GiB holds the KV of 16384 prompt tokens, ...".
  std::string prompt_limit_why() const;

  // Sessions. id "" = a random one. create and delete return once their record is durable.
  Result<SessionView> create_session(const std::string& bot, const std::string& id);
  // create_session without waiting: `done` runs once the record is durable (the session) or not (the
  // error; the session is gone again), on the log's completion thread; or at once on a refusal. Many
  // creations at once share their fsyncs (the log's group commit) and hold no thread meanwhile.
  using SessionCreated = std::function<void(Result<SessionView>)>;
  void create_session_async(const std::string& bot, const std::string& id, SessionCreated done);
  Status delete_session(const std::string& id);
  // with_transcript on a session at rest: Unavailable (wake_session it first).
  Result<SessionView> session(const std::string& id, bool with_transcript) const;
  std::vector<SessionView> sessions() const;

  // Sessions at rest (above). rest_sessions: every idle session whose transcript segments are all at
  // rest in the cold packs goes to rest; returns how many. at_rest: the session is (wake it before a
  // turn or its messages). wake_session: decodes it back (blocks for the decode and a record; call it
  // off the I/O threads); Ok when it is not at rest. sessions_at_rest_below: the sessions an edit of
  // `name` would need awake.
  size_t rest_sessions();
  bool at_rest(const std::string& id) const;
  Status wake_session(const std::string& id);
  std::vector<std::string> sessions_at_rest_below(const std::string& name) const;
  // How a segment at rest is decoded back (the scheduler's waker: its own Forward, never the model
  // thread's). Unset: SegmentPool::wake on the caller's thread (offline tools, tests).
  using Waker = std::function<Status(SegmentId)>;
  void set_waker(Waker waker) { waker_ = std::move(waker); }

  // A session turn: begin (any thread; marks it busy and returns the new user turn's tokens), prepare
  // (scheduler thread, at admission: the whole prompt; missing segments go in the pool cold), finish
  // (scheduler thread, when the model is done: seals and queues the turn's record unless it failed or was
  // cancelled; never waits). `done` runs once the turn is settled — recorded durably (ok) or not (the
  // error) — on whichever thread that happens; only then is the turn part of the session and busy
  // cleared, and the segments the session no longer uses (after a drop) leave the pool.
  struct Turn {
    std::string session;
    std::string role;  // "user", or "tool": `user` holds tool results (TurnInput)
    std::string user;
    std::string tools;       // the session's tools for this turn (tools_json; "" none)
    bool sets_tools = false;  // this turn brings them (the session's first): recorded with it
    std::vector<int32_t> delta;
    size_t prompt_estimate = 0;  // base + transcript + delta tokens (after any drop)
    size_t drop_turns = 0, drop_tokens = 0;  // oldest turns left out so that the reply fits the context
    uint64_t number = 0;  // the number this turn gets once recorded (1, 2, ...)
  };
  // reserve: tokens to keep free for the reply. When base + transcript + message + reserve pass the
  // prompt limit, the oldest whole turns are dropped ([limits] overflow = "truncate"); the kept
  // transcript segments move up by a RoPE shift. ResourceExhausted when even that cannot fit.
  // What a turn brings: a user message, or (role "tool") the results of the previous reply's tool
  // calls as tool_results_json; and the request's tools (tools_json; "" none sent: the session's
  // stay). InvalidArgument when the tools differ from the session's, or when a session that had turns
  // without tools is sent some ("Tools on sessions").
  struct TurnInput {
    std::string role = "user", content, tools;
  };
  Result<Turn> begin_turn(const std::string& session, const TurnInput& input, size_t reserve = 0);
  Result<std::vector<int32_t>> prepare_turn(const Turn& t);
  void finish_turn(const Turn& t, const GenOutcome& out, Lease* lease, const std::string& reply_text,
                   std::function<void(const Status&)> done);
  void abort_turn(const std::string& session);  // the job never reached the scheduler

  // Session-less requests. base: the bot's chain, or the system block (cached as a segment). prepare
  // (scheduler thread) returns the prompt; finish seals the prompt for reuse (bounded count).
  struct Stateless {
    std::string bot;                   // "" = none
    std::string tools;                 // with a bot: tools_json, in the base as a session's ("Tools on sessions")
    std::optional<std::string> system;
    std::vector<ChatMessage> turns;    // user, assistant, ..., user
    std::vector<int32_t> base;         // without a bot: the system block's tokens
    std::vector<int32_t> rest;         // tokens after the base
    size_t prompt_estimate = 0;
  };
  // tools (with a bot only): the base holds them as a session with these tools has them, and the
  // messages may be of any role the template knows (as render_tool_messages gives them).
  Result<Stateless> begin_stateless(const std::string& bot, std::vector<ChatMessage> messages,
                                    const std::string& tools = "");
  Result<std::vector<int32_t>> prepare_stateless(const Stateless& s);
  void finish_stateless(GenOutcome& out, Lease* lease);

  // Compaction when the log is big and mostly dead (queued under the lock, waited for without it);
  // `now`: whatever the log's size (sessions just went to rest: their text leaves the log).
  void maybe_compact(bool now = false);
  // Removes the segments let go earlier that could not go then (an edit's old segments, a session's
  // old chain) once nothing uses them any more (leases, a modular placement waiting to be built from
  // them). Returns how many are left.
  size_t collect_retired();

  // The cold tier at rest. record_cold_tiers (after the daemon's compressor ran): every hierarchy
  // segment the pool holds cold gets its coded bytes recorded; returns their names. set_hot (after a
  // thaw): the segment restarts hot. encode_cold (offline, towerctl on a stopped daemon's state):
  // codes the segment's tokens under its parent chain (the model runs, the lock released) and
  // records them.
  std::vector<std::string> record_cold_tiers();
  Status set_hot(const std::string& name);
  Result<size_t> encode_cold(const std::string& name, const Codec& codec, Forward& forward, const CodecOptions& options);
  // Offline idleness: definitions (not cold yet) with no change and no session turn in their subtree
  // for idle_seconds before now, leaves first.
  std::vector<std::string> idle_segments(int64_t idle_seconds, int64_t now) const;
  bool model_changed() const { return model_changed_; }

 private:
  // (the configured prompt limit, the tokens whose tail the RAM budget holds when fewer, else 0)
  std::pair<size_t, size_t> prompt_limits() const;
  SegmentDef* find_def(const std::string& name);
  const SegmentDef* find_def(const std::string& name) const;
  std::vector<SegmentDef*> chain_locked(const std::string& name);  // root first
  Status tokenize_def_locked(SegmentDef& d);
  Status ensure_chain_locked(const std::string& name, SegmentId* id, std::vector<int32_t>* base);
  Status ensure_session_locked(Session& s, SegmentId base_id);
  // A session's base: its bot's chain, and with tools the segments that hold them ("Tools on
  // sessions"). session_base_locked puts them in the pool (cold when missing) and gives the last one's
  // id and their tokens; base_tokens_locked only counts the tokens.
  struct BasePlan {
    std::string chain;  // the hierarchy chain it starts with ("": none, a root bot opened for tools)
    std::vector<std::vector<int32_t>> pieces;  // then these pool segments, in order
    std::vector<std::string> labels;
  };
  Result<BasePlan> base_plan_locked(const std::string& bot, const std::string& tools);
  Status session_base_locked(const std::string& bot, const std::string& tools, SegmentId* id, std::vector<int32_t>* base);
  Result<size_t> base_tokens_locked(const std::string& bot, const std::string& tools);
  // The tokens of a turn's user side (a user message, or tool results) after n_before turns.
  Result<std::vector<int32_t>> turn_delta_locked(size_t n_before, const std::string& role, const std::string& content) const;
  SegmentOptions def_options_locked(const SegmentDef& d) const;
  SegmentOptions transcript_options(const Session& s) const;
  void record_binding_locked(SegmentDef& d);  // a segment_put naming d's current pool id
  std::vector<SegmentId> session_segments_locked(const Session& s) const;
  // Segments any session other than `except` names or uses (sessions with the same history share).
  std::set<SegmentId> sessions_segments_locked(const std::string& except) const;
  // An edit of `name`: its old pool segments and its subtree's (sessions' too) are to go (`remove`,
  // leaves first, for remove_segments once the lock is released), except those a modular placement
  // reuses (SegmentDef::modular_source of the definitions below it, set here when `modular`, and
  // self_source), which are retired (collect_retired); every definition below it gets a new segment.
  // Returns the definitions below it placed modularly, parents first.
  std::vector<std::string> forget_pool_subtree_locked(const std::string& name, bool modular, SegmentId self_source,
                                                      std::vector<SegmentId>* remove, std::vector<SegmentId>* retired);
  // Without the lock: removes these segments from the pool (and their files), in order (leaves
  // first); what cannot go yet (leased, or something was computed on top) is retired for
  // collect_retired to try again.
  void remove_segments(const std::vector<SegmentId>& ids);
  // Queues a record under the lock (no I/O here); the caller waits for it after releasing the lock.
  std::future<Status> queue_record_locked(const Record& r);
  SegmentView view_locked(const SegmentDef& d) const;
  SessionView view_locked(const Session& s, bool with_transcript) const;
  size_t live_estimate_locked() const;
  std::vector<Record> live_records_locked() const;
  // Sets d's tier at rest and queues its segment_tier record (wait for it without the lock).
  std::future<Status> record_tier_locked(SegmentDef& d, std::vector<uint8_t> coded);
  std::string cold_mismatch_locked(const SegmentDef& d, std::span<const int32_t> context) const;
  // A session at rest whole again from its woken segments (their tokens in the trie): Corruption
  // when they do not give back what it recorded.
  Status unrest_locked(Session& s);
  std::vector<std::string> sessions_at_rest_below_locked(const std::string& name) const;

  // Moves a session's kept transcript up after `drop_tokens` of it were dropped: the segments of the
  // kept part go in under base_id at their new positions as RoPE-shifted copies of the old ones
  // (derived segments: at once when the old one is in memory, else cold with the recipe, and the
  // scheduler pages in or computes the old one and shifts). The session itself changes only when the
  // turn is recorded, and that record waits for the shifted segments' files (finish_turn). The
  // segments it added go in s.shifted; `derive` lists those whose source is in memory now (the
  // caller shifts them once the lock is released).
  Status shift_kept_locked(Session& s, SegmentId base_id, size_t drop_tokens, std::vector<SegmentId>* derive);

  const Model& model_;
  SegmentPool& pool_;
  const PromptBuilder& prompts_;
  StateStore& store_;
  const Config& config_;
  uint64_t fingerprint_;
  uint64_t coder_fingerprint_;  // what a cold record must have been coded with
  bool model_changed_ = false;
  mutable NoWaitMutex mu_;
  std::map<std::string, SegmentDef> defs_;
  std::map<std::string, Session> sessions_;
  std::deque<SegmentId> prompt_cache_;  // sealed prompts of session-less requests, oldest first
  // Segments to remove that could not go yet (leased, or something was computed on top): old
  // segments of edited definitions, a session's old chain; leaves first (collect_retired).
  std::vector<SegmentId> retired_;
  Waker waker_;
};

}  // namespace towers::daemon
