// Where a session's messages sit in its detokenized transcript (daemon/rest_text.h): found in order,
// given back byte for byte; a message not found verbatim keeps its text; a place outside the text
// is refused, never cut short.
#include "daemon/rest_text.h"
#include "test_support.h"

using namespace towers;
using namespace towers::daemon;

TEST_CASE("messages are found in order in the transcript's text and come back the same") {
  const std::string text = "<s>[INST] hi [/INST] hi there</s>[INST] again hi [/INST] </s>";
  const std::vector<ChatMessage> messages = {{"user", "hi"}, {"assistant", "hi there"}, {"user", "again hi"}, {"assistant", ""}};
  auto where = locate_messages(text, messages);
  REQUIRE(where.size() == 4);
  for (const auto& w : where) CHECK(w.in_transcript);
  // Each one after the one before: the reply "hi there" is not the user's "hi" found again.
  CHECK(where[1].offset > where[0].offset);
  CHECK(where[2].offset > where[1].offset + where[1].length - 1);
  auto back = messages_at(text, where);
  REQUIRE_MESSAGE(back.ok(), back.error());
  REQUIRE(back->size() == messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    CHECK(back.value()[i].role == messages[i].role);
    CHECK(back.value()[i].content == messages[i].content);
  }
}

TEST_CASE("a message not in the transcript's text keeps its own, and a place outside the text is refused") {
  const std::string text = "user: caf\xc3\xa9 assistant: ok";
  auto where = locate_messages(text, {{"user", "cafe"}, {"assistant", "ok"}});
  REQUIRE(where.size() == 2);
  CHECK(!where[0].in_transcript);
  CHECK(where[0].content == "cafe");
  CHECK(where[1].in_transcript);
  auto back = messages_at(text, where);
  REQUIRE(back.ok());
  CHECK(back.value()[0].content == "cafe");
  CHECK(back.value()[1].content == "ok");

  where[1].offset = text.size() - 1;
  where[1].length = 2;
  auto bad = messages_at(text, where);
  REQUIRE(!bad.ok());
  CHECK(bad.status().is_corruption());
  CHECK_MESSAGE(bad.error().find("outside") != std::string::npos, bad.error());
}
