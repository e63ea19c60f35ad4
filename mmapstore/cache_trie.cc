#include "mmapstore/cache_trie.h"

#include <algorithm>
#include <string>
#include <utility>

namespace towers {

namespace {

std::string seg_name(SegmentId id) { return "segment " + std::to_string(id); }

// Length of the common prefix of a and b.
size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t n = std::min(a.size(), b.size());
  auto mm = std::mismatch(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin());
  return static_cast<size_t>(mm.first - a.begin());
}

}  // namespace

CacheTrie::CacheTrie() : CacheTrie(Limits{}) {}

CacheTrie::CacheTrie(Limits limits) : limits_(limits), root_(std::make_unique<Node>()) {}

CacheTrie::~CacheTrie() { destroy(); }

CacheTrie::CacheTrie(CacheTrie&& o) noexcept
    : limits_(o.limits_), root_(std::move(o.root_)), index_(std::move(o.index_)), nodes_(o.nodes_),
      edge_tokens_(o.edge_tokens_) {
  o.root_ = std::make_unique<Node>();
  o.index_.clear();
  o.nodes_ = o.edge_tokens_ = 0;
}

CacheTrie& CacheTrie::operator=(CacheTrie&& o) noexcept {
  if (this == &o) return *this;
  destroy();
  limits_ = o.limits_;
  root_ = std::move(o.root_);
  index_ = std::move(o.index_);
  nodes_ = o.nodes_;
  edge_tokens_ = o.edge_tokens_;
  o.root_ = std::make_unique<Node>();
  o.index_.clear();
  o.nodes_ = o.edge_tokens_ = 0;
  return *this;
}

// Iterative teardown: a long chain of sealed transcript segments must not recurse once per node.
void CacheTrie::destroy() {
  if (!root_) return;
  std::vector<std::unique_ptr<Node>> stack;
  stack.push_back(std::move(root_));
  while (!stack.empty()) {
    std::unique_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    for (Child& c : n->children) stack.push_back(std::move(c.node));
  }
  index_.clear();
  nodes_ = edge_tokens_ = 0;
}

CacheTrie::Child* CacheTrie::find_child(Node* n, int32_t first) {
  auto it = std::lower_bound(n->children.begin(), n->children.end(), first,
                             [](const Child& c, int32_t t) { return c.first < t; });
  return (it != n->children.end() && it->first == first) ? &*it : nullptr;
}

const CacheTrie::Child* CacheTrie::find_child(const Node* n, int32_t first) {
  return find_child(const_cast<Node*>(n), first);
}

CacheTrie::Node* CacheTrie::attach(Node* parent, std::vector<int32_t> label) {
  auto node = std::make_unique<Node>();
  node->label = std::move(label);
  node->parent = parent;
  node->end = parent->end + node->label.size();
  Node* raw = node.get();
  int32_t first = raw->label[0];
  auto it = std::lower_bound(parent->children.begin(), parent->children.end(), first,
                             [](const Child& c, int32_t t) { return c.first < t; });
  parent->children.insert(it, Child{first, std::move(node)});
  ++nodes_;
  edge_tokens_ += raw->label.size();
  return raw;
}

// Splits `child` after its first k label tokens (0 < k < label size): a new payload-less node takes
// those k tokens and `child` (payload, children and all) hangs below it. Returns the new node.
CacheTrie::Node* CacheTrie::split(Node* child, size_t k) {
  Node* parent = child->parent;
  Child* slot = find_child(parent, child->label[0]);
  auto mid = std::make_unique<Node>();
  mid->label.assign(child->label.begin(), child->label.begin() + static_cast<std::ptrdiff_t>(k));
  mid->parent = parent;
  mid->end = child->end - child->label.size() + k;
  child->label.erase(child->label.begin(), child->label.begin() + static_cast<std::ptrdiff_t>(k));
  child->label.shrink_to_fit();
  child->parent = mid.get();
  Node* raw = mid.get();
  int32_t child_first = child->label[0];
  raw->children.push_back(Child{child_first, std::move(slot->node)});
  slot->node = std::move(mid);  // slot->first (== label[0]) is unchanged
  ++nodes_;
  return raw;
}

const CacheTrie::Node* CacheTrie::payload_ancestor(const Node* n) {
  const Node* a = n->parent;
  while (a->parent != nullptr && a->payload == kNoSegment) a = a->parent;
  return a;
}

const CacheTrie::Node* CacheTrie::find_exact(std::span<const int32_t> tokens) const {
  const Node* n = root_.get();
  size_t i = 0;
  while (i < tokens.size()) {
    const Child* c = find_child(n, tokens[i]);
    if (!c) return nullptr;
    const auto& label = c->node->label;
    if (tokens.size() - i < label.size() || common_prefix(label, tokens.subspan(i)) != label.size())
      return nullptr;
    i += label.size();
    n = c->node.get();
  }
  return n;
}

// Nearest payload-carrying nodes strictly below n.
size_t CacheTrie::count_payload_frontier(const Node* n) {
  size_t count = 0;
  std::vector<const Node*> stack;
  for (const Child& c : n->children) stack.push_back(c.node.get());
  while (!stack.empty()) {
    const Node* m = stack.back();
    stack.pop_back();
    if (m->payload != kNoSegment) {
      ++count;
      continue;
    }
    for (const Child& c : m->children) stack.push_back(c.node.get());
  }
  return count;
}

Result<CacheTrie::InsertResult> CacheTrie::insert(std::span<const int32_t> tokens, SegmentId id) {
  if (tokens.empty()) return Status::Error("cache trie: cannot insert an empty sequence");
  if (tokens.size() > limits_.max_sequence)
    return Status::Error("cache trie: sequence of " + std::to_string(tokens.size()) + " tokens exceeds the limit of " +
                         std::to_string(limits_.max_sequence));
  for (int32_t t : tokens)
    if (t < 0) return Status::Error("cache trie: negative token id " + std::to_string(t));
  if (id == kNoSegment) return Status::Error("cache trie: segment id 0 is reserved for 'no segment'");

  if (const Node* existing = find_exact(tokens); existing && existing->payload != kNoSegment)
    return InsertResult{existing->payload, false};
  if (index_.count(id))
    return Status::Error("cache trie: " + seg_name(id) + " is already registered for another sequence");

  // Descend, splitting where the sequence ends or diverges inside an edge.
  Node* n = root_.get();
  size_t i = 0;
  Node* target = nullptr;
  while (target == nullptr) {
    if (i == tokens.size()) {
      target = n;
      break;
    }
    Child* c = find_child(n, tokens[i]);
    if (!c) {
      target = attach(n, std::vector<int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(i), tokens.end()));
      break;
    }
    Node* child = c->node.get();
    size_t k = common_prefix(child->label, tokens.subspan(i));  // >= 1: first tokens are equal
    i += k;
    if (k == child->label.size()) {
      n = child;
      continue;
    }
    Node* mid = split(child, k);
    target = (i == tokens.size())
                 ? mid
                 : attach(mid, std::vector<int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(i), tokens.end()));
  }

  // The payloads directly below target were directly below target's payload ancestor until now.
  size_t below = count_payload_frontier(target);
  Node* above = const_cast<Node*>(payload_ancestor(target));
  above->payload_children = above->payload_children + 1 - below;
  target->payload = id;
  target->refcount = 0;
  target->payload_children = below;
  index_.emplace(id, target);
  return InsertResult{id, true};
}

CacheTrie::Match CacheTrie::match(std::span<const int32_t> tokens) const {
  Match m;
  const Node* n = root_.get();
  size_t i = 0, last_end = 0;
  while (i < tokens.size()) {
    const Child* c = find_child(n, tokens[i]);
    if (!c) break;
    const Node* child = c->node.get();
    size_t k = common_prefix(child->label, tokens.subspan(i));
    i += k;
    if (k < child->label.size()) break;  // diverged (or the query ended) inside the edge
    n = child;
    if (n->payload != kNoSegment) {
      m.path.push_back(Step{n->payload, last_end, i});
      last_end = i;
    }
  }
  m.matched = i;
  if (!m.path.empty()) {
    m.length = m.path.back().end;
    m.segment = m.path.back().segment;
  }
  return m;
}

Status CacheTrie::acquire(SegmentId id) {
  auto it = index_.find(id);
  if (it == index_.end()) return Status::Error("cache trie: acquire of unknown " + seg_name(id));
  ++it->second->refcount;
  return Status::Ok();
}

Status CacheTrie::release(SegmentId id) {
  auto it = index_.find(id);
  if (it == index_.end()) return Status::Error("cache trie: release of unknown " + seg_name(id));
  if (it->second->refcount == 0)
    return Status::Error("cache trie: release of " + seg_name(id) + " which is not acquired");
  --it->second->refcount;
  return Status::Ok();
}

void CacheTrie::remove_leaf(Node* n) {
  Node* parent = n->parent;
  auto it = std::lower_bound(parent->children.begin(), parent->children.end(), n->label[0],
                             [](const Child& c, int32_t t) { return c.first < t; });
  --nodes_;
  edge_tokens_ -= n->label.size();
  parent->children.erase(it);  // destroys n
}

// n (not the root, no payload, exactly one child) is folded into its child: the child's label gets
// n's label in front and takes n's place under n's parent. The child keeps its address, so the index
// stays valid.
void CacheTrie::merge_into_child(Node* n) {
  std::unique_ptr<Node> child = std::move(n->children[0].node);
  child->label.insert(child->label.begin(), n->label.begin(), n->label.end());
  child->label.shrink_to_fit();
  child->parent = n->parent;
  Child* slot = find_child(n->parent, n->label[0]);
  --nodes_;
  slot->node = std::move(child);  // destroys n; slot->first is still the label's first token
}

Status CacheTrie::evict(SegmentId id) {
  auto it = index_.find(id);
  if (it == index_.end()) return Status::Error("cache trie: evict of unknown " + seg_name(id));
  Node* n = it->second;
  if (n->refcount > 0)
    return Status::Error("cache trie: " + seg_name(id) + " is in use (refcount " + std::to_string(n->refcount) +
                         ")");
  if (n->payload_children > 0)
    return Status::Error("cache trie: " + seg_name(id) + " has " + std::to_string(n->payload_children) +
                         " dependent segment(s) computed on top of it");
  Node* above = const_cast<Node*>(payload_ancestor(n));
  --above->payload_children;
  n->payload = kNoSegment;
  index_.erase(it);
  // With no payload below, n has no children (every leaf carries a payload); the general cases are
  // handled anyway.
  if (n->children.empty()) {
    Node* parent = n->parent;
    remove_leaf(n);
    if (parent != root_.get() && parent->payload == kNoSegment && parent->children.size() == 1)
      merge_into_child(parent);
  } else if (n->children.size() == 1) {
    merge_into_child(n);
  }
  return Status::Ok();
}

Result<size_t> CacheTrie::fan_out(SegmentId id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return Status::Error("cache trie: fan_out of unknown " + seg_name(id));
  return it->second->payload_children;
}

size_t CacheTrie::root_fan_out() const { return root_->payload_children; }

CacheTrie::PayloadInfo CacheTrie::make_info(const Node* n, size_t depth) const {
  PayloadInfo p;
  const Node* above = payload_ancestor(n);
  p.segment = n->payload;
  p.parent = above->payload;
  p.begin = above->end;
  p.end = n->end;
  p.depth = depth;
  p.refcount = n->refcount;
  p.fan_out = n->payload_children;
  p.children = n->children.size();
  return p;
}

Result<CacheTrie::PayloadInfo> CacheTrie::info(SegmentId id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return Status::Error("cache trie: info of unknown " + seg_name(id));
  size_t depth = 0;
  for (const Node* a = payload_ancestor(it->second); a->parent != nullptr; a = payload_ancestor(a)) ++depth;
  return make_info(it->second, depth);
}

Result<std::vector<int32_t>> CacheTrie::sequence(SegmentId id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return Status::Error("cache trie: sequence of unknown " + seg_name(id));
  std::vector<int32_t> out(it->second->end);
  size_t pos = out.size();
  for (const Node* n = it->second; n->parent != nullptr; n = n->parent) {
    pos -= n->label.size();
    std::copy(n->label.begin(), n->label.end(), out.begin() + static_cast<std::ptrdiff_t>(pos));
  }
  return out;
}

CacheTrie::Stats CacheTrie::stats() const {
  Stats s;
  s.nodes = nodes_;
  s.payloads = index_.size();
  s.edge_tokens = edge_tokens_;
  // Per node: the node, its slot in the parent, and ~16 bytes of allocator overhead for each of its
  // (up to three) allocations; per payload: an index entry (key, value, next pointer, overhead) and a
  // bucket. Slack capacity in children vectors is not counted.
  constexpr size_t kMallocOverhead = 16;
  s.bytes = sizeof(*this) + sizeof(Node) + (nodes_) * (sizeof(Node) + sizeof(Child) + 3 * kMallocOverhead) +
            edge_tokens_ * sizeof(int32_t) +
            index_.size() * (sizeof(SegmentId) + sizeof(Node*) + sizeof(void*) + kMallocOverhead) +
            index_.bucket_count() * sizeof(void*);
  return s;
}

void CacheTrie::for_each(const std::function<void(const PayloadInfo&)>& fn) const {
  struct Frame {
    const Node* node;
    size_t depth;  // payload ancestors of node's payload (if it has one)
    SegmentId parent;
    size_t begin;
  };
  std::vector<Frame> stack;
  for (auto it = root_->children.rbegin(); it != root_->children.rend(); ++it)
    stack.push_back(Frame{it->node.get(), 0, kNoSegment, 0});
  while (!stack.empty()) {
    Frame f = stack.back();
    stack.pop_back();
    const Node* n = f.node;
    size_t depth = f.depth;
    SegmentId parent = f.parent;
    size_t begin = f.begin;
    if (n->payload != kNoSegment) {
      PayloadInfo p;
      p.segment = n->payload;
      p.parent = f.parent;
      p.begin = f.begin;
      p.end = n->end;
      p.depth = f.depth;
      p.refcount = n->refcount;
      p.fan_out = n->payload_children;
      p.children = n->children.size();
      fn(p);
      depth = f.depth + 1;
      parent = n->payload;
      begin = n->end;
    }
    for (auto it = n->children.rbegin(); it != n->children.rend(); ++it)
      stack.push_back(Frame{it->node.get(), depth, parent, begin});
  }
}

Status CacheTrie::check_invariants() const {
  auto fail = [](const std::string& what) { return Status::Error("cache trie invariant: " + what); };
  const Node* root = root_.get();
  if (!root) return fail("no root");
  if (!root->label.empty() || root->payload != kNoSegment || root->parent != nullptr || root->end != 0 ||
      root->refcount != 0)
    return fail("root must be empty, payload-less, parentless");
  if (root->payload_children != count_payload_frontier(root)) return fail("root payload fan-out count");

  size_t nodes = 0, tokens = 0, payloads = 0;
  std::vector<const Node*> stack{root};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    bool first_child = true;
    int32_t prev = 0;
    for (const Child& c : n->children) {
      const Node* m = c.node.get();
      if (!m) return fail("null child");
      if (m->label.empty()) return fail("empty label below the root");
      if (c.first != m->label[0]) return fail("child key differs from its label's first token");
      if (!first_child && c.first <= prev) return fail("children not sorted by distinct first tokens");
      first_child = false;
      prev = c.first;
      if (m->parent != n) return fail("wrong parent pointer");
      if (m->end != n->end + m->label.size()) return fail("wrong end offset");
      for (int32_t t : m->label)
        if (t < 0) return fail("negative token in a label");
      ++nodes;
      tokens += m->label.size();
      if (m->payload == kNoSegment) {
        if (m->children.empty()) return fail("payload-less leaf");
        if (m->children.size() == 1) return fail("payload-less single-child node");
        if (m->refcount != 0 || m->payload_children != 0) return fail("counts on a payload-less node");
      } else {
        ++payloads;
        auto it = index_.find(m->payload);
        if (it == index_.end() || it->second != m) return fail("index does not point at the payload's node");
        if (m->payload_children != count_payload_frontier(m)) return fail("payload fan-out count");
      }
      stack.push_back(m);
    }
  }
  if (payloads != index_.size()) return fail("index holds payloads that are not in the tree");
  if (nodes != nodes_) return fail("node count");
  if (tokens != edge_tokens_) return fail("edge token count");
  return Status::Ok();
}

}  // namespace towers
