// The native tests' own runner: no framework to provision (nothing is downloaded at build time).
//
// TEST(name) { ... } registers a test; CHECK(cond) and CHECK_EQ(a, b) record a failure with its
// file:line and let the test go on (so one run shows every broken property), REQUIRE(cond) ends
// the test at once (for what later checks depend on). run_tests() runs the tests whose name
// contains argv[1] (all without it) and returns the process's exit status: 0 only when every
// test ran and passed. A test that throws fails with the exception's message.
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace harness_test {

struct Registered {
  const char* name;
  std::function<void()> fn;
};

inline std::vector<Registered>& registry() {
  static std::vector<Registered> tests;
  return tests;
}

inline int& failures() {  // of the running test
  static int n = 0;
  return n;
}

// Prefixed to every message (MPI tests: the rank), so interleaved output says who failed.
inline std::string& label() {
  static std::string s;
  return s;
}

struct Stop {};  // thrown by REQUIRE: the rest of the test depends on what failed

inline void fail(const char* file, int line, const std::string& what) {
  ++failures();
  std::fprintf(stderr, "%s%s:%d: FAILED %s\n", label().c_str(), file, line, what.c_str());
  std::fflush(stderr);
}

template <class A, class B>
std::string show_pair(const char* ea, const char* eb, const A& a, const B& b) {
  std::ostringstream os;
  os.precision(17);
  os << ea << " == " << eb << " (" << a << " vs " << b << ")";
  return os.str();
}

struct Registrar {
  Registrar(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

inline int run_tests(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  int failed = 0, ran = 0;
  for (const Registered& t : registry()) {
    if (!only.empty() && std::string(t.name).find(only) == std::string::npos) continue;
    ++ran;
    failures() = 0;
    try {
      t.fn();
    } catch (const Stop&) {
    } catch (const std::exception& e) {
      fail(t.name, 0, std::string("threw: ") + e.what());
    }
    std::fprintf(stderr, "%s%s %s\n", label().c_str(), failures() ? "FAIL" : "ok  ", t.name);
    if (failures()) ++failed;
  }
  std::fprintf(stderr, "%s%d of %d tests failed\n", label().c_str(), failed, ran);
  return failed == 0 && ran > 0 ? 0 : 1;
}

}  // namespace harness_test

#define HT_CAT2(a, b) a##b
#define HT_CAT(a, b) HT_CAT2(a, b)
#define TEST(name)                                                                         \
  static void name();                                                                      \
  static harness_test::Registrar HT_CAT(registrar_, name)(#name, name);                   \
  static void name()
#define CHECK(cond) \
  ((cond) ? (void)0 : harness_test::fail(__FILE__, __LINE__, #cond))
#define CHECK_MSG(cond, msg) \
  ((cond) ? (void)0 : harness_test::fail(__FILE__, __LINE__, std::string(#cond) + ": " + (msg)))
#define CHECK_EQ(a, b)                                                                            \
  do {                                                                                            \
    const auto& ht_a = (a);                                                                       \
    const auto& ht_b = (b);                                                                       \
    if (!(ht_a == ht_b)) harness_test::fail(__FILE__, __LINE__, harness_test::show_pair(#a, #b, ht_a, ht_b)); \
  } while (0)
#define REQUIRE(cond)                                                  \
  do {                                                                 \
    if (!(cond)) {                                                     \
      harness_test::fail(__FILE__, __LINE__, std::string("required: ") + #cond); \
      throw harness_test::Stop{};                                      \
    }                                                                  \
  } while (0)
// Fails unless `expr` throws an exception of type `type`.
#define CHECK_THROWS(type, expr)                                                                 \
  do {                                                                                           \
    bool ht_threw = false;                                                                       \
    try {                                                                                        \
      (void)(expr);                                                                              \
    } catch (const type&) {                                                                      \
      ht_threw = true;                                                                           \
    }                                                                                            \
    if (!ht_threw) harness_test::fail(__FILE__, __LINE__, std::string(#expr) + " did not throw " #type); \
  } while (0)
