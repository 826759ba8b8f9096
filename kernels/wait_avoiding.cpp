#include "wait_avoiding.hpp"

#include <algorithm>
#include <cstring>

namespace harness {

namespace {
constexpr int kActivationTag = 0;
}

WaitAvoidingOp::WaitAvoidingOp(std::shared_ptr<OpState> st, MPI_Comm comm, int rank, int size, int tag_ub,
                               WaConfig cfg, std::shared_ptr<WaShared> shared)
    : Op("wait_avoiding", std::move(st)),
      comm_(comm),
      rank_(rank),
      size_(size),
      tag_ub_(tag_ub),
      cfg_(std::move(cfg)),
      shared_(std::move(shared)) {
  post_listener();
}

WaitAvoidingOp::~WaitAvoidingOp() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void WaitAvoidingOp::post_listener() {
  check_mpi(MPI_Irecv(&act_buf_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kActivationTag, comm_, &act_req_),
            "MPI_Irecv(activation)");
}

void WaitAvoidingOp::join(Engine& e, int64_t k) {
  Slot& slot = rounds_[k];
  const bool sync = wa_is_sync_round(k, cfg_.sync_every);
  std::vector<int> members;
  if (sync) {
    members.resize(size_);
    for (int r = 0; r < size_; ++r) members[r] = r;
  } else {
    members = cfg_.phases[static_cast<size_t>(k % static_cast<int64_t>(cfg_.phases.size()))];
  }
  const int me = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  slot.work.reset(new float[cfg_.count > 0 ? cfg_.count : 1]);
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    std::memcpy(slot.work.get(), shared_->published.data(), sizeof(float) * cfg_.count);
    if (cfg_.accumulate) std::fill(shared_->published.begin(), shared_->published.end(), 0.0f);
    slot.info.staleness = k - shared_->published_round;
    slot.info.joined_early = shared_->published_round < k;
  }
  slot.info.round = k;
  slot.info.sync = sync;
  slot.info.group_size = static_cast<int>(members.size());
  slot.info.t_join = now();
  Schedule s = allreduce_schedule(static_cast<int>(members.size()), me, slot.work.get(), cfg_.count,
                                  cfg_.ring_threshold_bytes, e.links().allreduce_plan(members));
  std::vector<int> world = members;  // the op's communicator is a duplicate of the world
  slot.exec.emplace(comm_, members, world, tag_for(k), std::move(s));
  next_join_ = k + 1;
}

void WaitAvoidingOp::send_to_all(Engine& e, int64_t value) {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto payload = std::make_unique<int64_t>(value);
    // Synchronous sends: when they complete the receiver has matched them, which lets close()
    // prove that no activation is left in flight.
    auto send = e.isend(comm_, r, r, payload.get(), 1, MPI_INT64_T, kActivationTag, true, nullptr);
    act_sends_.emplace_back(std::move(send), std::move(payload));
  }
}

void WaitAvoidingOp::activate(Engine& e, int64_t k) { send_to_all(e, k); }

void WaitAvoidingOp::on_activation(Engine& e, int64_t k) {
  while (next_join_ <= k && !wa_is_sync_round(next_join_, cfg_.sync_every)) join(e, next_join_);
}

void WaitAvoidingOp::notify_arrival(Engine& e, int64_t k) {
  send_to_all(e, -(k + 1));  // a notice, told from an activation (k >= 0) by its sign
  count_arrival(e, k);
}

void WaitAvoidingOp::count_arrival(Engine& e, int64_t k) {
  if (k >= next_join_) ++arrived_[k];
  apply_quorum(e);
}

void WaitAvoidingOp::apply_quorum(Engine& e) {
  // The latest round whose count reached the quorum is activated (on_activation joins every
  // round up to it). A synchronous round stops the joining; the caller joins that one, and the
  // count kept for the later round is applied again then.
  arrived_.erase(arrived_.begin(), arrived_.lower_bound(next_join_));
  for (auto it = arrived_.rbegin(); it != arrived_.rend(); ++it) {
    if (it->second >= cfg_.quorum) {
      on_activation(e, it->first);
      break;
    }
  }
  arrived_.erase(arrived_.begin(), arrived_.lower_bound(next_join_));
}

bool WaitAvoidingOp::deliver(Engine& e, int64_t k, Slot& slot) {
  if (!slot.done || !slot.state) return false;
  std::memcpy(slot.out, slot.work.get(), sizeof(float) * cfg_.count);
  *slot.info_out = slot.info;
  e.add_record({slot.info.sync ? "wa_sync_round" : "wa_group_round", slot.state->t_post, slot.info.t_join,
                slot.info.t_done, slot.bytes, k});
  slot.state->finish();
  rounds_.erase(k);
  return true;
}

bool WaitAvoidingOp::progress(Engine& e) {
  bool any = false;
  std::deque<WaShared::Arrival> arrivals;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    arrivals.swap(shared_->arrivals);
    if (shared_->close_requested) closing_ = true;
  }
  for (auto& a : arrivals) {
    any = true;
    a.state->t_start = now();
    const int64_t k = a.round;
    if (k >= next_join_) {
      if (wa_is_sync_round(k, cfg_.sync_every)) {
        if (k != next_join_)
          throw CommError("wait-avoiding allreduce: round " + std::to_string(k) +
                          " reached before round " + std::to_string(next_join_));
        join(e, k);
        if (cfg_.quorum > 1) apply_quorum(e);
      } else if (cfg_.quorum > 1) {
        notify_arrival(e, k);  // may_activate is ignored: the quorum activates
      } else if (a.may_activate) {
        activate(e, k);
        on_activation(e, k);
      }
    }
    Slot& slot = rounds_[k];  // exists if joined; otherwise waits for the activation
    slot.out = a.out;
    slot.state = a.state;
    slot.info_out = a.info;
    deliver(e, k, slot);
  }

  // Activations (k >= 0; possibly several, possibly duplicates) and, with a quorum, arrival
  // notices (-(k+1)) from other ranks.
  for (;;) {
    int flag = 0;
    MPI_Status status;
    check_mpi(MPI_Test(&act_req_, &flag, &status), "MPI_Test(activation)");
    if (!flag) break;
    any = true;
    int64_t k = act_buf_;
    post_listener();
    if (k < 0)
      count_arrival(e, -k - 1);
    else
      on_activation(e, k);
  }

  for (auto it = rounds_.begin(); it != rounds_.end();) {
    Slot& slot = it->second;
    const int64_t k = it->first;
    ++it;  // deliver() may erase the slot
    if (!slot.exec || slot.done) continue;
    if (slot.exec->progress(e, &slot.bytes)) any = true;
    if (slot.exec->done()) {
      slot.done = true;
      slot.info.t_done = now();
      slot.exec.reset();
      deliver(e, k, slot);
    }
  }

  for (auto it = act_sends_.begin(); it != act_sends_.end();) {
    if (e.test_send(*it->first)) {
      it = act_sends_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }

  if (closing_) {
    bool idle = act_sends_.empty() &&
                std::all_of(rounds_.begin(), rounds_.end(), [](const auto& kv) { return !kv.second.exec; });
    if (idle && barrier_req_ == MPI_REQUEST_NULL) {
      // Everyone's activations were matched before anyone enters the barrier, so after it no
      // activation is in flight and the listener can be cancelled.
      check_mpi(MPI_Ibarrier(comm_, &barrier_req_), "MPI_Ibarrier");
      any = true;
    }
    if (barrier_req_ != MPI_REQUEST_NULL) {
      int flag = 0;
      check_mpi(MPI_Test(&barrier_req_, &flag, MPI_STATUS_IGNORE), "MPI_Test(barrier)");
      if (flag) {
        MPI_Cancel(&act_req_);
        MPI_Wait(&act_req_, MPI_STATUS_IGNORE);
        for (auto& kv : rounds_)
          if (kv.second.state) kv.second.state->finish("wait-avoiding allreduce closed before the round completed");
        rounds_.clear();
        finished_ = true;
        any = true;
      }
    }
  }
  return any;
}

void WaitAvoidingOp::abort(Engine& e, const std::string& reason) {
  (void)e;
  if (act_req_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&act_req_);
    MPI_Request_free(&act_req_);
  }
  for (auto& kv : rounds_) {
    if (kv.second.exec) kv.second.exec->abort();
    if (kv.second.state) kv.second.state->finish(reason);
  }
  rounds_.clear();
  for (auto& s : act_sends_) {
    s.first->cancelled = true;
    // MPI may still read a posted payload after we are gone: leak it rather than free it.
    if (s.first->posted && !s.first->complete) s.second.release();
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (auto& a : shared_->arrivals) a.state->finish(reason);
  shared_->arrivals.clear();
}

}  // namespace harness
