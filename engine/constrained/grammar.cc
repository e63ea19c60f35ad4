#include "engine/constrained/grammar.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <unordered_map>
#include <utility>

#include "engine/text/tokenizer.h"

namespace towers {

namespace {

using ByteSet = Grammar::ByteSet;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

struct Sym {
  bool ref;      // false: a byte set
  uint32_t arg;  // byte set index or rule index
};
using Seq = std::vector<Sym>;
struct CodeRange {
  uint32_t lo, hi;
};

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9') || c == '-'; }

// Sorted, merged, without surrogates; `negate` complements over all scalar values first.
std::vector<CodeRange> normalize(std::vector<CodeRange> r, bool negate) {
  std::sort(r.begin(), r.end(), [](CodeRange a, CodeRange b) { return a.lo < b.lo; });
  std::vector<CodeRange> merged;
  for (CodeRange x : r) {
    if (!merged.empty() && x.lo <= merged.back().hi + 1) merged.back().hi = std::max(merged.back().hi, x.hi);
    else merged.push_back(x);
  }
  if (negate) {
    std::vector<CodeRange> inv;
    uint32_t next = 0;
    for (CodeRange x : merged) {
      if (x.lo > next) inv.push_back({next, x.lo - 1});
      next = x.hi + 1;
    }
    if (next <= kMaxCodePoint) inv.push_back({next, kMaxCodePoint});
    merged = std::move(inv);
  }
  std::vector<CodeRange> out;
  for (CodeRange x : merged) {  // cut out U+D800..U+DFFF
    if (x.hi < 0xD800 || x.lo > 0xDFFF) {
      out.push_back(x);
      continue;
    }
    if (x.lo < 0xD800) out.push_back({x.lo, 0xD7FF});
    if (x.hi > 0xDFFF) out.push_back({0xE000, x.hi});
  }
  return out;
}

int utf8_encode(uint32_t cp, uint8_t* b) {
  if (cp < 0x80) {
    b[0] = uint8_t(cp);
    return 1;
  }
  if (cp < 0x800) {
    b[0] = uint8_t(0xC0 | (cp >> 6));
    b[1] = uint8_t(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    b[0] = uint8_t(0xE0 | (cp >> 12));
    b[1] = uint8_t(0x80 | ((cp >> 6) & 0x3F));
    b[2] = uint8_t(0x80 | (cp & 0x3F));
    return 3;
  }
  b[0] = uint8_t(0xF0 | (cp >> 18));
  b[1] = uint8_t(0x80 | ((cp >> 12) & 0x3F));
  b[2] = uint8_t(0x80 | ((cp >> 6) & 0x3F));
  b[3] = uint8_t(0x80 | (cp & 0x3F));
  return 4;
}

// A range of scalar values (no surrogates) as sequences of byte ranges, each sequence the product of
// its ranges (the splitting of RE2 and Rust's regex-syntax utf8 module).
using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;
void utf8_sequences(uint32_t s, uint32_t e, std::vector<ByteRangeSeq>& out) {
  static constexpr uint32_t kMaxOfLength[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t max : kMaxOfLength) {
    if (s <= max && e > max) {
      utf8_sequences(s, max, out);
      utf8_sequences(max + 1, e, out);
      return;
    }
  }
  if (e <= 0x7F) {
    out.push_back({{uint8_t(s), uint8_t(e)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((s & ~m) != (e & ~m)) {
      if ((s & m) != 0) {
        utf8_sequences(s, s | m, out);
        utf8_sequences((s | m) + 1, e, out);
        return;
      }
      if ((e & m) != m) {
        utf8_sequences(s, (e & ~m) - 1, out);
        utf8_sequences(e & ~m, e, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  const int n = utf8_encode(s, a);
  utf8_encode(e, b);
  ByteRangeSeq seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out.push_back(std::move(seq));
}

// Decodes one UTF-8 code point at s[i] (advancing i); -1 on malformed input.
int64_t utf8_decode(std::string_view s, size_t& i) {
  const auto c = uint8_t(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size() || !is_valid_utf8(s.substr(i, n))) return -1;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

}  // namespace

// Parses GBNF into rules of byte sets and references, then checks and flattens them.
class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::string_view src) : src_(src) {}

  Result<std::shared_ptr<const Grammar>> run(std::string_view root_name) {
    skip_space();
    if (at_end()) return Status::InvalidArgument("grammar: empty (no rules)");
    while (!at_end()) {
      if (Status s = parse_rule(); !s.ok()) return s;
      skip_space();
    }
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (!defined_[r])
        return Status::InvalidArgument("grammar: rule '" + rules_[r].name + "' is used but never defined");
    }
    auto root = by_name_.find(std::string(root_name));
    if (root == by_name_.end() || !defined_[root->second])
      return Status::InvalidArgument("grammar: no rule named '" + std::string(root_name) + "' (the start rule)");
    if (Status s = check_left_recursion(); !s.ok()) return s;
    if (Status s = prune_unfinishable(root->second); !s.ok()) return s;
    return flatten(root->second);
  }

 private:
  struct BRule {
    std::string name;
    std::vector<Seq> alts;
  };

  // ------------------------------------------------------------------------------------ lexing
  bool at_end() const { return pos_ >= src_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < src_.size() ? src_[pos_ + ahead] : '\0'; }

  void skip_space() {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  Status error(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return Status::InvalidArgument("grammar: " + what + " at line " + std::to_string(line) + ", column " +
                                   std::to_string(col));
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    return std::string(src_.substr(start, pos_ - start));
  }

  // Whether a rule definition ("name ::=") starts at the current position.
  bool at_rule_definition() const {
    size_t p = pos_;
    if (p >= src_.size() || !is_name_start(src_[p])) return false;
    while (p < src_.size() && is_name_char(src_[p])) ++p;
    while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t' || src_[p] == '\n' || src_[p] == '\r')) ++p;
    return src_.substr(p, 3) == "::=";
  }

  uint32_t rule_id(const std::string& name) {
    auto [it, added] = by_name_.emplace(name, uint32_t(rules_.size()));
    if (added) {
      rules_.push_back({name, {}});
      defined_.push_back(false);
    }
    return it->second;
  }

  uint32_t new_rule(const std::string& base) {
    std::string name;
    do {
      name = base + "-" + std::to_string(++generated_);
    } while (by_name_.count(name));
    const uint32_t id = rule_id(name);
    defined_[id] = true;
    return id;
  }

  uint32_t byte_set(const ByteSet& s) {
    auto [it, added] = set_index_.emplace(s, uint32_t(sets_.size()));
    if (added) sets_.push_back(s);
    return it->second;
  }
  Sym byte_sym(uint8_t lo, uint8_t hi) {
    ByteSet s{};
    for (unsigned b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t(1) << (b & 63);
    return {false, byte_set(s)};
  }

  // One code point of a literal or class, with escapes; -1 (and *err set) on bad input.
  int64_t parse_char(Status* err) {
    if (peek() != '\\') {
      size_t i = pos_;
      const int64_t cp = utf8_decode(src_, i);
      if (cp < 0) {
        *err = error("invalid UTF-8");
        return -1;
      }
      pos_ = i;
      return cp;
    }
    ++pos_;
    const char c = peek();
    ++pos_;
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '\\': case '"': case '\'': case '[': case ']': case '-': case '/': case '^': return c;
      case 'x': case 'u': case 'U': {
        const int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k) {
          const char h = peek();
          const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (d < 0) {
            *err = error(std::string("\\") + c + " needs " + std::to_string(digits) + " hex digits");
            return -1;
          }
          v = v * 16 + uint32_t(d);
          ++pos_;
        }
        if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
          *err = error("escape is not a Unicode scalar value");
          return -1;
        }
        return v;
      }
      default:
        --pos_;
        *err = error(std::string("unknown escape \\") + c);
        return -1;
    }
  }

  // ------------------------------------------------------------------------------------ parsing
  Status parse_rule() {
    if (!is_name_start(peek())) return error("expected a rule name");
    const std::string name = parse_name();
    skip_space();
    if (src_.substr(pos_, 3) != "::=") return error("expected '::=' after rule name '" + name + "'");
    pos_ += 3;
    const uint32_t id = rule_id(name);
    if (defined_[id]) return error("rule '" + name + "' is defined twice");
    defined_[id] = true;
    std::vector<Seq> alts;
    if (Status s = parse_alternatives(name, alts, /*nested=*/false); !s.ok()) return s;
    rules_[id].alts = std::move(alts);
    return Status::Ok();
  }

  Status parse_alternatives(const std::string& name, std::vector<Seq>& alts, bool nested) {
    for (;;) {
      Seq seq;
      if (Status s = parse_sequence(name, seq, nested); !s.ok()) return s;
      alts.push_back(std::move(seq));
      skip_space();
      if (peek() != '|') return Status::Ok();
      ++pos_;
    }
  }

  Status parse_sequence(const std::string& name, Seq& seq, bool nested) {
    for (;;) {
      skip_space();
      if (at_end() || peek() == '|' || peek() == ')') return Status::Ok();
      if (!nested && at_rule_definition()) return Status::Ok();
      Seq atom;
      const char c = peek();
      if (c == '"') {
        ++pos_;
        while (peek() != '"') {
          if (at_end()) return error("unterminated string literal");
          Status err;
          const int64_t cp = parse_char(&err);
          if (cp < 0) return err;
          uint8_t b[4];
          const int n = utf8_encode(uint32_t(cp), b);
          for (int k = 0; k < n; ++k) atom.push_back(byte_sym(b[k], b[k]));
        }
        ++pos_;
      } else if (c == '[' || c == '.') {
        std::vector<CodeRange> ranges;
        bool negate = false;
        if (c == '.') {
          ++pos_;
          negate = true;  // the complement of nothing
        } else {
          ++pos_;
          if (peek() == '^') {
            negate = true;
            ++pos_;
          }
          while (peek() != ']') {
            if (at_end()) return error("unterminated character class");
            Status err;
            const int64_t lo = parse_char(&err);
            if (lo < 0) return err;
            int64_t hi = lo;
            if (peek() == '-' && peek(1) != ']' && pos_ + 1 < src_.size()) {
              ++pos_;
              hi = parse_char(&err);
              if (hi < 0) return err;
              if (hi < lo) return error("character range is backwards");
            }
            ranges.push_back({uint32_t(lo), uint32_t(hi)});
          }
          ++pos_;
        }
        atom.push_back(code_point_class(name, normalize(std::move(ranges), negate)));
        if (atom.back().ref && rules_[atom.back().arg].alts.empty())
          return error("character class matches nothing");
      } else if (c == '(') {
        ++pos_;
        // Groups are parsed recursively: their depth is bounded, so the stack is.
        if (++group_depth_ > Grammar::kMaxGroupDepth)
          return error("groups nested deeper than " + std::to_string(Grammar::kMaxGroupDepth));
        std::vector<Seq> alts;
        if (Status s = parse_alternatives(name, alts, /*nested=*/true); !s.ok()) return s;
        --group_depth_;
        if (peek() != ')') return error("expected ')'");
        ++pos_;
        if (alts.size() == 1) {
          atom = std::move(alts[0]);
        } else {
          const uint32_t r = new_rule(name);
          rules_[r].alts = std::move(alts);
          atom.push_back({true, r});
        }
      } else if (is_name_start(c)) {
        atom.push_back({true, rule_id(parse_name())});
      } else {
        return error(std::string("unexpected character '") + c + "'");
      }
      if (Status s = parse_repetition(name, atom); !s.ok()) return s;
      seq.insert(seq.end(), atom.begin(), atom.end());
      if ((elements_ += atom.size()) > Grammar::kMaxElements)
        return error("grammar too large (more than " + std::to_string(Grammar::kMaxElements) + " elements)");
    }
  }

  // A code-point class as one byte set (ASCII only) or a rule of UTF-8 byte sequences (shared by
  // equal classes).
  Sym code_point_class(const std::string& name, const std::vector<CodeRange>& ranges) {
    if (!ranges.empty() && ranges.back().hi < 0x80) {
      ByteSet s{};
      for (CodeRange r : ranges)
        for (uint32_t b = r.lo; b <= r.hi; ++b) s[b >> 6] |= uint64_t(1) << (b & 63);
      return {false, byte_set(s)};
    }
    std::vector<uint32_t> key;
    for (CodeRange r : ranges) key.insert(key.end(), {r.lo, r.hi});
    if (auto it = class_rules_.find(key); it != class_rules_.end()) return {true, it->second};
    std::vector<ByteRangeSeq> seqs;
    for (CodeRange r : ranges) utf8_sequences(r.lo, r.hi, seqs);
    const uint32_t rule = new_rule(name);
    ByteSet ascii{};
    bool any_ascii = false;
    for (const auto& q : seqs) {
      if (q.size() == 1) {
        for (unsigned b = q[0].first; b <= q[0].second; ++b) ascii[b >> 6] |= uint64_t(1) << (b & 63);
        any_ascii = true;
        continue;
      }
      Seq alt;
      for (auto [lo, hi] : q) alt.push_back(byte_sym(lo, hi));
      rules_[rule].alts.push_back(std::move(alt));
    }
    if (any_ascii) rules_[rule].alts.insert(rules_[rule].alts.begin(), Seq{{false, byte_set(ascii)}});
    class_rules_.emplace(std::move(key), rule);
    return {true, rule};
  }

  Status parse_repetition(const std::string& name, Seq& atom) {
    const char c = peek();
    if (c != '*' && c != '+' && c != '?' && c != '{') return Status::Ok();
    ++pos_;
    long m = 0, n = -1;  // n < 0: unbounded
    if (c == '+') m = 1;
    if (c == '?') n = 1;
    if (c == '{') {
      auto number = [&](long& v) {
        skip_space();
        if (!(peek() >= '0' && peek() <= '9')) return false;
        v = 0;
        while (peek() >= '0' && peek() <= '9') {
          v = v * 10 + (peek() - '0');
          if (v > Grammar::kMaxRepeat) v = Grammar::kMaxRepeat + 1;
          ++pos_;
        }
        skip_space();
        return true;
      };
      if (!number(m)) return error("expected a number after '{'");
      n = m;
      if (peek() == ',') {
        ++pos_;
        if (!number(n)) n = -1;
      }
      if (peek() != '}') return error("expected '}'");
      ++pos_;
      if (m > Grammar::kMaxRepeat || n > Grammar::kMaxRepeat)
        return error("repetition count above " + std::to_string(Grammar::kMaxRepeat));
      if (n >= 0 && n < m) return error("repetition {m,n} with n < m");
    }
    Sym x = atom.size() == 1 ? atom[0] : Sym{true, 0};
    if (atom.size() != 1) {
      x.arg = new_rule(name);
      rules_[x.arg].alts = {atom};
    }
    Seq out;
    for (long k = 0; k < m; ++k) out.push_back(x);
    if (n < 0) {  // x*: R ::= x R | ""
      const uint32_t r = new_rule(name);
      rules_[r].alts = {Seq{x, Sym{true, r}}, Seq{}};
      out.push_back({true, r});
    } else if (n > m) {  // up to n - m more: R1 ::= x | "", Rk ::= x R(k-1) | ""
      uint32_t prev = 0;
      for (long k = 1; k <= n - m; ++k) {
        const uint32_t r = new_rule(name);
        rules_[r].alts = {k == 1 ? Seq{x} : Seq{x, Sym{true, prev}}, Seq{}};
        prev = r;
      }
      out.push_back({true, prev});
    }
    elements_ += size_t(std::max<long>(m, 0)) + 3 * size_t(std::max<long>(n - m, 1));
    atom = std::move(out);
    return Status::Ok();
  }

  // ------------------------------------------------------------------------------------ checks
  // The least set of rules that have an alternative whose every symbol passes ok(symbol, set).
  template <class Ok>
  std::vector<bool> fixpoint(Ok ok) const {
    std::vector<bool> in(rules_.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < rules_.size(); ++r) {
        if (in[r]) continue;
        for (const Seq& alt : rules_[r].alts) {
          if (std::all_of(alt.begin(), alt.end(), [&](Sym s) { return ok(s, in); })) {
            in[r] = changed = true;
            break;
          }
        }
      }
    }
    return in;
  }
  std::vector<bool> nullable() const {
    return fixpoint([](Sym s, const std::vector<bool>& in) { return s.ref && in[s.arg]; });
  }

  // The matcher expands a rule's leading references before it reads a byte; a cycle among them (also
  // through rules that can match "") would never end.
  Status check_left_recursion() const {
    const std::vector<bool> nul = nullable();
    std::vector<std::vector<uint32_t>> leads(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const Seq& alt : rules_[r].alts) {
        for (Sym s : alt) {
          if (!s.ref) break;
          leads[r].push_back(s.arg);
          if (!nul[s.arg]) break;
        }
      }
    }
    // Depth first with a stack of its own (rule, next lead to follow), not recursion: a chain of
    // thousands of rules would overflow the call stack.
    std::vector<int> color(rules_.size(), 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> path;
    for (uint32_t start = 0; start < rules_.size(); ++start) {
      if (color[start] != 0) continue;
      color[start] = 1;
      path.assign(1, {start, 0});
      while (!path.empty()) {
        const uint32_t r = path.back().first;
        if (path.back().second == leads[r].size()) {
          color[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t n = leads[r][path.back().second++];
        if (color[n] == 1) {
          std::string cycle;
          auto from = std::find_if(path.begin(), path.end(), [n](const auto& step) { return step.first == n; });
          for (; from != path.end(); ++from) cycle += rules_[from->first].name + " -> ";
          return Status::InvalidArgument("grammar: left recursion (" + cycle + rules_[n].name +
                                         "): a rule may not start with itself; write it right-recursive");
        }
        if (color[n] == 0) {
          color[n] = 1;
          path.emplace_back(n, 0);
        }
      }
    }
    return Status::Ok();
  }

  Status prune_unfinishable(uint32_t root) {
    const std::vector<bool> fin = fixpoint([](Sym s, const std::vector<bool>& in) { return !s.ref || in[s.arg]; });
    if (!fin[root])
      return Status::InvalidArgument("grammar: rule '" + rules_[root].name +
                                     "' can never finish (every alternative recurses for ever)");
    for (BRule& rule : rules_) {
      std::erase_if(rule.alts, [&](const Seq& alt) {
        return std::any_of(alt.begin(), alt.end(), [&](Sym s) { return s.ref && !fin[s.arg]; });
      });
    }
    return Status::Ok();
  }

  Result<std::shared_ptr<const Grammar>> flatten(uint32_t root) {
    auto g = std::make_shared<Grammar>();
    g->byte_sets_ = sets_;
    g->root_ = root;
    for (const BRule& rule : rules_) {
      Grammar::Rule out{rule.name, {}};
      for (const Seq& alt : rule.alts) {
        out.alternatives.push_back(uint32_t(g->elements_.size()));
        for (Sym s : alt) g->elements_.push_back({s.ref ? Grammar::Kind::Ref : Grammar::Kind::Byte, s.arg});
        g->elements_.push_back({Grammar::Kind::End, 0});
      }
      g->rules_.push_back(std::move(out));
    }
    if (g->elements_.size() > Grammar::kMaxElements)
      return Status::InvalidArgument("grammar too large (more than " + std::to_string(Grammar::kMaxElements) +
                                     " elements)");
    return std::shared_ptr<const Grammar>(std::move(g));
  }

  std::string_view src_;
  size_t pos_ = 0;
  size_t elements_ = 0;
  int generated_ = 0;
  int group_depth_ = 0;
  std::vector<BRule> rules_;
  std::vector<bool> defined_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::vector<ByteSet> sets_;
  std::map<ByteSet, uint32_t> set_index_;
  std::map<std::vector<uint32_t>, uint32_t> class_rules_;
};

Result<std::shared_ptr<const Grammar>> Grammar::parse(std::string_view gbnf, std::string_view root) {
  return GrammarCompiler(gbnf).run(root);
}

std::string Grammar::dump() const {
  auto byte_set_text = [](const ByteSet& s) {
    std::string out = "[";
    char buf[8];
    for (int b = 0; b < 256;) {
      if (!contains(s, uint8_t(b))) {
        ++b;
        continue;
      }
      int e = b;
      while (e + 1 < 256 && contains(s, uint8_t(e + 1))) ++e;
      auto one = [&](int x) {
        if (x >= 0x21 && x < 0x7F && x != '\\' && x != ']' && x != '-' && x != '^') {
          out += char(x);
        } else {
          std::snprintf(buf, sizeof buf, "\\x%02X", x);
          out += buf;
        }
      };
      one(b);
      if (e > b) {
        out += '-';
        one(e);
      }
      b = e + 1;
    }
    return out + "]";
  };
  std::string out;
  for (const Rule& r : rules_) {
    out += r.name + " ::=";
    for (size_t a = 0; a < r.alternatives.size(); ++a) {
      if (a) out += " |";
      for (uint32_t p = r.alternatives[a]; elements_[p].kind != Kind::End; ++p) {
        const Element& e = elements_[p];
        out += ' ';
        out += e.kind == Kind::Ref ? rules_[e.arg].name : byte_set_text(byte_sets_[e.arg]);
      }
      if (elements_[r.alternatives[a]].kind == Kind::End) out += " \"\"";
    }
    out += '\n';
  }
  return out;
}

Result<std::string> gbnf_literal(std::string_view bytes) {
  if (!is_valid_utf8(bytes)) return Status::InvalidArgument("grammar literal is not valid UTF-8");
  std::string out = "\"";
  char buf[8];
  for (char ch : bytes) {
    const auto c = uint8_t(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace towers
