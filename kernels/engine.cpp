#include "engine.hpp"

#include <algorithm>

namespace harness {

Engine::Engine(MPI_Comm parent, EngineOptions options) : opt_(options) {
  int provided = 0;
  check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  if (provided != MPI_THREAD_MULTIPLE)
    throw CommError("the native layer needs MPI initialized with MPI_THREAD_MULTIPLE (got level " +
                    std::to_string(provided) + "); import mpi4py with its default thread level");
  check_mpi(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
  // Errors come back as codes and become CommError instead of aborting the process.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  void* attr = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &attr, &flag);
  if (flag) tag_ub_ = *static_cast<int*>(attr);
  links_.set_self(rank_);
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  shutdown();
  if (comm_ != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
}

MPI_Comm Engine::dup_comm() {
  MPI_Comm c;
  check_mpi(MPI_Comm_dup(comm_, &c), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  return c;
}

std::shared_ptr<OpState> Engine::submit(std::unique_ptr<Op> op) {
  auto state = op->state();
  state->t_post = now();
  {
    std::lock_guard<std::mutex> lock(qmu_);
    if (stop_requested_) throw CommError("communicator is shut down: " + stop_reason_);
    incoming_.push_back(std::move(op));
  }
  qcv_.notify_one();
  return state;
}

void Engine::wake() {
  {
    std::lock_guard<std::mutex> lock(qmu_);
    woken_ = true;
  }
  qcv_.notify_one();
}

void Engine::shutdown(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(qmu_);
    if (!stop_requested_) {
      stop_requested_ = true;
      stop_reason_ = reason;
    }
  }
  qcv_.notify_one();
  if (thread_.joinable()) thread_.join();
  stopped_.store(true);
}

std::vector<OpRecord> Engine::drain_records() {
  std::lock_guard<std::mutex> lock(rec_mu_);
  std::vector<OpRecord> out;
  out.swap(records_);
  return out;
}

void Engine::add_record(OpRecord rec) {
  std::lock_guard<std::mutex> lock(rec_mu_);
  records_.push_back(std::move(rec));
}

std::shared_ptr<SendReq> Engine::isend(MPI_Comm comm, int peer, int world_peer, const void* buf, int count,
                                       MPI_Datatype type, int tag, bool synchronous, int64_t* bytes_counter) {
  int type_size = 0;
  MPI_Type_size(type, &type_size);
  double bytes = static_cast<double>(count) * type_size;
  if (bytes_counter) *bytes_counter += static_cast<int64_t>(bytes);
  auto send = std::make_shared<SendReq>();
  double t = now();
  double release = links_.release_time(world_peer, bytes, t);
  Deferred d{release, deferred_seq_++, comm, peer, buf, count, type, tag, synchronous, send};
  if (release <= t)
    post_send(d);
  else
    deferred_.push(d);
  return send;
}

void Engine::post_send(const Deferred& d) {
  int rc = d.synchronous ? MPI_Issend(d.buf, d.count, d.type, d.peer, d.tag, d.comm, &d.send->req)
                         : MPI_Isend(d.buf, d.count, d.type, d.peer, d.tag, d.comm, &d.send->req);
  check_mpi(rc, d.synchronous ? "MPI_Issend" : "MPI_Isend");
  d.send->posted = true;
}

bool Engine::test_send(SendReq& s) {
  if (s.complete) return true;
  if (!s.posted) return false;
  int flag = 0;
  check_mpi(MPI_Test(&s.req, &flag, MPI_STATUS_IGNORE), "MPI_Test(send)");
  if (flag) s.complete = true;
  return s.complete;
}

bool Engine::release_due_sends(double t) {
  bool any = false;
  while (!deferred_.empty() && deferred_.top().release <= t) {
    Deferred d = deferred_.top();
    deferred_.pop();
    if (!d.send->cancelled) post_send(d);
    any = true;
  }
  return any;
}

void Engine::finish_op(Op& op, const std::string& error) {
  auto& st = op.state();
  if (op.traced() && error.empty()) {
    std::lock_guard<std::mutex> lock(rec_mu_);
    records_.push_back({op.name(), st->t_post, st->t_start, now(), op.bytes_sent, op.round});
  }
  st->finish(error);
}

void Engine::run() {
  double last_progress = now();
  double sleep_s = 1e-6;
  std::string reason;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(qmu_);
      if (stop_requested_) {
        reason = stop_reason_;
        break;
      }
      while (!incoming_.empty()) {
        incoming_.front()->state()->t_start = now();
        active_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
        last_progress = now();
      }
      woken_ = false;
    }

    bool progressed = release_due_sends(now());
    for (auto& op : active_) {
      try {
        if (op->progress(*this)) progressed = true;
      } catch (const CommError& e) {
        op->abort(*this, e.what());
        finish_op(*op, e.what());
        op.reset();
      } catch (const std::exception& e) {
        op->abort(*this, std::string("internal error: ") + e.what());
        finish_op(*op, std::string("internal error: ") + e.what());
        op.reset();
      }
      if (op && op->finished()) {
        finish_op(*op, std::string());
        op.reset();
      }
    }
    active_.erase(std::remove(active_.begin(), active_.end(), nullptr), active_.end());

    double t = now();
    if (progressed) {
      last_progress = t;
      sleep_s = 1e-6;
      continue;
    }
    bool only_passive = std::all_of(active_.begin(), active_.end(), [](const auto& op) { return op->passive(); });
    std::unique_lock<std::mutex> lock(qmu_);
    if (!incoming_.empty() || stop_requested_ || woken_) continue;
    if (active_.empty() && deferred_.empty()) {
      qcv_.wait(lock, [&] { return !incoming_.empty() || stop_requested_ || woken_; });
      last_progress = now();
      continue;
    }
    if (!only_passive && t - last_progress < opt_.spin_s) {
      lock.unlock();
      std::this_thread::yield();
      continue;
    }
    double cap = only_passive ? opt_.passive_sleep_s : opt_.max_sleep_s;
    sleep_s = std::min(sleep_s * 2, cap);
    double wait_s = sleep_s;
    if (!deferred_.empty()) wait_s = std::min(wait_s, std::max(0.0, deferred_.top().release - t));
    qcv_.wait_for(lock, std::chrono::duration<double>(wait_s),
                  [&] { return !incoming_.empty() || stop_requested_ || woken_; });
  }

  // Shutdown: fail what is still running or queued; cancel what MPI lets us cancel.
  {
    std::lock_guard<std::mutex> lock(qmu_);
    while (!incoming_.empty()) {
      active_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
    }
  }
  for (auto& op : active_) {
    try {
      op->abort(*this, reason);
    } catch (...) {
    }
    op->state()->finish(reason);
  }
  active_.clear();
  while (!deferred_.empty()) deferred_.pop();
}

}  // namespace harness
