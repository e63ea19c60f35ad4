#include "engine/model/forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "engine/base/no_wait_lock.h"
#include "engine/gguf/quant.h"
#include "simd/attention.h"
#include "simd/ops.h"
#include "simd/onednn_matmul.h"
#include "simd/quant_dot.h"

namespace towers {

Forward::Forward(const Model& model, ThreadPool& pool, Kernels kernels)
    : model_(model), cfg_(model.config()), pool_(pool), kernels_(kernels), rope_(model.config()) {
  scratch_.resize(pool.size());
}

Status Forward::eval(KvCache& cache, std::span<const int32_t> tokens, Logits which,
                     std::vector<float>& logits) {
  const Sequence one{&cache, tokens, which};
  return eval_batch(std::span<const Sequence>(&one, 1), logits);
}

Status Forward::eval_batch(std::span<const Sequence> batch, std::vector<float>& logits) {
  check_may_wait("Forward::eval_batch (the model)");
  tok_.clear(), seq_of_.clear(), pos_.clear();
  for (size_t s = 0; s < batch.size(); ++s) {
    const Sequence& q = batch[s];
    const int32_t n = static_cast<int32_t>(q.tokens.size());
    if (n == 0) return Status::Error("eval: sequence " + std::to_string(s) + " has no tokens");
    if (q.cache->size() + n > q.cache->capacity()) {
      return Status::Error("context full: " + std::to_string(q.cache->size()) + " + " + std::to_string(n) +
                           " tokens exceed the capacity of " + std::to_string(q.cache->capacity()));
    }
    for (size_t j = 0; j < s; ++j) {
      if (batch[j].cache == q.cache) return Status::Error("eval: a cache appears twice in one batch");
    }
    if ((q.which == Logits::Hidden) != (batch[0].which == Logits::Hidden)) {
      return Status::Error("eval: hidden states and logits in one batch");
    }
    for (int32_t i = 0; i < n; ++i) {
      const int32_t t = q.tokens[i];
      if (t < 0 || t >= cfg_.n_vocab) {
        return Status::Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                             std::to_string(cfg_.n_vocab - 1) + ")");
      }
      tok_.push_back(t);
      seq_of_.push_back(static_cast<int32_t>(s));
      pos_.push_back(q.cache->next_pos() + i);
    }
  }
  const int T = static_cast<int>(tok_.size());
  if (T == 0) return Status::Error("eval: no tokens");
  const int d = cfg_.n_embd, qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  x_.resize(size_t(T) * d); xb_.resize(size_t(T) * d);
  q_.resize(size_t(T) * qd); k_.resize(size_t(T) * kvd); v_.resize(size_t(T) * kvd);
  att_.resize(size_t(T) * qd);

  embed();
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const LayerWeights& L = model_.layers[l];

    // Attention block: x += post_norm(Wo · attention(rope(Wq·norm(x)), cache + rope(Wk·norm(x)), Wv·norm(x)))
    rmsnorm(x_.data(), L.attn_norm, xb_.data(), T);
    const MatOut qkv[] = {{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}};
    matmuls(qkv, xb_.data(), T);
    if (cfg_.qkv_bias) {
      add_bias(L.bq, q_.data(), T);
      add_bias(L.bk, k_.data(), T);
      add_bias(L.bv, v_.data(), T);
    }
    if (cfg_.qk_norm) {  // every head of q and k normalised on its own (olmoe: all heads as one), before RoPE
      rmsnorm(q_.data(), L.q_norm, q_.data(), static_cast<int>(T * qd / L.q_norm.cols));
      rmsnorm(k_.data(), L.k_norm, k_.data(), static_cast<int>(T * kvd / L.k_norm.cols));
    }
    rope(q_.data(), T, cfg_.n_head, l);
    rope(k_.data(), T, cfg_.n_head_kv, l);
    for (int t = 0; t < T; ++t) {
      KvCache& cache = *batch[seq_of_[t]].cache;
      const int32_t i = pos_[t] - cache.next_pos();
      cache.put_pending(l, i, &k_[size_t(t) * kvd], &v_[size_t(t) * kvd]);
    }
    if (time_attention_) {
      const auto t0 = std::chrono::steady_clock::now();
      attention(batch, l, T);
      attention_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      attention(batch, l, T);
    }
    matmul(L.wo, att_.data(), T, xb_.data());
    add_residual(L.post_attn_norm, T);

    // Feed-forward block: x += post_norm(W_down · (act(W_gate·norm(x)) * W_up·norm(x))), act = silu or gelu;
    // or the mixture of experts' weighted sum of such blocks.
    rmsnorm(x_.data(), L.ffn_norm, xb_.data(), T);
    if (cfg_.is_moe()) {
      moe(L, T);
    } else {
      const FfnBlock dense{&L.w_gate, &L.w_up, &L.w_down, xb_.data()};
      ffn(std::span<const FfnBlock>(&dense, 1), xb_.data(), T);
    }
    add_residual(L.post_ffn_norm, T);
  }
  for (const Sequence& q : batch) q.cache->commit(static_cast<int32_t>(q.tokens.size()));

  // Final norm and output projection, for the rows the callers want (gathered into xb).
  const bool hidden = batch[0].which == Logits::Hidden;
  if (hidden) {  // the final norm of every token, no projection
    logits.resize(size_t(T) * d);
    for (int t = 0; t < T; ++t) rmsnorm(&x_[size_t(t) * d], model_.output_norm, &logits[size_t(t) * d], 1);
    return Status::Ok();
  }
  int rows = 0;
  for (int t = 0; t < T; ++t) {
    const Sequence& q = batch[seq_of_[t]];
    const bool last = t + 1 == T || seq_of_[t + 1] != seq_of_[t];
    if (q.which == Logits::All || last) {
      rmsnorm(&x_[size_t(t) * d], model_.output_norm, &xb_[size_t(rows) * d], 1);
      ++rows;
    }
  }
  logits.resize(size_t(rows) * cfg_.n_vocab);
  matmul(model_.output, xb_.data(), rows, logits.data());
  if (cfg_.final_softcap > 0) {
    pool_.parallel_for(static_cast<size_t>(rows), [&](size_t r0, size_t r1, int) {
      simd::softcap_f32(&logits[r0 * cfg_.n_vocab], (r1 - r0) * cfg_.n_vocab, 1.0f, cfg_.final_softcap);
    });
  }
  return Status::Ok();
}

// For each block i: out_i = W_down · (act(W_gate · x) * (W_up · x)) for the same T rows of x (out_i may
// be x). All gate and up matrices go in one matmuls call (one activation quantization, one parallel
// loop: a decode step's chosen experts together); results are those of one block at a time.
void Forward::ffn(std::span<const FfnBlock> blocks, const float* x, int T) {
  size_t total = 0;
  for (const FfnBlock& b : blocks) total += size_t(T) * static_cast<size_t>(b.gate->rows);
  hb_.resize(total), hb2_.resize(total);
  std::vector<MatOut> gate_up;
  size_t at = 0;
  for (const FfnBlock& b : blocks) {
    gate_up.push_back({b.gate, &hb_[at]});
    gate_up.push_back({b.up, &hb2_[at]});
    at += size_t(T) * static_cast<size_t>(b.gate->rows);
  }
  matmuls(gate_up, x, T);
  constexpr size_t kChunk = 4096;  // elementwise: any split gives the same values
  pool_.parallel_for((total + kChunk - 1) / kChunk, [&](size_t c0, size_t c1, int) {
    const size_t from = c0 * kChunk, n = std::min(total, c1 * kChunk) - from;
    if (cfg_.ffn_gate == FfnGate::Silu) {
      simd::swiglu_f32(&hb_[from], &hb2_[from], &hb_[from], n);
    } else if (rounding_ == Rounding::Ggml) {
      simd::geglu_f32_ggml(&hb_[from], &hb2_[from], &hb_[from], n);
    } else {
      simd::geglu_f32(&hb_[from], &hb2_[from], &hb_[from], n);
    }
  });
  at = 0;
  for (const FfnBlock& b : blocks) {
    matmul(*b.down, &hb_[at], T, b.out);
    at += size_t(T) * static_cast<size_t>(b.gate->rows);
  }
}

// Mixture of experts on the T normalised rows in xb_, result in xb_. Routing: softmax over the router's
// logits, the n_expert_used most probable experts (ties: the lower id), their probabilities as weights
// (divided by their sum when expert_weights_norm). Each chosen expert runs once over the tokens routed to
// it (gathered into consecutive rows), so a step reads only the chosen experts' matrices, each once.
// A token's output is summed over its experts in rank order (most probable first), then the shared
// expert is added: the order is fixed by the token's own routing, so its result does not depend on
// which other tokens share the step (every row of a matmul is computed on its own as well).
void Forward::moe(const LayerWeights& L, int T) {
  const int d = cfg_.n_embd, E = cfg_.n_expert, K = cfg_.n_expert_used;
  router_.resize(size_t(T) * E);
  matmul(L.gate_inp, xb_.data(), T, router_.data());
  chosen_.resize(size_t(T) * K), chosen_w_.resize(size_t(T) * K);
  std::vector<int32_t> order(E);
  for (int t = 0; t < T; ++t) {
    float* p = &router_[size_t(t) * E];
    const float mx = *std::max_element(p, p + E);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(p[e] - mx));
    for (int e = 0; e < E; ++e) p[e] /= sum;
    for (int e = 0; e < E; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float chosen_sum = 0;
    for (int k = 0; k < K; ++k) chosen_sum += p[order[k]];
    for (int k = 0; k < K; ++k) {
      chosen_[size_t(t) * K + k] = order[k];
      chosen_w_[size_t(t) * K + k] = cfg_.expert_weights_norm ? p[order[k]] / chosen_sum : p[order[k]];
    }
  }
  // Slot (t, k) receives expert chosen_[t][k]'s output for token t.
  slots_.resize(size_t(T) * K * d);
  std::vector<int32_t> slots_of_expert;
  if (T == 1) {  // decode: the chosen experts share the one row, so they run as one call
    std::vector<FfnBlock> blocks;
    for (int k = 0; k < K; ++k) {
      const int e = chosen_[k];
      blocks.push_back({&L.gate_exps[e], &L.up_exps[e], &L.down_exps[e], &slots_[size_t(k) * d]});
    }
    ffn(blocks, xb_.data(), 1);
  }
  for (int e = 0; e < E && T > 1; ++e) {
    slots_of_expert.clear();
    for (int i = 0; i < T * K; ++i) {
      if (chosen_[i] == e) slots_of_expert.push_back(i);
    }
    if (slots_of_expert.empty()) continue;
    const int n = static_cast<int>(slots_of_expert.size());
    expert_x_.resize(size_t(n) * d), expert_y_.resize(size_t(n) * d);
    for (int j = 0; j < n; ++j) {
      const float* from = &xb_[size_t(slots_of_expert[j] / K) * d];
      std::copy(from, from + d, &expert_x_[size_t(j) * d]);
    }
    const FfnBlock expert{&L.gate_exps[e], &L.up_exps[e], &L.down_exps[e], expert_y_.data()};
    ffn(std::span<const FfnBlock>(&expert, 1), expert_x_.data(), n);
    for (int j = 0; j < n; ++j) {
      std::copy(&expert_y_[size_t(j) * d], &expert_y_[size_t(j + 1) * d], &slots_[size_t(slots_of_expert[j]) * d]);
    }
  }
  if (L.gate_inp_shexp) {  // qwen2moe: out += sigmoid(g · x) * shared_ffn(x), computed before xb_ is overwritten
    shared_gate_.resize(T);
    matmul(L.gate_inp_shexp, xb_.data(), T, shared_gate_.data());
    expert_y_.resize(size_t(T) * d);
    const FfnBlock shared{&L.gate_shexp, &L.up_shexp, &L.down_shexp, expert_y_.data()};
    ffn(std::span<const FfnBlock>(&shared, 1), xb_.data(), T);
  }
  for (int t = 0; t < T; ++t) {
    float* out = &xb_[size_t(t) * d];
    std::fill(out, out + d, 0.0f);
    for (int k = 0; k < K; ++k) {
      const float w = chosen_w_[size_t(t) * K + k];
      const float* y = &slots_[(size_t(t) * K + k) * d];
      for (int i = 0; i < d; ++i) out[i] += w * y[i];
    }
    if (L.gate_inp_shexp) {
      const float g = 1.0f / (1.0f + std::exp(-shared_gate_[t]));
      const float* y = &expert_y_[size_t(t) * d];
      for (int i = 0; i < d; ++i) out[i] += g * y[i];
    }
  }
}

void Forward::embed() {
  const int d = cfg_.n_embd;
  weight_bytes_read_ += tok_.size() * model_.tok_embd.row_stride();
  for (size_t t = 0; t < tok_.size(); ++t) {
    float* x = &x_[t * d];
    dequantize_row(model_.tok_embd.type, model_.tok_embd.row(tok_[t]), x, d);
    if (cfg_.embd_scale != 1.0f) {
      for (int i = 0; i < d; ++i) x[i] *= cfg_.embd_scale;
    }
  }
}

// Each of `rows` vectors of w.cols floats (a token's n_embd, or one head) normalised with weights w.
void Forward::rmsnorm(const float* x, const Weight& w, float* out, int rows) {
  const int64_t n = w.cols;
  const float* g = reinterpret_cast<const float*>(w.data);
  for (int r = 0; r < rows; ++r) simd::rmsnorm_f32(x + size_t(r) * n, g, out + size_t(r) * n, n, cfg_.norm_eps);
}

// x += y (xb_), or x += post_norm(y) when the family normalises a block's output (gemma).
void Forward::add_residual(const Weight& post_norm, int T) {
  if (post_norm) rmsnorm(xb_.data(), post_norm, xb_.data(), T);
  for (size_t i = 0; i < size_t(T) * cfg_.n_embd; ++i) x_[i] += xb_[i];
}

bool reads_packed(PackedSet set, uint32_t ggml_type) {
  switch (static_cast<GgmlType>(ggml_type)) {
    case GgmlType::Q4_0: case GgmlType::Q8_0: case GgmlType::Q4_K: case GgmlType::Q6_K: return true;  // Classic
    default: return set >= PackedSet::Extended && simd::has_packed(ggml_type);
  }
}

// y[t][r] = W[r] · x[t]. Each row of W is read once and used for all T tokens.
void Forward::matmul(const Weight& w, const float* x, int T, float* y) {
  const MatOut one{&w, y};
  matmuls(std::span<const MatOut>(&one, 1), x, T);
}

void Forward::matmuls(std::span<const MatOut> mats, const float* x, int T) {
  const int64_t cols = mats[0].w->cols;
  const auto type0 = static_cast<uint32_t>(mats[0].w->type);
  bool fast = kernels_ == Kernels::Fast;
  for (const MatOut& m : mats) {
    const auto t = static_cast<uint32_t>(m.w->type);
    fast = fast && simd::has_quant_dot(t) && m.w->cols == cols &&
           simd::act_bytes(t, cols) == simd::act_bytes(type0, cols);
  }
  if (!fast) {
    // Matrices of two activation layouts in one call (an IQ4_NL attn_q beside a Q5_K attn_v) take a
    // call each; a type without kernels (F16, F32, BF16) the f32 path.
    for (const MatOut& m : mats) {
      if (mats.size() > 1 && kernels_ == Kernels::Fast) matmuls(std::span<const MatOut>(&m, 1), x, T);
      else matmul_f32(*m.w, x, T, m.y);
    }
    return;
  }
  for (const MatOut& m : mats) weight_bytes_read_ += m.w->bytes();
  // A oneDNN step: the matrices with an int8 copy go to oneDNN, the rest (a Q6_K attn_v beside Q4_K
  // q and k) stay below on the fast kernels.
  std::vector<MatOut> rest;
  if (onednn_min_tokens_ > 0 && T >= onednn_min_tokens_) {
    std::vector<MatOut> on;
    for (const MatOut& m : mats) (m.w->s8 || m.w->s8_packed ? on : rest).push_back(m);
    if (!on.empty()) {
      matmuls_onednn(on, x, T);
      if (rest.empty()) return;
      mats = rest;
    }
  }
  // Activation rows are quantized independently of each other, so batching does not change them;
  // all matrices here share one activation layout (same family: 32- or 256-element blocks).
  const size_t stride = (simd::act_bytes(type0, cols) + 63) / 64 * 64;
  const auto act_scales = rounding_ == Rounding::Ggml ? simd::ActScales::F16 : simd::ActScales::F32;
  act_.resize(stride * T + 64);
  uint8_t* act = act_.data() + (64 - reinterpret_cast<uintptr_t>(act_.data()) % 64) % 64;
  pool_.parallel_for(static_cast<size_t>(T), [&](size_t t0, size_t t1, int) {
    for (size_t t = t0; t < t1; ++t) simd::quantize_act(type0, x + t * cols, act + t * stride, cols, act_scales);
  });
  // Work units of 16 rows (a packed group, or up to 16 plain rows), numbered across the matrices.
  constexpr size_t G = simd::kPackRows;
  size_t units = 0;
  for (const MatOut& m : mats) units += (static_cast<size_t>(m.w->rows) + G - 1) / G;
  pool_.parallel_dynamic(units, [&](size_t u0, size_t u1, int) {
    size_t base = 0;
    for (const MatOut& m : mats) {
      const Weight& w = *m.w;
      const size_t rows = static_cast<size_t>(w.rows), n = (rows + G - 1) / G;
      const size_t a = std::max(u0, base), b = std::min(u1, base + n);
      base += n;
      if (a >= b) continue;
      size_t g0 = a - (base - n), g1 = b - (base - n);  // units of this matrix
      const auto t = static_cast<uint32_t>(w.type);
      if (w.packed && reads_packed(packed_set_, t)) {
        const size_t groups = rows / G, gb = simd::packed_group_bytes(t, static_cast<size_t>(cols));
        const size_t p1 = std::min(g1, groups);
        if (g0 < p1) {
          simd::gemm_packed(t, w.packed + g0 * gb, p1 - g0, act, stride, T, cols, m.y + g0 * G, rows);
        }
        g0 = std::max(g0, groups);
      }
      const size_t r0 = g0 * G, r1 = std::min(rows, g1 * G);
      if (r0 < r1) simd::gemm_q(t, w.row(r0), w.row_stride(), r1 - r0, act, stride, T, cols, m.y + r0, rows);
    }
  });
}

void Forward::matmuls_onednn(std::span<const MatOut> mats, const float* x, int T) {
  // One activation quantization for all: the matrices of a call share their row length and group.
  const size_t cols = static_cast<size_t>(mats[0].w->cols), G = static_cast<size_t>(mats[0].w->s8_group);
  const size_t groups = cols / G;
  act8_.resize(cols * T);
  act8_scales_.resize(groups * T);
  pool_.parallel_for(static_cast<size_t>(T), [&](size_t t0, size_t t1, int) {
    for (size_t t = t0; t < t1; ++t) {
      simd::onednn_quantize_act(x + t * cols, act8_.data() + t * cols, act8_scales_.data() + t * groups, cols, G);
    }
  });
  // (Packed copies have their slices: the pool's path below.)
  if (onednn_omp_ && std::all_of(mats.begin(), mats.end(), [](const MatOut& m) { return m.w->s8 != nullptr; })) {
    for (const MatOut& m : mats) {
      simd::onednn_gemm_omp(m.w->s8, m.w->s8_scales, static_cast<size_t>(m.w->rows), act8_.data(),
                            act8_scales_.data(), T, cols, G, m.y, static_cast<size_t>(m.w->rows), pool_.size());
    }
    return;
  }
  // Work units of kRows rows, numbered across the matrices (as matmuls does with 16-row groups): large
  // enough that oneDNN's per-call packing of the activations stays small beside the multiply; a packed
  // copy's slices are such units.
  constexpr size_t kRows = simd::kOnednnSliceRows;  // measured against 256 and 4096 (docs/numerics.md)
  size_t units = 0;
  for (const MatOut& m : mats) units += (static_cast<size_t>(m.w->rows) + kRows - 1) / kRows;
  pool_.parallel_dynamic(units, [&](size_t u0, size_t u1, int) {
    size_t base = 0;
    for (const MatOut& m : mats) {
      const size_t rows = static_cast<size_t>(m.w->rows), n = (rows + kRows - 1) / kRows;
      const size_t a = std::max(u0, base), b = std::min(u1, base + n);
      base += n;
      for (size_t u = a; u < b; ++u) {  // one call per unit: the same row slices whoever runs them
        const size_t r0 = (u - (base - n)) * kRows, r1 = std::min(rows, r0 + kRows);
        if (m.w->s8_packed) {
          simd::onednn_gemm_packed(m.w->s8_packed, rows, u - (base - n), m.w->s8_scales, act8_.data(),
                                   act8_scales_.data(), T, cols, m.y, rows);
        } else {
          simd::onednn_gemm(m.w->s8, m.w->s8_scales, r0, r1, act8_.data(), act8_scales_.data(), T, cols, G, m.y, rows);
        }
      }
    }
  });
}

void Forward::matmul_f32(const Weight& w, const float* x, int T, float* y) {
  const int64_t cols = w.cols, rows = w.rows;
  weight_bytes_read_ += w.bytes();
  pool_.parallel_for(static_cast<size_t>(rows), [&](size_t r0, size_t r1, int thread) {
    std::vector<float>& buf = scratch_[thread];
    if (buf.size() < static_cast<size_t>(cols)) buf.resize(cols);
    for (size_t r = r0; r < r1; ++r) {
      const float* wr;
      if (w.type == GgmlType::F32) {
        wr = reinterpret_cast<const float*>(w.row(r));
      } else {
        dequantize_row(w.type, w.row(r), buf.data(), cols);
        wr = buf.data();
      }
      for (int t = 0; t < T; ++t) y[size_t(t) * rows + r] = simd::dot_f32(wr, x + size_t(t) * cols, cols);
    }
  });
}

void Forward::add_bias(const Weight& b, float* y, int T) {
  const float* bias = reinterpret_cast<const float*>(b.data);
  for (int t = 0; t < T; ++t) {
    for (int64_t i = 0; i < b.cols; ++i) y[size_t(t) * b.cols + i] += bias[i];
  }
}

bool Forward::int8_attention_for(int T) const {
  return int8_attention_ != Int8Attention::Off && kernels_ == Kernels::Fast && onednn_min_tokens_ > 0 &&
         T >= onednn_min_tokens_ && simd::int8_attention_available();
}

// The int8 blocks (keys, and values when Full) of every F32/F16 span of the batch's sequences, for the
// whole blocks their tiles read (rows below the sequence's last position), each built once for all tiles.
void Forward::build_int8_blocks(std::span<const Sequence> batch, int T) {
  const int n_kv = cfg_.n_head_kv, hd = cfg_.head_dim;
  int8_spans_.resize(batch.size());
  std::vector<int32_t> last_pos(batch.size(), -1);
  for (int t = 0; t < T; ++t) last_pos[size_t(seq_of_[t])] = std::max(last_pos[size_t(seq_of_[t])], pos_[t]);
  int64_t total = 0;
  for (size_t q = 0; q < batch.size(); ++q) {
    int8_spans_[q].assign(spans_[q].size(), Int8Span{});
    for (size_t si = 0; si < spans_[q].size(); ++si) {
      const KvSpan& s = spans_[q][si];
      if (s.format != simd::KvQuant::F32 && s.format != simd::KvQuant::F16) continue;
      const int32_t rows = std::min<int32_t>(s.n, last_pos[q] - s.pos0 + 1);
      if (rows < simd::kAttnBlock) continue;
      int8_spans_[q][si] = {total, rows / simd::kAttnBlock};
      total += int64_t(n_kv) * (rows / simd::kAttnBlock);
    }
  }
  const bool sums = int8_attention_ == Int8Attention::Full;
  if (int8_keys_.size() < size_t(total)) int8_keys_.resize(size_t(total));
  if (sums && int8_values_.size() < size_t(total)) int8_values_.resize(size_t(total));
  // One job per block: its first row's K and V of its head, in int8_keys_ order.
  struct Job {
    const uint8_t *k, *v;
    size_t stride;
    simd::KvQuant format;
  };
  std::vector<Job> jobs;
  jobs.reserve(size_t(total));
  for (size_t q = 0; q < batch.size(); ++q) {
    for (size_t si = 0; si < spans_[q].size(); ++si) {
      const KvSpan& s = spans_[q][si];
      for (int h = 0; int8_spans_[q][si].first >= 0 && h < n_kv; ++h) {
        for (int32_t b = 0; b < int8_spans_[q][si].blocks; ++b) {
          const size_t at = size_t(b) * simd::kAttnBlock * s.row_bytes + size_t(h) * s.head_bytes;
          jobs.push_back({s.k + at, s.v + at, s.row_bytes, s.format});
        }
      }
    }
  }
  pool_.parallel_dynamic(jobs.size(), [&](size_t i0, size_t i1, int) {
    for (size_t i = i0; i < i1; ++i) {
      simd::int8_keys(jobs[i].format, jobs[i].k, jobs[i].stride, simd::kAttnBlock, hd, &int8_keys_[i]);
      if (sums) simd::int8_values(jobs[i].format, jobs[i].v, jobs[i].stride, simd::kAttnBlock, hd, &int8_values_[i]);
    }
  });
}

// Rotates every head of token t by its position pos[t], with the layer's frequencies.
void Forward::rope(float* vecs, int T, int n_heads, int layer) {
  for (int t = 0; t < T; ++t) {
    rope_.embed(vecs + size_t(t) * n_heads * cfg_.head_dim, n_heads, static_cast<float>(pos_[t]), layer);
  }
}

// Causal attention of the T new queries over every row of their own sequence's cache at a position
// <= the query's, walking the cache's spans in place with an online (streaming) softmax
// (simd::kv_attend). Scores and value sums are computed straight from each span's format (no dense
// copy of a quantized cache).
// Tiles (prefill of long prompts): one work unit is one (tile, KV head), a tile being up to R
// consecutive tokens of one sequence (R * group ~ kAttentionTileQueries query heads). The tile's query
// heads go through each block of kAttnBlock rows together, so a block is read from memory (and
// decoded, for quantized formats) once per tile instead of once per token: a 4096-token prompt read
// its whole cache once per token, from L3 or DRAM, where now a block is used by the tile's 64
// queries while it is in L1/L2. Each query takes the same steps in the same order as alone: the
// blocks every row of the tile has in full (rows [first, first + full_r), full_r a multiple of
// kAttnBlock) in kv_attend calls over the tile's rows that have them (a suffix of the tile: ends
// ascend with positions), then its own last partial block alone. kv_attend gives a query the same
// bits whatever the other queries of the call and however the rows are split at multiples of
// kAttnBlock, so a row's result does not depend on the tile size, its tile or the thread: prefill
// and token-by-token decode (tiles of one) stay bit-identical.
// Units are handed out in a zigzag order over the tiles (first, last, second, second to last, ...)
// so that with a causal mask every contiguous chunk of units, i.e. every thread, gets about the same
// number of cached rows; the split never changes a result.
// A windowed layer (sliding_window) sees only the rows acting at positions qpos - window + 1 .. qpos:
// the window is a mask on acting positions, so it holds across the spans of a tower as it does in
// one dense cache (docs/towers.md, "Sliding windows"). Where the window cuts a span at different rows
// for the rows of a tile, their blocks start at different rows, so each row walks the span alone.
void Forward::attention(std::span<const Sequence> batch, int layer, int T) {
  const int hd = cfg_.head_dim;
  const int n_kv = cfg_.n_head_kv;
  const int group = cfg_.n_head / n_kv;
  const float scale = cfg_.attn_scale;
  const int32_t window = cfg_.is_swa(layer) ? cfg_.sliding_window : 0;
  spans_.resize(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) {
    batch[s].cache->spans(layer, static_cast<int32_t>(batch[s].tokens.size()), spans_[s]);
  }
  const int R = tile_rows_ > 0 ? tile_rows_ : std::max(1, kAttentionTileQueries / group);
  tiles_.clear();
  for (int t = 0; t < T;) {
    int n = 1;
    while (n < R && t + n < T && seq_of_[t + n] == seq_of_[t]) ++n;
    tiles_.push_back({t, n});
    t += n;
  }
  const size_t n_tiles = tiles_.size();
  const bool int8 = window == 0 && int8_attention_for(T);
  if (int8) build_int8_blocks(batch, T);
  pool_.parallel_dynamic(n_tiles * n_kv, [&](size_t i0, size_t i1, int thread) {
    std::vector<float>& buf = scratch_[thread];
    const size_t nq_max = size_t(R) * group;
    const size_t need = nq_max * (2 + 3 * size_t(hd));
    if (buf.size() < need) buf.resize(need);
    float* m = buf.data();
    float* l = m + nq_max;
    float* acc = l + nq_max;                // [row][group][hd]
    float* qt = acc + nq_max * hd;          // the tile's queries of this KV head, [row][group][hd]
    float* qs = qt + nq_max * hd;           // the same as one span needs them (RoPE shift, key scales)
    for (size_t i = i0; i < i1; ++i) {
      const size_t k = i / n_kv;
      const int kvh = static_cast<int>(i % n_kv);
      const AttentionTile& tile = tiles_[k % 2 == 0 ? k / 2 : n_tiles - 1 - k / 2];
      const int rows = tile.n, nq = rows * group;
      for (int r = 0; r < rows; ++r) {
        const float* q = &q_[(size_t(tile.t0 + r) * cfg_.n_head + size_t(kvh) * group) * hd];
        std::copy(q, q + size_t(group) * hd, qt + size_t(r) * group * hd);
      }
      std::fill(m, m + nq, -INFINITY);
      std::fill(l, l + nq, 0.0f);
      std::fill(acc, acc + size_t(nq) * hd, 0.0f);
      for (size_t si = 0; si < spans_[seq_of_[tile.t0]].size(); ++si) {
        const KvSpan& s = spans_[seq_of_[tile.t0]][si];
        const Int8Span i8 = int8 ? int8_spans_[seq_of_[tile.t0]][si] : Int8Span{};
        // Row r of the tile attends to span rows [first(r), end(r)); both ascend with r.
        auto end = [&](int r) { return std::min<int32_t>(s.n, pos_[tile.t0 + r] - s.pos0 + 1); };  // causal
        auto first = [&](int r) {
          return window > 0 ? std::max<int32_t>(0, pos_[tile.t0 + r] - window + 1 - s.pos0) : 0;
        };
        if (end(rows - 1) <= first(0)) continue;
        const float* qv = qt;
        if (s.rope_delta != 0 || s.k_scale) {
          std::copy(qt, qt + size_t(nq) * hd, qs);
          // q·R(p_k)k depends on p_q - p_k only: using rows computed rope_delta positions earlier
          // than they act is the same as rotating the query back by rope_delta.
          if (s.rope_delta != 0) rope_.rotate(qs, nq, -static_cast<float>(s.rope_delta), layer);
          if (s.k_scale) {
            const float* cs = s.k_scale + size_t(kvh) * hd;
            for (int g = 0; g < nq; ++g) {
              for (int e = 0; e < hd; ++e) qs[size_t(g) * hd + e] *= cs[e];
            }
          }
          qv = qs;
        }
        // kv_attend over span rows [from, to) for the queries of tile rows r0 .. r0 + n_rows - 1.
        // Whole blocks (from a multiple of kAttnBlock) take the span's int8 blocks when it has them.
        auto attend = [&](int r0, int n_rows, int32_t from, int32_t to) {
          const size_t at = size_t(r0) * group, row0 = size_t(from) * s.row_bytes + size_t(kvh) * s.head_bytes;
          if (i8.first >= 0 && from % simd::kAttnBlock == 0 && (to - from) % simd::kAttnBlock == 0 &&
              to / simd::kAttnBlock <= i8.blocks) {
            const size_t b = size_t(i8.first + int64_t(kvh) * i8.blocks + from / simd::kAttnBlock);
            const simd::Int8Values* values = int8_attention_ == Int8Attention::Full ? &int8_values_[b] : nullptr;
            simd::kv_attend_int8(&int8_keys_[b], values, s.format, qv + at * hd, n_rows * group, s.v + row0,
                                 s.row_bytes, to - from, hd, scale, m + at, l + at, acc + at * hd, cfg_.attn_softcap);
          } else {
            simd::kv_attend(s.format, qv + at * hd, n_rows * group, s.k + row0, s.v + row0, s.row_bytes, to - from, hd,
                            scale, m + at, l + at, acc + at * hd, cfg_.attn_softcap);
          }
        };
        const bool shared = first(0) == first(rows - 1);  // every row's blocks start at the same row
        auto full = [&](int r) {  // rows of row r's whole blocks (0 when the tile does not share them)
          return shared ? std::max<int32_t>(0, end(r) - first(r)) / simd::kAttnBlock * simd::kAttnBlock : 0;
        };
        int32_t done = 0;  // whole-block rows every row from r on has been through
        for (int r = 0; r < rows && shared; ++r) {
          if (full(r) > done) {
            attend(r, rows - r, first(r) + done, first(r) + full(r));
            done = full(r);
          }
        }
        for (int r = 0; r < rows; ++r) {
          if (end(r) > first(r) + full(r)) attend(r, 1, first(r) + full(r), end(r));
        }
      }
      for (int r = 0; r < rows; ++r) {
        for (int g = 0; g < group; ++g) {
          float* out = &att_[(size_t(tile.t0 + r) * cfg_.n_head + size_t(kvh) * group + g) * hd];
          const float* a = acc + (size_t(r) * group + g) * hd;
          const float lg = l[size_t(r) * group + g];
          for (int e = 0; e < hd; ++e) out[e] = a[e] / lg;
        }
      }
    }
  });
}

}  // namespace towers
