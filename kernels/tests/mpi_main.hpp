// The main of a C++ test that runs on several ranks under mpiexec: MPI up (THREAD_MULTIPLE, as
// the native layer asks), every failure line labelled with its rank, and one exit status for the
// job: the worst of the ranks', so a check failing on any rank fails the test.
#pragma once

#include <mpi.h>

#include <string>

#include "check.hpp"

namespace harness_test {

// run_tests() on this rank, with `rank` and `size` set before any test runs.
inline int run_mpi_tests(int argc, char** argv, int& rank, int& size) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  label() = "[rank " + std::to_string(rank) + "] ";
  int rc = run_tests(argc, argv), worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

}  // namespace harness_test
