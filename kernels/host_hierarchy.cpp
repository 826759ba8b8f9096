#include "host_hierarchy.hpp"

#include <optional>

namespace harness {

namespace {

// up (this host's members into the leader), across (the leaders, leaders only), down (the
// leader to this host's members).
class HierarchicalOp : public Op {
 public:
  HierarchicalOp(std::string name, std::shared_ptr<OpState> st, std::unique_ptr<ShmTurn> up,
                 std::optional<StepExecutor> across, std::unique_ptr<ShmTurn> down, int64_t record_bytes)
      : Op(std::move(name), std::move(st)), up_(std::move(up)), across_(std::move(across)), down_(std::move(down)) {
    bytes_sent = record_bytes;
  }

  bool progress(Engine& engine) override {
    bool moved = false;
    if (stage_ == 0) {
      if (!up_->poll(&moved)) return moved;
      stage_ = 1;
      moved = true;
    }
    if (stage_ == 1) {
      if (across_) {
        int64_t ignored = 0;  // the record counts the flat program's bytes (record_bytes)
        moved = across_->progress(engine, &ignored) || moved;
        if (!across_->done()) return moved;
      }
      stage_ = 2;
    }
    bool down_moved = false;
    done_ = down_->poll(&down_moved);
    return moved || down_moved;
  }
  bool finished() const override { return done_; }
  void abort(Engine& engine, const CommError& error) override {
    up_->give_up(error);
    if (stage_ == 1 && across_ && !across_->done()) across_->abort(engine, state());
    // Past its own host's part, a member that gives up says so to the others waiting on it.
    down_->give_up(error, /*announce=*/stage_ >= 1);
  }

 private:
  std::unique_ptr<ShmTurn> up_;
  std::optional<StepExecutor> across_;
  std::unique_ptr<ShmTurn> down_;
  int stage_ = 0;
  bool done_ = false;
};

int all_min(int v, MPI_Comm comm, const char* what) {
  int out = 0;
  check_mpi(MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MIN, comm), what);
  return out;
}

}  // namespace

std::unique_ptr<HostHierarchy> HostHierarchy::open(MPI_Comm comm, const std::vector<int>& world_ranks,
                                                   int64_t ring_threshold_bytes, std::string* why_not) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MpiComm on_host = members_on_this_host(comm);
  MPI_Comm split = on_host.get();
  int local_rank = 0, local_size = 0;
  MPI_Comm_rank(split, &local_rank);
  MPI_Comm_size(split, &local_size);
  // Every member decides alike: nobody turned the path off, the members are not all on one
  // host (ShmChannel::open_on_host serves that case) and some host has two of them.
  int say[2] = {shm_turned_off() ? 0 : 1, local_size == size ? 0 : 1}, all[2] = {0, 0}, most = 0;
  check_mpi(MPI_Allreduce(say, all, 2, MPI_INT, MPI_MIN, comm), "MPI_Allreduce(host layout)");
  check_mpi(MPI_Allreduce(&local_size, &most, 1, MPI_INT, MPI_MAX, comm), "MPI_Allreduce(host layout)");
  if (!all[0] || !all[1] || most < 2) return nullptr;

  std::vector<int> local_world(static_cast<size_t>(local_size));
  const int mine = world_ranks.at(static_cast<size_t>(rank));
  check_mpi(MPI_Allgather(&mine, 1, MPI_INT, local_world.data(), 1, MPI_INT, split), "MPI_Allgather(host members)");
  std::string local_why;
  auto local = ShmChannel::open(split, local_world, ShmChannel::kSlotBytes, &local_why);
  if (!all_min(local ? 1 : 0, comm, "MPI_Allreduce(host segments)")) {
    *why_not = local ? "another host's shared segment could not be made" : local_why;
    return nullptr;
  }

  std::unique_ptr<HostHierarchy> h(new HostHierarchy());
  h->local_ = std::move(local);
  h->ring_threshold_ = ring_threshold_bytes;
  MPI_Comm leaders = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm, local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders), "MPI_Comm_split(leaders)");
  if (leaders != MPI_COMM_NULL) {
    MpiComm owned(leaders);
    MPI_Comm_rank(leaders, &h->leader_index_);
    MPI_Comm_size(leaders, &h->hosts_);
    h->leader_world_.resize(static_cast<size_t>(h->hosts_));
    check_mpi(MPI_Allgather(&mine, 1, MPI_INT, h->leader_world_.data(), 1, MPI_INT, leaders),
              "MPI_Allgather(leaders)");
    h->leaders_ = share(std::move(owned));
  }
  check_mpi(MPI_Bcast(&h->hosts_, 1, MPI_INT, 0, split), "MPI_Bcast(hosts)");
  void* attr = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm, MPI_TAG_UB, &attr, &flag);
  if (flag) h->tag_ub_ = *static_cast<int*>(attr);
  return h;
}

StepExecutor HostHierarchy::among_leaders(int tag, StepProgram program) const {
  std::vector<int> members(static_cast<size_t>(hosts_));
  for (int i = 0; i < hosts_; ++i) members[i] = i;
  return StepExecutor(leaders_, std::move(members), leader_world_, tag, std::move(program));
}

int HostHierarchy::next_tag() {
  std::lock_guard<std::mutex> lock(seq_mu_);
  return static_cast<int>(seq_++ % tag_ub_);
}

std::unique_ptr<Op> HostHierarchy::allreduce(const char* name, std::shared_ptr<OpState> state, const ShmCall& call,
                                             const ElemType& elem) {
  const int tag = next_tag();
  ShmCall up = call;
  up.kind = ShmKind::kReduce;
  up.root = 0;
  up.divide = nullptr;  // divided once, by the leaders
  up.divide_by = 1;
  ShmCall down{ShmKind::kBroadcast, call.out, call.out, call.count, call.esz};
  auto turns = local_->turns({{name, up}, {name, down}});
  std::optional<StepExecutor> across;
  if (leaders_) {
    StepProgram s = allreduce_program(hosts_, leader_index_, call.out, call.count, ring_threshold_, {}, call.esz);
    s.elem = elem;
    s.reduce = call.reduce;
    s.result = call.out;
    s.count = call.count;
    s.divide = call.divide;
    s.divide_by = call.divide ? call.divide_by : 1;
    across = among_leaders(tag, std::move(s));
  }
  return std::make_unique<HierarchicalOp>(name, std::move(state), std::move(turns[0]), std::move(across),
                                          std::move(turns[1]), call.record_bytes);
}

std::unique_ptr<Op> HostHierarchy::barrier(const char* name, std::shared_ptr<OpState> state) {
  const int tag = next_tag();
  auto turns = local_->turns({{name, ShmCall{}}, {name, ShmCall{}}});
  std::optional<StepExecutor> across;
  if (leaders_) across = among_leaders(tag, dissemination_barrier(hosts_, leader_index_));
  // A barrier's messages are empty: its record counts no bytes on any path.
  return std::make_unique<HierarchicalOp>(name, std::move(state), std::move(turns[0]), std::move(across),
                                          std::move(turns[1]), 0);
}

}  // namespace harness
