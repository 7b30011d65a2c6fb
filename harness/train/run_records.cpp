// Per-step records of a training run (see run_records.h).
#include "harness/train/run_records.h"

#include <sys/resource.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
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

// ---- the tables, declared once ------------------------------------------------------------------
// The rank tables below are the per-step records every rank contributes: each is declared once, as
// its columns after (step, rank), each column with the value it takes from one row's item, and the
// rows (items) a rank has in a step, at most capacity() of them (the same on every rank). The
// schema (result_tables), the packing into the step's one all-gather and the rows rank 0 appends
// all read these declarations, so adding a column is one edit.

// What one rank measured in a step.
struct RankStep {
  const TrafficMeter& meter;
  int64_t peak_rss = 0;
  double pipeline_seconds = 0, step_seconds = 0;
  const StepExtras& x;
};

template <class Item>
struct RecordColumn {
  const char* name;
  ColumnType type;
  const char* unit;
  std::function<double(const Item&)> value;  // exact for integers below 2^53
};

class RankTable {
 public:
  virtual ~RankTable() = default;
  virtual TableSpec spec() const = 0;
  /// Rows a rank may add per step (the all-gather's fixed width needs it on every rank alike).
  virtual int64_t capacity(const StepExtras& x) const = 0;
  virtual int64_t columns() const = 0;
  /// Doubles this table takes in a rank's row of the all-gather: the row count, then the rows.
  int64_t width(const StepExtras& x) const { return 1 + capacity(x) * columns(); }
  /// Writes width(s.x) doubles at `out`: this rank's rows of the step.
  virtual void pack(const RankStep& s, double* out) const = 0;
  /// Appends the rows rank `rank` packed at `in`.
  virtual void append(MetricsSink& sink, int64_t step, int64_t rank, const double* in) const = 0;
};

template <class Item>
class Table final : public RankTable {
 public:
  using Items = std::function<std::vector<Item>(const RankStep&)>;
  using Capacity = std::function<int64_t(const StepExtras&)>;
  Table(std::string group, Capacity capacity, Items items, std::vector<RecordColumn<Item>> columns)
      : group_(std::move(group)), capacity_(std::move(capacity)), items_(std::move(items)), columns_(std::move(columns)) {}

  TableSpec spec() const override {
    TableSpec t{group_, {{"step", ColumnType::kInt64, "steps"}, {"rank", ColumnType::kInt64, ""}}};
    for (const auto& c : columns_) t.columns.push_back({c.name, c.type, c.unit});
    return t;
  }
  int64_t capacity(const StepExtras& x) const override { return capacity_(x); }
  int64_t columns() const override { return static_cast<int64_t>(columns_.size()); }
  void pack(const RankStep& s, double* out) const override {
    const auto items = items_(s);
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(items.size()), capacity_(s.x));
    out[0] = static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < columns(); ++j) out[1 + i * columns() + j] = columns_[j].value(items[i]);
    }
  }
  void append(MetricsSink& sink, int64_t step, int64_t rank, const double* in) const override {
    for (int64_t i = 0; i < static_cast<int64_t>(in[0]); ++i) {
      std::vector<Cell> row{step, rank};
      for (int64_t j = 0; j < columns(); ++j) {
        const double v = in[1 + i * columns() + j];
        row.push_back(columns_[j].type == ColumnType::kInt64 ? Cell{static_cast<int64_t>(v)} : Cell{v});
      }
      sink.append(group_, row);
    }
  }

 private:
  std::string group_;
  Capacity capacity_;
  Items items_;
  std::vector<RecordColumn<Item>> columns_;
};

constexpr auto kI = ColumnType::kInt64;
constexpr auto kF = ColumnType::kFloat64;
template <class Item>
using Cols = std::vector<RecordColumn<Item>>;
std::function<int64_t(const StepExtras&)> one_row() { return [](const StepExtras&) -> int64_t { return 1; }; }

struct TrafficItem {
  int cls = 0, link = 0;
  TrafficCounters t;
};
struct TensorItem {
  int64_t index = 0;
  TensorRecord r;
};
struct DpTotals {
  int64_t tensors = 0, compressed = 0, raw = 0, sent = 0;
};
struct OrthItem {
  int microbatch = 0;
  double cosine = 0, error_mean = 0, delta_mean = 0;
};

// Loss curves (written by the trainer), and the tables of every rank's step.
std::vector<TableSpec> trainer_tables() {
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
  };
}

// What the rank measured: traffic by class and link, peak memory.
void add_measured_tables(std::vector<std::unique_ptr<RankTable>>& t) {
  // One row per (step, rank, class, link) with traffic in that step. class: 0 tp, 1 pp_fwd,
  // 2 pp_bwd, 3 dp, 4 embedding, 5 control, 6 outer (DiLoCo); link: 0 intra-node, 1 inter-node. seconds: measured
  // wall time in the operations; emulated_seconds: link emulation's duration of them
  // (harness/parallel/link_emulator.h; 0 without network.emulate). p2p_bytes: of bytes, those sent
  // point to point; for pp_fwd and pp_bwd the stage-to-stage wire, without the receiving stage's TP
  // all-gather of scatter-gathered slices that the class also holds (stage_link.h).
  t.push_back(std::make_unique<Table<TrafficItem>>(
      "traffic", [](const StepExtras&) -> int64_t { return kNumTraffic * 2; },
      [](const RankStep& s) {
        std::vector<TrafficItem> rows;
        for (int c = 0; c < kNumTraffic; ++c) {
          for (int l = 0; l < 2; ++l) {
            const auto& counters = s.meter.at(static_cast<Traffic>(c), static_cast<Link>(l));
            if (counters.calls > 0) rows.push_back({c, l, counters});
          }
        }
        return rows;
      },
      Cols<TrafficItem>{{"class", kI, "", [](const TrafficItem& i) { return double(i.cls); }},
                        {"link", kI, "", [](const TrafficItem& i) { return double(i.link); }},
                        {"bytes", kI, "bytes", [](const TrafficItem& i) { return double(i.t.bytes); }},
                        {"p2p_bytes", kI, "bytes", [](const TrafficItem& i) { return double(i.t.p2p_bytes); }},
                        {"calls", kI, "", [](const TrafficItem& i) { return double(i.t.calls); }},
                        {"seconds", kF, "s", [](const TrafficItem& i) { return i.t.seconds; }},
                        {"emulated_seconds", kF, "s", [](const TrafficItem& i) { return i.t.emulated_seconds; }}}));
  t.push_back(std::make_unique<Table<RankStep>>(
      "memory", one_row(), [](const RankStep& s) { return std::vector<RankStep>{s}; },
      Cols<RankStep>{{"peak_rss_bytes", kI, "bytes", [](const RankStep& s) { return double(s.peak_rss); }}}));
}

// What the DP reducer and the pipeline codec did.
void add_compression_tables(std::vector<std::unique_ptr<RankTable>>& t) {
  // Every DP gradient reduction, per (step, rank): how many tensors, how many of them compressed,
  // their raw and handed-to-collective bytes (the sums of the per-tensor records below).
  t.push_back(std::make_unique<Table<DpTotals>>(
      "dp_totals", one_row(),
      [](const RankStep& s) {
        std::vector<DpTotals> rows;
        if (!s.x.dp_reducer || s.x.dp_reducer->records().empty()) return rows;
        DpTotals d;
        for (const auto& r : s.x.dp_reducer->records()) {
          d.tensors += 1, d.compressed += r.compressed ? 1 : 0, d.raw += r.raw_bytes, d.sent += r.sent_bytes;
        }
        rows.push_back(d);
        return rows;
      },
      Cols<DpTotals>{{"tensors", kI, "", [](const DpTotals& d) { return double(d.tensors); }},
                     {"compressed_tensors", kI, "", [](const DpTotals& d) { return double(d.compressed); }},
                     {"raw_bytes", kI, "bytes", [](const DpTotals& d) { return double(d.raw); }},
                     {"sent_bytes", kI, "bytes", [](const DpTotals& d) { return double(d.sent); }}}));
  // The per-tensor detail, only where it says something: one row per (step, rank, COMPRESSED DP
  // tensor), at the steps that log (step % log.interval == 0, and the last step). Raw vs.
  // handed-to-collective bytes; `tensor` indexes the root attribute dp_tensor_names[rank];
  // matrix_rank is PowerSGD's effective rank. (Uncompressed tensors are in dp_totals only.)
  t.push_back(std::make_unique<Table<TensorItem>>(
      "dp_tensors", [](const StepExtras& x) { return x.max_dp_tensors; },
      [](const RankStep& s) {
        std::vector<TensorItem> rows;
        if (!s.x.dp_reducer || !s.x.tensor_detail) return rows;
        const auto& recs = s.x.dp_reducer->records();
        for (size_t i = 0; i < recs.size(); ++i) {
          if (recs[i].compressed) rows.push_back({static_cast<int64_t>(i), recs[i]});
        }
        return rows;
      },
      Cols<TensorItem>{{"tensor", kI, "", [](const TensorItem& i) { return double(i.index); }},
                       {"raw_bytes", kI, "bytes", [](const TensorItem& i) { return double(i.r.raw_bytes); }},
                       {"sent_bytes", kI, "bytes", [](const TensorItem& i) { return double(i.r.sent_bytes); }},
                       {"compressed", kI, "", [](const TensorItem& i) { return i.r.compressed ? 1.0 : 0.0; }},
                       {"matrix_rank", kI, "", [](const TensorItem& i) { return double(i.r.rank); }}}));
  // Pipeline codec per (step, rank): messages this rank sent and their bytes before/after; the LEP
  // buffers it holds at the end of the step. Ranks that sent nothing have no row.
  using Codec = const PipelineCodec*;
  t.push_back(std::make_unique<Table<Codec>>(
      "pipeline_codec", one_row(),
      [](const RankStep& s) {
        const PipelineCodec* c = s.x.codec;
        const bool sent = c && (c->stats().backward_sends > 0 || c->stats().forward_wire_bytes > 0);
        return sent ? std::vector<Codec>{c} : std::vector<Codec>{};
      },
      Cols<Codec>{{"backward_sends", kI, "", [](Codec c) { return double(c->stats().backward_sends); }},
                  {"backward_compressed", kI, "", [](Codec c) { return double(c->stats().backward_compressed); }},
                  {"backward_raw_bytes", kI, "bytes", [](Codec c) { return double(c->stats().backward_raw_bytes); }},
                  {"backward_wire_bytes", kI, "bytes", [](Codec c) { return double(c->stats().backward_wire_bytes); }},
                  {"forward_raw_bytes", kI, "bytes", [](Codec c) { return double(c->stats().forward_raw_bytes); }},
                  {"forward_wire_bytes", kI, "bytes", [](Codec c) { return double(c->stats().forward_wire_bytes); }},
                  {"encode_seconds", kF, "s", [](Codec c) { return c->stats().encode_seconds; }},
                  {"decode_seconds", kF, "s", [](Codec c) { return c->stats().decode_seconds; }},
                  {"lep_bytes", kI, "bytes", [](Codec c) { return double(c->lep_bytes()); }}}));
}

// Memory by component (Fig. 12), the LEP series (Fig. 11, diagnostics), per-rank timing.
void add_component_tables(std::vector<std::unique_ptr<RankTable>>& t) {
  // Fig. 12 (docs/design.md §8.3): tensor memory per (step, rank) by component, bytes. activations_peak
  // is the tracked peak during the pipeline schedule above the memory held when it started;
  // tracked_peak the peak of all tensor memory over the step (memory_tracker.h). The trainer fills
  // StepExtras::memory in this order. outer_state: DiLoCo's backup weights, outer momentum, delayed
  // global values and outer reducer state (harness/train/outer_sync.h; 0 under allreduce).
  const char* components[kMemoryComponents] = {"parameters", "gradients", "optimizer", "activations_peak",
                                               "lep_buffers", "ef_buffers", "pq_buffers", "tracked_peak",
                                               "outer_state"};
  Cols<RankStep> memory;
  for (int i = 0; i < kMemoryComponents; ++i) {
    memory.push_back({components[i], kI, "bytes", [i](const RankStep& s) { return double(s.x.memory[i]); }});
  }
  t.push_back(std::make_unique<Table<RankStep>>(
      "memory_components", one_row(), [](const RankStep& s) { return std::vector<RankStep>{s}; }, memory));
  // Fig. 11 (docs/design.md §3.3), when log.lep_orthogonality is on: one row per (step, rank, j).
  t.push_back(std::make_unique<Table<OrthItem>>(
      "lep_orthogonality", [](const StepExtras& x) { return x.max_orth_pairs; },
      [](const RankStep& s) {
        std::vector<OrthItem> rows;
        if (!s.x.codec || s.x.max_orth_pairs == 0) return rows;
        const auto o = s.x.codec->orthogonality();
        for (size_t i = 0; i < o.cosine.size(); ++i) {
          rows.push_back({o.microbatch[i], o.cosine[i], o.error_mean[i], o.delta_mean[i]});
        }
        return rows;
      },
      Cols<OrthItem>{{"microbatch", kI, "", [](const OrthItem& i) { return double(i.microbatch); }},
                     {"cosine", kF, "", [](const OrthItem& i) { return i.cosine; }},
                     {"error_mean", kF, "", [](const OrthItem& i) { return i.error_mean; }},
                     {"delta_mean", kF, "", [](const OrthItem& i) { return i.delta_mean; }}}));
  // LEP diagnostics (paper/lep-study.md), when log.lep_diagnostics is on: one row per compressed backward
  // send (step, rank, micro-batch); pipeline_codec.h's LepSendRecord. Norms are L2 over the
  // rank's fp32 slice; NaN where undefined; carried_age -1 = nothing carried.
  t.push_back(std::make_unique<Table<LepSendRecord>>(
      "lep_diagnostics", [](const StepExtras& x) { return x.max_lep_sends; },
      [](const RankStep& s) {
        if (!s.x.codec || s.x.max_lep_sends == 0) return std::vector<LepSendRecord>{};
        return s.x.codec->lep_diagnostics();
      },
      Cols<LepSendRecord>{{"microbatch", kI, "", [](const LepSendRecord& e) { return double(e.microbatch); }},
                          {"slice_norm", kF, "", [](const LepSendRecord& e) { return e.slice_norm; }},
                          {"carried_norm", kF, "", [](const LepSendRecord& e) { return e.carried_norm; }},
                          {"error_norm", kF, "", [](const LepSendRecord& e) { return e.error_norm; }},
                          {"relative_error", kF, "", [](const LepSendRecord& e) { return e.relative_error; }},
                          {"cos_carried_slice", kF, "", [](const LepSendRecord& e) { return e.cos_carried_slice; }},
                          {"cos_carried_delta", kF, "", [](const LepSendRecord& e) { return e.cos_carried_delta; }},
                          {"carried_age", kI, "steps", [](const LepSendRecord& e) { return double(e.carried_age); }}}));
  // Every rank's own timing of each step (BR-19 in docs/faults.md): its pipeline schedule, then the whole step;
  // pipeline_compute_seconds: the schedule's compute actions (F, B, W with the TP collectives inside
  // them), so 1 - pipeline_compute_seconds / pipeline_seconds is the rank's measured bubble.
  t.push_back(std::make_unique<Table<RankStep>>(
      "timing", one_row(), [](const RankStep& s) { return std::vector<RankStep>{s}; },
      Cols<RankStep>{{"pipeline_seconds", kF, "s", [](const RankStep& s) { return s.pipeline_seconds; }},
                     {"step_seconds", kF, "s", [](const RankStep& s) { return s.step_seconds; }},
                     {"pipeline_compute_seconds", kF, "s",
                      [](const RankStep& s) { return s.x.pipeline_compute_seconds; }}}));
}

// Every rank table, in results-file order (the order of result_tables()).
const std::vector<std::unique_ptr<RankTable>>& rank_tables() {
  static const auto tables = [] {
    std::vector<std::unique_ptr<RankTable>> t;
    add_measured_tables(t);
    add_compression_tables(t);
    add_component_tables(t);
    return t;
  }();
  return tables;
}

}  // namespace

std::vector<TableSpec> result_tables() {
  std::vector<TableSpec> out = trainer_tables();
  for (const auto& t : rank_tables()) out.push_back(t->spec());
  return out;
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// Every rank's rows of the step (rank_tables(): traffic, peak memory, timings, compression records,
// at widths every rank agrees on), gathered to all ranks with one all-gather; rank 0 writes.
void record_rank_stats(Distributed& d, MetricsSink* sink, int64_t step, double pipeline_seconds, double step_seconds,
                       const StepExtras& x) {
  const auto& tables = rank_tables();
  int64_t width = 0;
  for (const auto& t : tables) width += t->width(x);
  auto mine = torch::zeros({width}, torch::kDouble);
  const RankStep s{d.meter, peak_rss_bytes(), pipeline_seconds, step_seconds, x};
  int64_t at = 0;
  for (const auto& t : tables) {
    t->pack(s, mine.data_ptr<double>() + at);
    at += t->width(x);
  }
  if (x.codec) x.codec->reset_stats();
  d.meter.reset();
  auto all = d.world->all_gather(mine.unsqueeze(0), Traffic::kControl, 0).contiguous();  // [world, width]
  if (!sink) return;
  for (int64_t r = 0; r < all.size(0); ++r) {
    const double* row = all[r].data_ptr<double>();
    at = 0;
    for (const auto& t : tables) {
      t->append(*sink, step, r, row + at);
      at += t->width(x);
    }
  }
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
