// Collectives of members spread over several hosts: shared memory within each host, messages
// between the hosts.
//
// An allreduce runs in three parts: the members of each host reduce into the host's leader (its
// first member) through the host's shared segment (shm_collective.hpp), the leaders allreduce
// among themselves with the message path's program (ring or recursive doubling, as for any
// allreduce), and each leader broadcasts the result to its host's members through the segment.
// Only the leaders send messages, once per host instead of once per member. Every member gets
// bitwise the same result (the broadcast copies the leader's), summed in a fixed order: each
// host's members in member order, then the hosts in the leaders' program's order. A barrier runs
// the same way (a barrier on each host, the leaders' dissemination barrier, a barrier on each
// host).
//
// The two shared-memory parts take their turns in their host's channel together when the
// operation is posted, and the whole runs on the progress thread. A leader whose exchange with
// the other hosts fails tells its host's members so through the segment (ShmTurn::give_up with
// an announcement): they fail at once with an error naming it, instead of waiting for a result
// that will not come.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mpi_comm.hpp"
#include "shm_collective.hpp"
#include "step_program.hpp"

namespace harness {

class HostHierarchy {
 public:
  // Collective over `comm` (world_ranks[i]: world rank of comm rank i). Null unless the members
  // span several hosts and at least one host has two or more of them, nobody turned the
  // shared-memory path off (HARNESS_SHM=0) and every host could make its segment; `why_not`
  // says why when a segment was wanted and could not be made (the same on every member).
  static std::unique_ptr<HostHierarchy> open(MPI_Comm comm, const std::vector<int>& world_ranks, int64_t ring_threshold_bytes,
                                             std::string* why_not);

  // In-place allreduce of `call` (kind kAllreduce: its buffer, element size, reduction and
  // division) as an op for the progress thread; its record counts `call.record_bytes`.
  std::unique_ptr<Op> allreduce(const char* name, std::shared_ptr<OpState> state, const ShmCall& call, const ElemType& elem);
  std::unique_ptr<Op> barrier(const char* name, std::shared_ptr<OpState> state);

  // Whether the call of `kind` moving `bytes` takes this path (the same rule as one host's).
  bool wins(ShmKind kind, int64_t bytes) const {
    return (kind == ShmKind::kAllreduce || kind == ShmKind::kBarrier) && local_->wins(kind, bytes);
  }
  ShmChannel& local() { return *local_; }
  int hosts() const { return hosts_; }
  bool leader() const { return static_cast<bool>(leaders_); }

 private:
  HostHierarchy() = default;
  int next_tag();
  // `program` run by this leader among the hosts' leaders.
  StepExecutor among_leaders(int tag, StepProgram program) const;

  std::shared_ptr<ShmChannel> local_;  // this host's members
  SharedComm leaders_;                 // the hosts' first members; null on the others
  std::vector<int> leader_world_;      // world rank of each leader, in the leaders' order
  int leader_index_ = -1;
  int hosts_ = 0;
  int tag_ub_ = 32767;
  int64_t ring_threshold_ = 0;
  std::mutex seq_mu_;
  int64_t seq_ = 0;  // one tag per operation, in posting order (the same on every member)
};

}  // namespace harness
