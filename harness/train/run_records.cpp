// Per-step records of a training run (see run_records.h).
#include "harness/train/run_records.h"

#include <sys/resource.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace optcc {

Perplexity perplexity(double loss) {
  if (std::isnan(loss)) return {loss, false};  // std::min(cap, NaN) would return the cap
  const bool capped = loss > kPerplexityLossCap;
  return {std::exp(capped ? kPerplexityLossCap : loss), capped};
}

std::string eval_text(double loss, const Perplexity& ppl) {
  return fmt::format("valid loss {:.4f} | ppl {}{:.2f}{}", loss, ppl.capped ? "> " : "", ppl.value,
                     ppl.capped ? " (capped)" : "");
}

namespace {

// Loss curves, traffic and peak RSS.
std::vector<TableSpec> step_tables() {
  return {
      {"train",
       {{"step", ColumnType::kInt64, "steps"},
        {"loss", ColumnType::kFloat64, "nats"},
        {"lr", ColumnType::kFloat64, ""},
        {"grad_norm", ColumnType::kFloat64, ""},
        {"step_seconds", ColumnType::kFloat64, "s"},
        {"tokens_per_second", ColumnType::kFloat64, "tokens/s"},
        {"loss_scale", ColumnType::kFloat64, ""},    // fp16's loss scale S the step ran with; 1 otherwise
        {"skipped", ColumnType::kInt64, "flag"}}},  // 1: inf/NaN gradients, nothing updated (loss_scaler.h)
      // ppl = exp(min(loss, 20)); ppl_capped = 1 where the loss exceeded the cap (ppl is then a lower
      // bound); a NaN loss has a NaN ppl.
      {"eval",
       {{"step", ColumnType::kInt64, "steps"},
        {"loss", ColumnType::kFloat64, "nats"},
        {"ppl", ColumnType::kFloat64, ""},
        {"ppl_capped", ColumnType::kInt64, ""}}},
      // One row per (step, rank, class, link) with traffic in that step. class: 0 tp, 1 pp_fwd,
      // 2 pp_bwd, 3 dp, 4 embedding, 5 control; link: 0 intra-node, 1 inter-node. seconds: measured
      // wall time in the operations; emulated_seconds: link emulation's duration of them
      // (harness/parallel/link_emulator.h; 0 without network.emulate).
      {"traffic",
       {{"step", ColumnType::kInt64, "steps"},
        {"rank", ColumnType::kInt64, ""},
        {"class", ColumnType::kInt64, ""},
        {"link", ColumnType::kInt64, ""},
        {"bytes", ColumnType::kInt64, "bytes"},
        {"calls", ColumnType::kInt64, ""},
        {"seconds", ColumnType::kFloat64, "s"},
        {"emulated_seconds", ColumnType::kFloat64, "s"}}},
      {"memory", {{"step", ColumnType::kInt64, "steps"}, {"rank", ColumnType::kInt64, ""}, {"peak_rss_bytes", ColumnType::kInt64, "bytes"}}},
  };
}

// What the DP reducers and the pipeline codec did.
std::vector<TableSpec> compression_tables() {
  return {
      // Every DP gradient reduction, per (step, rank): how many tensors, how many of them compressed,
      // their raw and handed-to-collective bytes (the sums of the per-tensor records below).
      {"dp_totals",
       {{"step", ColumnType::kInt64, "steps"},
        {"rank", ColumnType::kInt64, ""},
        {"tensors", ColumnType::kInt64, ""},
        {"compressed_tensors", ColumnType::kInt64, ""},
        {"raw_bytes", ColumnType::kInt64, "bytes"},
        {"sent_bytes", ColumnType::kInt64, "bytes"}}},
      // The per-tensor detail, only where it says something: one row per (step, rank, COMPRESSED DP
      // tensor), at the steps that log (step % log.interval == 0, and the last step). Raw vs.
      // handed-to-collective bytes; `tensor` indexes the root attribute dp_tensor_names[rank];
      // matrix_rank is PowerSGD's effective rank. (Uncompressed tensors are in dp_totals only.)
      {"dp_tensors",
       {{"step", ColumnType::kInt64, "steps"},
        {"rank", ColumnType::kInt64, ""},
        {"tensor", ColumnType::kInt64, ""},
        {"raw_bytes", ColumnType::kInt64, "bytes"},
        {"sent_bytes", ColumnType::kInt64, "bytes"},
        {"compressed", ColumnType::kInt64, ""},
        {"matrix_rank", ColumnType::kInt64, ""}}},
      // Pipeline codec per (step, rank): messages this rank sent and their bytes before/after.
      {"pipeline_codec",
       {{"step", ColumnType::kInt64, "steps"},
        {"rank", ColumnType::kInt64, ""},
        {"backward_sends", ColumnType::kInt64, ""},
        {"backward_compressed", ColumnType::kInt64, ""},
        {"backward_raw_bytes", ColumnType::kInt64, "bytes"},
        {"backward_wire_bytes", ColumnType::kInt64, "bytes"},
        {"forward_raw_bytes", ColumnType::kInt64, "bytes"},
        {"forward_wire_bytes", ColumnType::kInt64, "bytes"},
        {"encode_seconds", ColumnType::kFloat64, "s"},
        {"decode_seconds", ColumnType::kFloat64, "s"},
        {"lep_bytes", ColumnType::kInt64, "bytes"}}},
  };
}

// Memory by component, LEP orthogonality (Fig. 11), per-rank timing.
std::vector<TableSpec> component_tables() {
  return {
      // Fig. 12 (spec §8.3): tensor memory per (step, rank) by component, bytes. activations_peak
      // is the tracked peak during the pipeline schedule above the memory held when it started;
      // tracked_peak the peak of all tensor memory over the step (memory_tracker.h).
      {"memory_components",
       {{"step", ColumnType::kInt64, "steps"},
        {"rank", ColumnType::kInt64, ""},
        {"parameters", ColumnType::kInt64, "bytes"},
        {"gradients", ColumnType::kInt64, "bytes"},
        {"optimizer", ColumnType::kInt64, "bytes"},
        {"activations_peak", ColumnType::kInt64, "bytes"},
        {"lep_buffers", ColumnType::kInt64, "bytes"},
        {"ef_buffers", ColumnType::kInt64, "bytes"},
        {"pq_buffers", ColumnType::kInt64, "bytes"},
        {"tracked_peak", ColumnType::kInt64, "bytes"}}},
      // Fig. 11 (spec §3.3), when log.lep_orthogonality is on: one row per (step, rank, j).
      {"lep_orthogonality",
       {{"step", ColumnType::kInt64, "steps"},
        {"rank", ColumnType::kInt64, ""},
        {"microbatch", ColumnType::kInt64, ""},
        {"cosine", ColumnType::kFloat64, ""},
        {"error_mean", ColumnType::kFloat64, ""},
        {"delta_mean", ColumnType::kFloat64, ""}}},
      // LEP diagnostics (issue 16), when log.lep_diagnostics is on: one row per compressed backward
      // send (step, rank, micro-batch); pipeline_codec.h's LepSendRecord. Norms are L2 over the
      // rank's fp32 slice; NaN where undefined; carried_age -1 = nothing carried.
      {"lep_diagnostics",
       {{"step", ColumnType::kInt64, "steps"},
        {"rank", ColumnType::kInt64, ""},
        {"microbatch", ColumnType::kInt64, ""},
        {"slice_norm", ColumnType::kFloat64, ""},
        {"carried_norm", ColumnType::kFloat64, ""},
        {"error_norm", ColumnType::kFloat64, ""},
        {"relative_error", ColumnType::kFloat64, ""},
        {"cos_carried_slice", ColumnType::kFloat64, ""},
        {"cos_carried_delta", ColumnType::kFloat64, ""},
        {"carried_age", ColumnType::kInt64, "steps"}}},
      // Every rank's own timing of each step (BR-19): its pipeline schedule, then the whole step.
      {"timing",
       {{"step", ColumnType::kInt64, "steps"},
        {"rank", ColumnType::kInt64, ""},
        {"pipeline_seconds", ColumnType::kFloat64, "s"},
        {"step_seconds", ColumnType::kFloat64, "s"}}},
  };
}

}  // namespace

std::vector<TableSpec> result_tables() {
  std::vector<TableSpec> out;
  for (auto part : {step_tables(), compression_tables(), component_tables()}) {
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

namespace {

// Where each part sits in a rank's row of the per-step all-gather (doubles).
struct RecordLayout {
  static constexpr int kPer = 4;    // bytes, calls, seconds, emulated seconds per (class, link)
  static constexpr int kCodec = 9;  // pipeline codec stats
  static constexpr int kLepSend = 8;  // one LepSendRecord
  int64_t traffic_width = 0, tensors_at = 0, codec_at = 0, orth_at = 0, lep_at = 0, memory_at = 0, width = 0;
  explicit RecordLayout(const StepExtras& x)
      : traffic_width(kNumTraffic * 2 * kPer),
        tensors_at(traffic_width + 3),
        codec_at(tensors_at + 1 + 4 * x.max_dp_tensors),
        orth_at(codec_at + kCodec),
        lep_at(orth_at + 1 + 4 * x.max_orth_pairs),
        memory_at(lep_at + 1 + kLepSend * x.max_lep_sends),
        width(memory_at + kMemoryComponents) {}
};

// This rank's traffic of the step, peak RSS and timings.
void pack_traffic(at::TensorAccessor<double, 1>& a, const RecordLayout& lay, Distributed& d, double pipeline_seconds,
                  double step_seconds) {
  for (int c = 0; c < kNumTraffic; ++c) {
    for (int l = 0; l < 2; ++l) {
      const auto& t = d.meter.at(static_cast<Traffic>(c), static_cast<Link>(l));
      const int64_t i = (c * 2 + l) * RecordLayout::kPer;
      a[i] = static_cast<double>(t.bytes), a[i + 1] = static_cast<double>(t.calls), a[i + 2] = t.seconds;
      a[i + 3] = t.emulated_seconds;
    }
  }
  a[lay.traffic_width] = static_cast<double>(peak_rss_bytes());
  a[lay.traffic_width + 1] = pipeline_seconds;
  a[lay.traffic_width + 2] = step_seconds;
}

// DP tensor records; the pipeline codec's stats (then reset) and LEP orthogonality records.
void pack_compression(at::TensorAccessor<double, 1>& a, const RecordLayout& lay, const StepExtras& x) {
  if (x.dp_reducer) {
    const auto& recs = x.dp_reducer->records();
    a[lay.tensors_at] = static_cast<double>(recs.size());
    for (size_t i = 0; i < recs.size() && static_cast<int64_t>(i) < x.max_dp_tensors; ++i) {
      const int64_t o = lay.tensors_at + 1 + 4 * static_cast<int64_t>(i);
      a[o] = static_cast<double>(recs[i].raw_bytes), a[o + 1] = static_cast<double>(recs[i].sent_bytes);
      a[o + 2] = recs[i].compressed ? 1 : 0, a[o + 3] = static_cast<double>(recs[i].rank);
    }
  }
  if (!x.codec) return;
  const auto& st = x.codec->stats();
  const double v[RecordLayout::kCodec] = {
      static_cast<double>(st.backward_sends), static_cast<double>(st.backward_compressed),
      static_cast<double>(st.backward_raw_bytes), static_cast<double>(st.backward_wire_bytes),
      static_cast<double>(st.forward_raw_bytes), static_cast<double>(st.forward_wire_bytes),
      st.encode_seconds, st.decode_seconds, static_cast<double>(x.codec->lep_bytes())};
  for (int i = 0; i < RecordLayout::kCodec; ++i) a[lay.codec_at + i] = v[i];
  x.codec->reset_stats();
  if (x.max_orth_pairs > 0) {
    const auto orth = x.codec->orthogonality();
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(orth.cosine.size()), x.max_orth_pairs);
    a[lay.orth_at] = static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t o = lay.orth_at + 1 + 4 * i;
      a[o] = orth.microbatch[i], a[o + 1] = orth.cosine[i], a[o + 2] = orth.error_mean[i], a[o + 3] = orth.delta_mean[i];
    }
  }
  if (x.max_lep_sends > 0) {
    const auto& recs = x.codec->lep_diagnostics();
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(recs.size()), x.max_lep_sends);
    a[lay.lep_at] = static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) {
      const LepSendRecord& e = recs[i];
      const double v[RecordLayout::kLepSend] = {static_cast<double>(e.microbatch), e.slice_norm, e.carried_norm,
                                                e.error_norm, e.relative_error, e.cos_carried_slice,
                                                e.cos_carried_delta, static_cast<double>(e.carried_age)};
      for (int j = 0; j < RecordLayout::kLepSend; ++j) a[lay.lep_at + 1 + RecordLayout::kLepSend * i + j] = v[j];
    }
  }
}

// Rank r's rows of the step, from its gathered row g.
void append_rank_rows(MetricsSink& sink, int64_t step, int64_t r, at::TensorAccessor<double, 1> g,
                      const RecordLayout& lay, bool tensor_detail) {
  auto i64 = [](double v) { return static_cast<int64_t>(v); };
  for (int c = 0; c < kNumTraffic; ++c) {
    for (int l = 0; l < 2; ++l) {
      const int64_t i = (c * 2 + l) * RecordLayout::kPer;
      if (g[i + 1] == 0) continue;
      sink.append("traffic", {step, r, int64_t{c}, int64_t{l}, i64(g[i]), i64(g[i + 1]), g[i + 2], g[i + 3]});
    }
  }
  sink.append("memory", {step, r, i64(g[lay.traffic_width])});
  sink.append("timing", {step, r, g[lay.traffic_width + 1], g[lay.traffic_width + 2]});
  const int64_t tensors = i64(g[lay.tensors_at]);
  int64_t compressed = 0, raw = 0, sent = 0;
  for (int64_t i = 0; i < tensors; ++i) {
    const int64_t o = lay.tensors_at + 1 + 4 * i;
    raw += i64(g[o]), sent += i64(g[o + 1]), compressed += i64(g[o + 2]);
    if (tensor_detail && g[o + 2] != 0) {
      sink.append("dp_tensors", {step, r, i, i64(g[o]), i64(g[o + 1]), i64(g[o + 2]), i64(g[o + 3])});
    }
  }
  if (tensors > 0) sink.append("dp_totals", {step, r, tensors, compressed, raw, sent});
  const int64_t k = lay.codec_at;
  if (g[k] > 0 || g[k + 5] > 0) {
    sink.append("pipeline_codec", {step, r, i64(g[k]), i64(g[k + 1]), i64(g[k + 2]), i64(g[k + 3]), i64(g[k + 4]),
                                   i64(g[k + 5]), g[k + 6], g[k + 7], i64(g[k + 8])});
  }
  std::vector<Cell> mem{step, r};
  for (int i = 0; i < kMemoryComponents; ++i) mem.push_back(i64(g[lay.memory_at + i]));
  sink.append("memory_components", mem);
  for (int64_t i = 0; i < i64(g[lay.orth_at]); ++i) {
    const int64_t o = lay.orth_at + 1 + 4 * i;
    sink.append("lep_orthogonality", {step, r, i64(g[o]), g[o + 1], g[o + 2], g[o + 3]});
  }
  for (int64_t i = 0; i < i64(g[lay.lep_at]); ++i) {
    const int64_t o = lay.lep_at + 1 + RecordLayout::kLepSend * i;
    sink.append("lep_diagnostics", {step, r, i64(g[o]), g[o + 1], g[o + 2], g[o + 3], g[o + 4], g[o + 5], g[o + 6],
                                    i64(g[o + 7])});
  }
}

}  // namespace

// Per-rank rows of one step besides traffic: compression records (fixed widths agreed at start).
// Gathers every rank's traffic of this step, peak memory, timings and compression records to all
// ranks with one all-gather; rank 0 writes.
void record_rank_stats(Distributed& d, MetricsSink* sink, int64_t step, double pipeline_seconds, double step_seconds,
                       const StepExtras& x) {
  const RecordLayout lay(x);
  auto mine = torch::zeros({lay.width}, torch::kDouble);
  auto a = mine.accessor<double, 1>();
  pack_traffic(a, lay, d, pipeline_seconds, step_seconds);
  pack_compression(a, lay, x);
  for (int i = 0; i < kMemoryComponents; ++i) a[lay.memory_at + i] = static_cast<double>(x.memory[i]);
  d.meter.reset();
  auto all = d.world->all_gather(mine.unsqueeze(0), Traffic::kControl, 0);  // [world, width]
  if (!sink) return;
  auto g = all.accessor<double, 2>();
  for (int64_t r = 0; r < all.size(0); ++r) append_rank_rows(*sink, step, r, g[r], lay, x.tensor_detail);
}

namespace {

int64_t columns_of(const std::string& group) {
  for (const auto& t : result_tables()) {
    if (t.group == group) return static_cast<int64_t>(t.columns.size());
  }
  throw std::logic_error("no results table " + group);
}

}  // namespace

ResultsProjection project_results(const Config& c) {
  const auto& p = c.parallel;
  const int64_t world = p.tp * p.pp * p.dp, steps = c.train.train_steps;
  const int64_t m = c.train.global_batch_size / std::max<int64_t>(1, c.train.micro_batch_size * p.dp);
  // Traffic classes a rank can use here (control: records and agreements, always), on one link, or
  // on both when the world spans nodes.
  const int64_t classes = 1 + (p.tp > 1 ? 1 : 0) + (p.pp > 1 ? 3 : 0) + (p.dp > 1 ? 1 : 0);  // pp: fwd, bwd, embedding
  const int64_t links = p.ranks_per_node > 0 && world > p.ranks_per_node ? 2 : 1;
  ResultsProjection r;
  const std::vector<std::pair<std::string, int64_t>> every_step{
      {"train", 1},
      {"traffic", world * classes * links},
      {"memory", world},
      {"timing", world},
      {"memory_components", world},
      {"dp_totals", world},
      {"pipeline_codec", p.pp > 1 ? world : 0},
      {"lep_orthogonality", c.log.lep_orthogonality ? world * std::max<int64_t>(0, m - 1) : 0},
      {"lep_diagnostics", c.log.lep_diagnostics ? world * m : 0}};
  for (const auto& [group, rows] : every_step) {
    r.rows_per_step += rows;
    r.bytes_per_step += rows * columns_of(group) * 8;
  }
  // DP tensors of a rank: 12 per layer of its stage (LayerNorms, qkv, proj, fc1, fc2: weights and
  // biases), + 2 position/word embeddings on the first stage, + final LayerNorm and the word
  // embedding's copy on the last: at most 12 L_stage + 4, summed over stages, times tp * dp.
  int64_t per_replica = 0;
  for (int64_t layers : c.stage_layer_counts()) per_replica += 12 * layers + 4;
  r.detail_rows = c.compression.dp.name == "none" ? 0 : per_replica * p.tp * p.dp;
  r.detail_bytes = r.detail_rows * columns_of("dp_tensors") * 8;
  const int64_t interval = std::max<int64_t>(1, c.log.interval);
  r.logging_steps = steps / interval + (steps % interval != 0 ? 1 : 0);
  const int64_t evals = c.train.eval_interval > 0 ? steps / c.train.eval_interval + 1 : 1;
  r.total_bytes = r.bytes_per_step * steps + r.detail_bytes * r.logging_steps + evals * columns_of("eval") * 8;
  return r;
}

std::string byte_text(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (bytes >= 1000 && u < 5) bytes /= 1000, ++u;
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[u]);
}

std::string projection_text(const ResultsProjection& p, int64_t train_steps) {
  return fmt::format("about {} per step ({} rows){}; {} for {} steps (an upper bound on the rows' data; HDF5's chunked "
                     "storage adds to the file)",
                     byte_text(static_cast<double>(p.bytes_per_step)), p.rows_per_step,
                     p.detail_rows == 0 ? ""
                         : fmt::format(", + {} of per-tensor rows at each of {} logging steps",
                                       byte_text(static_cast<double>(p.detail_bytes)), p.logging_steps),
                     byte_text(static_cast<double>(p.total_bytes)), train_steps);
}

// Every rank's strings (e.g. DP tensor names) on every rank, in rank order.
std::vector<std::vector<std::string>> gather_names(Distributed& d, const std::vector<std::string>& names) {
  std::string joined;
  for (const auto& n : names) joined += n + "\n";
  auto len = torch::tensor({static_cast<int64_t>(joined.size())}, torch::kLong);
  d.world->all_reduce(len, Traffic::kControl, /*max=*/true);
  auto buf = torch::zeros({len.item<int64_t>() + 1}, torch::kUInt8);
  std::memcpy(buf.data_ptr(), joined.data(), joined.size());
  auto all = d.world->all_gather(buf.unsqueeze(0), Traffic::kControl, 0).contiguous();
  std::vector<std::vector<std::string>> out(all.size(0));
  for (int64_t r = 0; r < all.size(0); ++r) {
    const char* p = reinterpret_cast<const char*>(all[r].data_ptr<uint8_t>());
    std::string s(p, strnlen(p, static_cast<size_t>(all.size(1))));
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n') out[r].push_back(s.substr(start, i - start)), start = i + 1;
    }
  }
  return out;
}

// Forward-only pass over the validation micro-batches through the pipeline; mean loss on all ranks.
}  // namespace optcc
