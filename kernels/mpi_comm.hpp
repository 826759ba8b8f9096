// The one owner of an MPI communicator the native layer creates (duplicates, groups).
//
// MpiComm frees its communicator when it goes, unless MPI is already finalized (freeing then is
// an error: Python's atexit may drop the last reference after mpi4py finalized MPI). Every such
// communicator returns errors as codes (MPI_ERRORS_RETURN), which become CommError, instead of
// aborting the process. A communicator that operations still post on is held by each of them
// (SharedComm), so it outlives the object that made it (a Group dropped while its operations run).
// MPI_Comm_free with requests still pending is allowed: MPI frees it once they end.
#pragma once

#include <mpi.h>

#include <memory>
#include <utility>

#include "common.hpp"

namespace harness {

class MpiComm {
 public:
  MpiComm() = default;
  // Takes ownership of `comm` (MPI_COMM_NULL: owns nothing) and makes it return errors.
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiComm() { release(); }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  MpiComm(MpiComm&& other) noexcept : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}
  MpiComm& operator=(MpiComm&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    }
    return *this;
  }

  // A duplicate of `parent` (collective over it).
  static MpiComm dup(MPI_Comm parent) {
    MPI_Comm c = MPI_COMM_NULL;
    check_mpi(MPI_Comm_dup(parent, &c), "MPI_Comm_dup");
    return MpiComm(c);
  }

  MPI_Comm get() const { return comm_; }

 private:
  void release() {
    if (comm_ == MPI_COMM_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
};

// A communicator shared by its maker and the operations that post on it.
using SharedComm = std::shared_ptr<const MpiComm>;

inline SharedComm share(MpiComm comm) { return std::make_shared<const MpiComm>(std::move(comm)); }

}  // namespace harness
