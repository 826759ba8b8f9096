// Requests an operation gave up on while MPI may still use their memory, and that memory.
//
// An operation aborts (a peer died, the communicator shut down, a size mismatch) with requests
// still posted: a cancelled receive may yet be matched and written into, a posted send may yet be
// read from, a nonblocking barrier can be neither cancelled nor freed. Freeing their buffers then
// would let MPI write into freed memory; leaking them would grow with every abort. Every op hands
// such requests here instead, with what keeps their memory alive (its scratch, staging and reply
// buffers) and, when its caller lent it memory, the caller's op state: the progress thread tests
// them, and once MPI is done with one (completed, cancelled or failed) its memory is let go. The
// caller's buffers stay with harness._core's handle until then (OpState::buffers_free).
//
// At shutdown, what MPI still holds (a send to a dead peer never completes) stays allocated on
// purpose: MPI may touch it until MPI_Finalize, and nothing can test it after the progress thread
// ended. Progress thread only.
#pragma once

#include <memory>
#include <vector>

#include "common.hpp"

namespace harness {

class Quarantine {
 public:
  Quarantine() = default;
  ~Quarantine() { abandon(); }
  Quarantine(const Quarantine&) = delete;
  Quarantine& operator=(const Quarantine&) = delete;

  // Takes `req` (cancelled first when `cancel`: receives only; sends and nonblocking collectives
  // are left to complete) with `keep`, the owner of the memory it uses (may be null), and
  // `lender`, the op whose caller lent it memory (may be null).
  void admit(MPI_Request req, bool cancel, std::shared_ptr<void> keep, std::shared_ptr<OpState> lender);
  // Tests every request; lets go of the memory of those MPI is done with. True if any was.
  bool sweep();
  bool empty() const { return held_.empty(); }
  // One last sweep; the memory of what is still pending is kept allocated for good.
  void abandon();

 private:
  struct Held {
    MPI_Request req;
    std::shared_ptr<void> keep;
    std::shared_ptr<OpState> lender;
  };
  static void release(Held& h);

  std::vector<Held> held_;
};

}  // namespace harness
