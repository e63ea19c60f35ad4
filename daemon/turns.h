// A turn: one generation request from its parsed body to the acknowledged reply, in one place.
// The handlers (daemon/api_openai.cc, api_towers.cc) parse the body once into a GenerationSpec —
// what the turn continues (a session's transcript, or a session-less prompt) and how to reply — and
// call run_generation. From there a Turn (daemon/turns.cc) goes through these steps, each one of its
// methods, on the thread named:
//   submit       HTTP       the prompt fits the context; the job joins the scheduler's queue
//   rejected     HTTP       it never ran (queue full, shutting down): a session is released (abort_turn)
//   prompt       scheduler  at admission, the catalog gives the prompt's tokens (prepare_turn,
//                           prepare_stateless); missing segments are built before the model runs
//   admitted     scheduler  the model is about to run: a stream's head goes out
//   text         scheduler  each choice's final text: an SSE chunk, or kept for the whole reply
//   finished     scheduler  the catalog seals the reply and queues the session's record (finish_turn),
//                           or seals a session-less prompt for reuse (finish_stateless); never waits
//   recorded     any        the record is durable (or failed): the reply goes out, or the error
//   client_left  I/O        the connection closed: the job is cancelled (the scheduler also asks
//                           client_gone before every step, so a disconnect costs at most one step)
// The methods run one after the other (the scheduler thread's order, then the record's), so a Turn
// needs no lock.
#pragma once
#include <variant>

#include "daemon/service.h"

namespace towers::daemon::api {

// What a generation continues: a session's next turn (Catalog::begin_turn has marked it busy), or a
// session-less prompt (a bot's chain or a system block, and the conversation after it).
using TurnContext = std::variant<Catalog::Turn, Catalog::Stateless>;

struct GenerationSpec {
  ReplyApi api = ReplyApi::Chat;
  GenParams params;
  TurnContext context;
  nlohmann::json extra;        // extra fields for the response ("session", "bot")
  std::string not_found_code;  // what a NotFound at admission is about ("session_not_found", ...)
  // A session made for this turn (a first response, daemon/api_responses.cc): when the turn is not
  // recorded (failed, cancelled), the session, still empty, goes too.
  bool remove_session_if_empty = false;

  size_t prompt_estimate() const;
  const Catalog::Turn* session_turn() const { return std::get_if<Catalog::Turn>(&context); }
};

// Runs the turn: submits it and returns at once; the Turn answers as the model runs (a
// chat.completion or text_completion object, or their SSE chunks ending in "data: [DONE]"). An error
// only when the job could not be queued (the turn is then released).
ApiStatus run_generation(Service& svc, HttpResponder& out, GenerationSpec spec);

// A session's next message: Catalog::begin_turn with room kept for the reply. Errors are the API's (a
// session that cannot fit its message even without its earlier turns: 400 context_length_exceeded).
// session_param: the request field that named the session ("" when the path did).
// input: the user's message, or tool results, and the request's tools (Catalog::TurnInput); an error
// about the tools names param "tools".
ApiStatus begin_session_turn(Service& svc, const std::string& session, const Catalog::TurnInput& input,
                             const GenParams& params, const std::string& session_param, GenerationSpec* spec);

// How many messages at the end of a conversation are a session's next turn: the last one when it
// is the user's, else the tool messages it ends with (0: neither). Those before are the conversation
// so far.
template <class Messages>
size_t new_turn_messages(const Messages& m) {
  if (!m.empty() && m.back().role == "user") return 1;
  size_t n = 0;
  while (n < m.size() && m[m.size() - 1 - n].role == "tool") ++n;
  return n;
}

// A session's next turn from chat messages (new_turn_messages: the user's message, or the tool
// messages answering the last reply's calls; anything else is 400 param "messages"), alone or after
// the whole conversation so far, which must then be the session's, with the request's tools (the
// session's first turn sets them, later ones send the same or none: daemon/catalog.h, "Tools on
// sessions"); the reply is decoded under the session's tools and the request's tool_choice
// (params gets the grammar and the tool format). daemon/api_openai.cc.
ApiStatus session_generation(Service& svc, const std::string& session, const std::vector<ToolChatMessage>& messages,
                             const ToolRequest& tools, const std::string& session_param, GenParams* params,
                             GenerationSpec* spec);

// A session-less generation: the catalog's prefix-reusing path (the prompt is sealed for reuse).
GenerationSpec stateless_spec(Catalog::Stateless stateless);

}  // namespace towers::daemon::api
