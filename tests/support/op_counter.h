// Counts the ATen operations a piece of code issues on this thread, through a thread-local
// RecordFunction callback: the CPU-visible proxy for kernel launches on a GPU (an encode whose count
// grows with the rank r or the batch size B is launch-bound there; lowrank_batch.h).
//   all:      every dispatcher call, nested ones included (a composite op and the ops it calls).
//   kernels:  the leaf calls (no computing op nested inside) that compute: views, allocations and other
//             metadata-only ops (as_strided, select, empty, resize_, ...) are left out. On a GPU
//             each of these is one kernel launch or more (a linalg op may launch several).
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace optcc::testing {

struct OpCount {
  int64_t all = 0;
  int64_t kernels = 0;
  std::map<std::string, int64_t> kernels_by_name;  // e.g. {"aten::bmm", 2}
};

namespace op_counter_detail {
inline thread_local OpCount* count = nullptr;
inline thread_local std::vector<bool> had_child;  // per open call: did an op start inside it?

inline bool metadata_only(const std::string& name) {
  static const std::set<std::string> ops{
      "aten::as_strided", "aten::view",     "aten::_reshape_alias", "aten::alias",         "aten::expand",
      "aten::empty",      "aten::empty_strided", "aten::resize_",   "aten::resolve_conj",  "aten::resolve_neg",
      "aten::detach",     "aten::_unsafe_view",  "aten::unsqueeze", "aten::squeeze",       "aten::transpose",
      "aten::permute",    "aten::t",        "aten::select",         "aten::slice",         "aten::narrow",
      "aten::diagonal",   "aten::set_",     "aten::lift_fresh",     "aten::new_empty",     "aten::empty_like"};
  return ops.count(name) > 0;
}

inline std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  // A call with only metadata calls inside (an out= op resizing its output) still computes itself.
  if (!had_child.empty() && !metadata_only(fn.name())) had_child.back() = true;
  had_child.push_back(false);
  ++count->all;
  return nullptr;
}

inline void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  const bool leaf = !had_child.back();
  had_child.pop_back();
  const std::string name = fn.name();
  if (leaf && !metadata_only(name)) {
    ++count->kernels;
    ++count->kernels_by_name[name];
  }
}
}  // namespace op_counter_detail

/// What `fn` issues on the calling thread (see the top of this file).
inline OpCount count_aten_ops(const std::function<void()>& fn) {
  OpCount out;
  op_counter_detail::count = &out;
  op_counter_detail::had_child.clear();
  const auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&op_counter_detail::on_start, &op_counter_detail::on_end)
          .scopes({at::RecordScope::FUNCTION}));
  try {
    fn();
  } catch (...) {
    at::removeCallback(handle);
    op_counter_detail::count = nullptr;
    throw;
  }
  at::removeCallback(handle);
  op_counter_detail::count = nullptr;
  return out;
}

}  // namespace optcc::testing
