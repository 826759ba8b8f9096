#include "mpi_library.hpp"

#include <dlfcn.h>
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

#include <fstream>
#include <set>
#include <sstream>

#ifndef HARNESS_MPICC
#define HARNESS_MPICC ""
#endif

namespace harness {

namespace {

std::string real_path(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : path;
}

// The file that defines `address`, resolved through symbolic links; empty if none.
std::string file_of(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return {};
  return real_path(info.dli_fname);
}

}  // namespace

MpiBuild mpi_build() {
  MpiBuild b;
#if defined(OPEN_MPI)
  b.family = "openmpi";
  b.compiled_with = "Open MPI " + std::to_string(OMPI_MAJOR_VERSION) + "." + std::to_string(OMPI_MINOR_VERSION) + "." +
                    std::to_string(OMPI_RELEASE_VERSION);
#elif defined(MPICH_VERSION)
  b.family = "mpich";
  b.compiled_with = std::string("MPICH ") + MPICH_VERSION;
#else
  b.family = "unknown";
  b.compiled_with = "unknown";
#endif
  b.mpicc = HARNESS_MPICC;
  b.mpi_version = MPI_VERSION * 10 + MPI_SUBVERSION;
  return b;
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return {};
  std::string version(text, static_cast<size_t>(length > 0 ? length : 0));
  while (!version.empty() && version.back() == '\0') version.pop_back();  // Open MPI counts its terminator
  return version;
}

std::string mpi_library_path() { return file_of(reinterpret_cast<const void*>(&MPI_Get_library_version)); }

std::vector<std::string> mpi_libraries_loaded() {
  std::set<std::string> files;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos || line.find(".so") == std::string::npos) continue;
    files.insert(line.substr(slash));
  }
  std::set<std::string> libraries;
  for (const std::string& file : files) {
    // Already loaded (RTLD_NOLOAD): this only looks the symbol up, it loads nothing.
    void* handle = dlopen(file.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    const void* symbol = dlsym(handle, "MPI_Get_library_version");
    if (symbol != nullptr && file_of(symbol) == real_path(file)) libraries.insert(real_path(file));
    dlclose(handle);
  }
  return {libraries.begin(), libraries.end()};
}

int mpi_cuda_support() {
  // Looked up in the library this module calls, not linked: MPIs without it still load.
  void* handle = dlopen(mpi_library_path().c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return -1;
  auto query = reinterpret_cast<int (*)()>(dlsym(handle, "MPIX_Query_cuda_support"));
  const int answer = query != nullptr ? (query() != 0 ? 1 : 0) : -1;
  dlclose(handle);
  return answer;
}

}  // namespace harness
