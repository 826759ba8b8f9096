#include "wait_avoiding.hpp"

#include <algorithm>
#include <cstring>

namespace harness {

namespace {
constexpr int kActivationTag = 0;
}

WaitAvoidingOp::WaitAvoidingOp(std::shared_ptr<OpState> st, SharedComm comm, int rank, int size, int tag_ub,
                               WaConfig cfg, std::shared_ptr<WaShared> shared)
    : ListenerOp("wait_avoiding", std::move(st), std::move(comm)),
      rank_(rank),
      size_(size),
      tag_ub_(tag_ub),
      cfg_(std::move(cfg)),
      shared_(std::move(shared)),
      act_buf_(std::make_shared<int64_t>(0)) {
  post_listener();
}

void WaitAvoidingOp::post_listener() {
  listen(act_buf_.get(), 1, MPI_INT64_T, kActivationTag, "MPI_Irecv(activation)");
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
  slot.work = std::shared_ptr<float[]>(new float[cfg_.count > 0 ? cfg_.count : 1]);
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
  StepProgram s = allreduce_program(static_cast<int>(members.size()), me, slot.work.get(), cfg_.count,
                                  cfg_.ring_threshold_bytes, e.links().allreduce_plan(members));
  next_join_ = k + 1;
  if (join_on_shm(e, slot, members, s)) return;
  std::vector<int> world = members;  // the op's communicator is a duplicate of the world
  slot.exec.emplace(shared_comm(), members, world, tag_for(k), std::move(s));
}

bool WaitAvoidingOp::join_on_shm(Engine& e, Slot& slot, const std::vector<int>& members, const StepProgram& program) {
  const int64_t k = slot.info.round;
  ShmChannel* channel =
      slot.info.sync ? cfg_.shm_sync.get()
                     : cfg_.shm_phases[static_cast<size_t>(k % static_cast<int64_t>(cfg_.phases.size()))].get();
  if (!channel || !channel->wins(ShmKind::kAllreduce, cfg_.count * 4) || e.links().message_path_among(members))
    return false;
  // Every member joins the rounds of one group in increasing order, so the channel's turns
  // come in the same order everywhere.
  ShmCall call{ShmKind::kAllreduce, slot.work.get(), slot.work.get(), cfg_.count, 4,
               reduce_fn(DType::kF32, ReduceOp::kSum, "wait-avoiding round")};
  // The record counts the message path's bytes (ShmCall::record_bytes).
  slot.bytes = harness::bytes_sent(program);
  slot.turn = std::move(channel->turns({{slot.info.sync ? "wa_sync_round" : "wa_group_round", call}}).front());
  return true;
}

void WaitAvoidingOp::send_to_all(Engine& e, int64_t value) {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto payload = std::make_shared<int64_t>(value);
    // Synchronous sends: when they complete the receiver has matched them, which lets close()
    // prove that no activation is left in flight.
    auto send = e.isend(comm(), r, r, payload.get(), 1, MPI_INT64_T, kActivationTag, true, nullptr);
    act_sends_.push_back({std::move(send), std::move(payload)});
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
    a.state->mark_started();
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
  MPI_Status status;
  while (heard(status, "wait-avoiding allreduce: an activation message longer than one int64")) {
    any = true;
    const int64_t k = *act_buf_;
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
    if ((!slot.exec && !slot.turn) || slot.done) continue;
    bool finished = false;
    if (slot.turn) {
      bool moved = false;
      finished = slot.turn->poll(&moved);  // throws the round's error: abort_rest gives the turns up
      if (moved) any = true;
    } else {
      if (slot.exec->progress(e, &slot.bytes)) any = true;
      finished = slot.exec->done();
    }
    if (finished) {
      slot.done = true;
      slot.info.t_done = now();
      slot.exec.reset();
      slot.turn.reset();
      deliver(e, k, slot);
    }
  }

  for (auto it = act_sends_.begin(); it != act_sends_.end();) {
    if (e.test_send(*it->req)) {
      it = act_sends_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }

  if (closing_) {
    bool idle = act_sends_.empty() && std::all_of(rounds_.begin(), rounds_.end(), [](const auto& kv) {
                  return !kv.second.exec && !kv.second.turn;
                });
    // Everyone's activations were matched before anyone enters the barrier, so after it no
    // activation is in flight and the listener can stop.
    if (idle || closing_barrier_posted()) {
      if (!closing_barrier_posted()) any = true;
      if (closing_barrier_done("MPI_Ibarrier")) {
        stop_listening(status, "MPI_Wait(activation)");
        for (auto& kv : rounds_)
          if (kv.second.state)
            kv.second.state->finish(CommError("wait-avoiding allreduce closed before the round completed"));
        rounds_.clear();
        finished_ = true;
        any = true;
      }
    }
  }
  return any;
}

void WaitAvoidingOp::abort_rest(Engine& e, const CommError& error) {
  for (auto& kv : rounds_) {
    Slot& slot = kv.second;
    // A round's allreduce works in slot.work: it goes to the quarantine with the requests.
    if (slot.exec) slot.exec->abort(e, nullptr, slot.work);
    if (slot.turn) slot.turn->give_up(error);
    if (slot.state) slot.state->finish(error);
  }
  rounds_.clear();
  for (auto& s : act_sends_) e.abandon_send(*s.req, s.buf);
  act_sends_.clear();
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (auto& a : shared_->arrivals) a.state->finish(error);
  shared_->arrivals.clear();
  shared_->error = error;
}

}  // namespace harness
