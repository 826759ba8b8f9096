#include "wait_avoiding_caller.hpp"

#include <algorithm>
#include <cstring>

namespace harness {

namespace {

// Sorts each phase's group and checks it: ranks in range, no duplicates, this rank a member.
void check_phases(std::vector<std::vector<int>>& phases, int rank, int size) {
  if (phases.empty()) throw CommError("the wait-avoiding allreduce needs at least one phase of groups");
  for (size_t j = 0; j < phases.size(); ++j) {
    auto& g = phases[j];
    std::sort(g.begin(), g.end());
    for (int r : g) check_rank(r, size, "group member");
    if (std::adjacent_find(g.begin(), g.end()) != g.end())
      throw CommError("group of phase " + std::to_string(j) + " contains duplicate ranks");
    if (std::find(g.begin(), g.end(), rank) == g.end())
      throw CommError("group of phase " + std::to_string(j) + " does not contain this rank (" +
                      std::to_string(rank) + ")");
  }
}

}  // namespace

void WaitAvoiding::open_shared_memory(WaConfig& cfg) {
  // Collective: every rank takes part in each phase's split (its group's members together),
  // in phase order, then in the one of all ranks.
  SharedComm comm = engine_->dup_comm();
  const int rank = engine_->rank(), size = engine_->size();
  std::vector<int> everyone(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) everyone[r] = r;
  std::string why_not;  // a segment that cannot be made leaves the message path (the Communicator warned once)
  for (const std::vector<int>& group : cfg.phases) {
    MPI_Comm split = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm->get(), group.front(), rank, &split), "MPI_Comm_split(wait-avoiding group)");
    MpiComm members(split);
    // The group's members must agree on it (phases from harness.schedules do); otherwise the
    // message path reports what is wrong.
    int n = 0;
    MPI_Comm_size(split, &n);
    std::vector<int> seen(static_cast<size_t>(n));
    check_mpi(MPI_Allgather(&rank, 1, MPI_INT, seen.data(), 1, MPI_INT, split), "MPI_Allgather(wait-avoiding group)");
    int agree = seen == group ? 1 : 0, all = 0;
    check_mpi(MPI_Allreduce(&agree, &all, 1, MPI_INT, MPI_MIN, split), "MPI_Allreduce(wait-avoiding group)");
    cfg.shm_phases.push_back(all ? ShmChannel::open_on_host(split, group, &why_not) : nullptr);
    if (cfg.shm_phases.back()) ++shm_phases_;
  }
  cfg.shm_sync = ShmChannel::open_on_host(comm->get(), everyone, &why_not);
}

WaitAvoiding::WaitAvoiding(std::shared_ptr<Engine> engine, FloatSpan initial, int sync_every, bool accumulate,
                           std::vector<std::vector<int>> phases, int64_t ring_threshold_bytes, int quorum)
    : engine_(std::move(engine)),
      count_(initial.count),
      accumulate_(accumulate),
      shared_(std::make_shared<WaShared>()) {
  // Checked before the collective below, so a bad argument fails before any rank commits.
  if (sync_every < 0) throw CommError("sync_every must be >= 0 (got " + std::to_string(sync_every) + ")");
  check_phases(phases, engine_->rank(), engine_->size());
  if (quorum < 1 || quorum > engine_->size())
    throw CommError("quorum must be in [1, " + std::to_string(engine_->size()) + "] (the number of ranks; got " +
                    std::to_string(quorum) + ")");
  if (accumulate)
    shared_->published.assign(static_cast<size_t>(count_), 0.0f);
  else
    shared_->published.assign(initial.data, initial.data + count_);
  WaConfig cfg;
  cfg.count = count_;
  cfg.sync_every = sync_every;
  cfg.accumulate = accumulate;
  cfg.quorum = quorum;
  cfg.phases = std::move(phases);
  cfg.ring_threshold_bytes = ring_threshold_bytes;
  open_shared_memory(cfg);
  op_state_ = engine_->submit(std::make_unique<WaitAvoidingOp>(std::make_shared<OpState>(), engine_->dup_comm(), engine_->rank(),
                                                               engine_->size(), engine_->tag_ub(), std::move(cfg),
                                                               shared_));
}

WaitAvoiding::Round WaitAvoiding::iround(FloatSpan buf, FloatSpan out, bool may_activate) {
  if (closed_) throw CommError("wait-avoiding allreduce is closed");
  if (!engine_->running()) throw CommError("communicator is shut down");
  if (buf.count != count_ || out.count != count_)
    throw CommError("wait-avoiding allreduce carries " + std::to_string(count_) + " floats; got buffers of " +
                    std::to_string(buf.count) + " and " + std::to_string(out.count));
  Round r{std::make_shared<OpState>(), std::make_shared<RoundInfo>()};
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    // An op that failed takes no more arrivals: nothing would ever finish this one.
    if (shared_->error) throw shared_->error->in_context("wait-avoiding allreduce failed: ");
    float* pub = shared_->published.data();
    if (accumulate_)
      for (int64_t i = 0; i < count_; ++i) pub[i] += buf.data[i];
    else
      std::memcpy(pub, buf.data, sizeof(float) * count_);
    // Numbered under the lock that queues the arrival, so arrivals reach the progress thread in
    // round order.
    const int64_t k = next_round_++;
    shared_->published_round = k;
    r.state->t_post = now();
    shared_->arrivals.push_back({k, may_activate, out.data, r.state, r.info});
  }
  engine_->wake();
  return r;
}

void WaitAvoiding::close() {
  if (closed_.exchange(true)) return;
  close_persistent_op(*engine_, *shared_, *op_state_);
}

}  // namespace harness
