#include "engine/generate/kl_divergence.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "engine/model/forward.h"
#include "engine/model/kv_cache.h"
#include "engine/text/tokenizer.h"

namespace towers {

namespace {

constexpr char kMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};

// llama.cpp's mean_and_uncertainty: the mean and its standard error (0 for 10 values or fewer).
std::pair<double, double> mean_and_uncertainty(double sum, double sum2, size_t count) {
  if (count < 1) return {0.0, 0.0};
  const double f = sum / count;
  const double var = sum2 / count - f * f;
  return {f, var > 0 && count > 10 ? std::sqrt(var / (count - 1)) : 0.0};
}

template <typename Value>
std::pair<double, double> mean_of(const std::vector<KlRow>& rows, Value value) {
  double sum = 0, sum2 = 0;
  for (const KlRow& r : rows) {
    const double v = value(r);
    sum += v;
    sum2 += v * v;
  }
  return mean_and_uncertainty(sum, sum2, rows.size());
}

}  // namespace

Result<BaseLogProbsFile> BaseLogProbsFile::open(const std::string& path) {
  BaseLogProbsFile f;
  f.path_ = path;
  f.in_.open(path, std::ios::binary);
  if (!f.in_) return Status::NotFound(path + ": cannot open");
  char magic[8];
  int32_t header[3];
  if (!f.in_.read(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0) {
    return Status::InvalidArgument(path + ": not a llama.cpp logits file (it does not start with \"_logits_\")");
  }
  if (!f.in_.read(reinterpret_cast<char*>(header), sizeof header)) {
    return Status::InvalidArgument(path + ": truncated header (n_ctx, n_vocab, n_chunk)");
  }
  f.n_ctx_ = header[0];
  f.n_vocab_ = header[1];
  f.n_chunk_ = header[2];
  if (f.n_ctx_ < 4 || f.n_ctx_ > (1 << 24) || f.n_vocab_ < 2 || f.n_vocab_ > (1 << 24) || f.n_chunk_ < 1 ||
      f.n_chunk_ > (1 << 24)) {
    return Status::InvalidArgument(path + ": implausible header n_ctx=" + std::to_string(f.n_ctx_) + " n_vocab=" +
                                   std::to_string(f.n_vocab_) + " n_chunk=" + std::to_string(f.n_chunk_));
  }
  const uint64_t n_tokens = uint64_t(f.n_chunk_) * f.n_ctx_;
  f.rows_offset_ = sizeof magic + sizeof header + n_tokens * sizeof(int32_t);
  const uint64_t expected =
      f.rows_offset_ + uint64_t(f.n_chunk_) * f.rows_per_chunk() * f.row_stride() * sizeof(uint16_t);
  std::error_code ec;
  const uint64_t actual = std::filesystem::file_size(path, ec);
  if (ec) return Status::IOError(path + ": " + ec.message());
  if (actual != expected) {
    return Status::InvalidArgument(path + ": " + std::to_string(actual) + " bytes, but its header (n_ctx=" +
                                   std::to_string(f.n_ctx_) + " n_vocab=" + std::to_string(f.n_vocab_) +
                                   " n_chunk=" + std::to_string(f.n_chunk_) + ") says " + std::to_string(expected) +
                                   (actual < expected ? " (truncated)" : ""));
  }
  f.tokens_.resize(n_tokens);
  if (!f.in_.read(reinterpret_cast<char*>(f.tokens_.data()), n_tokens * sizeof(int32_t))) {
    return Status::IOError(path + ": cannot read its tokens");
  }
  return f;
}

Status BaseLogProbsFile::read_chunk(int chunk, std::vector<uint16_t>& rows) {
  if (chunk < 0 || chunk >= n_chunk_) return Status::InvalidArgument("chunk " + std::to_string(chunk) + " out of range");
  const size_t n = size_t(rows_per_chunk()) * row_stride();
  rows.resize(n);
  in_.seekg(static_cast<std::streamoff>(rows_offset_ + uint64_t(chunk) * n * sizeof(uint16_t)));
  if (!in_.read(reinterpret_cast<char*>(rows.data()), static_cast<std::streamsize>(n * sizeof(uint16_t)))) {
    return Status::IOError(path_ + ": cannot read the log-probabilities of chunk " + std::to_string(chunk));
  }
  return Status::Ok();
}

Status BaseLogProbsFile::check_matches(const ModelConfig& config) const {
  if (n_vocab_ != config.n_vocab) {
    return Status::InvalidArgument(path_ + ": vocabulary mismatch: the file has " + std::to_string(n_vocab_) +
                                   " tokens, the model " + std::to_string(config.n_vocab));
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i] < 0 || tokens_[i] >= config.n_vocab) {
      return Status::InvalidArgument(path_ + ": token mismatch: chunk " + std::to_string(i / n_ctx_) + " position " +
                                     std::to_string(i % n_ctx_) + " holds token " + std::to_string(tokens_[i]) +
                                     ", outside the model's vocabulary of " + std::to_string(config.n_vocab));
    }
  }
  return Status::Ok();
}

KlRow compare_row(const float* logits, const uint16_t* base_row, int n_vocab, int next_token) {
  // As llama.cpp: log-softmax of our logits in double, the base row dequantized, KL summed over the
  // base's entries above e^-16 (the rest were clamped when the file was written).
  const int imax = static_cast<int>(std::max_element(logits, logits + n_vocab) - logits);
  const double max_logit = logits[imax];
  double sum_exp = 0;
  for (int i = 0; i < n_vocab; ++i) sum_exp += std::exp(double(logits[i]) - max_logit);
  const double log_norm = max_logit + std::log(sum_exp);  // log p(i) = logits[i] - log_norm
  float scale, min_log_prob;
  std::memcpy(&scale, base_row, sizeof scale);
  std::memcpy(&min_log_prob, base_row + 2, sizeof min_log_prob);
  const uint16_t* q = base_row + 4;

  KlRow r;
  r.nll = log_norm - logits[next_token];
  r.nll_base = -(double(scale) * q[next_token] + min_log_prob);
  int imax_base = 0;
  float log_base_max = 0;
  for (int i = 0; i < n_vocab; ++i) {
    const float log_base = scale * q[i] + min_log_prob;
    if (i == 0 || log_base > log_base_max) {
      log_base_max = log_base;
      imax_base = i;
    }
    if (log_base > -16.f) r.kld += std::exp(double(log_base)) * (double(log_base) - (logits[i] - log_norm));
  }
  r.same_top = imax == imax_base;
  return r;
}

std::pair<double, double> KlDivergenceResult::mean_kld() const {
  return mean_of(rows, [](const KlRow& r) { return r.kld; });
}
std::pair<double, double> KlDivergenceResult::mean_nll() const {
  return mean_of(rows, [](const KlRow& r) { return r.nll; });
}
std::pair<double, double> KlDivergenceResult::mean_nll_base() const {
  return mean_of(rows, [](const KlRow& r) { return r.nll_base; });
}
std::pair<double, double> KlDivergenceResult::mean_p_diff() const {
  return mean_of(rows, [](const KlRow& r) { return std::exp(-r.nll) - std::exp(-r.nll_base); });
}
double KlDivergenceResult::rms_p_diff() const {
  const auto sq = mean_of(rows, [](const KlRow& r) {
    const double d = std::exp(-r.nll) - std::exp(-r.nll_base);
    return d * d;
  });
  return std::sqrt(sq.first);
}
double KlDivergenceResult::same_top_share() const {
  if (rows.empty()) return 0;
  return double(std::count_if(rows.begin(), rows.end(), [](const KlRow& r) { return r.same_top; })) / rows.size();
}
double KlDivergenceResult::kld_quantile(double p) const {
  if (rows.empty()) return 0;
  std::vector<double> v(rows.size());
  std::transform(rows.begin(), rows.end(), v.begin(), [](const KlRow& r) { return r.kld; });
  std::sort(v.begin(), v.end());
  if (p <= 0) return v.front();
  if (p >= 1) return v.back();
  const double x = p * (v.size() - 1);
  const size_t i = static_cast<size_t>(x);
  const double frac = x - i;
  return (1 - frac) * v[i] + frac * v[std::min(i + 1, v.size() - 1)];
}

Result<KlDivergenceResult> kl_divergence(const Model& model, ThreadPool& pool, BaseLogProbsFile& base,
                                         const KlDivergenceOptions& options) {
  const ModelConfig& cfg = model.config();
  if (auto s = base.check_matches(cfg); !s) return s;
  const int n_ctx = base.n_ctx(), n_vocab = cfg.n_vocab, first = base.first_scored();
  const int batch = std::max(1, options.batch);
  const Tokenizer& tok = model.tokenizer();
  const bool add_bos = tok.add_bos_default() && tok.bos() >= 0;

  KlDivergenceResult result;
  result.rows.reserve(size_t(base.n_chunk()) * base.rows_per_chunk());
  Forward fwd(model, pool, options.kernels);
  std::vector<float> logits;
  std::vector<uint16_t> base_rows;
  std::vector<int32_t> chunk_tokens(n_ctx);
  for (int c = 0; c < base.n_chunk(); ++c) {
    if (auto s = base.read_chunk(c, base_rows); !s) return s;
    const int32_t* src = base.tokens().data() + size_t(c) * n_ctx;
    std::copy(src, src + n_ctx, chunk_tokens.begin());
    if (add_bos) chunk_tokens[0] = tok.bos();
    DenseKvCache cache(cfg, n_ctx);
    for (int b0 = 0; b0 < n_ctx; b0 += batch) {
      const int b1 = std::min(n_ctx, b0 + batch);
      std::span<const int32_t> span(chunk_tokens.data() + b0, size_t(b1 - b0));
      if (auto s = fwd.eval(cache, span, Logits::All, logits); !s) return s;
      // Positions first .. n_ctx-2 are scored: row (pos - first) of the base predicts src[pos + 1].
      const int lo = std::max(b0, first), hi = std::min(b1, n_ctx - 1);
      if (lo >= hi) continue;
      const size_t out0 = result.rows.size();
      result.rows.resize(out0 + (hi - lo));
      pool.parallel_for(size_t(hi - lo), [&](size_t i0, size_t i1, int) {
        for (size_t i = i0; i < i1; ++i) {
          const int pos = lo + static_cast<int>(i);
          result.rows[out0 + i] = compare_row(&logits[size_t(pos - b0) * n_vocab],
                                              &base_rows[size_t(pos - first) * base.row_stride()], n_vocab,
                                              src[pos + 1]);
        }
      });
    }
    result.chunks = c + 1;
    if (options.on_chunk) options.on_chunk(c, base.n_chunk(), result);
  }
  return result;
}

}  // namespace towers
