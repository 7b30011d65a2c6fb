// The `optcc traffic` report (traffic_report.h): formatting only; the numbers come from the estimate.
#include "harness/perfmodel/traffic_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <cmath>

#include "harness/train/run_records.h"

namespace optcc {

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  int u = 0;
  double v = bytes;
  while (std::abs(v) >= 1000.0 && u < 6) v /= 1000.0, ++u;
  if (u == 0) return fmt::format("{:.0f} B", v);
  const int decimals = std::abs(v) >= 100 ? 1 : std::abs(v) >= 10 ? 2 : 3;
  return fmt::format("{:.{}f} {}", v, decimals, units[u]);
}

namespace {

const Traffic kModelledClasses[] = {Traffic::kTensorParallel, Traffic::kPipelineForward, Traffic::kPipelineBackward,
                                    Traffic::kDataParallel, Traffic::kEmbedding, Traffic::kOuter};

// `outer` exists under compression.dp_strategy: diloco only; other runs' reports leave it out.
bool shown(const TrafficEstimate& e, Traffic cls) { return cls != Traffic::kOuter || e.cluster_total(cls) != 0; }

std::string join_bytes(const std::vector<int64_t>& v) {
  std::string out;
  for (auto x : v) out += (out.empty() ? "" : " / ") + format_bytes(static_cast<double>(x));
  return out;
}

std::string or_na(int64_t v) { return v < 0 ? "n/a" : format_bytes(static_cast<double>(v)); }

// "powersgd r128" for "{name: powersgd, rank: 128, ...}", else the name.
std::string short_spec(const std::string& yaml) {
  const YAML::Node n = YAML::Load(yaml);
  if (!n.IsMap()) return n.as<std::string>();
  std::string out = n["name"].as<std::string>();
  if (n["rank"]) out += " r" + n["rank"].as<std::string>();
  return out;
}

std::string describe_scheme(const Config& cfg) {
  const auto& k = cfg.compression;
  return fmt::format("scheme '{}': dp={} (dp_stages {}) | pipeline_backward={} ({}, lep {}) | pipeline_forward={} | "
                     "fused_embedding={} | embedding={} | tp={}",
                     k.scheme.empty() ? "-" : k.scheme, to_yaml_value(k.dp), k.dp_stages.text(), to_yaml_value(k.pipeline_backward),
                     to_string(k.backward_phases), to_string(k.lep), to_yaml_value(k.pipeline_forward), k.fused_embedding ? "on" : "off",
                     to_yaml_value(k.embedding), to_yaml_value(k.tp)) +
         (k.diloco_on() ? fmt::format("\ndp_strategy diloco: inner_steps H={} fragments F={} sync_delay τ={} mix α={} | outer "
                                      "lr {} momentum {}{} | outer={} (bytes per iteration: a period's over H)",
                                      k.diloco.inner_steps, k.diloco.fragments, k.diloco.sync_delay, k.diloco.mix,
                                      k.diloco.outer_lr, k.diloco.outer_momentum, k.diloco.nesterov ? " nesterov" : "",
                                      to_yaml_value(k.diloco.outer))
                        : "");
}

}  // namespace

namespace {

// "2 B" or "2 B (activations, train.precision bf16) / 4 B (gradients)", with the uncompressed DP
// all-reduce's when parallel.grad_reduce_dtype makes it differ.
std::string beta_text(const Config& cfg, const TrafficModelOptions& o) {
  const int64_t a = activation_element_bytes(cfg, o), g = gradient_element_bytes(o);
  const int64_t dp = uncompressed_dp_element_bytes(cfg, o);
  if (o.element_bytes > 0) return fmt::format("{} B", a);
  return fmt::format("{} B (activations, train.precision {}) / {} B (gradients{})", a, cfg.train.precision, g,
                     dp != g ? fmt::format("; uncompressed DP all-reduce {} B, parallel.grad_reduce_dtype compute", dp)
                             : "");
}

void report_header(std::string& out, const Config& cfg, const TrafficEstimate& e, const TrafficModelOptions& o) {
  out += fmt::format(
      "optcc traffic (analytic, bytes per iteration; decimal units): model '{}' L={} h={} heads={} s={} vocab {} "
      "(padded {})\n",
      cfg.model.preset, cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_heads, cfg.model.seq_len,
      cfg.model.vocab_size, cfg.padded_vocab_size());
  out += fmt::format(
      "layout tp={} pp={} dp={} = {} GPUs, {} per node ({} nodes); b={} B={} m={}; β={}; k_TP={} ({}); "
      "scatter-gather {}\n",
      e.dims.tp, e.dims.pp, e.dims.dp, e.dims.world(), e.ranks_per_node,
      (e.dims.world() + e.ranks_per_node - 1) / e.ranks_per_node, cfg.train.micro_batch_size,
      cfg.train.global_batch_size, e.micro_batches, beta_text(cfg, o), e.k_tp,
      o.recompute ? "full recomputation" : "no recomputation", e.scatter_gather ? "on" : "off");
  out += describe_scheme(cfg) + "\n";
  if (o.reference_powersgd) out += "DP PowerSGD modelled with the reference's rule: every >=2-D gradient compressed\n";
}

// Per GPU of each stage: class x link rows, the total, the DP reducer and compressed backward sends.
void report_per_gpu(std::string& out, const TrafficEstimate& e) {
  const int64_t p = e.dims.pp;
  out += "\nPer GPU and iteration (one GPU of each stage; all TP and DP ranks of a stage send alike)\n";
  std::string head = fmt::format("{:<10} {:<6}", "class", "link");
  for (int64_t k = 0; k < p; ++k) head += fmt::format(" {:>13}", fmt::format("stage {}", k));
  out += head + "\n";
  for (Traffic cls : kModelledClasses) {
    const int c = static_cast<int>(cls);
    for (int l = 0; l < 2; ++l) {
      bool any = false;
      for (int64_t k = 0; k < p; ++k) any = any || e.gpu(static_cast<int>(k)).bytes[c][l] != 0;
      if (!any && e.modelled[c]) continue;
      std::string line = fmt::format("{:<10} {:<6}", traffic_name(cls), link_name(static_cast<Link>(l)));
      for (int64_t k = 0; k < p; ++k) {
        line += fmt::format(" {:>13}", e.modelled[c] ? format_bytes(static_cast<double>(e.gpu(static_cast<int>(k)).bytes[c][l]))
                                                     : "not modelled");
      }
      out += line + "\n";
    }
  }
  std::string total = fmt::format("{:<10} {:<6}", "total", "");
  for (int64_t k = 0; k < p; ++k) {
    int64_t sum = 0;
    for (Traffic cls : kModelledClasses) {
      if (e.modelled[static_cast<int>(cls)]) sum += e.gpu(static_cast<int>(k)).of(cls);
    }
    total += fmt::format(" {:>13}", format_bytes(static_cast<double>(sum)));
  }
  out += total + "\n";
  std::string reducers = fmt::format("{:<17}", "DP reducer");
  for (int64_t k = 0; k < p; ++k) reducers += fmt::format(" {:>13}", short_spec(e.stages[k].dp_reducer));
  out += reducers + "\n";
  std::string cb = fmt::format("{:<17}", "bwd compressed");
  for (int64_t k = 0; k < p; ++k) cb += fmt::format(" {:>13}", fmt::format("{}/{}", e.stages[k].backward_compressed, e.stages[k].backward_sends));
  out += cb + "\n";
}

void report_cluster(std::string& out, const TrafficEstimate& e) {
  out += "\nCluster total per iteration\n";
  out += fmt::format("{:<10} {:>13} {:>13} {:>13}\n", "class", "intra", "inter", "total");
  for (Traffic cls : kModelledClasses) {
    const int c = static_cast<int>(cls);
    if (!shown(e, cls)) continue;
    if (!e.modelled[c]) {
      out += fmt::format("{:<10} {:>13} {:>13} {:>13}\n", traffic_name(cls), "not modelled", "", "");
      continue;
    }
    out += fmt::format("{:<10} {:>13} {:>13} {:>13}\n", traffic_name(cls), format_bytes(static_cast<double>(e.cluster[c][0])),
                       format_bytes(static_cast<double>(e.cluster[c][1])), format_bytes(static_cast<double>(e.cluster_total(cls))));
  }
  int64_t intra = 0, inter = 0;
  for (Traffic cls : kModelledClasses) {
    if (!e.modelled[static_cast<int>(cls)]) continue;
    intra += e.cluster[static_cast<int>(cls)][0], inter += e.cluster[static_cast<int>(cls)][1];
  }
  out += fmt::format("{:<10} {:>13} {:>13} {:>13}\n", "total", format_bytes(static_cast<double>(intra)),
                     format_bytes(static_cast<double>(inter)), format_bytes(static_cast<double>(intra + inter)));
}

void report_spec_rows(std::string& out, const TrafficEstimate& e, const PaperTrafficRows& rows) {
  out += "\ndocs/design.md §9 rows (this model and layout; baseline / technique variants of the config)\n";
  auto row = [&](const std::string& what, const std::string& value) { out += fmt::format("  {:<58} {}\n", what, value); };
  std::string theta;
  for (auto v : rows.stage_parameters) theta += (theta.empty() ? "" : " / ") + fmt::format("{:.1f} M", v / 1e6);
  row("Θ per TP rank, stage 0..p-1", theta);
  row("one PP message (all TP ranks)", format_bytes(static_cast<double>(rows.pp_message)));
  row(fmt::format("same, {}-compressed ({})", rows.cb_label, rows.cb_codec), or_na(rows.pp_message_cb));
  row("PP forward total (cluster, stage-to-stage sends)", format_bytes(static_cast<double>(rows.pp_forward_total)));
  row(fmt::format("PP backward, baseline / {0}-epi / {0}-all", rows.cb_label),
      fmt::format("{} / {} / {}", format_bytes(static_cast<double>(rows.pp_backward_baseline)), or_na(rows.pp_backward_cb_epilogue),
                  or_na(rows.pp_backward_cb_all)));
  row("DP per GPU, stage 0..p-1, baseline", join_bytes(rows.dp_per_gpu_baseline));
  if (rows.fe_sc_apply) {
    row("DP per GPU with FE+SC, stage 0..p-1 (reducer below)",
        rows.dp_per_gpu_fe_sc.empty() ? "not modelled" : join_bytes(rows.dp_per_gpu_fe_sc));
    row("  FE+SC reducer, dp_stages", fmt::format("{}, {}", rows.fe_sc_reducer, rows.fe_sc_stages));
    row("DP total, baseline -> FE+SC", fmt::format("{} -> {}", format_bytes(static_cast<double>(rows.dp_total_baseline)),
                                                    rows.dp_total_fe_sc < 0 ? "not modelled" : format_bytes(static_cast<double>(rows.dp_total_fe_sc))));
    row("embedding-related total: baseline / FE / FE (reference group)",
        fmt::format("{} / {} / {}", format_bytes(static_cast<double>(rows.embedding_total_baseline)),
                    format_bytes(static_cast<double>(rows.embedding_total_fe)),
                    format_bytes(static_cast<double>(rows.embedding_total_fe_reference))));
  } else {
    row("FE and SC rows", "left out: they act on the every-step DP reduction, which dp_strategy diloco does not run");
  }
  row(fmt::format("TP all-reduce total (k_TP={})", e.k_tp), format_bytes(static_cast<double>(rows.tp_total)));
  row("LEP buffer per GPU", format_bytes(static_cast<double>(rows.lep_per_gpu)));
}

void report_notes(std::string& out, const TrafficEstimate& e, const PaperTrafficRows& rows) {
  std::vector<std::string> notes = e.notes;
  notes.insert(notes.end(), rows.notes.begin(), rows.notes.end());
  if (!notes.empty()) {
    out += "\nNotes\n";
    for (const auto& n : notes) out += "  - " + n + "\n";
  }
}

}  // namespace

std::string traffic_report(const Config& cfg, const TrafficEstimate& e, const PaperTrafficRows& rows,
                           const TrafficModelOptions& o) {
  std::string out;
  report_header(out, cfg, e, o);
  report_per_gpu(out, e);
  report_cluster(out, e);
  report_spec_rows(out, e, rows);
  report_notes(out, e, rows);
  out += fmt::format("\nresults file of such a run (optcc train's records, harness/train/run_records.h): {}\n",
                     projection_text(project_results(cfg), cfg.train.train_steps));
  return out;
}

namespace {

// One class x link table: {class: {intra, inter, total}} (null: not modelled).
nlohmann::json class_link_json(const TrafficEstimate& e, const ClassLinkBytes& v) {
  using nlohmann::json;
  json c;
  for (Traffic cls : kModelledClasses) {
    const int i = static_cast<int>(cls);
    if (!shown(e, cls)) continue;
    if (!e.modelled[i]) {
      c[traffic_name(cls)] = nullptr;
      continue;
    }
    c[traffic_name(cls)] = {{"intra", v[i][0]}, {"inter", v[i][1]}, {"total", v[i][0] + v[i][1]}};
  }
  return c;
}

nlohmann::json stages_json(const TrafficEstimate& e) {
  using nlohmann::json;
  json stages = json::array();
  for (int64_t k = 0; k < e.dims.pp; ++k) {
    const auto& g = e.stages[k];
    stages.push_back({{"stage", k},
                      {"layers", g.layers},
                      {"parameters", g.parameters},
                      {"dp_elements", g.dp_elements},
                      {"dp_reducer", g.dp_reducer},
                      {"compresses_dp", g.compresses_dp},
                      {"backward_sends", g.backward_sends},
                      {"backward_compressed", g.backward_compressed},
                      {"lep_bytes", g.lep_bytes},
                      {"per_gpu", class_link_json(e, e.gpu(static_cast<int>(k)).bytes)}});
  }
  return stages;
}

nlohmann::json spec9_json(const PaperTrafficRows& rows) {
  nlohmann::json j;
  j["spec9"] = {{"stage_parameters", rows.stage_parameters},
                {"pp_message", rows.pp_message},
                {"pp_message_cb", rows.pp_message_cb},
                {"cb_codec", rows.cb_codec},
                {"cb_label", rows.cb_label},
                {"fe_sc_apply", rows.fe_sc_apply},
                {"pp_forward_total", rows.pp_forward_total},
                {"pp_backward_baseline", rows.pp_backward_baseline},
                {"pp_backward_cb_epilogue", rows.pp_backward_cb_epilogue},
                {"pp_backward_cb_all", rows.pp_backward_cb_all},
                {"dp_per_gpu_baseline", rows.dp_per_gpu_baseline},
                {"dp_per_gpu_fe_sc", rows.dp_per_gpu_fe_sc},
                {"fe_sc_reducer", rows.fe_sc_reducer},
                {"fe_sc_stages", rows.fe_sc_stages},
                {"dp_total_baseline", rows.dp_total_baseline},
                {"dp_total_fe_sc", rows.dp_total_fe_sc},
                {"embedding_total_baseline", rows.embedding_total_baseline},
                {"embedding_total_fe", rows.embedding_total_fe},
                {"embedding_total_fe_reference", rows.embedding_total_fe_reference},
                {"tp_total", rows.tp_total},
                {"lep_per_gpu", rows.lep_per_gpu}};
  return j["spec9"];
}

}  // namespace

std::string traffic_report_json(const Config& cfg, const TrafficEstimate& e, const PaperTrafficRows& rows,
                                const TrafficModelOptions& o) {
  using nlohmann::json;
  json j;
  j["model"] = {{"preset", cfg.model.preset},        {"num_layers", cfg.model.num_layers},
                {"hidden_size", cfg.model.hidden_size}, {"num_heads", cfg.model.num_heads},
                {"seq_len", cfg.model.seq_len},      {"vocab_size", cfg.model.vocab_size},
                {"padded_vocab_size", cfg.padded_vocab_size()}};
  j["layout"] = {{"tp", e.dims.tp},
                 {"pp", e.dims.pp},
                 {"dp", e.dims.dp},
                 {"world", e.dims.world()},
                 {"ranks_per_node", e.ranks_per_node},
                 {"micro_batch_size", cfg.train.micro_batch_size},
                 {"global_batch_size", cfg.train.global_batch_size},
                 {"micro_batches", e.micro_batches}};
  const ResultsProjection proj = project_results(cfg);
  j["results_file"] = {{"rows_per_step", proj.rows_per_step},   {"bytes_per_step", proj.bytes_per_step},
                       {"detail_rows", proj.detail_rows},       {"detail_bytes", proj.detail_bytes},
                       {"logging_steps", proj.logging_steps},   {"total_bytes", proj.total_bytes},
                       {"train_steps", cfg.train.train_steps}};
  j["options"] = {{"recompute", o.recompute},
                  {"k_tp", e.k_tp},
                  {"element_bytes", activation_element_bytes(cfg, o)},
                  {"gradient_element_bytes", gradient_element_bytes(o)},
                  {"uncompressed_dp_element_bytes", uncompressed_dp_element_bytes(cfg, o)},
                  {"reference_powersgd", o.reference_powersgd},
                  {"scatter_gather", e.scatter_gather}};
  j["compression"] = describe_scheme(cfg);
  j["stages"] = stages_json(e);
  j["cluster"] = class_link_json(e, e.cluster);
  j["cluster_total"] = e.cluster_total();
  j["spec9"] = spec9_json(rows);
  std::vector<std::string> notes = e.notes;
  notes.insert(notes.end(), rows.notes.begin(), rows.notes.end());
  j["notes"] = notes;
  return j.dump(2) + "\n";
}

}  // namespace optcc
