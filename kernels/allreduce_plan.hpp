// Which allreduce algorithm a communicator runs, shared by the step program builders and the link
// emulator (which knows the emulated nodes a hierarchical or tree allreduce needs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace harness {

// The allreduce algorithm a communicator uses (the scenario's `network.allreduce`):
// kAuto picks ring or recursive doubling by the message size; kRing and kRecursiveDoubling
// force one (a ring needs p > 2 and at least one float per member, else recursive doubling);
// kReduceBroadcast is a binomial reduce to member 0 and a binomial broadcast from it, both
// moving the whole buffer at every step (the TCP backend of early PyTorch did this);
// kHierarchical goes through the nodes of the emulated topology; kTree is NCCL's pipelined tree
// (a chain inside each node, a binary tree across nodes; tree_allreduce in step program.hpp).
enum class AllreduceAlgorithm : int { kAuto, kRing, kRecursiveDoubling, kReduceBroadcast, kHierarchical, kTree };

// Every algorithm by its name in scenarios: the one list of them. Python reads it from
// harness._core.AllreduceAlgorithm (bindings.cpp); a test pins the scenario schema's and the
// simulator's lists to it.
struct NamedAllreduceAlgorithm {
  const char* name;
  AllreduceAlgorithm algorithm;
};
constexpr NamedAllreduceAlgorithm kAllreduceAlgorithms[] = {
    {"auto", AllreduceAlgorithm::kAuto},
    {"ring", AllreduceAlgorithm::kRing},
    {"recursive_doubling", AllreduceAlgorithm::kRecursiveDoubling},
    {"reduce_broadcast", AllreduceAlgorithm::kReduceBroadcast},
    {"hierarchical", AllreduceAlgorithm::kHierarchical},
    {"tree", AllreduceAlgorithm::kTree},
};
AllreduceAlgorithm allreduce_algorithm_named(const std::string& name);  // throws CommError (step_program.cpp)

// What an allreduce over some members runs: the algorithm and, for kHierarchical and kTree, the
// node of every member (kTree: empty when there is no topology, every member a node of its own);
// for kTree the size of its pipeline's chunks (harness.schedules.TREE_CHUNK_BYTES, which the
// communicator is built with).
struct AllreducePlan {
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  std::vector<int> member_nodes;
  int64_t tree_chunk_bytes = 0;  // > 0 for kTree
};

}  // namespace harness
