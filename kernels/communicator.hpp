// The caller side of the world communicator: one-shot collectives, pairwise exchanges, the
// factories of the persistent operations, link emulation and the op records.
//
// One-shot operations return the OpState to wait on; their buffers must stay alive until it
// is done (bindings.cpp keeps the Python objects for that long).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "async_pairwise_caller.hpp"
#include "caller.hpp"
#include "group.hpp"
#include "host_hierarchy.hpp"
#include "push_channel_caller.hpp"
#include "wait_avoiding_caller.hpp"

namespace harness {

class Communicator {
 public:
  // Collective over `parent`, which the engine duplicates for its own traffic. Allreduces of at
  // least `ring_threshold_bytes` are rings (auto); the tree allreduce's pipeline has chunks of
  // about `tree_chunk_bytes` (> 0).
  Communicator(MPI_Comm parent, EngineOptions options, int64_t ring_threshold_bytes, int64_t tree_chunk_bytes);

  int rank() const { return engine_->rank(); }
  int size() const { return engine_->size(); }

  // In-place allreduce; `op` is "sum" or "mean".
  std::shared_ptr<OpState> iallreduce(FloatSpan buf, const std::string& op);
  std::shared_ptr<OpState> ibroadcast(FloatSpan buf, int root);
  std::shared_ptr<OpState> ibarrier();
  // The blocking calls: in the calling thread where the shared-memory path takes them (every
  // rank on this host, nothing emulated), else posted and waited for. Throw the op's error.
  void allreduce(FloatSpan buf, const std::string& op);
  void broadcast(FloatSpan buf, int root);
  void barrier();
  // Why the ranks have no shared segment although they share a host ("" otherwise).
  const std::string& shm_fallback_reason() const { return shm_why_not_; }
  // Where shared memory serves the collectives: "host" (every rank on this host),
  // "hierarchical" (within each host, messages between the hosts: host_hierarchy.hpp) or "".
  std::string shm_path() const { return shm_ ? "host" : hier_ ? "hierarchical" : ""; }
  // Symmetric exchange with `peer`: both sides call it; exchanges between the same two ranks
  // are matched in the order they are posted.
  std::shared_ptr<OpState> iexchange(FloatSpan send, FloatSpan recv, int peer);

  // The persistent operations; each construction is collective.
  std::unique_ptr<PushChannel> push_channel(int64_t count);
  std::unique_ptr<WaitAvoiding> wait_avoiding(FloatSpan initial, int sync_every, bool accumulate,
                                              std::vector<std::vector<int>> phases, int quorum = 1);
  std::unique_ptr<PairwiseAverager> pairwise_averager(FloatSpan initial);
  // Typed collectives over `world_ranks` (collective over those ranks only; group.hpp).
  std::unique_ptr<Group> group(std::vector<int> world_ranks);

  // Outgoing links of this rank: (dst rank, latency s, bandwidth B/s or inf); `emulated_pairs`:
  // every emulated link of the job as (src, dst), the same on every rank.
  void set_links(const std::vector<std::tuple<int, double, double>>& links,
                 std::vector<std::pair<int, int>> emulated_pairs);
  // Nodes of the emulated cluster (collective): node_of[world rank], intra-node link and NIC as
  // (latency s, bandwidth B/s or inf) and the fabric's bandwidth (inf: no limit). See
  // link_emulator.hpp for the contention rule.
  void set_topology(const std::vector<int>& node_of, std::tuple<double, double> intra,
                    std::tuple<double, double> nic, double fabric_Bps);
  // The allreduce algorithm (allreduce_plan.hpp) by name: auto, ring, recursive_doubling,
  // reduce_broadcast, hierarchical (needs set_topology) or tree (through the topology's nodes
  // when there is one). Every rank sets the same.
  void set_allreduce(const std::string& algorithm);
  std::vector<OpRecord> drain_records() { return engine_->drain_records(); }

  // Stops the progress thread; operations still running fail. Idempotent.
  void shutdown();
  bool closed() const { return closed_ || !engine_->running(); }

 private:
  void check_open() const;
  std::shared_ptr<OpState> submit(const char* name, StepProgram s);
  // The shared-memory channel for a call of `kind` moving `bytes`, or null: the message path.
  ShmChannel* shm_for(ShmKind kind, int64_t bytes) const;
  // The same across hosts: the hierarchy for the call, or null.
  HostHierarchy* hierarchy_for(ShmKind kind, int64_t bytes) const;
  static void wait_for(const std::shared_ptr<OpState>& st);
  StepProgram allreduce_steps(FloatSpan buf, const std::string& op) const;
  // The shared-memory path's calls, their record bytes those of the message path's programs.
  ShmCall allreduce_call(ShmChannel& shm, FloatSpan buf, const std::string& op) const;
  ShmCall broadcast_call(ShmChannel& shm, FloatSpan buf, int root) const;

  std::shared_ptr<Engine> engine_;
  int64_t ring_threshold_;
  // Exchanges run on a communicator of their own, tagged by how many exchanges this rank had
  // with the peer so far (both sides count alike), so they never match collectives' messages.
  SharedComm exchange_comm_;
  std::mutex seq_mu_;  // guards the two counters below; callers may be several Python threads
  std::map<int, int64_t> exchange_seq_;
  int64_t collective_seq_ = 0;  // one tag per collective, in the order this rank posts them
  std::atomic<bool> closed_{false};
  std::vector<int> everyone_;  // 0 .. size-1
  std::shared_ptr<ShmChannel> shm_;
  std::unique_ptr<HostHierarchy> hier_;  // the ranks span hosts (then shm_ is null)
  std::string shm_why_not_;
};

}  // namespace harness
