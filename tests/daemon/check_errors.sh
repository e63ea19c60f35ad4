#!/usr/bin/env bash
# towerd's one error model, end to end (stories260K): every error body is {"error":{message, type,
# param, code}} with a string code; the HTTP status follows the code (docs/api.md, "Errors"); a
# removed session is 404 session_not_found; the "model" field must name the served model, its file
# or an alias from [model] aliases (GET /v1/models/{id} likewise); every request field towerd does not
# support is refused with 400 naming it; and a reply that fails after its stream started ends with an
# SSE "error" event (forced here by a file size limit that makes the turn's state-log append fail).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
towerd_setup "$1" "$2" "$3"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
# expect_error STATUS CODE PARAM curl-args...: the status, and an error object with all four fields,
# a string code equal to CODE and param equal to PARAM ("null" = JSON null).
expect_error() {
  local want="$1" code="$2" param="$3"; shift 3
  local body got
  body="$(api -w '\n%{http_code}' "$@")"; got="$(echo "$body" | tail -1)"; body="$(echo "$body" | sed '$d')"
  [ "$got" = "$want" ] || fail "expected HTTP $want, got $got for $*: $body"
  echo "$body" | python3 -c "
import json, sys
e = json.load(sys.stdin)['error']
assert set(e) == {'message', 'type', 'param', 'code'}, e
assert isinstance(e['message'], str) and e['message'] and isinstance(e['type'], str), e
assert e['code'] == sys.argv[1], e
assert e['param'] == (None if sys.argv[2] == 'null' else sys.argv[2]), e
" "$code" "$param" || fail "bad error object for $* (want code $code, param $param): $body"
}
printf '[model]\naliases = ["gpt-4o-mini", "house-model"]\n' >"$tmp/towerd.toml"
start --config "$tmp/towerd.toml"

api -X PUT http://localhost/v1/segments/plat -d '{"level":"platform","text":"You tell stories."}' >/dev/null
api -X PUT http://localhost/v1/segments/bot -d '{"level":"bot","parent":"plat","text":"Your name is Bot."}' >/dev/null
chat=http://localhost/v1/chat/completions
msg='"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"temperature":0'

# Model naming.
for name in stories260K stories260K.gguf gpt-4o-mini house-model; do
  [ "$(api "$chat" -d "{\"model\":\"$name\",$msg}" | json 'd["object"]')" = chat.completion ] || fail "model $name refused"
  [ "$(api "http://localhost/v1/models/$name" | json 'd["id"]')" = stories260K ] || fail "GET /v1/models/$name"
done
[ "$(api "$chat" -d "{$msg}" | json 'd["object"]')" = chat.completion ] || fail "a request without model refused"
api http://localhost/v1/models | json 'd["data"][0]["aliases"]' | grep -q house-model || fail "/v1/models lists no aliases"
expect_error 404 model_not_found model "$chat" -d "{\"model\":\"gpt-5\",$msg}"
expect_error 404 model_not_found null http://localhost/v1/models/gpt-5

# Removed things.
api http://localhost/v1/sessions -d '{"bot":"bot","id":"s1"}' >/dev/null
api -X DELETE http://localhost/v1/sessions/s1 >/dev/null
expect_error 404 session_not_found null http://localhost/v1/sessions/s1/messages -d '{"content":"x"}'
expect_error 404 session_not_found session "$chat" -d '{"session":"s1","messages":[{"role":"user","content":"x"}]}'
expect_error 404 session_not_found null -X DELETE http://localhost/v1/sessions/s1
expect_error 404 segment_not_found null http://localhost/v1/segments/nope
expect_error 404 segment_not_found bot http://localhost/v1/sessions -d '{"bot":"nope"}'
expect_error 404 segment_not_found bot "$chat" -d "{\"bot\":\"nope\",$msg}"
expect_error 404 segment_not_found parent -X PUT http://localhost/v1/segments/b2 -d '{"level":"bot","parent":"nope","text":"x"}'
expect_error 404 endpoint_not_found null http://localhost/v1/nothing-here

# Other codes.
expect_error 400 invalid_request_error null "$chat" -d '{"messages": [}'
expect_error 400 invalid_request_error null "$chat" -d '{"messages": 1e6666}'  # a number past double (api_fuzz)
expect_error 400 invalid_request_error temperature "$chat" -d "{$msg,\"temperature\":\"hot\"}"
expect_error 400 invalid_request_error level -X PUT http://localhost/v1/segments/x -d '{"level":"galaxy","text":"x"}'
expect_error 409 conflict null -X DELETE http://localhost/v1/segments/plat
expect_error 405 method_not_allowed null -X DELETE http://localhost/v1/pool
expect_error 400 unknown_parameter temprature "$chat" -d "{$msg,\"temprature\":1}"
expect_error 400 unknown_parameter colour http://localhost/v1/sessions -d '{"bot":"bot","colour":"red"}'
python3 -c "import json; print(json.dumps({'messages':[{'role':'user','content':' '.join(['word']*5000)}]}))" >"$tmp/long.json"
expect_error 400 context_length_exceeded messages "$chat" --data-binary @"$tmp/long.json"
head -c 2000000 /dev/zero | tr '\0' 'a' >"$tmp/big.json"
expect_error 413 request_too_large null "$chat" --data-binary @"$tmp/big.json"

# Unsupported fields: refused naming them, unless they hold their neutral value.
for field in '"audio":{"voice":"alloy","format":"wav"}' '"modalities":["text","audio"]' \
             '"prediction":{"type":"content","content":"x"}' '"web_search_options":{}' '"store":true' \
             '"reasoning_effort":"low"' '"tools":[{"type":"code_interpreter"}]' \
             '"functions":[{"name":"f"}]'; do
  name="${field%%\":*}"; name="${name#\"}"
  [ "$name" = tools ] && name='tools[0].type'
  expect_error 400 unsupported_parameter "$name" "$chat" -d "{$msg,$field}"
done
expect_error 400 unsupported_parameter 'messages[0].content' "$chat" \
  -d '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}'
expect_error 400 unsupported_parameter 'messages[0].role' "$chat" -d '{"messages":[{"role":"function","content":"x"}]}'
# Tools: a tool message needs its call's id; a call asked for needs tools; tools bring their own grammar.
expect_error 400 invalid_request_error 'messages[1].tool_call_id' "$chat" -d '{"messages":[{"role":"user","content":"x"},{"role":"tool","content":"x"}]}'
expect_error 400 invalid_request_error tool_choice "$chat" -d "{$msg,\"tool_choice\":\"required\"}"
expect_error 400 invalid_request_error response_format "$chat" \
  -d "{$msg,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"response_format\":{\"type\":\"json_object\"}}"
expect_error 400 invalid_request_error 'messages[1].tool_calls[0].function.arguments' "$chat" \
  -d '{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{nope"}}]}]}'
# With a bot its segments are the system prompt, tools or not.
expect_error 400 invalid_request_error messages "$chat" \
  -d '{"bot":"bot","messages":[{"role":"system","content":"s"},{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}'
expect_error 400 unsupported_parameter 'messages[0].audio' "$chat" -d '{"messages":[{"role":"user","content":"x","audio":{"id":"a"}}]}'
expect_error 400 unsupported_parameter tools http://localhost/v1/sessions/nope/messages -d '{"content":"x","tools":[{"type":"function"}]}'
# chat_template_kwargs: enable_thinking only (stories260K's plain format has no switch: accepted, no change).
[ "$(api "$chat" -d "{$msg,\"chat_template_kwargs\":{\"enable_thinking\":false}}" | json 'd["object"]')" = chat.completion ] ||
  fail "chat_template_kwargs.enable_thinking refused"
expect_error 400 unsupported_parameter 'chat_template_kwargs.tools_in_user_message' "$chat" \
  -d "{$msg,\"chat_template_kwargs\":{\"tools_in_user_message\":true}}"
expect_error 400 invalid_request_error 'chat_template_kwargs.enable_thinking' "$chat" \
  -d "{$msg,\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}"
expect_error 400 invalid_request_error chat_template_kwargs "$chat" -d "{$msg,\"chat_template_kwargs\":[]}"
expect_error 400 unknown_parameter chat_template_kwargs http://localhost/v1/completions \
  -d '{"prompt":"x","chat_template_kwargs":{"enable_thinking":false}}'
# Honoured sampling fields with bad values: 400 naming the field.
expect_error 400 invalid_request_error top_logprobs "$chat" -d "{$msg,\"top_logprobs\":2}"
expect_error 400 invalid_request_error top_logprobs "$chat" -d "{$msg,\"logprobs\":true,\"top_logprobs\":21}"
expect_error 400 invalid_request_error logprobs "$chat" -d "{$msg,\"logprobs\":1}"
expect_error 400 invalid_request_error presence_penalty "$chat" -d "{$msg,\"presence_penalty\":2.5}"
expect_error 400 invalid_request_error frequency_penalty "$chat" -d "{$msg,\"frequency_penalty\":\"x\"}"
expect_error 400 invalid_request_error logit_bias "$chat" -d "{$msg,\"logit_bias\":{\"512\":1}}"
expect_error 400 invalid_request_error logit_bias "$chat" -d "{$msg,\"logit_bias\":{\"a\":1}}"
expect_error 400 invalid_request_error logit_bias "$chat" -d "{$msg,\"logit_bias\":{\"5\":101}}"
expect_error 400 invalid_request_error stream_options "$chat" -d "{$msg,\"stream_options\":{\"include_usage\":true}}"
expect_error 400 invalid_request_error n "$chat" -d "{$msg,\"n\":9}"
expect_error 400 invalid_request_error response_format.type "$chat" -d "{$msg,\"response_format\":{\"type\":\"yaml\"}}"
expect_error 400 invalid_request_error response_format.json_schema.schema "$chat" -d "{$msg,\"response_format\":{\"type\":\"json_schema\"}}"
expect_error 400 invalid_request_error response_format.json_schema.schema "$chat" \
  -d "{$msg,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"integer\",\"multipleOf\":2}}}}"
expect_error 400 unsupported_parameter n http://localhost/v1/sessions/nope/messages -d '{"content":"x","n":2}'
expect_error 400 unknown_parameter stream_options.colour "$chat" -d "{$msg,\"stream\":true,\"stream_options\":{\"colour\":1}}"
# Client errors are 4xx naming the rule, never 500 (these were 500, or accepted): a conversation that
# does not alternate user/assistant after an optional system message and end with the user's.
expect_rule() {  # expect_rule PARAM MESSAGES: 400 naming PARAM, the message stating the rule
  expect_error 400 invalid_request_error "$1" "$chat" -d "{\"messages\":$2,\"max_tokens\":2}"
  api "$chat" -d "{\"messages\":$2,\"max_tokens\":2}" | grep -q 'alternate user/assistant' || fail "no rule named for $2"
}
expect_rule 'messages[0].role' '[{"role":"assistant","content":"x"}]'
expect_rule messages '[{"role":"system","content":"x"}]'
expect_rule 'messages[1].role' '[{"role":"user","content":"x"},{"role":"user","content":"y"}]'
expect_rule messages '[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]'
expect_error 400 invalid_request_error 'messages[2].role' "$chat" \
  -d '{"messages":[{"role":"system","content":"s"},{"role":"user","content":"x"},{"role":"system","content":"y"}]}'
# compress and thaw take no fields; a session's id, when given, is not empty.
expect_error 400 unknown_parameter x http://localhost/v1/segments/plat/compress -d '{"x":1}'
expect_error 400 unknown_parameter x http://localhost/v1/segments/plat/thaw -d '{"x":1}'
expect_error 400 invalid_request_error null http://localhost/v1/segments/plat/thaw -d '[1]'
expect_error 400 invalid_request_error id http://localhost/v1/sessions -d '{"bot":"bot","id":""}'
expect_error 400 invalid_request_error id http://localhost/v1/sessions -d '{"bot":"bot","id":7}'
# Every route: a wrong method is 405, a path on no route 404 (the route table, daemon/routes.cc).
expect_error 405 method_not_allowed null -X PUT http://localhost/v1/sessions/s1
expect_error 405 method_not_allowed null -X DELETE http://localhost/v1/completions
expect_error 404 endpoint_not_found null http://localhost/v1/sessions//messages
expect_error 404 endpoint_not_found null http://localhost/v1/segments/plat/nothing
# Bodies of the wrong shape or with wrong types, route by route: 400 naming the field.
expect_error 400 invalid_request_error null -X PUT http://localhost/v1/segments/x -d '"text"'
expect_error 400 invalid_request_error text -X PUT http://localhost/v1/segments/x -d '{"level":"platform","text":3}'
expect_error 400 invalid_request_error parent http://localhost/v1/segments/bot/link -d '{"parent":false}'
expect_error 400 invalid_request_error null http://localhost/v1/sessions -d ''
expect_error 400 invalid_request_error content http://localhost/v1/sessions/s1/messages -d '{"content":["x"]}'
expect_error 400 invalid_request_error idle_seconds http://localhost/v1/compress -d '{"idle_seconds":"soon"}'
expect_error 400 invalid_request_error eviction -X PUT http://localhost/v1/policy -d '{"eviction":3}'
expect_error 400 invalid_request_error prompt http://localhost/v1/completions -d '{"prompt":3}'
expect_error 400 invalid_request_error logprobs http://localhost/v1/completions -d '{"prompt":"x","logprobs":true}'
expect_error 400 invalid_request_error 'messages[0]' "$chat" -d '{"messages":["hi"]}'
expect_error 400 invalid_request_error messages "$chat" -d '{"messages":{"role":"user"}}'
expect_error 400 invalid_request_error max_tokens "$chat" -d "{$msg,\"max_tokens\":\"4\"}"
expect_error 400 invalid_request_error model "$chat" -d "{$msg,\"model\":1}"
# /v1/completions reads "logprobs" as a count without the chat parser's boolean check.
[ "$(api http://localhost/v1/completions -d '{"prompt":"Once","max_tokens":2,"logprobs":2}' |
     json '1 <= len(d["choices"][0]["logprobs"]["top_logprobs"][0]) <= 2')" = True ] || fail "completions logprobs: N"

neutral='"n":1,"tools":[],"tool_choice":"auto","parallel_tool_calls":true,"response_format":{"type":"text"},"logprobs":false,"presence_penalty":0,"frequency_penalty":0,"logit_bias":{},"modalities":["text"],"audio":null,"store":false,"user":"u1","metadata":{"k":"v"}'
[ "$(api "$chat" -d "{$msg,$neutral}" | json 'd["object"]')" = chat.completion ] || fail "neutral values refused"

# A streamed reply whose turn cannot be stored: the stream has started, so the error is an SSE event.
api http://localhost/v1/sessions -d '{"bot":"bot","id":"s2"}' >/dev/null
stop
size="$(stat -c %s "$state/towerd.log")"
real_towerd="$towerd"
limited_towerd() {  # files at most the log's size rounded up to a KiB: the next big append fails
  trap '' XFSZ
  ulimit -f $(( (size + 1023) / 1024 ))
  exec "$real_towerd" "$@"
}
towerd=limited_towerd
start
long="$(python3 -c "print('once upon a time ' * 80)")"
api -N http://localhost/v1/sessions/s2/messages \
  -d "{\"content\":\"$long\",\"max_tokens\":8,\"temperature\":0,\"stream\":true}" >"$tmp/sse"
python3 -c '
import json, sys
events = [e for e in open(sys.argv[1]).read().split("\n\n") if e.strip()]
assert events[0].startswith("data: {"), events[0]  # the stream had started
err = [e for e in events if e.startswith("event: error\n")]
assert len(err) == 1, events
e = json.loads(err[0].split("\n", 1)[1][len("data: "):])["error"]
assert set(e) == {"message", "type", "param", "code"} and e["code"] == "server_error", e
assert events[-1] == "data: [DONE]", events[-1]
' "$tmp/sse" || fail "no SSE error event: $(cat "$tmp/sse")"
[ "$(api http://localhost/v1/sessions/s2 | json 'd["messages"]')" = 0 ] || fail "a turn that was not stored shows"
stop
echo "towerd errors: OK"
