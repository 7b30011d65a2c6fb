// Per-rank event recording for selected steps (see timeline.h).
#include "harness/parallel/timeline.h"

#include <algorithm>

#include "harness/parallel/nic_table.h"

namespace optcc {
namespace {

thread_local Timeline* t_active = nullptr;
thread_local int t_microbatch = -1;

constexpr const char* kKindNames[kNumEventKinds] = {
    "step", "forward", "backward", "send", "recv", "collective", "compress", "decompress", "lep_update",
    "dp_reduce", "optimizer", "evaluation", "checkpoint", "emulated_wait"};
constexpr const char* kStreamNames[kNumStreams] = {"step", "compute", "tp", "pp_fwd", "pp_bwd",
                                                   "dp", "embedding", "control", "compression"};

}  // namespace

const char* kind_name(EventKind k) {
  const auto i = static_cast<int>(k);
  return i >= 0 && i < kNumEventKinds ? kKindNames[i] : "?";
}

const char* stream_name(Stream s) {
  const auto i = static_cast<int>(s);
  return i >= 0 && i < kNumStreams ? kStreamNames[i] : "?";
}

std::vector<std::string> kind_names() { return {std::begin(kKindNames), std::end(kKindNames)}; }
std::vector<std::string> stream_names() { return {std::begin(kStreamNames), std::end(kStreamNames)}; }

Timeline::Timeline(std::vector<int64_t> steps) : steps_(std::move(steps)) {}

bool Timeline::selected(int64_t step) const {
  return std::find(steps_.begin(), steps_.end(), step) != steps_.end();
}

Timeline::StepGuard::StepGuard(Timeline* t, int64_t step) {
  if (!t || !t->selected(step)) return;
  previous_ = t_active;
  installed_ = true;
  t->step_ = step;
  t_active = t;
}

Timeline::StepGuard::~StepGuard() {
  if (installed_) t_active = previous_;
}

Timeline* Timeline::active() { return t_active; }

void Timeline::add(EventKind kind, Stream stream, int microbatch, int64_t start_ns, int64_t end_ns) {
  TimelineEvent e;
  e.step = step_;
  e.kind = kind;
  e.stream = stream;
  e.microbatch = microbatch;
  e.start_us = static_cast<double>(start_ns - origin_ns_) * 1e-3;
  e.end_us = static_cast<double>(std::max(start_ns, end_ns) - origin_ns_) * 1e-3;
  events_.push_back(e);
}

std::vector<TimelineEvent> Timeline::take_events() {
  std::vector<TimelineEvent> out;
  out.swap(events_);
  return out;
}

int Timeline::current_microbatch() { return t_microbatch; }

TimelineScope::TimelineScope(EventKind kind, Stream stream, int microbatch)
    : timeline_(t_active), kind_(kind), stream_(stream), microbatch_(microbatch) {
  if (!timeline_) return;
  if (microbatch_ < 0) microbatch_ = t_microbatch;
  start_ns_ = monotonic_ns();
}

TimelineScope::~TimelineScope() {
  if (timeline_) timeline_->add(kind_, stream_, microbatch_, start_ns_, monotonic_ns());
}

MicrobatchContext::MicrobatchContext(int microbatch) : previous_(t_microbatch) {
  if (!t_active) return;
  set_ = true;
  t_microbatch = microbatch;
}

MicrobatchContext::~MicrobatchContext() {
  if (set_) t_microbatch = previous_;
}

}  // namespace optcc
