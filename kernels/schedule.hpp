// Collective algorithms as explicit step schedules, and the executor that runs them.
//
// A schedule is a list of steps; each step posts its receives and sends, waits for all of them,
// then applies its local reductions. Builders are pure functions of (group size, my index,
// length), so every member derives the same pattern; a member's peers are indices into
// `members` (ranks of the communicator the schedule runs on).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "allreduce_plan.hpp"
#include "engine.hpp"

namespace harness {

struct Xfer {
  int peer;  // index into members
  float* buf;
  int64_t count;
  int tag = -1;  // -1: the executor's tag
};

struct Reduce {
  float* dst;
  const float* src;
  int64_t count;
};

struct Step {
  std::vector<Xfer> sends, recvs;
  std::vector<Reduce> reduces;
};

struct Schedule {
  std::vector<Step> steps;
  std::unique_ptr<float[]> scratch;  // receive space referenced by steps
  std::vector<std::unique_ptr<float[]>> more_scratch;  // of schedules merged into this one
  float* result = nullptr;           // buffer to scale at the end (mean), if divide_by > 1
  int64_t count = 0;
  int divide_by = 1;
};

// Recursive doubling (with the fold of the ranks beyond the largest power of two): log2(p)
// steps that each exchange the whole buffer. For small messages. Results are bitwise equal
// on all members (each pairwise sum is commutative).
Schedule rd_allreduce(int p, int me, float* buf, int64_t n);
// Ring reduce-scatter + allgather: 2(p-1) steps of n/p elements. For large messages.
Schedule ring_allreduce(int p, int me, float* buf, int64_t n);
// Binomial tree broadcast from member `root`.
Schedule binomial_bcast(int p, int me, int root, float* buf, int64_t n);
// Dissemination barrier: ceil(log2 p) steps of empty messages.
Schedule dissemination_barrier(int p, int me);
// Hierarchical allreduce over members on nodes (member_nodes[i]: node of member i): a binomial
// reduce inside each node to its leader (the node's first member), an allreduce among the
// leaders (ring or recursive doubling, as allreduce_schedule picks for them), then a binomial
// broadcast inside each node. Results are bitwise equal on all members.
Schedule hierarchical_allreduce(int p, int me, const std::vector<int>& member_nodes, float* buf, int64_t n,
                                int64_t ring_threshold_bytes);
// The schedule `plan` names for member `me` of `p`.
Schedule allreduce_schedule(int p, int me, float* buf, int64_t n, int64_t ring_threshold_bytes,
                            const AllreducePlan& plan = {});

// Runs a schedule on `comm`. members[i] is the comm rank of member i and world[i] its world
// rank (link emulation is per world-rank link). Embeddable in ops.
class StepExecutor {
 public:
  StepExecutor(MPI_Comm comm, std::vector<int> members, std::vector<int> world, int tag, Schedule schedule,
               bool synchronous_sends = false);
  // Advances; true if anything happened. Throws CommError on MPI errors or size mismatch.
  bool progress(Engine& engine, int64_t* bytes_sent);
  bool done() const { return cur_ >= sched_.steps.size() && finalized_; }
  void abort();

 private:
  void post(Engine& engine, int64_t* bytes_sent);
  bool complete(Engine& engine);

  MPI_Comm comm_;
  std::vector<int> members_, world_;
  int tag_;
  Schedule sched_;
  bool sync_sends_;
  size_t cur_ = 0;
  bool posted_ = false, finalized_ = false;
  std::vector<std::shared_ptr<SendReq>> sends_;
  std::vector<MPI_Request> recvs_;
};

// A one-shot collective submitted by a caller.
class ScheduleOp : public Op {
 public:
  ScheduleOp(std::string name, std::shared_ptr<OpState> st, StepExecutor exec)
      : Op(std::move(name), std::move(st)), exec_(std::move(exec)) {}
  bool progress(Engine& e) override { return exec_.progress(e, &bytes_sent); }
  bool finished() const override { return exec_.done(); }
  void abort(Engine&, const std::string&) override { exec_.abort(); }

 private:
  StepExecutor exec_;
};

}  // namespace harness
