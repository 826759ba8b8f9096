// Shared basics of the native collective layer: the one error type and its kinds, the clock, op
// state.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

namespace harness {

// What kind of failure a CommError reports. The kind travels with the error from the progress
// thread to the caller, and bindings.cpp raises the Python exception of its kind (harness.comm:
// kPeerLost as PeerLostError, which the watchdog counts as a consequence of another rank's death,
// not as this rank's own fault). Python reads the kinds from harness._core.ErrorKind.
enum class ErrorKind : int {
  kLocal = 0,     // this rank's own call or state: bad arguments, buffers that differ across ranks,
                  // an operation on a closed communicator
  kPeerLost = 1,  // another rank's process died or its connection was lost
  kTimeout = 2,   // a wait gave up before the operation ended; the operation may still end
  kInternal = 3,  // a failure inside the native layer itself (out of memory, a bug)
};

// The single exception type of the native layer: a message and its kind.
class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& what, ErrorKind kind = ErrorKind::kLocal)
      : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  // The same error, its message preceded by `context` (what the caller was doing).
  CommError in_context(const std::string& context) const { return CommError(context + what(), kind_); }

 private:
  ErrorKind kind_;
};

// Seconds on CLOCK_MONOTONIC: the same clock as Python's time.monotonic(), common to all
// processes of one host, so native op records and Python step records line up.
inline double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline std::string mpi_error_string(int err) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  return std::string(msg, static_cast<size_t>(len));
}

// Whether MPI error `err` is about this rank's own call (bad arguments, a message longer than
// the receive) rather than about the peer it waited on: only those are this rank's fault.
inline bool is_local_mpi_error(int err) {
  int cls = MPI_ERR_OTHER;
  MPI_Error_class(err, &cls);
  switch (cls) {
    case MPI_ERR_BUFFER: case MPI_ERR_COUNT: case MPI_ERR_TYPE: case MPI_ERR_TAG: case MPI_ERR_COMM:
    case MPI_ERR_RANK: case MPI_ERR_REQUEST: case MPI_ERR_ROOT: case MPI_ERR_GROUP: case MPI_ERR_OP:
    case MPI_ERR_ARG: case MPI_ERR_TRUNCATE: case MPI_ERR_NO_MEM:
      return true;
    default:
      return false;
  }
}

// What a surviving rank sees of another rank's death: MPI fails a call that involves it (a send
// to it, a receive from it, a wait on it) with an error that is not about the call itself
// (MPICH: a closed connection, "Communication error with rank N", or MPIX_ERR_PROC_FAILED).
// The CommError of MPI error `rc` of call `what`: kLocal when it is about the call
// (is_local_mpi_error), else kPeerLost.
inline CommError mpi_failure(int rc, const char* what) {
  const std::string msg = std::string(what) + " failed: " + mpi_error_string(rc);
  if (is_local_mpi_error(rc)) return CommError(msg);
  return CommError(msg + " (a peer's process died or its connection was lost)", ErrorKind::kPeerLost);
}

// Throws mpi_failure(rc, what) when an MPI call fails.
inline void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw mpi_failure(rc, what);
}

// The error of a receive of `count` floats from member `peer` (world rank `world_rank`) that
// MPI failed with `err`. Only MPI_ERR_TRUNCATE means the sender's buffer was longer than this
// rank's; any other error is MPI losing the sender, and saying "buffer lengths differ" then
// would send the user after the wrong rank.
inline CommError failed_receive(int err, int peer, int world_rank, int64_t count, const char* type = "float32") {
  int cls = MPI_ERR_OTHER;
  MPI_Error_class(err, &cls);
  const std::string who = "member " + std::to_string(peer) + " (rank " + std::to_string(world_rank) + ")";
  if (cls == MPI_ERR_TRUNCATE)
    return CommError("size mismatch: " + who + " sent more than the " + std::to_string(count) + " " +
                     (std::string(type) == "float32" ? std::string("floats") : std::string(type) + " elements") +
                     " this rank expects (buffer lengths differ across ranks)");
  return CommError("the receive from " + who + " failed: " + mpi_error_string(err) +
                       " (its process died or its connection was lost)",
                   ErrorKind::kPeerLost);
}

// The same for a receive from any rank (a listener), which failed with `err`: `too_long` says
// what a longer message means; any other error is a lost peer.
inline CommError failed_any_source_receive(int err, const std::string& too_long) {
  int cls = MPI_ERR_OTHER;
  MPI_Error_class(err, &cls);
  if (cls == MPI_ERR_TRUNCATE) return CommError(too_long);
  return CommError("a listener's receive failed: " + mpi_error_string(err) +
                       " (a peer's process died or its connection was lost)",
                   ErrorKind::kPeerLost);
}

// Completion state of one posted operation, shared by the caller's handle and the progress
// thread. The caller blocks on the condition variable (never spins).
struct OpState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::optional<CommError> error;  // none on success
  double t_post = 0, t_start = 0, t_end = 0;
  std::function<void()> on_done;  // see when_done
  // Requests of this op that MPI may still use after it ended (Quarantine): until they are
  // done, the memory the caller lent the op must stay alive (bindings.cpp keeps it).
  int quarantined = 0;

  // Ends the op: with `err`, or successfully without.
  void finish(std::optional<CommError> err = std::nullopt) {
    std::function<void()> callback;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      done = true;
      error = std::move(err);
      t_end = now();
      callback = std::move(on_done);
    }
    cv.notify_all();
    if (callback) callback();
  }

  // The progress thread took the op up (under the lock: a caller may read the times meanwhile).
  void mark_started() {
    std::lock_guard<std::mutex> lock(mu);
    t_start = now();
  }

  // Calls `callback` once the op is done: at once (on this thread) if it is, else on the thread
  // that finishes it (the progress thread), which must not block in it. One callback per op.
  void when_done(std::function<void()> callback) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!done) {
        on_done = std::move(callback);
        return;
      }
    }
    callback();
  }

  bool is_done() {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }

  // Whether the op is done and MPI uses none of the memory the caller lent it any more.
  bool buffers_free() {
    std::lock_guard<std::mutex> lock(mu);
    return done && quarantined == 0;
  }

  // Waits until done or until timeout_s elapses (negative: no limit). Returns false on timeout.
  bool wait(double timeout_s) {
    std::unique_lock<std::mutex> lock(mu);
    if (timeout_s < 0) {
      cv.wait(lock, [&] { return done; });
      return true;
    }
    return cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return done; });
  }

  // Throws the error the op ended with, if any: a caller must learn why its op failed.
  void throw_if_failed() {
    std::lock_guard<std::mutex> lock(mu);
    if (error) throw *error;
  }
};

// Ids of finished operations, for a caller thread that waits for whichever finishes next
// (harness.dist completes torch futures with it): pushed by the progress thread, popped by a
// caller that sleeps on the condition variable meanwhile (never spins).
class CompletionQueue {
 public:
  void push(int64_t id) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(id);
    }
    cv_.notify_one();
  }
  // The next id; -1 after close() once the queue is empty, -2 on timeout (negative: none).
  int64_t pop(double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return !ready_.empty() || closed_; };
    if (timeout_s < 0)
      cv_.wait(lock, ready);
    else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready))
      return -2;
    if (ready_.empty()) return -1;
    int64_t id = ready_.front();
    ready_.pop_front();
    return id;
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int64_t> ready_;
  bool closed_ = false;
};

}  // namespace harness
