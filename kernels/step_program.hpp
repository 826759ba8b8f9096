// Collective algorithms as explicit step step programs, and the executor that runs them.
//
// A step program is a list of steps; each step posts its receives and sends, waits for all of them,
// then applies its local reductions. Builders are pure functions of (group size, my index,
// length), so every member derives the same pattern; a member's peers are indices into
// `members` (ranks of the communicator the step program runs on).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "allreduce_plan.hpp"
#include "dtype.hpp"
#include "engine.hpp"

namespace harness {

struct Xfer {
  int peer;  // index into members
  void* buf;
  int64_t count;  // elements of the step program's type
  int tag = -1;   // -1: the executor's tag
};

struct Reduce {
  void* dst;
  const void* src;
  int64_t count;
};

struct Step {
  std::vector<Xfer> sends, recvs;
  std::vector<Reduce> reduces;
};

struct StepProgram {
  std::vector<Step> steps;
  std::unique_ptr<float[]> scratch;  // receive space referenced by steps (any element type)
  std::vector<std::unique_ptr<float[]>> more_scratch;  // of step programs merged into this one
  void* result = nullptr;            // buffer to scale at the end (mean), if divide_by > 1
  int64_t count = 0;
  int divide_by = 1;
  // The element type MPI moves and how a Reduce combines two buffers; the default is float32
  // addition (every float-only step program). `divide` scales `result` by 1 / divide_by.
  ElemType elem;
  ReduceFn reduce = nullptr;  // nullptr: float32 sum
  DivideFn divide = nullptr;  // nullptr: float32
  // Runs on the progress thread once the last step is done (after the division): the typed
  // collectives copy a result out of scratch space with it.
  std::function<void()> on_done;
};

// The bytes a member sends running `s` (what its op record counts).
inline int64_t bytes_sent(const StepProgram& s) {
  int64_t bytes = 0;
  for (const Step& step : s.steps)
    for (const Xfer& x : step.sends) bytes += x.count * s.elem.size;
  return bytes;
}

// Scratch space of `bytes` bytes in `s` (aligned for any element type); returns its start.
inline char* alloc_scratch(StepProgram& s, int64_t bytes) {
  const int64_t floats = (bytes + 3) / 4;
  s.scratch.reset(new float[floats > 0 ? floats : 1]);
  return reinterpret_cast<char*>(s.scratch.get());
}
inline char* alloc_more_scratch(StepProgram& s, int64_t bytes) {
  const int64_t floats = (bytes + 3) / 4;
  s.more_scratch.emplace_back(new float[floats > 0 ? floats : 1]);
  return reinterpret_cast<char*>(s.more_scratch.back().get());
}

// Recursive doubling (with the fold of the ranks beyond the largest power of two): log2(p)
// steps that each exchange the whole buffer. For small messages. Results are bitwise equal
// on all members (each pairwise sum is commutative).
//
// Every builder takes the buffer as `buf` of `n` elements of `esz` bytes (default float32) and
// leaves the element type and reduction of the returned step program at float32 sum: the caller
// sets `elem`, `reduce` and `divide` for other types.
StepProgram rd_allreduce(int p, int me, void* buf, int64_t n, int esz = 4);
// Ring reduce-scatter + allgather: 2(p-1) steps of n/p elements. For large messages.
StepProgram ring_allreduce(int p, int me, void* buf, int64_t n, int esz = 4);
// Binomial tree broadcast from member `root`.
StepProgram binomial_bcast(int p, int me, int root, void* buf, int64_t n, int esz = 4);
// Dissemination barrier: ceil(log2 p) steps of empty messages.
StepProgram dissemination_barrier(int p, int me);
// Hierarchical allreduce over members on nodes (member_nodes[i]: node of member i): a binomial
// reduce inside each node to its leader (the node's first member), an allreduce among the
// leaders (ring or recursive doubling, as allreduce_program picks for them), then a binomial
// broadcast inside each node. Results are bitwise equal on all members.
StepProgram hierarchical_allreduce(int p, int me, const std::vector<int>& member_nodes, void* buf, int64_t n,
                                int64_t ring_threshold_bytes, int esz = 4);
// NCCL's tree allreduce, pipelined (member_nodes[i]: node of member i; empty: every member a node
// of its own). Inside each node a chain of its members in member order (the node's first member
// heads it: local member i's parent is local member i-1); across nodes a binary tree over the
// heads in order of first appearance (head j's parent is head (j-1)/2); member 0 is the root.
// A member's children are its chain successor, then its tree children in heap order. The buffer
// goes in K = max(1, min(n, ceil(n * esz / chunk_bytes))) chunks (split as the ring's) up the
// tree, each member adding its children's partial sums in child order (own + first child +
// second ...), and the root's sums come back down, so every member ends with bitwise the same
// result. Every step is a round in which every edge of the tree is active at once, as in NCCL:
// the child sends its next reduced chunk up, if it has one at the round's start (a later child
// only after the earlier children sent the same chunk: the order of additions), and the parent
// its next final chunk down, if it has one; a member posts the sends and receives on all its
// edges together (in the colour order of the tree's edge colouring, which the simulator's steps
// of a round follow) and adds the chunks its children sent once all are done, in child order.
// Every link then carries the buffer once each way, both ways at once. Unlike NCCL, one tree
// carries all of it (NCCL runs two complementary trees with half each), and a round waits for
// all of its messages (NCCL keeps several chunks in flight per edge).
StepProgram tree_allreduce(int p, int me, const std::vector<int>& member_nodes, void* buf, int64_t n,
                        int64_t chunk_bytes, int esz = 4);
// The step program `plan` names for member `me` of `p`.
StepProgram allreduce_program(int p, int me, void* buf, int64_t n, int64_t ring_threshold_bytes,
                            const AllreducePlan& plan = {}, int esz = 4);

// Runs a step program on `comm`. members[i] is the comm rank of member i and world[i] its world
// rank (link emulation is per world-rank link). Embeddable in ops; holds `comm` while it runs.
class StepExecutor {
 public:
  StepExecutor(SharedComm comm, std::vector<int> members, std::vector<int> world, int tag, StepProgram program,
               bool synchronous_sends = false);
  // Advances; true if anything happened. Throws CommError on MPI errors or size mismatch.
  bool progress(Engine& engine, int64_t* bytes_sent);
  bool done() const { return cur_ >= sched_.steps.size() && finalized_; }
  // Gives up: the step's requests go to the engine's quarantine with the step program's scratch
  // space and `op_memory` (memory of the embedding op the steps use, if any); `lender` is the op
  // whose caller lent the buffers the steps use (null: none).
  void abort(Engine& engine, const std::shared_ptr<OpState>& lender, std::shared_ptr<void> op_memory = nullptr);

 private:
  void post(Engine& engine, int64_t* bytes_sent);
  std::string elem_unit() const { return sched_.elem.dtype == DType::kF32 ? "floats" : std::string(sched_.elem.name) + " elements"; }
  bool complete(Engine& engine);

  SharedComm comm_;
  std::vector<int> members_, world_;
  int tag_;
  StepProgram sched_;
  bool sync_sends_;
  size_t cur_ = 0;
  bool posted_ = false, finalized_ = false;
  std::vector<std::shared_ptr<SendReq>> sends_;
  std::vector<MPI_Request> recvs_;
};

// A one-shot collective submitted by a caller.
class StepProgramOp : public Op {
 public:
  StepProgramOp(std::string name, std::shared_ptr<OpState> st, StepExecutor exec)
      : Op(std::move(name), std::move(st)), exec_(std::move(exec)) {}
  bool progress(Engine& e) override { return exec_.progress(e, &bytes_sent); }
  bool finished() const override { return exec_.done(); }
  void abort(Engine& e, const CommError&) override { exec_.abort(e, state()); }

 private:
  StepExecutor exec_;
};

}  // namespace harness
