#include "step_program.hpp"

#include <algorithm>
#include <climits>
#include <string>
#include <unordered_map>

namespace harness {

namespace {

void add_into(float* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

int64_t chunk_begin(int64_t n, int64_t p, int64_t k) {
  int64_t base = n / p, extra = n % p;
  return k * base + (k < extra ? k : extra);
}

// The tree allreduce's tree (tree_allreduce in step program.hpp), which harness/sim/
// step_programs.py builds alike: every member's parent (-1: the root, member 0) and
// children in order, and the colour of every member's edge to its parent (a round lists a
// member's messages in colour order; the simulator stores a round as one step per colour).
struct TreeShape {
  std::vector<int> parent;
  std::vector<std::vector<int>> children;  // chain successor first, then tree children in heap order
  std::vector<int> colour;                 // -1: the root
  int colours = 0;
};

TreeShape tree_shape(int p, const std::vector<int>& member_nodes) {
  TreeShape t;
  t.parent.assign(static_cast<size_t>(p), -1);
  t.children.assign(static_cast<size_t>(p), {});
  t.colour.assign(static_cast<size_t>(p), -1);
  std::unordered_map<int, int> index;  // node id -> its place in order of first appearance
  std::vector<std::vector<int>> local;
  for (int m = 0; m < p; ++m) {
    auto it = index.emplace(member_nodes.empty() ? m : member_nodes[m], static_cast<int>(local.size())).first;
    if (it->second == static_cast<int>(local.size())) local.emplace_back();
    local[static_cast<size_t>(it->second)].push_back(m);
  }
  for (const auto& ms : local)  // chains first: a head's chain successor is its first child
    for (size_t i = 1; i < ms.size(); ++i) {
      t.parent[ms[i]] = ms[i - 1];
      t.children[ms[i - 1]].push_back(ms[i]);
    }
  for (size_t j = 1; j < local.size(); ++j) {
    const int head = local[j][0], up = local[(j - 1) / 2][0];
    t.parent[head] = up;
    t.children[up].push_back(head);
  }
  // Greedy edge colouring in BFS order from the root: each edge to a child takes the smallest
  // colour that no coloured edge at the parent has (the child has none yet), which on a tree
  // uses as many colours as the largest degree.
  std::vector<int> queue{0};
  for (size_t q = 0; q < queue.size(); ++q) {
    const int u = queue[q];
    std::vector<int> used;
    if (t.colour[u] >= 0) used.push_back(t.colour[u]);
    for (int v : t.children[u]) {
      int c = 0;
      while (std::find(used.begin(), used.end(), c) != used.end()) ++c;
      t.colour[v] = c;
      used.push_back(c);
      t.colours = std::max(t.colours, c + 1);
      queue.push_back(v);
    }
  }
  return t;
}

}  // namespace

StepProgram rd_allreduce(int p, int me, void* buf, int64_t n, int esz) {
  StepProgram s;
  s.result = buf;
  s.count = n;
  if (p == 1) return s;
  void* tmp = alloc_scratch(s, n * esz);
  int pow2 = 1;
  while (pow2 * 2 <= p) pow2 *= 2;
  int rem = p - pow2;
  int vme;  // my index among the pow2 participants, -1 if folded away
  if (me < 2 * rem) {
    if (me % 2 == 0) {
      s.steps.push_back({{{me + 1, buf, n}}, {}, {}});
      vme = -1;
    } else {
      s.steps.push_back({{}, {{me - 1, tmp, n}}, {{buf, tmp, n}}});
      vme = me / 2;
    }
  } else {
    vme = me - rem;
  }
  auto real = [rem](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  if (vme >= 0) {
    for (int mask = 1; mask < pow2; mask <<= 1) {
      int partner = real(vme ^ mask);
      s.steps.push_back({{{partner, buf, n}}, {{partner, tmp, n}}, {{buf, tmp, n}}});
    }
  }
  if (me < 2 * rem) {
    if (me % 2 == 0)
      s.steps.push_back({{}, {{me + 1, buf, n}}, {}});
    else
      s.steps.push_back({{{me - 1, buf, n}}, {}, {}});
  }
  return s;
}

StepProgram ring_allreduce(int p, int me, void* buf, int64_t n, int esz) {
  StepProgram s;
  s.result = buf;
  s.count = n;
  if (p == 1) return s;
  int64_t max_chunk = n / p + 1;
  void* tmp = alloc_scratch(s, max_chunk * esz);
  int right = (me + 1) % p, left = (me + p - 1) % p;
  auto chunk = [&](int k) {
    k = ((k % p) + p) % p;
    int64_t b = chunk_begin(n, p, k);
    return std::make_pair(static_cast<void*>(static_cast<char*>(buf) + b * esz), chunk_begin(n, p, k + 1) - b);
  };
  for (int st = 0; st < p - 1; ++st) {  // reduce-scatter
    auto snd = chunk(me - st);
    auto rcv = chunk(me - st - 1);
    s.steps.push_back({{{right, snd.first, snd.second}}, {{left, tmp, rcv.second}}, {{rcv.first, tmp, rcv.second}}});
  }
  for (int st = 0; st < p - 1; ++st) {  // allgather
    auto snd = chunk(me + 1 - st);
    auto rcv = chunk(me - st);
    s.steps.push_back({{{right, snd.first, snd.second}}, {{left, rcv.first, rcv.second}}, {}});
  }
  return s;
}

StepProgram binomial_bcast(int p, int me, int root, void* buf, int64_t n, int) {
  StepProgram s;
  s.count = n;
  if (p == 1) return s;
  int v = (me - root + p) % p;
  auto real = [&](int vr) { return (vr + root) % p; };
  int mask = 1;
  while (mask < p) {
    if (v & mask) {
      s.steps.push_back({{}, {{real(v - mask), buf, n}}, {}});
      break;
    }
    mask <<= 1;
  }
  Step sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < p) sends.sends.push_back({real(v + mask), buf, n});
  if (!sends.sends.empty()) s.steps.push_back(std::move(sends));
  return s;
}

StepProgram dissemination_barrier(int p, int me) {
  StepProgram s;
  for (int d = 1; d < p; d <<= 1)
    s.steps.push_back({{{(me + d) % p, nullptr, 0}}, {{(me - d % p + p) % p, nullptr, 0}}, {}});
  return s;
}

StepProgram hierarchical_allreduce(int p, int me, const std::vector<int>& member_nodes, void* buf, int64_t n,
                                int64_t ring_threshold_bytes, int esz) {
  if (static_cast<int>(member_nodes.size()) != p)
    throw CommError("hierarchical allreduce: " + std::to_string(member_nodes.size()) + " node ids for " +
                    std::to_string(p) + " members");
  StepProgram s;
  s.result = buf;
  s.count = n;
  if (p == 1) return s;
  std::vector<int> local, leaders, leader_nodes;  // my node's members; each node's first member
  for (int m = 0; m < p; ++m) {
    if (member_nodes[m] == member_nodes[me]) local.push_back(m);
    if (std::find(leader_nodes.begin(), leader_nodes.end(), member_nodes[m]) == leader_nodes.end()) {
      leader_nodes.push_back(member_nodes[m]);
      leaders.push_back(m);
    }
  }
  const int q = static_cast<int>(local.size());
  const int li = static_cast<int>(std::find(local.begin(), local.end(), me) - local.begin());
  void* tmp = q > 1 ? alloc_scratch(s, n * esz) : nullptr;
  for (int mask = 1; mask < q; mask <<= 1) {  // binomial reduce to local[0]
    if (li & mask) {
      s.steps.push_back({{{local[li - mask], buf, n}}, {}, {}});
      break;
    }
    if (li + mask < q) s.steps.push_back({{}, {{local[li + mask], tmp, n}}, {{buf, tmp, n}}});
  }
  const int L = static_cast<int>(leaders.size());
  if (li == 0 && L > 1) {
    const int lid = static_cast<int>(std::find(leaders.begin(), leaders.end(), me) - leaders.begin());
    StepProgram among = allreduce_program(L, lid, buf, n, ring_threshold_bytes, {}, esz);
    for (Step& st : among.steps) {
      for (Xfer& x : st.sends) x.peer = leaders[x.peer];
      for (Xfer& x : st.recvs) x.peer = leaders[x.peer];
      s.steps.push_back(std::move(st));
    }
    if (among.scratch) s.more_scratch.push_back(std::move(among.scratch));
    for (auto& m : among.more_scratch) s.more_scratch.push_back(std::move(m));
  }
  int top = 1;
  while (top * 2 < q) top *= 2;
  for (int mask = top; mask >= 1 && q > 1; mask >>= 1) {  // binomial broadcast from local[0]
    if (li % (2 * mask) == 0 && li + mask < q)
      s.steps.push_back({{{local[li + mask], buf, n}}, {}, {}});
    else if (li % (2 * mask) == mask)
      s.steps.push_back({{}, {{local[li - mask], buf, n}}, {}});
  }
  return s;
}

StepProgram tree_allreduce(int p, int me, const std::vector<int>& member_nodes, void* buf, int64_t n,
                        int64_t chunk_bytes, int esz) {
  if (!member_nodes.empty() && static_cast<int>(member_nodes.size()) != p)
    throw CommError("tree allreduce: " + std::to_string(member_nodes.size()) + " node ids for " + std::to_string(p) +
                    " members");
  if (chunk_bytes <= 0) throw CommError("tree allreduce: chunks of " + std::to_string(chunk_bytes) + " bytes");
  StepProgram s;
  s.result = buf;
  s.count = n;
  if (p == 1) return s;
  const int64_t K = std::max<int64_t>(1, std::min<int64_t>(n, (n * esz + chunk_bytes - 1) / chunk_bytes));
  const TreeShape t = tree_shape(p, member_nodes);
  // One receive slot per child of mine (the largest chunk each): a round may bring a chunk from
  // every child at once.
  const int64_t slot = (n / K + 1) * esz;
  char* tmp = alloc_scratch(s, slot * static_cast<int64_t>(std::max<size_t>(1, t.children[me].size())));
  auto chunk = [&](int64_t c) {
    const int64_t b = chunk_begin(n, K, c);
    return std::make_pair(static_cast<void*>(static_cast<char*>(buf) + b * esz), chunk_begin(n, K, c + 1) - b);
  };
  // Every member derives the whole pipeline from counters: up[m], the chunks m has sent to its
  // parent; down[m], the final chunks it has received from it. Member m has reduced chunk c once
  // its last child sent c (a later child sends c only after the earlier ones did), a leaf has
  // all; the root's reduced chunks are final.
  std::vector<int64_t> up(static_cast<size_t>(p), 0), down(static_cast<size_t>(p), 0);
  std::vector<int> last_child(static_cast<size_t>(p), -1), prev_sibling(static_cast<size_t>(p), -1);
  for (int m = 0; m < p; ++m) {
    const auto& ch = t.children[m];
    if (!ch.empty()) last_child[m] = ch.back();
    for (size_t i = 1; i < ch.size(); ++i) prev_sibling[ch[i]] = ch[i - 1];
  }
  // Every edge (by its child), in colour order (then member order): a member has at most one
  // edge of a colour, so its sends and receives of a round come in colour order, as the
  // simulator's steps of a round (harness/sim/step_programs.py) list them.
  std::vector<int> edges;
  for (int m = 1; m < p; ++m) edges.push_back(m);
  std::stable_sort(edges.begin(), edges.end(), [&](int x, int y) { return t.colour[x] < t.colour[y]; });
  auto reduced = [&](int m) { return last_child[m] < 0 ? K : up[last_child[m]]; };
  int unfinished = p - 1;  // members short of a final chunk (the root has all once they do)
  std::vector<char> go_up(edges.size()), go_down(edges.size());
  std::vector<int64_t> from_child(t.children[me].size());  // the chunk each child of mine sends up (-1: none)
  while (unfinished > 0) {
    // One round: every edge at once, decided on the round's starting counters.
    Step st;
    bool any = false;
    std::fill(from_child.begin(), from_child.end(), -1);
    for (size_t i = 0; i < edges.size(); ++i) {
      const int v = edges[i], a = t.parent[v], before = prev_sibling[v];
      go_up[i] = up[v] < reduced(v) && (before < 0 || up[v] < up[before]);
      go_down[i] = down[v] < (a == 0 ? reduced(a) : down[a]);
      any = any || go_up[i] || go_down[i];
      if (v == me) {  // my edge to my parent
        if (go_up[i]) {
          auto c = chunk(up[v]);
          st.sends.push_back({a, c.first, c.second});
        }
        if (go_down[i]) {
          auto c = chunk(down[v]);
          st.recvs.push_back({a, c.first, c.second});
        }
      } else if (a == me) {  // my edge to child v
        const auto& ch = t.children[me];
        const size_t j = static_cast<size_t>(std::find(ch.begin(), ch.end(), v) - ch.begin());
        if (go_up[i]) {
          auto c = chunk(up[v]);
          st.recvs.push_back({v, tmp + static_cast<int64_t>(j) * slot, c.second});
          from_child[j] = up[v];
        }
        if (go_down[i]) {
          auto c = chunk(down[v]);
          st.sends.push_back({v, c.first, c.second});
        }
      }
    }
    if (!any) throw CommError("tree allreduce: the pipeline stalled (a bug)");
    // The round's chunks from my children (distinct chunks: a later child lags the earlier
    // ones) are added once all its messages are done, in child order.
    for (size_t j = 0; j < from_child.size(); ++j)
      if (from_child[j] >= 0) {
        auto c = chunk(from_child[j]);
        st.reduces.push_back({c.first, tmp + static_cast<int64_t>(j) * slot, c.second});
      }
    if (!st.sends.empty() || !st.recvs.empty()) s.steps.push_back(std::move(st));
    for (size_t i = 0; i < edges.size(); ++i) {
      const int v = edges[i];
      if (go_up[i]) ++up[v];
      if (go_down[i] && ++down[v] == K) --unfinished;
    }
  }
  return s;
}

AllreduceAlgorithm allreduce_algorithm_named(const std::string& name) {
  std::string known;
  for (const NamedAllreduceAlgorithm& a : kAllreduceAlgorithms) {
    if (name == a.name) return a.algorithm;
    known += (known.empty() ? "" : ", ") + std::string(a.name);
  }
  throw CommError("unknown allreduce algorithm '" + name + "' (one of " + known + ")");
}

StepProgram allreduce_program(int p, int me, void* buf, int64_t n, int64_t ring_threshold_bytes,
                            const AllreducePlan& plan, int esz) {
  const bool ring_fits = p > 2 && n >= p;
  switch (plan.algorithm) {
    case AllreduceAlgorithm::kHierarchical:
      return hierarchical_allreduce(p, me, plan.member_nodes, buf, n, ring_threshold_bytes, esz);
    case AllreduceAlgorithm::kTree:
      return tree_allreduce(p, me, plan.member_nodes, buf, n, plan.tree_chunk_bytes, esz);
    case AllreduceAlgorithm::kReduceBroadcast:
      // A hierarchical allreduce on one node is exactly that: reduce to member 0, broadcast.
      return hierarchical_allreduce(p, me, std::vector<int>(static_cast<size_t>(p), 0), buf, n, ring_threshold_bytes,
                                    esz);
    case AllreduceAlgorithm::kRing:
      return ring_fits ? ring_allreduce(p, me, buf, n, esz) : rd_allreduce(p, me, buf, n, esz);
    case AllreduceAlgorithm::kRecursiveDoubling:
      return rd_allreduce(p, me, buf, n, esz);
    case AllreduceAlgorithm::kAuto:
      break;
  }
  if (ring_fits && n * static_cast<int64_t>(esz) >= ring_threshold_bytes) return ring_allreduce(p, me, buf, n, esz);
  return rd_allreduce(p, me, buf, n, esz);
}

StepExecutor::StepExecutor(SharedComm comm, std::vector<int> members, std::vector<int> world, int tag,
                           StepProgram program, bool synchronous_sends)
    : comm_(std::move(comm)),
      members_(std::move(members)),
      world_(std::move(world)),
      tag_(tag),
      sched_(std::move(program)),
      sync_sends_(synchronous_sends) {}

void StepExecutor::post(Engine& engine, int64_t* bytes_sent) {
  const Step& st = sched_.steps[cur_];
  recvs_.assign(st.recvs.size(), MPI_REQUEST_NULL);
  for (size_t k = 0; k < st.recvs.size(); ++k) {
    const Xfer& x = st.recvs[k];
    check_mpi(MPI_Irecv(x.buf, static_cast<int>(x.count), sched_.elem.mpi, members_[x.peer], x.tag < 0 ? tag_ : x.tag,
                        comm_->get(), &recvs_[k]),
              "MPI_Irecv");
  }
  sends_.clear();
  for (const Xfer& x : st.sends)
    sends_.push_back(engine.isend(comm_->get(), members_[x.peer], world_[x.peer], x.buf, static_cast<int>(x.count),
                                  sched_.elem.mpi, x.tag < 0 ? tag_ : x.tag, sync_sends_, bytes_sent));
  posted_ = true;
}

bool StepExecutor::complete(Engine& engine) {
  const Step& st = sched_.steps[cur_];
  if (!recvs_.empty()) {
    int flag = 0;
    std::vector<MPI_Status> statuses(recvs_.size());
    int rc = MPI_Testall(static_cast<int>(recvs_.size()), recvs_.data(), &flag, statuses.data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (size_t k = 0; k < statuses.size(); ++k)
        if (statuses[k].MPI_ERROR != MPI_SUCCESS && statuses[k].MPI_ERROR != MPI_ERR_PENDING)
          throw failed_receive(statuses[k].MPI_ERROR, st.recvs[k].peer, world_[st.recvs[k].peer], st.recvs[k].count,
                               sched_.elem.name);
    }
    check_mpi(rc, "MPI_Testall");
    if (!flag) return false;
    for (size_t k = 0; k < statuses.size(); ++k) {
      int got = 0;
      MPI_Get_count(&statuses[k], sched_.elem.mpi, &got);
      if (got != st.recvs[k].count)
        throw CommError("size mismatch: expected " + std::to_string(st.recvs[k].count) + " " + elem_unit() +
                        " from member " + std::to_string(st.recvs[k].peer) + " (rank " +
                        std::to_string(world_[st.recvs[k].peer]) + "), got " + std::to_string(got) +
                        " (buffer lengths differ across ranks)");
    }
    recvs_.clear();
  }
  for (auto& s : sends_)
    if (!engine.test_send(*s)) return false;
  sends_.clear();
  return true;
}

bool StepExecutor::progress(Engine& engine, int64_t* bytes_sent) {
  bool any = false;
  while (cur_ < sched_.steps.size()) {
    if (!posted_) {
      post(engine, bytes_sent);
      any = true;
    }
    if (!complete(engine)) return any;
    for (const Reduce& r : sched_.steps[cur_].reduces) {
      if (sched_.reduce)
        sched_.reduce(r.dst, r.src, r.count);
      else
        add_into(static_cast<float*>(r.dst), static_cast<const float*>(r.src), r.count);
    }
    ++cur_;
    posted_ = false;
    any = true;
  }
  if (!finalized_) {
    if (sched_.divide_by > 1) {
      if (sched_.divide) {
        sched_.divide(sched_.result, sched_.count, sched_.divide_by);
      } else {
        float* r = static_cast<float*>(sched_.result);
        float d = static_cast<float>(sched_.divide_by);
        for (int64_t i = 0; i < sched_.count; ++i) r[i] /= d;
      }
    }
    if (sched_.on_done) sched_.on_done();
    finalized_ = true;
    any = true;
  }
  return any;
}

void StepExecutor::abort(Engine& engine, const std::shared_ptr<OpState>& lender, std::shared_ptr<void> op_memory) {
  // The step's requests may use the scratch space (and the caller's buffers): the scratch goes
  // with them, kept alive by the quarantine until MPI is done with every one.
  struct Memory {
    std::unique_ptr<float[]> scratch;
    std::vector<std::unique_ptr<float[]>> more_scratch;
    std::shared_ptr<void> op_memory;
  };
  std::shared_ptr<void> scratch =
      std::make_shared<Memory>(Memory{std::move(sched_.scratch), std::move(sched_.more_scratch), std::move(op_memory)});
  for (auto& r : recvs_) engine.abandon_recv(r, scratch, lender);
  recvs_.clear();
  for (auto& s : sends_) engine.abandon_send(*s, scratch, lender);
  sends_.clear();
}

}  // namespace harness
