// The busy times of every emulated node's NIC (and of the fabric between nodes), shared by all
// ranks of the job, so that messages of different ranks leaving one node queue on its NIC.
//
// The table lives in POSIX shared memory: the job's ranks are processes on this host. It is
// created collectively (the first rank creates and names it, the others map it, then the name
// is unlinked at once, so nothing is left behind when the job ends or crashes) and guarded by a
// robust process-shared mutex: a rank killed while holding it (an injected `kill` fault) leaves
// the mutex to the next rank instead of deadlocking the node.
#pragma once

#include <mpi.h>
#include <pthread.h>

#include <cstddef>
#include <memory>

namespace harness {

class SharedNics {
 public:
  // Collective over `comm`, whose ranks must all be on this host (CommError otherwise).
  static std::unique_ptr<SharedNics> create(MPI_Comm comm, int nodes);
  // A private table in this process's memory: the same rule without MPI (tests, simulator checks).
  static std::unique_ptr<SharedNics> local(int nodes);
  ~SharedNics();
  SharedNics(const SharedNics&) = delete;
  SharedNics& operator=(const SharedNics&) = delete;

  int nodes() const;
  // Busy-until times (seconds on CLOCK_MONOTONIC); only while holding lock().
  double& egress(int node);
  double& ingress(int node);
  double& fabric();

  class Lock {
   public:
    explicit Lock(SharedNics& s);
    ~Lock();
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;

   private:
    pthread_mutex_t* mu_;
  };

 private:
  // The table's memory: a Header, then (at times_offset()) 2 * nodes busy times.
  struct Header;
  SharedNics(void* memory, size_t bytes, bool owned_heap);
  static size_t times_offset();
  static size_t bytes_for(int nodes);
  static void init_table(void* memory, int nodes);

  void* memory_;
  size_t bytes_;
  bool heap_;
  Header* header_;
  double* times_;
};

}  // namespace harness
