// harness/parallel/allocator.h: the heap keeps freed pages, so a training step that allocates and
// frees the same large tensors every time touches no fresh page after the first (minor page faults
// counted by getrusage).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/resource.h>

#include <string>

#include "harness/parallel/allocator.h"

namespace optcc {
namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

TEST(Allocator, IsJemallocKeepingFreedPages) {
  const std::string a = cpu_allocator();
  if (a == "glibc malloc") GTEST_SKIP() << "built without jemalloc (libjemalloc-dev)";
  EXPECT_NE(a.find("jemalloc 5."), std::string::npos) << a;
  EXPECT_NE(a.find("kept for reuse"), std::string::npos) << a;
}

TEST(Allocator, AFreedLargeTensorIsReusedWithoutPageFaults) {
  if (cpu_allocator() == "glibc malloc") GTEST_SKIP() << "built without jemalloc";
  // 64 MiB, above glibc's largest mmap threshold (32 MiB): glibc would fault all 16,384 pages again.
  constexpr int64_t kFloats = int64_t(16) << 20;
  { torch::full({kFloats}, 1.0f); }  // first touch: faults, then freed
  long worst = 0;
  for (int i = 0; i < 3; ++i) {
    const long before = minor_faults();
    auto t = torch::full({kFloats}, float(i));  // allocated and every page written
    ASSERT_EQ(t[kFloats - 1].item<float>(), float(i));
    worst = std::max(worst, minor_faults() - before);
  }
  EXPECT_LT(worst, 64) << "a reused 64 MiB block faulted " << worst << " pages (16,384 if it were fresh)";
}

}  // namespace
}  // namespace optcc
