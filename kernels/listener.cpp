#include "listener.hpp"

namespace harness {

ListenerOp::ListenerOp(std::string name, std::shared_ptr<OpState> st, SharedComm comm)
    : Op(std::move(name), std::move(st)), comm_(std::move(comm)) {}

void ListenerOp::listen(void* buf, int count, MPI_Datatype type, int tag, const char* what) {
  buf_ = buf;
  count_ = count;
  type_ = type;
  tag_ = tag;
  what_ = what;
  listening_ = true;
}

void ListenerOp::probe(const std::string& too_long) {
  int flag = 0;
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status probed;
  if (int rc = MPI_Improbe(MPI_ANY_SOURCE, tag_, comm(), &flag, &message, &probed); rc != MPI_SUCCESS)
    throw failed_any_source_receive(rc, too_long);
  // A longer message fails the receive with MPI_ERR_TRUNCATE (too_long), as a posted receive did.
  if (flag) check_mpi(MPI_Imrecv(buf_, count_, type_, &message, &recv_req_), what_);
}

bool ListenerOp::heard(MPI_Status& status, const std::string& too_long) {
  if (!listening_) return false;
  if (recv_req_ == MPI_REQUEST_NULL) probe(too_long);
  if (recv_req_ == MPI_REQUEST_NULL) return false;
  int flag = 0;
  if (int rc = MPI_Test(&recv_req_, &flag, &status); rc != MPI_SUCCESS) throw failed_any_source_receive(rc, too_long);
  if (flag) listening_ = false;  // a completed request is MPI_REQUEST_NULL again
  return flag != 0;
}

bool ListenerOp::stop_listening(MPI_Status& status, const char* what) {
  if (!listening_) return false;
  listening_ = false;
  // Nothing is posted to cancel. A message matched by the last probe is received; a probe now
  // finds one only if it was sent without a synchronous send the closing barrier waited for.
  if (recv_req_ == MPI_REQUEST_NULL) probe(std::string(what) + ": a message longer than the listener's buffer");
  if (recv_req_ == MPI_REQUEST_NULL) return false;
  check_mpi(MPI_Wait(&recv_req_, &status), what);
  return true;
}

bool ListenerOp::closing_barrier_done(const char* what) {
  if (barrier_ == MPI_REQUEST_NULL) check_mpi(MPI_Ibarrier(comm(), &barrier_), what);
  int flag = 0;
  check_mpi(MPI_Test(&barrier_, &flag, MPI_STATUS_IGNORE), what);
  return flag != 0;
}

void ListenerOp::abort(Engine& e, const CommError& error) {
  // A matched message's receive cannot be cancelled: the quarantine keeps the buffer until it is done.
  if (recv_req_ != MPI_REQUEST_NULL) e.abandon_recv(recv_req_, surrender_staging());
  listening_ = false;
  if (barrier_ != MPI_REQUEST_NULL) e.abandon_collective(barrier_);
  abort_rest(e, error);
}

}  // namespace harness
