// Typed collectives and point-to-point messages over a group of world ranks: what the
// torch.distributed backend (harness/dist) calls.
//
// A group is built collectively by its members only (MPI_Comm_create_group on the engine's
// communicator), so torch's new_group, which creates a backend on members only, maps onto it.
// Its operations run on the world's progress thread and under the world's link emulation:
// every message between members a and b obeys the emulated link (and topology) between world
// ranks a and b. Buffers are raw pointers lent by the caller (harness.dist checks the tensors
// and keeps them alive until the operation is done); counts are in elements of `dtype`.
// Reductions happen in the native layer (dtype.hpp), in an order fixed by the step program.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "caller.hpp"
#include "dtype.hpp"
#include "host_hierarchy.hpp"
#include "shm_collective.hpp"
#include "step_program.hpp"

namespace harness {

struct TypedSpan {
  void* data;
  int64_t count;  // elements
};

// block: the caller waits for the operation anyway, so where the shared-memory path takes it
// (every member on this host, nothing emulated between them, ShmChannel::wins), it runs in the
// calling thread and the returned state is already done. Otherwise the operation is posted.
// Members on several hosts run allreduce and barrier through each host's shared memory and
// messages between the hosts (host_hierarchy.hpp), on the progress thread.
class Group {
 public:
  // Collective over the members: world_ranks[i] is the world rank of group rank i.
  Group(std::shared_ptr<Engine> engine, std::vector<int> world_ranks, int64_t ring_threshold_bytes);
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(world_.size()); }
  const std::vector<int>& world_ranks() const { return world_; }

  std::shared_ptr<OpState> allreduce(TypedSpan buf, DType dtype, ReduceOp op, int tag = -1, bool block = false);
  std::shared_ptr<OpState> broadcast(TypedSpan buf, DType dtype, int root, int tag = -1, bool block = false);
  // The reduction lands in `buf` on `root`; other members' buffers are left as they were.
  std::shared_ptr<OpState> reduce(TypedSpan buf, DType dtype, ReduceOp op, int root, int tag = -1, bool block = false);
  // out: size() * in.count elements, member m's input at m * in.count (`in` may alias its slot).
  std::shared_ptr<OpState> allgather(TypedSpan in, TypedSpan out, DType dtype, int tag = -1, bool block = false);
  // in: size() * out.count elements; member m gets the reduction of every member's chunk m.
  std::shared_ptr<OpState> reduce_scatter(TypedSpan in, TypedSpan out, DType dtype, ReduceOp op, int tag = -1, bool block = false);
  // out (root only): size() * in.count elements.
  std::shared_ptr<OpState> gather(TypedSpan in, TypedSpan out, DType dtype, int root, int tag = -1, bool block = false);
  // in (root only): size() * out.count elements.
  std::shared_ptr<OpState> scatter(TypedSpan in, TypedSpan out, DType dtype, int root, int tag = -1, bool block = false);
  // in / out hold send_counts[m] / recv_counts[m] elements for member m, one after another.
  std::shared_ptr<OpState> alltoall(TypedSpan in, TypedSpan out, DType dtype, const std::vector<int64_t>& send_counts,
                                    const std::vector<int64_t>& recv_counts, int tag = -1);
  std::shared_ptr<OpState> barrier(int tag = -1, bool block = false);
  int tag_ub() const { return engine_->tag_ub(); }
  // Why the members that share this host have no shared segment ("" when they have one, or
  // when some member is on another host).
  const std::string& shm_fallback_reason() const { return shm_why_not_; }
  // "host", "hierarchical" or "": as Communicator::shm_path.
  std::string shm_path() const { return shm_ ? "host" : hier_ ? "hierarchical" : ""; }
  // Point to point on a communicator of their own: messages between two members with the same
  // tag are matched in the order they were posted.
  std::shared_ptr<OpState> send(TypedSpan buf, DType dtype, int dst, int tag);
  std::shared_ptr<OpState> recv(TypedSpan buf, DType dtype, int src, int tag);

 private:
  // tag: the collective's MPI tag (harness.dist derives it from the op's place in the program, so
  // that collectives posted by different threads match across ranks); -1: the next of this
  // group's own sequence.
  std::shared_ptr<OpState> submit(const char* name, StepProgram s, bool p2p = false, int tag = -1);
  void check_open(const char* what) const;
  // The shared-memory channel for a call of `kind` moving `bytes` with `tag`, or null: the message path.
  // Only the main sequence of a group (tag < 0, or below half the tag range: harness.dist's
  // numbering) is posted in the same order on every member, which the channel needs.
  ShmChannel* shm_for(ShmKind kind, int64_t bytes, int tag) const;
  // The same for members on several hosts: the hierarchy (allreduce and barrier), or null.
  HostHierarchy* hierarchy_for(ShmKind kind, int64_t bytes, int tag) const;
  // The call on the shared-memory path; `build` makes the step program the message path would
  // run, whose bytes the op's record counts (ShmChannel::record_bytes).
  template <class Build>
  std::shared_ptr<OpState> via_shm(const char* name, ShmCall call, bool block, Build&& build);

  std::shared_ptr<Engine> engine_;
  std::vector<int> world_;
  std::vector<int> members_;  // 0 .. size-1: ranks of comm_
  int rank_ = 0;
  int64_t ring_threshold_;
  SharedComm comm_, p2p_comm_;  // held as well by the operations that run on them
  std::shared_ptr<ShmChannel> shm_;  // null: some member is on another host, or no segment
  std::unique_ptr<HostHierarchy> hier_;  // the members span hosts, some of which have several
  std::string shm_why_not_;
  std::mutex seq_mu_;
  int64_t seq_ = 0;
};

}  // namespace harness
