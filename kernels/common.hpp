// Shared basics of the native collective layer: the one error type, the clock, op state.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
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

// Throws CommError with the MPI error string when an MPI call fails.
inline void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw CommError(std::string(what) + " failed: " + std::string(msg, static_cast<size_t>(len)));
}

// Completion state of one posted operation, shared by the caller's handle and the progress
// thread. The caller blocks on the condition variable (never spins).
struct OpState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;  // empty on success
  double t_post = 0, t_start = 0, t_end = 0;

  void finish(const std::string& err = std::string()) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      done = true;
      error = err;
      t_end = now();
    }
    cv.notify_all();
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

}  // namespace harness
