#include "listener.hpp"

namespace harness {

ListenerOp::ListenerOp(std::string name, std::shared_ptr<OpState> st, SharedComm comm)
    : Op(std::move(name), std::move(st)), comm_(std::move(comm)) {}

void ListenerOp::listen(void* buf, int count, MPI_Datatype type, int tag, const char* what) {
  check_mpi(MPI_Irecv(buf, count, type, MPI_ANY_SOURCE, tag, comm(), &listen_req_), what);
}

bool ListenerOp::heard(MPI_Status& status, const std::string& too_long) {
  if (listen_req_ == MPI_REQUEST_NULL) return false;
  int flag = 0;
  if (int rc = MPI_Test(&listen_req_, &flag, &status); rc != MPI_SUCCESS) throw failed_any_source_receive(rc, too_long);
  return flag != 0;  // a completed request is MPI_REQUEST_NULL again
}

bool ListenerOp::stop_listening(MPI_Status& status, const char* what) {
  if (listen_req_ == MPI_REQUEST_NULL) return false;
  MPI_Cancel(&listen_req_);
  check_mpi(MPI_Wait(&listen_req_, &status), what);
  int cancelled = 0;
  MPI_Test_cancelled(&status, &cancelled);
  return !cancelled;
}

bool ListenerOp::closing_barrier_done(const char* what) {
  if (barrier_ == MPI_REQUEST_NULL) check_mpi(MPI_Ibarrier(comm(), &barrier_), what);
  int flag = 0;
  check_mpi(MPI_Test(&barrier_, &flag, MPI_STATUS_IGNORE), what);
  return flag != 0;
}

void ListenerOp::abort(Engine& e, const CommError& error) {
  if (listen_req_ != MPI_REQUEST_NULL) e.abandon_recv(listen_req_, surrender_staging());
  if (barrier_ != MPI_REQUEST_NULL) e.abandon_collective(barrier_);
  abort_rest(e, error);
}

}  // namespace harness
