// The base of the persistent ops that listen: the push channel's listener, the pairwise
// averager's and the wait-avoiding allreduce's. Each keeps one receive from any rank posted on a
// communicator of its own, for messages that may come at any time (or never), ends with a
// collective close (a nonblocking barrier, then the listening receive is cancelled), and on abort
// hands what MPI may still use to the engine's quarantine.
#pragma once

#include <memory>
#include <string>

#include "engine.hpp"

namespace harness {

class ListenerOp : public Op {
 public:
  bool traced() const override { return false; }
  // The listening receive and the closing barrier go to the quarantine (the receive with the
  // buffer it writes into, surrender_staging()); then abort_rest.
  void abort(Engine& e, const CommError& error) final;

 protected:
  ListenerOp(std::string name, std::shared_ptr<OpState> st, SharedComm comm);

  MPI_Comm comm() const { return comm_->get(); }
  const SharedComm& shared_comm() const { return comm_; }

  // Posts the listening receive of up to `count` elements of `type` with `tag` from any rank.
  void listen(void* buf, int count, MPI_Datatype type, int tag, const char* what);
  bool listening() const { return listen_req_ != MPI_REQUEST_NULL; }
  // Tests the listening receive: true (and `status`) once a message arrived; it is then no longer
  // posted. A message longer than the buffer fails with `too_long`; any other failure is a lost
  // peer.
  bool heard(MPI_Status& status, const std::string& too_long);
  // Cancels the listening receive (once no message can be in flight): true (and `status`) when
  // a message had arrived before the cancel took.
  bool stop_listening(MPI_Status& status, const char* what);

  // The closing barrier: posted at the first call, true once every rank has entered it.
  bool closing_barrier_done(const char* what);
  bool closing_barrier_posted() const { return barrier_ != MPI_REQUEST_NULL; }

  // What keeps the listening receive's buffer alive, handed over at abort.
  virtual std::shared_ptr<void> surrender_staging() = 0;
  // The rest of the op's abort: its own sends to the quarantine, its callers' states failed.
  virtual void abort_rest(Engine& e, const CommError& error) = 0;

 private:
  SharedComm comm_;
  MPI_Request listen_req_ = MPI_REQUEST_NULL;
  MPI_Request barrier_ = MPI_REQUEST_NULL;
};

// A send a listener owns, with the buffer it sends from.
template <class Buffer>
struct OwnedSend {
  std::shared_ptr<SendReq> req;
  std::shared_ptr<Buffer> buf;
};

}  // namespace harness
