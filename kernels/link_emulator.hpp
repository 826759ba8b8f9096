// The emulated network, applied by the sender: per-link rules and a topology of nodes.
//
// A message of b bytes from this rank to `dst` crosses a path of resources, each with a
// bandwidth (and a latency):
//   - the pair's own link when network.default / network.links emulate it (private to the pair);
//   - with a topology, inside a node: the intra-node link of the pair (private to the pair);
//     between nodes: the source node's NIC out, the fabric when it has a bisection limit, then
//     the destination node's NIC in. NICs and fabric are shared by every rank (SharedNics).
// The one contention rule (the simulator's harness/sim/network.py implements the same):
// every resource carries messages one after another in the order they reach it (FIFO, no fair
// sharing), and a message starts on a resource no earlier than it started on the previous one
// (cut-through, not store-and-forward):
//   start_0 = max(post, free_0),  start_k = max(start_(k-1), free_k),  free_k = start_k + b / bw_k,
//   release = max_k(start_k + b / bw_k) + sum of the path's latencies.
// The message is handed to MPI at its release. FIFO rather than fair sharing because the release
// time is fixed when the message is posted: fair sharing would move the release of messages
// already in flight whenever another one starts. For equal messages posted together the last
// one finishes at the same time under both rules; FIFO finishes the others earlier.
#pragma once

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "allreduce_plan.hpp"
#include "common.hpp"
#include "shared_nics.hpp"

namespace harness {

struct LinkParams {
  double latency_s = 0.0;
  double bandwidth_Bps = std::numeric_limits<double>::infinity();
  bool is_free() const { return latency_s <= 0.0 && !(bandwidth_Bps < std::numeric_limits<double>::infinity()); }
};

// Nodes of the emulated cluster: node_of[world rank], the intra-node link, each node's NIC,
// the fabric's bisection bandwidth (inf: none).
struct Topology {
  std::vector<int> node_of;
  LinkParams intra, nic;
  double fabric_Bps = std::numeric_limits<double>::infinity();
  bool shares_resources() const {
    return nic.bandwidth_Bps < std::numeric_limits<double>::infinity() ||
           fabric_Bps < std::numeric_limits<double>::infinity();
  }
};

// One resource on a message's path: its busy-until time and the seconds per byte it takes.
struct PathStep {
  double* free_at;
  double inv_bw;
};

// The contention rule above over one path; reserves the resources. Returns the release time.
inline double reserve_path(const std::vector<PathStep>& path, double latency_s, double bytes, double now_s) {
  double start = now_s, finish = now_s;
  for (const PathStep& r : path) {
    if (r.inv_bw <= 0.0) continue;  // unlimited bandwidth: no queue (its latency still counts)
    if (*r.free_at > start) start = *r.free_at;
    double end = start + bytes * r.inv_bw;
    *r.free_at = end;
    if (end > finish) finish = end;
  }
  return finish + latency_s;
}

class LinkEmulator {
 public:
  void set_self(int world_rank) { self_ = world_rank; }

  // Replaces the outgoing-link table of this rank (entries whose src is another rank are
  // kept out by the caller). Takes effect for messages posted afterwards.
  void set_links(const std::unordered_map<int, LinkParams>& out_links) {
    std::lock_guard<std::mutex> lock(mu_);
    links_ = out_links;
    pair_free_.clear();
  }

  // Replaces the topology; `nics` holds the shared NIC table (null when nothing is shared).
  void set_topology(Topology topology, std::shared_ptr<SharedNics> nics) {
    std::lock_guard<std::mutex> lock(mu_);
    topo_ = std::move(topology);
    nics_ = std::move(nics);
    intra_free_.clear();
    note_emulation();
  }

  // Every emulated link of the job as (src, dst) world ranks: the same list on every rank
  // (set_links' table holds this rank's own links only).
  void set_emulated_pairs(std::vector<std::pair<int, int>> pairs) {
    std::lock_guard<std::mutex> lock(mu_);
    pairs_ = std::move(pairs);
    note_emulation();
  }

  // Whether collectives among `members` must take the message path: an emulated link between
  // two of them, emulated nodes, or an allreduce algorithm named by the user. The answer is the
  // same on every member (all three are set alike everywhere), so they all take the same path.
  bool message_path_among(const std::vector<int>& members) const {
    if (!emulates_.load(std::memory_order_acquire)) return false;  // every blocking call asks: no lock
    std::lock_guard<std::mutex> lock(mu_);
    if (!topo_.node_of.empty() || allreduce_ != AllreduceAlgorithm::kAuto) return true;
    if (pairs_.empty()) return false;
    auto member = [&](int r) { return std::find(members.begin(), members.end(), r) != members.end(); };
    return std::any_of(pairs_.begin(), pairs_.end(), [&](const auto& p) { return member(p.first) && member(p.second); });
  }

  std::unordered_map<int, LinkParams> links() const {
    std::lock_guard<std::mutex> lock(mu_);
    return links_;
  }

  // The allreduce algorithm of the emulated network (network.allreduce); kHierarchical needs a
  // topology, which set_topology gives.
  void set_allreduce(AllreduceAlgorithm algorithm) {
    std::lock_guard<std::mutex> lock(mu_);
    allreduce_ = algorithm;
    note_emulation();
  }

  // The chunk size of the tree allreduce's pipeline (the communicator's, set once).
  void set_tree_chunk_bytes(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    tree_chunk_bytes_ = bytes;
  }

  // What an allreduce over `world_members` runs: the algorithm and, when it is hierarchical or a
  // tree, the node of every member (a tree without a topology: none, every member its own node).
  AllreducePlan allreduce_plan(const std::vector<int>& world_members) const {
    std::lock_guard<std::mutex> lock(mu_);
    AllreducePlan plan{allreduce_, {}, tree_chunk_bytes_};
    if (allreduce_ != AllreduceAlgorithm::kHierarchical && allreduce_ != AllreduceAlgorithm::kTree) return plan;
    if (topo_.node_of.empty()) {
      if (allreduce_ == AllreduceAlgorithm::kTree) return plan;
      throw CommError("a hierarchical allreduce needs the emulated topology of nodes");
    }
    for (int r : world_members) plan.member_nodes.push_back(topo_.node_of.at(static_cast<size_t>(r)));
    return plan;
  }

  // Time at which a message of `bytes` posted now to world rank `dst` may be handed to MPI;
  // returns `now_s` (no delay) when nothing on its path is emulated. Reserves the path.
  double release_time(int dst, double bytes, double now_s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (dst == self_) return now_s;
    std::vector<PathStep> path;
    double latency = 0.0;
    auto it = links_.find(dst);
    if (it != links_.end() && !it->second.is_free()) {
      path.push_back({&pair_free_[dst], 1.0 / it->second.bandwidth_Bps});
      latency += it->second.latency_s;
    }
    // An empty path with no latency releases at once: reserve_path returns now_s.
    if (topo_.node_of.empty()) return reserve_path(path, latency, bytes, now_s);
    const int src_node = topo_.node_of.at(static_cast<size_t>(self_));
    const int dst_node = topo_.node_of.at(static_cast<size_t>(dst));
    if (src_node == dst_node) {
      if (!topo_.intra.is_free()) {
        path.push_back({&intra_free_[dst], 1.0 / topo_.intra.bandwidth_Bps});
        latency += topo_.intra.latency_s;
      }
      return reserve_path(path, latency, bytes, now_s);
    }
    latency += topo_.nic.latency_s;
    if (!nics_) return reserve_path(path, latency, bytes, now_s);  // nothing shared: only latency between nodes
    SharedNics::Lock shared(*nics_);
    const double nic_inv = 1.0 / topo_.nic.bandwidth_Bps;
    path.push_back({&nics_->egress(src_node), nic_inv});
    if (topo_.fabric_Bps < std::numeric_limits<double>::infinity()) path.push_back({&nics_->fabric(), 1.0 / topo_.fabric_Bps});
    path.push_back({&nics_->ingress(dst_node), nic_inv});
    return reserve_path(path, latency, bytes, now_s);
  }

 private:
  // Under mu_: whether anything at all is emulated or named (message_path_among's shortcut).
  void note_emulation() {
    emulates_.store(!topo_.node_of.empty() || allreduce_ != AllreduceAlgorithm::kAuto || !pairs_.empty(),
                    std::memory_order_release);
  }

  int self_ = -1;
  std::atomic<bool> emulates_{false};
  mutable std::mutex mu_;
  std::unordered_map<int, LinkParams> links_;
  std::vector<std::pair<int, int>> pairs_;
  std::unordered_map<int, double> pair_free_, intra_free_;
  AllreduceAlgorithm allreduce_ = AllreduceAlgorithm::kAuto;
  int64_t tree_chunk_bytes_ = 0;
  Topology topo_;
  std::shared_ptr<SharedNics> nics_;
};

}  // namespace harness
