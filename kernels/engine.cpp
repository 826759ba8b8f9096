#include "engine.hpp"

#include <algorithm>

namespace harness {

Engine::Engine(MPI_Comm parent, EngineOptions options) : opt_(options) {
  int provided = 0;
  check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  if (provided != MPI_THREAD_MULTIPLE)
    throw CommError("the native layer needs MPI initialized with MPI_THREAD_MULTIPLE (got level " +
                    std::to_string(provided) + "); import mpi4py with its default thread level");
  comm_ = share(MpiComm::dup(parent));
  MPI_Comm_rank(comm(), &rank_);
  MPI_Comm_size(comm(), &size_);
  void* attr = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm(), MPI_TAG_UB, &attr, &flag);
  if (flag) tag_ub_ = *static_cast<int*>(attr);
  links_.set_self(rank_);
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() { shutdown(); }

SharedComm Engine::dup_comm() { return share(MpiComm::dup(comm())); }

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
  {
    std::lock_guard<std::mutex> lock(join_mu_);
    if (thread_.joinable()) thread_.join();
  }
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
  if (rc != MPI_SUCCESS) {
    d.send->req = MPI_REQUEST_NULL;
    d.send->error = mpi_failure(rc, d.synchronous ? "MPI_Issend" : "MPI_Isend");
    return;
  }
  d.send->posted = true;
}

bool Engine::test_send(SendReq& s) {
  if (s.error) throw *s.error;
  if (s.complete) return true;
  if (!s.posted) return false;
  int flag = 0;
  check_mpi(MPI_Test(&s.req, &flag, MPI_STATUS_IGNORE), "MPI_Test(send)");
  if (flag) s.complete = true;
  return s.complete;
}

void Engine::abandon_send(SendReq& s, std::shared_ptr<void> keep, std::shared_ptr<OpState> lender) {
  s.cancelled = true;  // still deferred: release_due_sends drops it
  if (s.posted && !s.complete) quarantine_.admit(s.req, false, std::move(keep), std::move(lender));
  s.req = MPI_REQUEST_NULL;
}

void Engine::abandon_recv(MPI_Request& req, std::shared_ptr<void> keep, std::shared_ptr<OpState> lender) {
  quarantine_.admit(req, true, std::move(keep), std::move(lender));
  req = MPI_REQUEST_NULL;
}

void Engine::abandon_collective(MPI_Request& req) {
  quarantine_.admit(req, false, nullptr, nullptr);
  req = MPI_REQUEST_NULL;
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

void Engine::finish_op(Op& op, std::optional<CommError> error) {
  auto& st = op.state();
  if (op.traced() && !error) {
    double t_post, t_start;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      t_post = st->t_post;
      t_start = st->t_start;
    }
    std::lock_guard<std::mutex> lock(rec_mu_);
    records_.push_back({op.name(), t_post, t_start, now(), op.bytes_sent, op.round});
  }
  st->finish(std::move(error));
}

void Engine::run() {
  std::string reason;
  try {
    serve(reason);
    fail_all(CommError(reason));
  } catch (const std::exception& e) {
    // Nothing may escape the progress thread (that would end the process): a failure outside
    // any op fails every op, and the engine stops taking new ones.
    const CommError error(std::string("the progress thread failed: ") + e.what(), ErrorKind::kInternal);
    {
      std::lock_guard<std::mutex> lock(qmu_);
      if (!stop_requested_) {
        stop_requested_ = true;
        stop_reason_ = error.what();
      }
    }
    stopped_.store(true);
    fail_all(error);
  }
  quarantine_.abandon();
}

void Engine::serve(std::string& reason) {
  double last_progress = now();
  double sleep_s = 1e-6;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(qmu_);
      if (stop_requested_) {
        reason = stop_reason_;
        return;
      }
      while (!incoming_.empty()) {
        incoming_.front()->state()->mark_started();
        active_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
        last_progress = now();
      }
      woken_ = false;
    }

    bool progressed = release_due_sends(now());
    for (auto& op : active_) {
      // Every failure of an op's step becomes that op's error.
      std::optional<CommError> failure;
      try {
        if (op->progress(*this)) progressed = true;
      } catch (const CommError& e) {
        failure = e;
      } catch (const std::exception& e) {
        failure = CommError(std::string("internal error: ") + e.what(), ErrorKind::kInternal);
      }
      if (failure) {
        op->abort(*this, *failure);
        finish_op(*op, std::move(failure));
        op.reset();
      } else if (op->finished()) {
        finish_op(*op, std::nullopt);
        op.reset();
      }
    }
    active_.erase(std::remove(active_.begin(), active_.end(), nullptr), active_.end());
    if (!quarantine_.empty() && quarantine_.sweep()) progressed = true;

    double t = now();
    if (progressed) {
      last_progress = t;
      sleep_s = 1e-6;
      continue;
    }
    bool only_passive = std::all_of(active_.begin(), active_.end(), [](const auto& op) { return op->passive(); });
    std::unique_lock<std::mutex> lock(qmu_);
    if (!incoming_.empty() || stop_requested_ || woken_) continue;
    if (active_.empty() && deferred_.empty() && quarantine_.empty()) {
      qcv_.wait(lock, [&] { return !incoming_.empty() || stop_requested_ || woken_; });
      last_progress = now();
      continue;
    }
    if (!only_passive && t - last_progress < opt_.spin_s) {
      lock.unlock();
      std::this_thread::yield();
      continue;
    }
    // Quarantined requests alone wait like listeners: nobody waits for them.
    double cap = only_passive ? opt_.passive_sleep_s : opt_.max_sleep_s;
    sleep_s = std::min(sleep_s * 2, cap);
    double wait_s = sleep_s;
    if (!deferred_.empty()) wait_s = std::min(wait_s, std::max(0.0, deferred_.top().release - t));
    qcv_.wait_for(lock, std::chrono::duration<double>(wait_s),
                  [&] { return !incoming_.empty() || stop_requested_ || woken_; });
  }
}

void Engine::fail_all(const CommError& error) {
  // Shutdown: fail what is still running or queued; what MPI may still use goes to the quarantine.
  {
    std::lock_guard<std::mutex> lock(qmu_);
    while (!incoming_.empty()) {
      active_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
    }
  }
  for (auto& op : active_) {
    if (!op) continue;
    try {
      op->abort(*this, error);
    } catch (...) {
      // Its state is failed below all the same; the abort is best effort.
    }
    op->state()->finish(error);
  }
  active_.clear();
  while (!deferred_.empty()) deferred_.pop();
}

}  // namespace harness
