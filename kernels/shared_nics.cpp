#include "shared_nics.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "common.hpp"
#include "mpi_comm.hpp"

namespace harness {

// The fixed part of the table. The busy times follow it in the same memory, at an offset
// computed for their alignment (a struct with a trailing array indexed past its end would be
// undefined behaviour).
struct SharedNics::Header {
  pthread_mutex_t mu;
  int nodes;
  double fabric_free;
};

size_t SharedNics::times_offset() {
  return (sizeof(Header) + alignof(double) - 1) / alignof(double) * alignof(double);
}

size_t SharedNics::bytes_for(int nodes) { return times_offset() + sizeof(double) * (2 * static_cast<size_t>(nodes)); }

void SharedNics::init_table(void* memory, int nodes) {
  // The objects begin their lifetime here, in the process that creates the table; the other
  // processes map memory holding them (std::launder in the constructor).
  auto* h = new (memory) Header;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&h->mu, &attr);
  pthread_mutexattr_destroy(&attr);
  h->nodes = nodes;
  h->fabric_free = 0.0;
  char* times = static_cast<char*>(memory) + times_offset();
  for (int i = 0; i < 2 * nodes; ++i) new (times + sizeof(double) * static_cast<size_t>(i)) double(0.0);
}

SharedNics::SharedNics(void* memory, size_t bytes, bool heap)
    : memory_(memory),
      bytes_(bytes),
      heap_(heap),
      header_(std::launder(static_cast<Header*>(memory))),
      times_(std::launder(reinterpret_cast<double*>(static_cast<char*>(memory) + times_offset()))) {}

SharedNics::~SharedNics() {
  if (heap_)
    std::free(memory_);
  else
    munmap(memory_, bytes_);
}

std::unique_ptr<SharedNics> SharedNics::local(int nodes) {
  if (nodes < 1) throw CommError("emulated NICs need at least 1 node (got " + std::to_string(nodes) + ")");
  size_t bytes = bytes_for(nodes);
  void* memory = std::malloc(bytes);  // aligned for any fundamental type, the header's included
  if (!memory) throw std::bad_alloc();
  init_table(memory, nodes);
  return std::unique_ptr<SharedNics>(new SharedNics(memory, bytes, true));
}

std::unique_ptr<SharedNics> SharedNics::create(MPI_Comm comm, int nodes) {
  if (nodes < 1) throw CommError("emulated NICs need at least 1 node (got " + std::to_string(nodes) + ")");
  int rank = 0, size = 1, host_size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  {
    MPI_Comm split = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &split), "MPI_Comm_split_type");
    const MpiComm host(split);
    MPI_Comm_size(host.get(), &host_size);
  }
  int all_local = host_size == size ? 1 : 0, everywhere = 0;
  check_mpi(MPI_Allreduce(&all_local, &everywhere, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
  if (!everywhere)
    throw CommError("emulated NIC contention (network.topology) keeps the NICs' queues in shared memory and needs "
                    "every rank on one host; this job spans hosts, whose real NICs are shared already: emulate "
                    "per-link delays with network.default / network.links instead");

  const size_t bytes = bytes_for(nodes);
  char name[64] = {0};
  int err = 0;  // rank 0's errno when it could not create the table
  if (rank == 0) {
    std::snprintf(name, sizeof(name), "/harness-nics-%d-%ld", static_cast<int>(getpid()),
                  static_cast<long>(now() * 1e6) % 1000000000L);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      err = errno;
    } else {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED)
        err = errno;
      else {
        init_table(p, nodes);
        munmap(p, bytes);
      }
    }
    if (fd >= 0) close(fd);
    if (err) shm_unlink(name);
  }
  check_mpi(MPI_Bcast(&err, 1, MPI_INT, 0, comm), "MPI_Bcast");
  if (err) throw CommError(std::string("could not create the shared NIC table in /dev/shm: ") + std::strerror(err));
  check_mpi(MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, comm), "MPI_Bcast");

  void* p = MAP_FAILED;
  int fd = shm_open(name, O_RDWR, 0600);
  if (fd >= 0) {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  int mapped = p != MAP_FAILED ? 1 : 0, all_mapped = 0;
  check_mpi(MPI_Allreduce(&mapped, &all_mapped, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
  if (rank == 0) shm_unlink(name);  // everyone has it mapped (or failed): the name is not needed
  if (!all_mapped) {
    if (mapped) munmap(p, bytes);
    throw CommError("a rank could not map the shared NIC table");
  }
  return std::unique_ptr<SharedNics>(new SharedNics(p, bytes, false));
}

int SharedNics::nodes() const { return header_->nodes; }
double& SharedNics::egress(int node) { return times_[node]; }
double& SharedNics::ingress(int node) { return times_[header_->nodes + node]; }
double& SharedNics::fabric() { return header_->fabric_free; }

SharedNics::Lock::Lock(SharedNics& s) : mu_(&s.header_->mu) {
  int rc = pthread_mutex_lock(mu_);
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(mu_);  // its owner died: the times stay valid
  } else if (rc != 0) {
    // Not held: the destructor must not unlock it. The message becomes the op's error.
    throw CommError(std::string("could not lock the shared NIC table: ") + std::strerror(rc), ErrorKind::kInternal);
  }
}

SharedNics::Lock::~Lock() { pthread_mutex_unlock(mu_); }

}  // namespace harness
