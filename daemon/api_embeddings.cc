// POST /v1/embeddings (OpenAI's, as llama-server's --embeddings serves it): each input's vector is the
// mean of the served model's final hidden states (after its output norm) over the input's tokens,
// L2-normalised. The model runs on the scheduler's thread (Scheduler::run, between steps), each
// input in a cache of its own, so a vector never depends on the other inputs of the request or their
// order; the sums run in token order (docs/numerics.md: the kernels do not depend on thread count).
#include <cmath>
#include <cstring>

#include "daemon/base64.h"
#include "daemon/service.h"
#include "engine/model/kv_cache.h"

namespace towers::daemon::api {

using json = nlohmann::json;

namespace {

// "input": a string, an array of strings, an array of token ids, or an array of arrays of token ids.
ApiStatus parse_inputs(const Service& svc, const json& body, std::vector<std::vector<int32_t>>* out) {
  if (!body.contains("input") || body["input"].is_null()) return invalid_field("input", "\"input\" is required");
  const json& in = body["input"];
  const Tokenizer& tok = svc.model.tokenizer();
  const int32_t vocab = static_cast<int32_t>(svc.model.config().n_vocab);
  auto tokens_of = [&](const json& ids, const std::string& at, std::vector<int32_t>* t) -> ApiStatus {
    for (const auto& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab) {
        return invalid_field("input", at + " holds a value that is not a token id of this model (0.." + std::to_string(vocab - 1) + ")");
      }
      t->push_back(id.get<int32_t>());
    }
    return {};
  };
  if (in.is_string()) {
    out->push_back(tok.encode(in.get<std::string>(), tok.add_bos_default(), /*parse_special=*/false));
  } else if (in.is_array() && !in.empty() && in[0].is_number_integer()) {
    out->emplace_back();
    if (ApiStatus e = tokens_of(in, "\"input\"", &out->back()); !e.ok()) return e;
  } else if (in.is_array() && !in.empty()) {
    if (in.size() > 2048) return invalid_field("input", "\"input\" holds more than 2048 inputs");
    for (size_t i = 0; i < in.size(); ++i) {
      const std::string at = "input[" + std::to_string(i) + "]";
      if (in[i].is_string()) {
        out->push_back(tok.encode(in[i].get<std::string>(), tok.add_bos_default(), /*parse_special=*/false));
      } else if (in[i].is_array()) {
        out->emplace_back();
        if (ApiStatus e = tokens_of(in[i], at, &out->back()); !e.ok()) return e;
      } else {
        return invalid_field("input", at + " must be a string or an array of token ids");
      }
    }
  } else {
    return invalid_field("input", "\"input\" must be a string, an array of strings, or token ids (an array, or arrays)");
  }
  const size_t limit = svc.catalog.prompt_limit();
  for (size_t i = 0; i < out->size(); ++i) {
    if ((*out)[i].empty()) return invalid_field("input", "input " + std::to_string(i) + " is empty (no tokens)");
    if ((*out)[i].size() > limit) {
      return ApiStatus(Status::ResourceExhausted("input " + std::to_string(i) + " is " + std::to_string((*out)[i].size()) +
                                                 " tokens; this server embeds at most " + std::to_string(limit)),
                       "input", "context_length_exceeded");
    }
  }
  return {};
}

// The mean of the rows (token order), L2-normalised.
std::vector<float> mean_normalised(const std::vector<float>& rows, size_t d) {
  const size_t n = rows.size() / d;
  std::vector<double> sum(d, 0.0);
  for (size_t t = 0; t < n; ++t) {
    for (size_t i = 0; i < d; ++i) sum[i] += rows[t * d + i];
  }
  double norm = 0;
  for (double& s : sum) s /= static_cast<double>(n), norm += s * s;
  norm = std::sqrt(norm);
  std::vector<float> v(d);
  for (size_t i = 0; i < d; ++i) v[i] = static_cast<float>(norm > 0 ? sum[i] / norm : 0.0);
  return v;
}

}  // namespace

ApiStatus handle_embeddings(Service& svc, const HttpRequest& req, HttpResponder& out, const std::string&) {
  json body;
  if (ApiStatus e = parse_body(req, &body); !e.ok()) return e;
  if (ApiStatus e = known_fields(body, {"input", "model", "encoding_format", "dimensions", "user"}); !e.ok()) return e;
  if (ApiStatus e = check_model(svc, body); !e.ok()) return e;
  const size_t d = static_cast<size_t>(svc.model.config().n_embd);
  std::string format = "float";
  if (body.contains("encoding_format") && !body["encoding_format"].is_null()) {
    if (body["encoding_format"] != "float" && body["encoding_format"] != "base64") {
      return invalid_field("encoding_format", "\"encoding_format\" must be \"float\" or \"base64\"");
    }
    format = body["encoding_format"].get<std::string>();
  }
  if (body.contains("dimensions") && !body["dimensions"].is_null() && body["dimensions"] != d) {
    return ApiStatus(Status::Unimplemented("\"dimensions\" is not supported by towerd: this model's embeddings have " +
                                           std::to_string(d) + " dimensions (accepted: null or " + std::to_string(d) + ")"),
                     "dimensions");
  }
  std::vector<std::vector<int32_t>> inputs;
  if (ApiStatus e = parse_inputs(svc, body, &inputs); !e.ok()) return e;
  if (!svc.forward) return ApiStatus(Status::Unavailable("embeddings need the model thread, which is not running"), "");
  return answer_offloaded(svc, out, [&svc, inputs = std::move(inputs), format, d](HttpResponder& o) -> ApiStatus {
    // One model-thread turn per input, not one for all: the streams get their steps between inputs.
    std::vector<std::vector<float>> vectors;
    for (const auto& tokens : inputs) {
      Status st = svc.scheduler.run([&]() -> Status {
        DenseKvCache cache(svc.model.config(), static_cast<int32_t>(tokens.size()));
        std::vector<float> rows;
        if (Status e = svc.forward->eval(cache, tokens, Logits::Hidden, rows); !e.ok()) return e;
        vectors.push_back(mean_normalised(rows, d));
        return Status::Ok();
      });
      if (!st.ok()) return ApiStatus(st, "");
    }
    json data = json::array();
    size_t prompt_tokens = 0;
    for (size_t i = 0; i < vectors.size(); ++i) {
      prompt_tokens += inputs[i].size();
      json embedding;
      if (format == "base64") {
        std::vector<uint8_t> bytes(vectors[i].size() * sizeof(float));
        std::memcpy(bytes.data(), vectors[i].data(), bytes.size());  // little-endian float32, as OpenAI's
        embedding = base64_encode(bytes);
      } else {
        embedding = vectors[i];
      }
      data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(embedding)}});
    }
    return reply(o, {{"object", "list"},
                     {"data", std::move(data)},
                     {"model", svc.model_id},
                     {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}});
  });
}

}  // namespace towers::daemon::api
