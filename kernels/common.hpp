// Shared basics of the native collective layer: the one error type, the clock, op state.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>

namespace harness {

// The single exception type of the native layer; bindings map it to harness.comm.CommError.
class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& what) : std::runtime_error(what) {}
};

// Seconds on CLOCK_MONOTONIC: the same clock as Python's time.monotonic(), common to all
// processes of one host, so native op records and Python step records line up.
inline double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// What a surviving rank sees of another rank's death: MPI fails a receive from it, or a call
// that waits on it, with an error that is not about the message itself (MPICH: a closed
// connection, "Communication error with rank N", or MPIX_ERR_PROC_FAILED). Such an error's
// message begins with kPeerLost, which survives being carried as an op's error string, so that
// Python raises it as harness.comm.PeerLostError and the watchdog counts it as a consequence.
constexpr const char kPeerLost[] = "peer lost: ";

inline bool is_peer_lost(const std::string& what) { return what.rfind(kPeerLost, 0) == 0; }

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

// Throws CommError with the MPI error string when an MPI call fails; a failure that is not
// about the call itself (is_local_mpi_error) is reported as a lost peer.
inline void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  const std::string msg = std::string(what) + " failed: " + mpi_error_string(rc);
  if (is_local_mpi_error(rc)) throw CommError(msg);
  throw CommError(kPeerLost + msg + " (a peer's process died or its connection was lost)");
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
  return CommError(std::string(kPeerLost) + "the receive from " + who + " failed: " + mpi_error_string(err) +
                   " (its process died or its connection was lost)");
}

// The same for a receive from any rank (a listener), which failed with `err`: `too_long` says
// what a longer message means; any other error is a lost peer.
inline CommError failed_any_source_receive(int err, const std::string& too_long) {
  int cls = MPI_ERR_OTHER;
  MPI_Error_class(err, &cls);
  if (cls == MPI_ERR_TRUNCATE) return CommError(too_long);
  return CommError(std::string(kPeerLost) + "a listener's receive failed: " + mpi_error_string(err) +
                   " (a peer's process died or its connection was lost)");
}

// Completion state of one posted operation, shared by the caller's handle and the progress
// thread. The caller blocks on the condition variable (never spins).
struct OpState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;  // empty on success
  double t_post = 0, t_start = 0, t_end = 0;
  std::function<void()> on_done;  // see when_done

  void finish(const std::string& err = std::string()) {
    std::function<void()> callback;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      done = true;
      error = err;
      t_end = now();
      callback = std::move(on_done);
    }
    cv.notify_all();
    if (callback) callback();
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
    if (!error.empty()) throw CommError(error);
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
