#include "engine/constrained/json_schema_leaves.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "engine/constrained/grammar.h"

namespace towers {

namespace {

// ------------------------------------------------------------------------------------ integers

constexpr int64_t kIntegerCap = 9999999999999999;  // the largest integer of kMaxIntegerDigits digits
static_assert(kMaxIntegerDigits == 16);

std::string repeat(const std::string& atom, int m, int n) {
  if (m == 1 && n == 1) return atom;
  if (m == n) return atom + "{" + std::to_string(m) + "}";
  return atom + "{" + std::to_string(m) + "," + std::to_string(n) + "}";
}

std::string alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
  return out + " )";
}

std::string digit_class(char lo, char hi) {
  if (lo == hi) return std::string("\"") + lo + "\"";
  return std::string("[") + lo + "-" + hi + "]";
}

// Digit strings of x.size() digits (leading zeros allowed) between x and y inclusive.
std::string fixed_width_range(const std::string& x, const std::string& y) {
  const size_t w = x.size();
  if (w == 0) return "";
  const bool x_rest_zero = x.find_first_not_of('0', 1) == std::string::npos;
  const bool y_rest_nine = y.find_first_not_of('9', 1) == std::string::npos;
  const std::string tail_any = w > 1 ? " " + repeat("[0-9]", int(w) - 1, int(w) - 1) : "";
  if (x_rest_zero && y_rest_nine) return digit_class(x[0], y[0]) + tail_any;
  if (x[0] == y[0]) return digit_class(x[0], x[0]) + " " + fixed_width_range(x.substr(1), y.substr(1));
  std::vector<std::string> alts;
  char mid_lo = x[0], mid_hi = y[0];
  if (!x_rest_zero) {
    alts.push_back(digit_class(x[0], x[0]) + " " + fixed_width_range(x.substr(1), std::string(w - 1, '9')));
    ++mid_lo;
  }
  if (!y_rest_nine) --mid_hi;
  if (mid_lo <= mid_hi) alts.push_back(digit_class(mid_lo, mid_hi) + tail_any);
  if (!y_rest_nine) alts.push_back(digit_class(y[0], y[0]) + " " + fixed_width_range(std::string(w - 1, '0'), y.substr(1)));
  return alternatives(alts);
}

int64_t pow10(int d) {
  int64_t p = 1;
  while (d-- > 0) p *= 10;
  return p;
}

// Decimal strings without leading zeros of the integers in [a, b], 0 <= a <= b <= kIntegerCap.
std::string unsigned_range(int64_t a, int64_t b) {
  std::vector<std::string> alts;
  const int da = int(std::to_string(a).size()), db = int(std::to_string(b).size());
  int full_from = -1;  // a run of digit counts whose whole range is allowed: [1-9] [0-9]{m,n}
  auto flush_full = [&](int last) {
    if (full_from < 0) return;
    alts.push_back("[1-9] " + repeat("[0-9]", full_from - 1, last - 1));
    full_from = -1;
  };
  for (int d = da; d <= db; ++d) {
    const int64_t lo = std::max(a, d == 1 ? 0 : pow10(d - 1)), hi = std::min(b, pow10(d) - 1);
    if (d > 1 && lo == pow10(d - 1) && hi == pow10(d) - 1) {
      if (full_from < 0) full_from = d;
      continue;
    }
    flush_full(d - 1);
    alts.push_back(fixed_width_range(std::to_string(lo), std::to_string(hi)));
  }
  flush_full(db);
  return alternatives(alts);
}

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The smallest integer allowed by a lower bound / the largest by an upper one, clamped to the cap.
int64_t lowest_integer(const std::optional<NumberBound>& lo) {
  if (!lo) return -kIntegerCap;
  if (lo->integer) return std::max(-kIntegerCap, *lo->integer + (lo->exclusive ? 1 : 0));
  const double v = lo->exclusive ? std::floor(lo->value) + 1 : std::ceil(lo->value);
  return v < double(-kIntegerCap) ? -kIntegerCap : v > double(kIntegerCap) ? kIntegerCap + 1 : int64_t(v);
}
int64_t highest_integer(const std::optional<NumberBound>& hi) {
  if (!hi) return kIntegerCap;
  if (hi->integer) return std::min(kIntegerCap, *hi->integer - (hi->exclusive ? 1 : 0));
  const double v = hi->exclusive ? std::ceil(hi->value) - 1 : std::floor(hi->value);
  return v > double(kIntegerCap) ? kIntegerCap : v < double(-kIntegerCap) ? -kIntegerCap - 1 : int64_t(v);
}

// Integers in [lo, hi] (already clamped), or "" when there are none.
std::string integers_between(int64_t lo, int64_t hi) {
  if (lo > hi) return "";
  std::vector<std::string> alts;
  if (hi >= 0) alts.push_back(unsigned_range(std::max<int64_t>(lo, 0), hi));
  if (lo < 0) alts.push_back("\"-\" " + unsigned_range(std::max<int64_t>(-hi, 1), -lo));
  return alternatives(alts);
}

Status no_value(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi, const char* what) {
  std::string range = (lo ? (lo->exclusive ? "(" : "[") + format_number(lo->value) : std::string("(-inf")) + ", " +
                      (hi ? format_number(hi->value) + (hi->exclusive ? ")" : "]") : std::string("+inf)"));
  return Status::InvalidArgument(std::string("no ") + what + " in " + range + " that the grammar can write (at most " +
                                 std::to_string(kMaxIntegerDigits) + " integer digits" +
                                 (std::string(what) == "number" ? "; fractions only in whole unit intervals" : "") + ")");
}

// ------------------------------------------------------------------------------------ strings

struct Range {
  uint32_t lo, hi;
};
using Ranges = std::vector<Range>;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end(), [](Range a, Range b) { return a.lo < b.lo; });
  Ranges out;
  for (Range x : r) {
    if (!out.empty() && x.lo <= out.back().hi + 1) out.back().hi = std::max(out.back().hi, x.hi);
    else out.push_back(x);
  }
  return out;
}
Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (Range x : normalized(r)) {
    if (x.lo > next) out.push_back({next, x.lo - 1});
    next = x.hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}
bool contains(const Ranges& r, uint32_t c) {
  return std::any_of(r.begin(), r.end(), [&](Range x) { return x.lo <= c && c <= x.hi; });
}

std::string class_char(uint32_t c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return std::string(1, char(c));
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\U%08X", c);
  return buf;
}

// A GBNF expression writing each code point of `r` as JSON string content: as itself, or with the
// escapes \" \\ \n \r \t; other control characters are left out. "" when nothing is left.
std::string json_chars(const Ranges& r) {
  Ranges plain;
  for (Range x : normalized(r)) {  // without controls, '"', '\\' and surrogates
    const Range cut[] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}};
    Ranges pieces = {x};
    for (Range c : cut) {
      Ranges next;
      for (Range p : pieces) {
        if (p.hi < c.lo || p.lo > c.hi) {
          next.push_back(p);
          continue;
        }
        if (p.lo < c.lo) next.push_back({p.lo, c.lo - 1});
        if (p.hi > c.hi) next.push_back({c.hi + 1, p.hi});
      }
      pieces = std::move(next);
    }
    plain.insert(plain.end(), pieces.begin(), pieces.end());
  }
  std::vector<std::string> alts;
  if (!plain.empty()) {
    std::string cls = "[";
    for (Range x : plain) cls += class_char(x.lo) + (x.hi > x.lo ? "-" + class_char(x.hi) : "");
    alts.push_back(cls + "]");
  }
  const std::pair<uint32_t, const char*> escapes[] = {
      {'"', R"("\\\"")"}, {'\\', R"("\\\\")"}, {'\n', R"("\\n")"}, {'\r', R"("\\r")"}, {'\t', R"("\\t")"}};
  for (const auto& [c, lit] : escapes)
    if (contains(r, c)) alts.push_back(lit);
  if (alts.empty()) return "";
  return alternatives(alts);
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};

// A parsed pattern: what PatternCompiler reads, written out as one GBNF expression (gbnf) or as an
// automaton whose strings can be bounded in length (Nfa).
struct PatternNode {
  enum class Kind { Chars, Sequence, Alternation, Group, Repeat };
  Kind kind = Kind::Sequence;
  Ranges chars;                  // Chars
  std::vector<PatternNode> kids;  // Sequence, Alternation; Group and Repeat: one
  char op = 0;                   // Repeat: '*', '+', '?', or 0 for {m,n}
  long min = 0, max = -1;        // Repeat: the count (max -1: unbounded)
};

std::string gbnf(const PatternNode& n) {
  switch (n.kind) {
    case PatternNode::Kind::Chars: return json_chars(n.chars);
    case PatternNode::Kind::Sequence: {
      std::string out;
      for (const auto& k : n.kids) out += (out.empty() ? "" : " ") + gbnf(k);
      return out;
    }
    case PatternNode::Kind::Alternation: {
      std::vector<std::string> alts;
      for (const auto& k : n.kids) {
        std::string a = gbnf(k);
        alts.push_back(a.empty() ? "\"\"" : a);
      }
      return alternatives(alts);
    }
    case PatternNode::Kind::Group: return "( " + gbnf(n.kids[0]) + " )";
    case PatternNode::Kind::Repeat:
      if (n.op) return "( " + gbnf(n.kids[0]) + " )" + n.op;
      return "( " + gbnf(n.kids[0]) + " ){" + std::to_string(n.min) + "," + (n.max < 0 ? "" : std::to_string(n.max)) + "}";
  }
  return "";
}

PatternNode chars_node(Ranges r) {
  PatternNode n;
  n.kind = PatternNode::Kind::Chars;
  n.chars = std::move(r);
  return n;
}
PatternNode wrap(PatternNode::Kind kind, PatternNode kid) {
  PatternNode n;
  n.kind = kind;
  n.kids.push_back(std::move(kid));
  return n;
}

class PatternCompiler {
 public:
  explicit PatternCompiler(std::string_view p) : p_(p) {}

  Result<PatternNode> compile() {
    std::string_view body = p_;
    const bool anchored_start = !body.empty() && body.front() == '^';
    if (anchored_start) pos_ = 1;
    // A final '$' anchors unless it is escaped (an odd number of backslashes before it).
    size_t end = body.size();
    bool anchored_end = false;
    if (end > pos_ && body.back() == '$') {
      size_t backslashes = 0;
      while (end >= 2 + backslashes && body[end - 2 - backslashes] == '\\') ++backslashes;
      if (backslashes % 2 == 0) {
        anchored_end = true;
        --end;
      }
    }
    end_ = end;
    auto e = alternation(0);
    if (!e.ok()) return e;
    if (pos_ != end_) return error(std::string("unbalanced '") + p_[pos_] + "'");
    PatternNode any = wrap(PatternNode::Kind::Repeat, chars_node({{0, kMaxCodePoint}}));
    any.op = '*';
    any.min = 0;
    PatternNode out;  // a Sequence
    if (!anchored_start) out.kids.push_back(any);
    out.kids.push_back(std::move(*e));
    if (!anchored_end) out.kids.push_back(any);
    return out;
  }

 private:
  Status error(const std::string& what) const {
    return Status::InvalidArgument("pattern " + std::string(p_) + ": " + what);
  }
  bool at_end() const { return pos_ >= end_; }
  char peek() const { return at_end() ? '\0' : p_[pos_]; }

  Result<PatternNode> alternation(int depth) {
    if (depth > 64) return error("groups nested deeper than 64");
    PatternNode alts;
    alts.kind = PatternNode::Kind::Alternation;
    for (;;) {
      auto s = sequence(depth);
      if (!s.ok()) return s;
      alts.kids.push_back(std::move(*s));
      if (peek() != '|') break;
      ++pos_;
    }
    return alts;
  }

  Result<PatternNode> sequence(int depth) {
    PatternNode out;
    while (!at_end() && peek() != '|' && peek() != ')') {
      auto a = atom(depth);
      if (!a.ok()) return a;
      auto q = quantified(std::move(*a));
      if (!q.ok()) return q;
      out.kids.push_back(std::move(*q));
    }
    return out;
  }

  Result<PatternNode> quantified(PatternNode atom) {
    const char c = peek();
    PatternNode out;
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      out = wrap(PatternNode::Kind::Repeat, std::move(atom));
      out.op = c;
      out.min = c == '+' ? 1 : 0;
      out.max = c == '?' ? 1 : -1;
    } else if (c == '{' && looks_like_count()) {
      ++pos_;
      const long m = number();
      long n = m;
      if (peek() == ',') {
        ++pos_;
        n = peek() == '}' ? -1 : number();
      }
      if (peek() != '}' || m < 0 || (n >= 0 && n < m)) return error("bad {m,n} quantifier");
      ++pos_;
      if (m > Grammar::kMaxRepeat || n > Grammar::kMaxRepeat)
        return error("a count above " + std::to_string(Grammar::kMaxRepeat));
      out = wrap(PatternNode::Kind::Repeat, std::move(atom));
      out.min = m;
      out.max = n;
    } else {
      return atom;
    }
    if (peek() == '?') ++pos_;  // lazy: the same strings
    if (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')
      return error(std::string("a quantifier after a quantifier ('") + peek() + "')");
    return out;
  }
  bool looks_like_count() const {
    size_t i = pos_ + 1;
    while (i < end_ && (std::isdigit(uint8_t(p_[i])) || p_[i] == ',')) ++i;
    return i > pos_ + 1 && i < end_ && p_[i] == '}' && std::isdigit(uint8_t(p_[pos_ + 1]));
  }
  long number() {
    long v = 0;
    if (!std::isdigit(uint8_t(peek()))) return -1;
    while (std::isdigit(uint8_t(peek()))) {
      v = std::min<long>(v * 10 + (peek() - '0'), 1L << 40);
      ++pos_;
    }
    return v;
  }

  Result<PatternNode> atom(int depth) {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        const std::string_view rest = p_.substr(pos_, 3);
        if (rest.substr(0, 2) == "?:") {
          pos_ += 2;
        } else if (rest == "?<=" || rest == "?<!" || rest.substr(0, 2) == "?=" || rest.substr(0, 2) == "?!") {
          return error("lookaround '(" + std::string(rest.substr(0, rest[1] == '<' ? 3 : 2)) + "' is not supported");
        } else if (rest.substr(0, 2) == "?<") {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos || close >= end_) return error("unterminated group name");
          pos_ = close + 1;
        } else {
          return error("group flags '(?' are not supported");
        }
      }
      auto inner = alternation(depth + 1);
      if (!inner.ok()) return inner;
      if (peek() != ')') return error("missing ')'");
      ++pos_;
      return wrap(PatternNode::Kind::Group, std::move(*inner));
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      return chars(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '^' || c == '$') return error(std::string("anchor '") + c + "' inside the pattern is not supported");
    if (c == '*' || c == '+' || c == '?' || c == '{') {
      if (c != '{' || looks_like_count()) return error(std::string("nothing to repeat before '") + c + "'");
    }
    if (c == '\\') {
      Ranges r;
      auto s = escape(&r, /*in_class=*/false);
      if (!s.ok()) return s;
      return chars(r);
    }
    auto cp = code_point();
    if (!cp.ok()) return cp.status();
    return chars({{*cp, *cp}});
  }

  Result<PatternNode> chars(const Ranges& r) {
    if (json_chars(r).empty()) return error("a character class of control characters only, which are never written");
    return chars_node(r);
  }

  Result<uint32_t> code_point() {
    const uint8_t b = uint8_t(p_[pos_]);
    const int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + size_t(len) > end_) return error("invalid UTF-8");
    uint32_t cp = len == 1 ? b : len == 2 ? b & 0x1F : len == 3 ? b & 0x0F : b & 0x07;
    for (int k = 1; k < len; ++k) {
      const uint8_t cont = uint8_t(p_[pos_ + size_t(k)]);
      if ((cont & 0xC0) != 0x80) return error("invalid UTF-8");
      cp = (cp << 6) | (cont & 0x3F);
    }
    pos_ += size_t(len);
    return cp;
  }

  Result<uint32_t> hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const char h = peek();
      if (!std::isxdigit(uint8_t(h))) return error("\\x or \\u needs " + std::to_string(digits) + " hex digits");
      v = v * 16 + uint32_t(std::isdigit(uint8_t(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
      ++pos_;
    }
    return v;
  }

  // After a backslash: the code points the escape stands for, added to *r.
  Status escape(Ranges* r, bool in_class) {
    ++pos_;
    if (at_end()) return error("a trailing backslash");
    const char c = peek();
    ++pos_;
    auto add = [&](const Ranges& x) { r->insert(r->end(), x.begin(), x.end()); };
    switch (c) {
      case 'd': add(kDigit); return Status::Ok();
      case 'D': add(complement(kDigit)); return Status::Ok();
      case 'w': add(kWord); return Status::Ok();
      case 'W': add(complement(kWord)); return Status::Ok();
      case 's': add(kSpace); return Status::Ok();
      case 'S': add(complement(kSpace)); return Status::Ok();
      case 'n': r->push_back({'\n', '\n'}); return Status::Ok();
      case 'r': r->push_back({'\r', '\r'}); return Status::Ok();
      case 't': r->push_back({'\t', '\t'}); return Status::Ok();
      case 'f': r->push_back({'\f', '\f'}); return Status::Ok();
      case 'v': r->push_back({'\v', '\v'}); return Status::Ok();
      case '0': r->push_back({0, 0}); return Status::Ok();
      case 'x':
      case 'u': {
        if (c == 'u' && peek() == '{') return error("\\u{...} escapes are not supported");
        auto v = hex(c == 'x' ? 2 : 4);
        if (!v.ok()) return v.status();
        r->push_back({*v, *v});
        return Status::Ok();
      }
      case 'b':
        if (in_class) {
          r->push_back({'\b', '\b'});
          return Status::Ok();
        }
        return error("word boundary '\\b' is not supported");
      case 'B': return error("'\\B' is not supported");
      case 'p': case 'P': return error(std::string("Unicode property class '\\") + c + "' is not supported");
      case 'c': return error("control escape '\\c' is not supported");
      case 'k': return error("backreference '\\k' is not supported");
      default:
        if (c >= '1' && c <= '9') return error(std::string("backreference '\\") + c + "' is not supported");
        if (std::isalnum(uint8_t(c))) return error(std::string("unknown escape '\\") + c + "'");
        --pos_;  // an escaped punctuation or non-ASCII character: itself
        auto cp = code_point();
        if (!cp.ok()) return cp.status();
        r->push_back({*cp, *cp});
        return Status::Ok();
    }
  }

  Result<PatternNode> char_class() {
    ++pos_;
    const bool negate = peek() == '^';
    if (negate) ++pos_;
    Ranges r;
    while (peek() != ']') {
      if (at_end()) return error("missing ']'");
      // One member: a single code point (which may start a range) or an escape class.
      auto member = [&](Ranges* out, bool* single) -> Status {
        *single = false;
        if (peek() == '\\') {
          Ranges x;
          if (Status s = escape(&x, /*in_class=*/true); !s.ok()) return s;
          *single = x.size() == 1 && x[0].lo == x[0].hi;
          out->insert(out->end(), x.begin(), x.end());
          return Status::Ok();
        }
        auto cp = code_point();
        if (!cp.ok()) return cp.status();
        out->push_back({*cp, *cp});
        *single = true;
        return Status::Ok();
      };
      Ranges first;
      bool single = false;
      if (Status s = member(&first, &single); !s.ok()) return s;
      if (single && peek() == '-' && pos_ + 1 < end_ && p_[pos_ + 1] != ']') {
        ++pos_;
        Ranges last;
        bool last_single = false;
        if (Status s = member(&last, &last_single); !s.ok()) return s;
        if (!last_single) return error("a range ending in a class escape");
        if (last[0].lo < first[0].lo) return error("a range out of order");
        r.push_back({first[0].lo, last[0].lo});
      } else {
        r.insert(r.end(), first.begin(), first.end());
      }
    }
    ++pos_;
    return chars(negate ? complement(r) : normalized(r));
  }

  std::string_view p_;
  size_t pos_ = 0, end_ = 0;
};

// A pattern as an automaton (Thompson's construction): moves on character ranges and empty moves, the
// strings from `start` to `accept`. Loops enter and leave through states of their own, so parts may
// share their end states.
class Nfa {
 public:
  static constexpr size_t kMaxStates = 4096;
  struct State {
    std::vector<std::pair<Ranges, int>> moves;
    std::vector<int> empty;
  };

  Status build(const PatternNode& root) {
    start_ = add();
    accept_ = add();
    return add(root, start_, accept_);
  }
  int start() const { return start_; }
  int accept() const { return accept_; }
  size_t size() const { return states_.size(); }
  const State& state(int q) const { return states_[size_t(q)]; }

  // The states reachable from q by empty moves, q included.
  std::vector<int> closure(int q) const {
    std::vector<int> out = {q};
    std::vector<bool> seen(states_.size());
    seen[size_t(q)] = true;
    for (size_t i = 0; i < out.size(); ++i)
      for (int e : states_[size_t(out[i])].empty)
        if (!seen[size_t(e)]) {
          seen[size_t(e)] = true;
          out.push_back(e);
        }
    return out;
  }

 private:
  int add() {
    states_.emplace_back();
    return int(states_.size()) - 1;
  }
  Status add(const PatternNode& n, int from, int to) {
    if (states_.size() > kMaxStates) return Status::InvalidArgument("more than " + std::to_string(kMaxStates) + " automaton states");
    switch (n.kind) {
      case PatternNode::Kind::Chars: states_[size_t(from)].moves.push_back({n.chars, to}); return Status::Ok();
      case PatternNode::Kind::Group: return add(n.kids[0], from, to);
      case PatternNode::Kind::Alternation:
        for (const auto& k : n.kids)
          if (Status st = add(k, from, to); !st.ok()) return st;
        return Status::Ok();
      case PatternNode::Kind::Sequence: {
        int at = from;
        for (size_t i = 0; i < n.kids.size(); ++i) {
          const int next = i + 1 == n.kids.size() ? to : add();
          if (Status st = add(n.kids[i], at, next); !st.ok()) return st;
          at = next;
        }
        if (n.kids.empty()) states_[size_t(from)].empty.push_back(to);
        return Status::Ok();
      }
      case PatternNode::Kind::Repeat: {
        int at = from;
        for (long i = 0; i < n.min; ++i) {  // the required copies
          const int next = add();
          if (Status st = add(n.kids[0], at, next); !st.ok()) return st;
          at = next;
        }
        if (n.max < 0) {  // then any number more, through a loop of its own
          const int in = add(), out = add();
          states_[size_t(at)].empty.push_back(in);
          if (Status st = add(n.kids[0], in, out); !st.ok()) return st;
          states_[size_t(out)].empty.push_back(in);
          states_[size_t(out)].empty.push_back(to);
        }
        for (long i = n.min; i < n.max; ++i) {  // or up to max - min optional ones
          const int next = add();
          states_[size_t(at)].empty.push_back(to);
          if (Status st = add(n.kids[0], at, next); !st.ok()) return st;
          at = next;
        }
        states_[size_t(at)].empty.push_back(to);
        return Status::Ok();
      }
    }
    return Status::Ok();
  }

  std::vector<State> states_;
  int start_ = 0, accept_ = 0;
};

}  // namespace

Result<std::string> bounded_pattern_gbnf(std::string_view pattern, size_t min_length, size_t max_length,
                                         const std::function<std::string(std::string body)>& define) {
  auto tree = PatternCompiler(pattern).compile();
  if (!tree.ok()) return tree.status();
  Nfa nfa;
  if (Status st = nfa.build(*tree); !st.ok()) return Status::InvalidArgument("pattern " + std::string(pattern) + ": " + st.message());
  constexpr size_t kMaxRules = 20000;  // (state, length) pairs: the work grows with their number times the states
  if (nfa.size() * (max_length + 1) > kMaxRules) {
    return Status::InvalidArgument("pattern " + std::string(pattern) + " with maxLength " + std::to_string(max_length) + ": " +
                                   std::to_string(nfa.size()) + " automaton states times " + std::to_string(max_length + 1) +
                                   " lengths is more than " + std::to_string(kMaxRules) + " rules");
  }
  // Rule (q, i): the rest of the string from state q after i code points. Each moves to a rule of
  // length i + 1, so they are defined from the longest down, every body naming rules already defined.
  const size_t n = nfa.size();
  std::vector<std::vector<int>> closures(n);
  for (size_t q = 0; q < n; ++q) closures[q] = nfa.closure(int(q));
  std::vector<std::string> names(n * (max_length + 1));  // "" : no string of the right length from there
  auto name = [&](int q, size_t i) -> std::string& { return names[size_t(q) * (max_length + 1) + i]; };
  for (size_t i = max_length + 1; i-- > 0;) {
    for (size_t q = 0; q < n; ++q) {
      std::vector<std::pair<int, Ranges>> targets;  // by target state, in first-seen order
      bool accepts = false;
      for (int p : closures[q]) {
        accepts = accepts || p == nfa.accept();
        if (i == max_length) continue;
        for (const auto& [r, t] : nfa.state(p).moves) {
          if (name(t, i + 1).empty()) continue;
          auto it = std::find_if(targets.begin(), targets.end(), [t = t](const auto& x) { return x.first == t; });
          if (it == targets.end()) targets.push_back({t, r});
          else it->second.insert(it->second.end(), r.begin(), r.end());
        }
      }
      std::vector<std::string> alts;
      for (const auto& [t, r] : targets) {
        const std::string c = json_chars(r);
        if (!c.empty()) alts.push_back(c + " " + name(t, i + 1));
      }
      if (accepts && i >= min_length) alts.push_back("\"\"");
      if (!alts.empty()) name(int(q), i) = define(alternatives(alts));
    }
  }
  const std::string& root = name(nfa.start(), 0);
  if (root.empty()) {
    return Status::InvalidArgument("pattern " + std::string(pattern) + " has no string of " + std::to_string(min_length) + " to " +
                                   std::to_string(max_length) + " characters");
  }
  return root;
}

Result<std::string> integer_range_gbnf(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi) {
  std::string e = integers_between(lowest_integer(lo), highest_integer(hi));
  if (e.empty()) return no_value(lo, hi, "integer");
  return e;
}

Result<std::string> number_range_gbnf(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi) {
  const std::string fraction = "\".\" [0-9]{1,15}";
  const std::string nonzero_fraction = "\".\" \"0\"{0,14} [1-9] [0-9]{0,14}";
  std::vector<std::string> alts;
  const int64_t ilo = lowest_integer(lo), ihi = highest_integer(hi);
  if (std::string e = integers_between(ilo, ihi); !e.empty()) alts.push_back(e);
  // Positive-side fractions "I.F" cover [I, I+1): I >= lowest integer, I + 1 <= hi.
  const int64_t upper_unit = hi ? (hi->integer ? *hi->integer : int64_t(std::clamp(std::floor(hi->value), -1e17, 1e17))) - 1
                                : kIntegerCap;
  if (std::string e = integers_between(std::max<int64_t>(ilo, 0), std::min(upper_unit, kIntegerCap)); !e.empty())
    alts.push_back(e + " " + fraction);
  // Negative-side fractions "-I.F" cover (-(I+1), -I]: -I <= highest integer, -(I+1) >= lo.
  const int64_t lower_unit = lo ? (lo->integer ? *lo->integer : int64_t(std::clamp(std::ceil(lo->value), -1e17, 1e17))) + 1
                                : -kIntegerCap;
  if (std::string e = integers_between(std::max<int64_t>(-ihi, 0), std::min(-lower_unit, kIntegerCap)); !e.empty())
    alts.push_back("\"-\" " + e + " " + fraction);
  // Just past an exclusive integer bound: (lo, lo+1) and (hi-1, hi), when that unit lies within the other bound.
  if (lo && lo->exclusive && lo->integer && *lo->integer >= 0 && *lo->integer < kIntegerCap &&
      (!hi || (hi->integer ? *hi->integer : hi->value) >= double(*lo->integer + 1)))
    alts.push_back("\"" + std::to_string(*lo->integer) + "\" " + nonzero_fraction);
  if (hi && hi->exclusive && hi->integer && *hi->integer <= 0 && *hi->integer > -kIntegerCap &&
      (!lo || (lo->integer ? *lo->integer : lo->value) <= double(*hi->integer - 1)))
    alts.push_back("\"-" + std::to_string(-*hi->integer) + "\" " + nonzero_fraction);
  if (alts.empty()) return no_value(lo, hi, "number");
  return alternatives(alts);
}

Result<std::string> pattern_gbnf(std::string_view pattern) {
  auto tree = PatternCompiler(pattern).compile();
  if (!tree.ok()) return tree.status();
  return gbnf(*tree);
}

Result<std::string> format_gbnf(std::string_view format) {
  const std::string day = R"(( "0" [1-9] | "1" [0-9] | "2" [0-8] ))";
  const std::string date = R"([0-9]{4} "-" ( "02-" )" + day +
                           R"( | ( "0" [13578] | "1" [02] ) "-" ( )" + day + R"( | "29" | "30" | "31" ))" +
                           R"( | ( "0" [469] | "11" ) "-" ( )" + day + R"( | "29" | "30" ) ))";
  const std::string hms = R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )?)";
  if (format == "date") return date;
  if (format == "time") return hms + R"( ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))";
  if (format == "date-time") return date + " \"T\" " + hms + " \"Z\"";
  if (format == "uuid") {
    return std::string(R"([0-9a-f]{8} "-" [0-9a-f]{4} "-" [1-8] [0-9a-f]{3} "-" [89ab] [0-9a-f]{3} "-" [0-9a-f]{12})");
  }
  if (format == "email") {
    const std::string atom = "[A-Za-z0-9_+\\-]{1,32}";
    const std::string label = "[A-Za-z0-9] ( [A-Za-z0-9\\-]{0,30} [A-Za-z0-9] )?";
    return atom + " ( \".\" " + atom + " ){0,3} \"@\" ( " + label + " \".\" ){1,3} [A-Za-z]{2,12}";
  }
  return Status::InvalidArgument("format '" + std::string(format) +
                                 "' is not supported (date, time, date-time, uuid, email are)");
}

}  // namespace towers
