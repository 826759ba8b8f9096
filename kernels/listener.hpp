// The base of the persistent ops that listen: the push channel's listener, the pairwise
// averager's and the wait-avoiding allreduce's. Each listens on a communicator of its own for
// messages from any rank that may come at any time (or never), ends with a collective close (a
// nonblocking barrier, then whatever was matched is received), and on abort hands what MPI may
// still use to the engine's quarantine.
//
// Listening never keeps an MPI_ANY_SOURCE receive posted: it polls a matched probe
// (MPI_Improbe(MPI_ANY_SOURCE)) and receives what it matched (MPI_Imrecv). MPICH's ch4:ucx
// netmod loses MPI_ANY_SOURCE receives that UCX completes at once from its unexpected queue (a
// message that came while no receive was posted): the MPI request never completes, the message
// is gone, and a peer's synchronous send to it never completes. Over shared memory (one host)
// that cannot be seen; across hosts the listener went deaf after a few messages.
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

  // Listens for one message of up to `count` elements of `type` with `tag` (or MPI_ANY_TAG) from
  // any rank, to be received into `buf`.
  void listen(void* buf, int count, MPI_Datatype type, int tag, const char* what);
  bool listening() const { return listening_; }
  // Probes for (and receives) the message listened for: true (and `status`) once it is in the
  // buffer; the op is then no longer listening. A message longer than the buffer fails with
  // `too_long`; any other failure is a lost peer.
  bool heard(MPI_Status& status, const std::string& too_long);
  // Stops listening (once no message can be in flight: every sender's synchronous send is done):
  // true (and `status`) when a message had been matched, which is then received.
  bool stop_listening(MPI_Status& status, const char* what);

  // The closing barrier: posted at the first call, true once every rank has entered it.
  bool closing_barrier_done(const char* what);
  bool closing_barrier_posted() const { return barrier_ != MPI_REQUEST_NULL; }

  // What keeps the listening receive's buffer alive, handed over at abort.
  virtual std::shared_ptr<void> surrender_staging() = 0;
  // The rest of the op's abort: its own sends to the quarantine, its callers' states failed.
  virtual void abort_rest(Engine& e, const CommError& error) = 0;

 private:
  // Matches the next message, if one came, and posts its receive.
  void probe(const std::string& too_long);

  SharedComm comm_;
  bool listening_ = false;
  void* buf_ = nullptr;
  int count_ = 0;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  int tag_ = 0;
  const char* what_ = "";
  MPI_Request recv_req_ = MPI_REQUEST_NULL;  // the receive of a matched message, until it completes
  MPI_Request barrier_ = MPI_REQUEST_NULL;
};

// A send a listener owns, with the buffer it sends from.
template <class Buffer>
struct OwnedSend {
  std::shared_ptr<SendReq> req;
  std::shared_ptr<Buffer> buf;
};

}  // namespace harness
