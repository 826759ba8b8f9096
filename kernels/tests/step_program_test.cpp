// Unit tests of the collectives' step programs (kernels/step_program.hpp): every member's program is
// built and all of them are run together by the simulation in step_program_sim.hpp, for many member
// counts (odd, even, powers of two and not) and lengths (empty, shorter than the group, long).
// Properties: every send meets a receive of the same size in the peer's program and nothing is
// left unmatched (else a hang or a size-mismatch error on real ranks), peers in range, no step
// that receives into memory it also sends, no deadlock, the right data on every member (exact
// sums of integer-valued floats; bitwise equal across members where the header promises it), and
// per algorithm how the buffer is cut into chunks and which links carry what.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "check.hpp"
#include "step_program_sim.hpp"

using harness::AllreduceAlgorithm;
using harness::AllreducePlan;
using harness::CommError;
using harness::StepProgram;
using harness_test::SimMember;
using harness_test::SimResult;
using harness_test::Simulation;

namespace {

const std::vector<int> kSizes = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16};
const std::vector<int64_t> kLengths = {0, 1, 2, 7, 37, 1000};

template <class T>
void add_typed(void* dst, const void* src, int64_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] + s[i]);
}

// Member m's buffer builds its program; data(m, i) its element i.
template <class T>
struct Run {
  std::vector<std::vector<T>> data;
  std::vector<SimMember> members;
  SimResult result;
};

template <class T>
Run<T> simulate(int p, int64_t n, const std::function<StepProgram(int, void*)>& build,
                const std::function<T(int, int64_t)>& data) {
  Run<T> r;
  r.data.resize(static_cast<size_t>(p));
  r.members.resize(static_cast<size_t>(p));
  for (int m = 0; m < p; ++m) {
    auto& d = r.data[static_cast<size_t>(m)];
    d.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) d[static_cast<size_t>(i)] = data(m, i);
    r.members[m].buf = reinterpret_cast<char*>(d.data());
    r.members[m].sched = build(m, d.data());
  }
  Simulation sim(r.members, n, static_cast<int>(sizeof(T)), &add_typed<T>);
  r.result = sim.run();
  return r;
}

// Small integers: every order of float additions gives the exact sum.
float int_valued(int m, int64_t i) { return static_cast<float>((m * 7 + i * 3) % 11) - 5.0f; }

// Values whose float sums depend on the order of the additions (a cheap hash: splitmix64).
float random_valued(int m, int64_t i) {
  uint64_t z = static_cast<uint64_t>(m) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

// Checks that every member ends with the exact sum of int_valued and heard from every member.
template <class T>
void expect_exact_sums(const Run<T>& r, int p, int64_t n, const std::string& what) {
  CHECK_MSG(r.result.ok, what + ": " + r.result.error);
  if (!r.result.ok) return;
  for (int m = 0; m < p; ++m) {
    CHECK_MSG(static_cast<int>(r.members[m].heard.size()) == p, what + ": member " + std::to_string(m) +
                                                                   " never (transitively) heard from every member");
    for (int64_t i = 0; i < n; ++i) {
      double want = 0;
      for (int k = 0; k < p; ++k) want += static_cast<double>(static_cast<T>(int_valued(k, i)));
      if (static_cast<double>(r.data[m][static_cast<size_t>(i)]) != want) {
        CHECK_MSG(false, what + ": member " + std::to_string(m) + " element " + std::to_string(i) + " is " +
                             std::to_string(static_cast<double>(r.data[m][static_cast<size_t>(i)])) + ", want " +
                             std::to_string(want));
        return;
      }
    }
  }
}

template <class T>
bool all_members_equal(const Run<T>& r) {
  for (const auto& d : r.data)
    if (!d.empty() && std::memcmp(d.data(), r.data[0].data(), d.size() * sizeof(T)) != 0) return false;
  return true;
}

std::string name(const char* algo, int p, int64_t n) {
  return std::string(algo) + " p=" + std::to_string(p) + " n=" + std::to_string(n);
}

// Node layouts of p members: contiguous blocks, interleaved, every member alone, all on one.
std::vector<std::vector<int>> layouts(int p) {
  std::vector<std::vector<int>> out;
  std::vector<int> blocks, interleaved, alone, one(static_cast<size_t>(p), 0);
  for (int m = 0; m < p; ++m) {
    blocks.push_back(m / 2);
    interleaved.push_back((m * 5 + 1) % 3 == 0 ? 7 : (m % 2 ? 3 : 1));  // node ids need not be 0..k
    alone.push_back(m);
  }
  out = {blocks, interleaved, alone, one};
  return out;
}

int ceil_log2(int p) {
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
}

size_t max_steps(const std::vector<SimMember>& ms) {
  size_t s = 0;
  for (const auto& m : ms) s = std::max(s, m.sched.steps.size());
  return s;
}

}  // namespace

TEST(recursive_doubling_sums_and_exchanges_whole_buffers) {
  for (int p : kSizes)
    for (int64_t n : kLengths) {
      auto r = simulate<float>(p, n, [&](int m, void* b) { return harness::rd_allreduce(p, m, b, n); }, int_valued);
      expect_exact_sums(r, p, n, name("rd", p, n));
      for (const auto& m : r.members)
        for (const auto& st : m.sched.steps) {
          for (const auto& x : st.sends) CHECK_EQ(x.count, n);
          for (const auto& x : st.recvs) CHECK_EQ(x.count, n);
        }
      // log2 of the largest power of two, plus the fold in and out when p is not one.
      const int pow2_steps = ceil_log2(p + 1) - 1;
      CHECK_EQ(max_steps(r.members), static_cast<size_t>(pow2_steps + ((p & (p - 1)) ? 2 : 0)));
    }
}

TEST(ring_sums_with_chunks_that_cover_the_buffer) {
  for (int p : kSizes)
    for (int64_t n : kLengths) {
      if (n < p) continue;  // allreduce_program runs a ring only with a float per member
      auto r = simulate<float>(p, n, [&](int m, void* b) { return harness::ring_allreduce(p, m, b, n); },
                               int_valued);
      expect_exact_sums(r, p, n, name("ring", p, n));
      if (p == 1) continue;
      for (const auto& m : r.members) {
        CHECK_EQ(m.sched.steps.size(), static_cast<size_t>(2 * (p - 1)));
        for (const auto& st : m.sched.steps)
          for (const auto& x : st.sends) CHECK(x.count >= n / p && x.count <= n / p + 1);
      }
      // Allgather: a member receives every element once, except those of the one chunk it
      // reduced last (it has them); reduce-scatter: each element is reduced p - 1 times in all,
      // at most once per member.
      std::vector<int> reduced(static_cast<size_t>(n), 0);
      for (int m = 0; m < p; ++m) {
        const auto& got = r.members[m].recv_into_buf;
        int64_t zero = 0, first_zero = -1, last_zero = -1;
        for (int64_t i = 0; i < n; ++i) {
          CHECK(got[i] <= 1);
          if (got[i] == 0) {
            ++zero;
            if (first_zero < 0) first_zero = i;
            last_zero = i;
          }
          CHECK(r.members[m].reduced_into_buf[i] <= 1);
          reduced[i] += r.members[m].reduced_into_buf[i];
        }
        CHECK(zero == n / p || zero == n / p + 1);
        CHECK_EQ(last_zero - first_zero + 1, zero);  // one contiguous chunk
      }
      for (int64_t i = 0; i < n; ++i) CHECK_EQ(reduced[i], p - 1);
      auto rb = simulate<float>(p, n, [&](int m, void* b) { return harness::ring_allreduce(p, m, b, n); },
                                random_valued);
      CHECK_MSG(rb.result.ok && all_members_equal(rb), name("ring bitwise", p, n));
    }
}

TEST(binomial_broadcast_from_every_root) {
  for (int p : kSizes)
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}})
      for (int root = 0; root < p; ++root) {
        auto r = simulate<float>(
            p, n, [&](int m, void* b) { return harness::binomial_bcast(p, m, root, b, n); },
            [&](int m, int64_t i) { return m == root ? int_valued(m, i) : -99.0f; });
        const std::string what = name("bcast", p, n) + " root=" + std::to_string(root);
        CHECK_MSG(r.result.ok, what + ": " + r.result.error);
        for (int m = 0; m < p; ++m) {
          CHECK_MSG(r.data[m] == r.data[root], what);
          CHECK(r.members[m].sched.steps.size() <= 2);  // one receive, then one step of sends
          for (int64_t i = 0; i < n; ++i) CHECK_EQ(r.members[m].recv_into_buf[i], m == root ? 0 : 1);
          CHECK(static_cast<int>(r.members[m].heard.count(root)) == 1);
        }
        // A binomial tree: the root's data reaches everyone in ceil(log2 p) rounds of sends.
        size_t root_sends = 0;
        for (const auto& st : r.members[root].sched.steps) root_sends += st.sends.size();
        CHECK_EQ(root_sends, static_cast<size_t>(ceil_log2(p)));
      }
}

TEST(dissemination_barrier_reaches_everyone) {
  for (int p = 1; p <= 17; ++p) {
    auto r = simulate<float>(p, 0, [&](int m, void*) { return harness::dissemination_barrier(p, m); }, int_valued);
    CHECK_MSG(r.result.ok, name("barrier", p, 0) + ": " + r.result.error);
    for (int m = 0; m < p; ++m) {
      CHECK_EQ(r.members[m].sched.steps.size(), static_cast<size_t>(ceil_log2(p)));
      CHECK_MSG(static_cast<int>(r.members[m].heard.size()) == p,
                name("barrier", p, 0) + ": member " + std::to_string(m) + " left before hearing from all");
    }
  }
}

TEST(hierarchical_sums_and_only_leaders_cross_nodes) {
  for (int p : kSizes)
    for (const auto& nodes : layouts(p))
      for (int64_t threshold : {int64_t{0}, int64_t{1} << 30})  // ring or recursive doubling among leaders
        for (int64_t n : kLengths) {
          auto r = simulate<float>(
              p, n, [&](int m, void* b) { return harness::hierarchical_allreduce(p, m, nodes, b, n, threshold); },
              int_valued);
          const std::string what = name("hierarchical", p, n) + " threshold=" + std::to_string(threshold);
          expect_exact_sums(r, p, n, what);
          auto leader = [&](int m) {
            for (int k = 0; k < m; ++k)
              if (nodes[k] == nodes[m]) return false;
            return true;
          };
          for (int m = 0; m < p; ++m)
            for (const auto& st : r.members[m].sched.steps)
              for (const auto* xs : {&st.sends, &st.recvs})
                for (const auto& x : *xs)
                  if (nodes[x.peer] != nodes[m])
                    CHECK_MSG(leader(m) && leader(x.peer), what + ": member " + std::to_string(m) +
                                                              " talks across nodes to " + std::to_string(x.peer));
          auto rb = simulate<float>(
              p, n, [&](int m, void* b) { return harness::hierarchical_allreduce(p, m, nodes, b, n, threshold); },
              random_valued);
          CHECK_MSG(rb.result.ok && all_members_equal(rb), what + " (bitwise equal)");
        }
}

// The tree's sum at the root, in the header's order: own value, then each child's subtree sum
// in child order (chain successor first, then tree children in heap order).
namespace {
struct Tree {
  std::vector<int> parent;
  std::vector<std::vector<int>> children;
};
Tree tree_of(int p, const std::vector<int>& nodes) {
  Tree t{std::vector<int>(static_cast<size_t>(p), -1), std::vector<std::vector<int>>(static_cast<size_t>(p))};
  std::vector<int> ids;
  std::vector<std::vector<int>> local;
  for (int m = 0; m < p; ++m) {
    const int id = nodes.empty() ? m : nodes[m];
    size_t j = std::find(ids.begin(), ids.end(), id) - ids.begin();
    if (j == ids.size()) {
      ids.push_back(id);
      local.emplace_back();
    }
    local[j].push_back(m);
  }
  for (const auto& ms : local)
    for (size_t i = 1; i < ms.size(); ++i) {
      t.parent[ms[i]] = ms[i - 1];
      t.children[ms[i - 1]].push_back(ms[i]);
    }
  for (size_t j = 1; j < local.size(); ++j) {
    t.parent[local[j][0]] = local[(j - 1) / 2][0];
    t.children[local[(j - 1) / 2][0]].push_back(local[j][0]);
  }
  return t;
}
float subtree_sum(const Tree& t, int m, int64_t i) {
  float acc = random_valued(m, i);
  for (int c : t.children[m]) acc += subtree_sum(t, c, i);
  return acc;
}
}  // namespace

TEST(tree_sums_in_child_order_and_carries_the_buffer_once_per_edge) {
  for (int p : kSizes) {
    auto all_layouts = layouts(p);
    all_layouts.push_back({});  // no topology: every member a node of its own
    for (const auto& nodes : all_layouts)
      for (int64_t chunk : {int64_t{4}, int64_t{12}, int64_t{64}, int64_t{1} << 20})
        for (int64_t n : kLengths) {
          if (n * 4 / chunk > 100) continue;  // pipelines of at most ~100 chunks keep the run short
          auto build = [&](int m, void* b) { return harness::tree_allreduce(p, m, nodes, b, n, chunk); };
          const std::string what = name("tree", p, n) + " chunk=" + std::to_string(chunk) +
                                   (nodes.empty() ? " no nodes" : "");
          auto r = simulate<float>(p, n, build, int_valued);
          expect_exact_sums(r, p, n, what);
          if (!r.result.ok) continue;
          const Tree t = tree_of(p, nodes);
          for (int m = 0; m < p; ++m) {
            std::map<int, int64_t> sent, received;
            for (const auto& st : r.members[m].sched.steps) {
              for (const auto& x : st.sends) sent[x.peer] += x.count;
              for (const auto& x : st.recvs) received[x.peer] += x.count;
            }
            // Only tree edges carry messages, and each carries the buffer once each way.
            for (const auto* dir : {&sent, &received})
              for (const auto& kv : *dir) {
                const bool edge = t.parent[m] == kv.first || t.parent[kv.first] == m;
                CHECK_MSG(edge, what + ": member " + std::to_string(m) + " talks to non-neighbour " +
                                    std::to_string(kv.first));
                CHECK_EQ(kv.second, n);
              }
            if (n > 0 && m > 0) CHECK(sent.count(t.parent[m]) == 1 && received.count(t.parent[m]) == 1);
          }
          auto rb = simulate<float>(p, n, build, random_valued);
          CHECK_MSG(rb.result.ok, what + ": " + rb.result.error);
          if (!rb.result.ok) continue;
          std::vector<float> want(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) want[i] = subtree_sum(t, 0, i);
          for (int m = 0; m < p; ++m)
            for (int64_t i = 0; i < n; ++i)
              if (rb.data[m][i] != want[i]) {
                CHECK_MSG(false, what + ": member " + std::to_string(m) + " element " + std::to_string(i) +
                                     " differs from own + children in child order");
                goto next;
              }
        next:;
        }
  }
}

TEST(other_element_sizes_use_byte_offsets) {
  // int16 and float64 elements: the builders cut chunks and scratch slots in elements of esz.
  for (int p : {3, 5, 8})
    for (int64_t n : {int64_t{7}, int64_t{37}}) {
      auto r8 = simulate<double>(
          p, n, [&](int m, void* b) { return harness::ring_allreduce(p, m, b, n, 8); },
          [](int m, int64_t i) { return static_cast<double>(int_valued(m, i)); });
      expect_exact_sums(r8, p, n, name("ring f64", p, n));
      auto t8 = simulate<double>(
          p, n, [&](int m, void* b) { return harness::tree_allreduce(p, m, {}, b, n, 16, 8); },
          [](int m, int64_t i) { return static_cast<double>(int_valued(m, i)); });
      expect_exact_sums(t8, p, n, name("tree f64", p, n));
      auto h2 = simulate<int16_t>(
          p, n, [&](int m, void* b) { return harness::hierarchical_allreduce(p, m, layouts(p)[1], b, n, 0, 2); },
          [](int m, int64_t i) { return static_cast<int16_t>(int_valued(m, i)); });
      expect_exact_sums(h2, p, n, name("hierarchical i16", p, n));
      auto d2 = simulate<int16_t>(
          p, n, [&](int m, void* b) { return harness::rd_allreduce(p, m, b, n, 2); },
          [](int m, int64_t i) { return static_cast<int16_t>(int_valued(m, i)); });
      expect_exact_sums(d2, p, n, name("rd i16", p, n));
    }
}

TEST(allreduce_program_picks_the_algorithm_it_documents) {
  auto shape = [](const StepProgram& s) {
    std::vector<std::vector<std::pair<int, int64_t>>> out;
    for (const auto& st : s.steps) {
      out.emplace_back();
      for (const auto& x : st.sends) out.back().push_back({x.peer, x.count});
      for (const auto& x : st.recvs) out.back().push_back({-1 - x.peer, x.count});
    }
    return out;
  };
  const int64_t thr = 256;  // bytes
  for (int p : kSizes)
    for (int64_t n : kLengths)
      for (int m = 0; m < p; ++m) {
        std::vector<float> b(static_cast<size_t>(n) + 1);
        const bool ring_fits = p > 2 && n >= p;
        auto got = [&](AllreducePlan plan) { return shape(harness::allreduce_program(p, m, b.data(), n, thr, plan)); };
        auto ring = shape(harness::ring_allreduce(p, m, b.data(), n));
        auto rd = shape(harness::rd_allreduce(p, m, b.data(), n));
        CHECK(got({}) == (ring_fits && n * 4 >= thr ? ring : rd));
        CHECK(got({AllreduceAlgorithm::kRing, {}, 0}) == (ring_fits ? ring : rd));
        CHECK(got({AllreduceAlgorithm::kRecursiveDoubling, {}, 0}) == rd);
        std::vector<int> one(static_cast<size_t>(p), 0);
        CHECK(got({AllreduceAlgorithm::kReduceBroadcast, {}, 0}) ==
              shape(harness::hierarchical_allreduce(p, m, one, b.data(), n, thr)));
        auto nodes = layouts(p)[1];
        CHECK(got({AllreduceAlgorithm::kHierarchical, nodes, 0}) ==
              shape(harness::hierarchical_allreduce(p, m, nodes, b.data(), n, thr)));
        CHECK(got({AllreduceAlgorithm::kTree, nodes, 8}) == shape(harness::tree_allreduce(p, m, nodes, b.data(), n, 8)));
      }
}

TEST(bad_arguments_raise_comm_error) {
  float b[4] = {0, 0, 0, 0};
  CHECK_THROWS(CommError, harness::hierarchical_allreduce(3, 0, {0, 1}, b, 4, 0));
  CHECK_THROWS(CommError, harness::tree_allreduce(3, 0, {0, 1}, b, 4, 8));
  CHECK_THROWS(CommError, harness::tree_allreduce(3, 0, {}, b, 4, 0));
  CHECK_THROWS(CommError, harness::allreduce_algorithm_named("butterfly"));
  CHECK(harness::allreduce_algorithm_named("tree") == AllreduceAlgorithm::kTree);
  CHECK(harness::allreduce_algorithm_named("reduce_broadcast") == AllreduceAlgorithm::kReduceBroadcast);
  CHECK(harness::allreduce_algorithm_named("recursive_doubling") == AllreduceAlgorithm::kRecursiveDoubling);
}

TEST(the_simulation_catches_broken_programs) {
  // The checks above are only as good as the simulation: a program whose peers disagree must
  // fail it (a deadlock, a size mismatch, a message never received).
  auto run = [](std::function<StepProgram(int, void*)> build) {
    return simulate<float>(2, 4, build, int_valued).result;
  };
  auto one_way = [](int m, void* b) {  // both send first, neither receives
    StepProgram s;
    s.steps.push_back({{{1 - m, b, 4}}, {}, {}});
    return s;
  };
  CHECK(!run(one_way).ok);
  auto sizes_differ = [](int m, void* b) {
    StepProgram s;
    s.steps.push_back({{{1 - m, b, 4 - m}}, {{1 - m, static_cast<float*>(b) + 2, 2}}, {}});
    return s;
  };
  CHECK(!run(sizes_differ).ok);
  auto crossed = [](int m, void* b) {  // 0 waits to receive before sending, so does 1
    StepProgram s;
    s.steps.push_back({{}, {{1 - m, b, 1}}, {}});
    s.steps.push_back({{{1 - m, b, 1}}, {}, {}});
    return s;
  };
  SimResult dl = run(crossed);
  CHECK(!dl.ok && dl.error.find("deadlock") != std::string::npos);
  auto aliasing = [](int m, void* b) {
    StepProgram s;
    s.steps.push_back({{{1 - m, b, 2}}, {{1 - m, static_cast<float*>(b) + 1, 2}}, {}});
    return s;
  };
  CHECK(!run(aliasing).ok);
}

int main(int argc, char** argv) { return harness_test::run_tests(argc, argv); }
