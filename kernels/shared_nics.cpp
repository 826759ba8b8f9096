#include "shared_nics.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "common.hpp"

namespace harness {

struct SharedNics::Table {
  pthread_mutex_t mu;
  int nodes;
  double fabric_free;
  double free_at[1];  // 2 * nodes: egress of every node, then ingress
};

size_t SharedNics::bytes_for(int nodes) { return sizeof(Table) + sizeof(double) * (2 * static_cast<size_t>(nodes)); }

void SharedNics::init_table(Table* t, int nodes) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&t->mu, &attr);
  pthread_mutexattr_destroy(&attr);
  t->nodes = nodes;
  t->fabric_free = 0.0;
  for (int i = 0; i < 2 * nodes; ++i) t->free_at[i] = 0.0;
}

SharedNics::SharedNics(Table* table, size_t bytes, bool heap) : table_(table), bytes_(bytes), heap_(heap) {}

SharedNics::~SharedNics() {
  if (heap_)
    std::free(table_);
  else
    munmap(table_, bytes_);
}

std::unique_ptr<SharedNics> SharedNics::local(int nodes) {
  if (nodes < 1) throw CommError("emulated NICs need at least 1 node (got " + std::to_string(nodes) + ")");
  size_t bytes = bytes_for(nodes);
  auto* t = static_cast<Table*>(std::calloc(1, bytes));
  if (!t) throw std::bad_alloc();
  init_table(t, nodes);
  return std::unique_ptr<SharedNics>(new SharedNics(t, bytes, true));
}

std::unique_ptr<SharedNics> SharedNics::create(MPI_Comm comm, int nodes) {
  if (nodes < 1) throw CommError("emulated NICs need at least 1 node (got " + std::to_string(nodes) + ")");
  int rank = 0, size = 1, host_size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm host;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host), "MPI_Comm_split_type");
  MPI_Comm_size(host, &host_size);
  MPI_Comm_free(&host);
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
        init_table(static_cast<Table*>(p), nodes);
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
  return std::unique_ptr<SharedNics>(new SharedNics(static_cast<Table*>(p), bytes, false));
}

int SharedNics::nodes() const { return table_->nodes; }
double& SharedNics::egress(int node) { return table_->free_at[node]; }
double& SharedNics::ingress(int node) { return table_->free_at[table_->nodes + node]; }
double& SharedNics::fabric() { return table_->fabric_free; }

SharedNics::Lock::Lock(SharedNics& s) : mu_(&s.table_->mu) {
  int rc = pthread_mutex_lock(mu_);
  if (rc == EOWNERDEAD) pthread_mutex_consistent(mu_);  // its owner died: the times stay valid
}

SharedNics::Lock::~Lock() { pthread_mutex_unlock(mu_); }

}  // namespace harness
