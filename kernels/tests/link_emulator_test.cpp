// Unit tests of the emulated network (kernels/link_emulator.hpp): release times for given
// latencies and bandwidths, the FIFO queue of each resource, the cut-through rule over a path of
// resources (pair link, intra-node link, NIC out, fabric, NIC in), and NICs shared by the
// emulators of several ranks through one table (SharedNics::local: the same rule as the job-wide
// shared-memory table, in this process). Times are given, not read from the clock, so every
// expected value is exact up to rounding.
#include <cmath>
#include <limits>
#include <memory>

#include "check.hpp"
#include "link_emulator.hpp"

using harness::AllreduceAlgorithm;
using harness::CommError;
using harness::LinkEmulator;
using harness::LinkParams;
using harness::SharedNics;
using harness::Topology;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

bool near(double a, double b) { return std::fabs(a - b) <= 1e-12 * std::max(1.0, std::fabs(b)); }

#define CHECK_NEAR(a, b) CHECK_MSG(near((a), (b)), harness_test::show_pair(#a, #b, (a), (b)))

}  // namespace

TEST(nothing_emulated_releases_at_once) {
  LinkEmulator e;
  e.set_self(0);
  CHECK_EQ(e.release_time(1, 1e6, 5.0), 5.0);
  e.set_links({{1, LinkParams{}}});  // a free link: no latency, no bandwidth limit
  CHECK(LinkParams{}.is_free());
  CHECK_EQ(e.release_time(1, 1e6, 5.0), 5.0);
  e.set_links({{0, LinkParams{1.0, 10.0}}});  // a message to itself never waits
  CHECK_EQ(e.release_time(0, 1e6, 5.0), 5.0);
}

TEST(release_is_latency_plus_bytes_over_bandwidth) {
  LinkEmulator e;
  e.set_self(3);
  e.set_links({{1, LinkParams{0.01, 1e6}}, {2, LinkParams{0.5, kInf}}});
  CHECK_NEAR(e.release_time(1, 1000, 10.0), 10.0 + 0.001 + 0.01);
  CHECK_NEAR(e.release_time(2, 1e9, 10.0), 10.5);  // latency only
  CHECK_NEAR(e.release_time(2, 1e9, 10.0), 10.5);  // no bandwidth, no queue
}

TEST(one_link_carries_messages_one_after_another) {
  LinkEmulator e;
  e.set_self(0);
  e.set_links({{1, LinkParams{0.01, 1e6}}, {2, LinkParams{0.01, 1e6}}});
  // Three messages posted together leave in order, each after the one before.
  CHECK_NEAR(e.release_time(1, 1000, 10.0), 10.011);
  CHECK_NEAR(e.release_time(1, 1000, 10.0), 10.012);
  CHECK_NEAR(e.release_time(1, 2000, 10.0), 10.014);
  // One posted while the link is busy starts when it is free; a link of its own is not busy.
  CHECK_NEAR(e.release_time(1, 1000, 10.0025), 10.015);
  CHECK_NEAR(e.release_time(2, 1000, 10.0), 10.011);
  // Once the link is idle again a message starts when posted.
  CHECK_NEAR(e.release_time(1, 1000, 20.0), 20.011);
  // Replacing the links forgets the queues.
  e.set_links({{1, LinkParams{0.01, 1e6}}});
  CHECK_NEAR(e.release_time(1, 1000, 10.0), 10.011);
  CHECK(e.links().size() == 1 && e.links().at(1).latency_s == 0.01);
}

TEST(reserve_path_is_cut_through_and_fifo) {
  double a = 0, b = 5.0, c = 0;
  // a: free; b: busy until 5; c: unlimited (inv_bw 0: no queue, never reserved).
  std::vector<harness::PathStep> path{{&a, 1e-3}, {&b, 2e-3}, {&c, 0.0}};
  const double r = harness::reserve_path(path, 0.5, 100, 1.0);
  // start_a = 1, end_a = 1.1; start_b = max(1, 5) = 5, end_b = 5.2; release = 5.2 + 0.5.
  CHECK_NEAR(a, 1.1);
  CHECK_NEAR(b, 5.2);
  CHECK_EQ(c, 0.0);
  CHECK_NEAR(r, 5.7);
  CHECK_NEAR(harness::reserve_path({}, 0.25, 100, 1.0), 1.25);
}

TEST(topology_inside_a_node_uses_the_intra_link_per_pair) {
  LinkEmulator e;
  e.set_self(0);
  Topology t;
  t.node_of = {0, 0, 0, 1};
  t.intra = LinkParams{1e-3, 1e6};
  e.set_topology(t, nullptr);
  CHECK_NEAR(e.release_time(1, 1000, 1.0), 1.0 + 1e-3 + 1e-3);
  CHECK_NEAR(e.release_time(1, 1000, 1.0), 1.0 + 2e-3 + 1e-3);  // same pair: queued
  CHECK_NEAR(e.release_time(2, 1000, 1.0), 1.0 + 1e-3 + 1e-3);  // another pair: its own link
  // Between nodes without a shared table: only the NIC's latency.
  t.nic = LinkParams{0.25, kInf};
  e.set_topology(t, nullptr);
  CHECK_NEAR(e.release_time(3, 1e9, 1.0), 1.25);
}

TEST(ranks_of_one_node_queue_on_its_nic) {
  std::shared_ptr<SharedNics> nics(SharedNics::local(3));
  CHECK_EQ(nics->nodes(), 3);
  Topology t;
  t.node_of = {0, 0, 1, 1, 2};
  t.nic = LinkParams{0.002, 1e6};
  LinkEmulator r0, r1, r2;
  r0.set_self(0);
  r1.set_self(1);
  r2.set_self(2);
  for (LinkEmulator* e : {&r0, &r1, &r2}) e->set_topology(t, nics);
  CHECK(t.shares_resources());
  // Ranks 0 and 1 share node 0's NIC out: the second message waits for the first.
  CHECK_NEAR(r0.release_time(2, 1000, 10.0), 10.003);
  CHECK_NEAR(r1.release_time(3, 1000, 10.0), 10.004);
  // Node 1's NIC in took both (cut-through: each started there when it started on node 0's).
  {
    SharedNics::Lock lock(*nics);
    CHECK_NEAR(nics->egress(0), 10.002);
    CHECK_NEAR(nics->ingress(1), 10.002);
    CHECK_EQ(nics->egress(1), 0.0);
    CHECK_EQ(nics->ingress(0), 0.0);
  }
  // Ranks of different nodes sending to one node queue on its NIC in.
  CHECK_NEAR(r0.release_time(4, 1000, 20.0), 20.003);
  CHECK_NEAR(r2.release_time(4, 1000, 20.0), 20.004);
  // Inside node 0 nothing is shared: no NIC, no intra link emulated.
  CHECK_EQ(r0.release_time(1, 1000, 10.0), 10.0);
}

TEST(fabric_limit_and_pair_links_join_the_path) {
  std::shared_ptr<SharedNics> nics(SharedNics::local(2));
  Topology t;
  t.node_of = {0, 1};
  t.nic = LinkParams{0.002, 1e6};
  t.fabric_Bps = 5e5;
  LinkEmulator r0, r1;
  r0.set_self(0);
  r1.set_self(1);
  r0.set_topology(t, nics);
  r1.set_topology(t, nics);
  // NIC out 1 ms, fabric 2 ms, NIC in 1 ms, all starting at 10: released at 10.002 + 2 ms.
  CHECK_NEAR(r0.release_time(1, 1000, 10.0), 10.004);
  // The other direction has its own NICs but waits for the fabric (busy until 10.002).
  CHECK_NEAR(r1.release_time(0, 1000, 10.0), 10.006);
  // A pair link in front of the NIC: its latency adds, its queue comes first on the path.
  r0.set_links({{1, LinkParams{0.1, 2e6}}});
  // pair: 10.5..10.5005; NIC out 10.5..10.501; fabric 10.5..10.502; NIC in 10.5..10.501.
  CHECK_NEAR(r0.release_time(1, 1000, 10.5), 10.502 + 0.1 + 0.002);
}

TEST(allreduce_plans_follow_the_topology) {
  LinkEmulator e;
  e.set_self(0);
  e.set_tree_chunk_bytes(4096);
  CHECK(e.allreduce_plan({0, 1}).algorithm == AllreduceAlgorithm::kAuto);
  e.set_allreduce(AllreduceAlgorithm::kHierarchical);
  CHECK_THROWS(CommError, e.allreduce_plan({0, 1}));  // needs a topology
  e.set_allreduce(AllreduceAlgorithm::kTree);
  auto plan = e.allreduce_plan({0, 1, 2});
  CHECK(plan.member_nodes.empty());  // a tree without nodes: every member its own
  CHECK_EQ(plan.tree_chunk_bytes, int64_t{4096});
  Topology t;
  t.node_of = {5, 5, 7, 7};
  e.set_topology(t, nullptr);
  plan = e.allreduce_plan({3, 0, 2});
  CHECK(plan.member_nodes == std::vector<int>({7, 5, 7}));
  e.set_allreduce(AllreduceAlgorithm::kHierarchical);
  CHECK(e.allreduce_plan({1, 2}).member_nodes == std::vector<int>({5, 7}));
}

TEST(shared_nics_local_table) {
  CHECK_THROWS(CommError, SharedNics::local(0));
  auto nics = SharedNics::local(4);
  SharedNics::Lock lock(*nics);
  // Every node's NIC out and in and the fabric are distinct times, all zero at first.
  std::vector<double*> slots{&nics->fabric()};
  for (int n = 0; n < 4; ++n) {
    slots.push_back(&nics->egress(n));
    slots.push_back(&nics->ingress(n));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    CHECK_EQ(*slots[i], 0.0);
    *slots[i] = static_cast<double>(i + 1);
  }
  for (size_t i = 0; i < slots.size(); ++i) CHECK_EQ(*slots[i], static_cast<double>(i + 1));
}

int main(int argc, char** argv) { return harness_test::run_tests(argc, argv); }
