// The process's heap allocator, as far as training speed is concerned.
//
// Why it matters: every training step allocates and frees the same large tensors (the logits and
// their gradient are [tokens, vocabulary] fp32: 33 MB for the `mini` micro-batch, 65 MB for
// `small`). glibc's malloc gives blocks above 32 MiB back to the kernel at free() (mmap/munmap) and
// trims its heap top, so each step touches fresh pages again: measured here 32,000 minor page
// faults per `mini` step (about 125 MB), at a few microseconds each. optcc links jemalloc
// (Debian's libjemalloc-dev) and configures it (below) to keep freed pages for reuse, like a
// caching allocator: after the first step a step faults no page at all (0 of 107,000 faults of a
// 2- or 8-step `bench step` come after the first step). The cost: the process holds its peak heap.
//
// The configuration is the `malloc_conf` string jemalloc reads at start-up,
// "dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0" (never purge freed pages; no
// separate eagerly-purged arena for large blocks); MALLOC_CONF in the environment overrides it
// (jemalloc's rule). Built without jemalloc, the process runs on glibc malloc unchanged.
#pragma once

#include <string>

namespace optcc {

/// The allocator malloc() goes to in this process, for logs: "jemalloc 5.3.0 (freed pages kept for
/// reuse)" (or with the decay jemalloc reports when MALLOC_CONF changed it), or "glibc malloc".
/// Any thread; throws nothing.
std::string cpu_allocator();

}  // namespace optcc
