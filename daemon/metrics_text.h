// /metrics: the Prometheus text exposition format (version 0.0.4) of towerd's counters.
//
// Exposition is the writer: one # HELP / # TYPE per family, label values escaped (\\, \", \n),
// counters as integers, floats with round-trip precision, histograms with cumulative _bucket
// lines up to le="+Inf", _sum and _count. metrics_text renders a Service with it: names follow
// llama-server where it has one (towerd_prompt_tokens_total ~ llamacpp:prompt_tokens_total,
// towerd_tokens_predicted_total ~ llamacpp:tokens_predicted_total); docs/http.md lists them all.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "daemon/metrics.h"

namespace towers::daemon {

struct Service;

class Exposition {
 public:
  using Labels = std::initializer_list<std::pair<std::string_view, std::string_view>>;
  // Starts a family; its samples follow before the next family.
  void family(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, Labels labels, uint64_t value);
  void sample(std::string_view name, Labels labels, double value);
  void histogram(std::string_view name, Labels labels, const Histogram& h);
  // A family of one unlabelled sample.
  void counter(std::string_view name, std::string_view help, uint64_t value);
  void gauge(std::string_view name, std::string_view help, double value);
  const std::string& text() const { return out_; }

  static std::string escape_label(std::string_view value);
  static std::string format_double(double v);

 private:
  void head(std::string_view name, Labels labels, std::string_view extra_name = {}, std::string_view extra_value = {});
  std::string out_;
};

std::string metrics_text(Service& svc);

}  // namespace towers::daemon
