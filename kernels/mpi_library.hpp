// Which MPI library the layer runs on: what it was built against, which file it loaded, what
// that library says of itself, and whether it takes device (CUDA) buffers. harness.mpi_library
// compares these with what mpi4py loaded and records them in run.json.
#pragma once

#include <string>
#include <vector>

namespace harness {

struct MpiBuild {
  std::string family;        // "mpich" (the MPICH ABI: MPICH, Intel MPI, MVAPICH, Cray) or "openmpi"
  std::string compiled_with;  // the headers' own version (MPICH_VERSION, OMPI_*_VERSION)
  std::string mpicc;         // the wrapper it was built with; empty: the PyPI mpich wheel
  int mpi_version = 0;       // MPI_VERSION.MPI_SUBVERSION of the headers, as 31, 40, 41
};

MpiBuild mpi_build();

// MPI_Get_library_version of the library this module calls (allowed before MPI_Init).
std::string mpi_library_version();

// The file of the library this module calls (dladdr of MPI_Get_library_version).
std::string mpi_library_path();

// Every file mapped into this process that defines MPI_Get_library_version itself: one when all
// MPI callers share a library, more when two MPIs were loaded side by side.
std::vector<std::string> mpi_libraries_loaded();

// The library's answer to MPIX_Query_cuda_support(): 1 (device buffers may go to MPI), 0 (not),
// -1 when the library has no such function. Call after MPI_Init.
int mpi_cuda_support();

}  // namespace harness
