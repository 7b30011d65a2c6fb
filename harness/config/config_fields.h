// The field lists of each config section, in file order. One visitor drives loading, overrides,
// type checks and YAML output, so a new field is added in exactly two places (struct + here).
#pragma once

namespace optcc {

template <class V> void ModelConfig::visit(V&& v) {
  v("preset", preset);
  v("num_layers", num_layers);
  v("hidden_size", hidden_size);
  v("num_heads", num_heads);
  v("seq_len", seq_len);
  v("max_position_embeddings", max_position_embeddings);
  v("vocab_size", vocab_size);
  v("vocab_divisor", vocab_divisor);
  v("hidden_dropout", hidden_dropout);
  v("attention_dropout", attention_dropout);
  v("init_std", init_std);
  v("attention", attention);
}

template <class V> void ParallelConfig::visit(V&& v) {
  v("tp", tp);
  v("pp", pp);
  v("dp", dp);
  v("ranks_per_node", ranks_per_node);
  v("stage_layers", stage_layers);
  v("schedule", schedule);
  v("virtual_stages", virtual_stages);
  v("timeout_seconds", timeout_seconds);
  v("interface", interface);
  v("device", device);
  v("backend", backend);
  v("grad_reduce_dtype", grad_reduce_dtype);
}

template <class V> void TrainConfig::visit(V&& v) {
  v("micro_batch_size", micro_batch_size);
  v("global_batch_size", global_batch_size);
  v("train_steps", train_steps);
  v("lr", lr);
  v("min_lr", min_lr);
  v("warmup_steps", warmup_steps);
  v("decay_steps", decay_steps);
  v("weight_decay", weight_decay);
  v("adam_beta1", adam_beta1);
  v("adam_beta2", adam_beta2);
  v("adam_eps", adam_eps);
  v("clip_grad", clip_grad);
  v("seed", seed);
  v("eval_interval", eval_interval);
  v("eval_iters", eval_iters);
  v("threads", threads);
  v("precision", precision);
  v("loss_scale_initial", loss_scale_initial);
  v("loss_scale_growth_interval", loss_scale_growth_interval);
  v("loss_scale_backoff", loss_scale_backoff);
  v("loss_scale_min", loss_scale_min);
  v("max_skipped_steps", max_skipped_steps);
  v("skip_nonfinite", skip_nonfinite);
}

template <class V> void DataConfig::visit(V&& v) {
  v("dir", dir);
  v("sources", sources);
  v("prefix", prefix);
  v("vocab_size", vocab_size);
  v("tokenizer_type", tokenizer_type);
  v("split", split);
}

template <class V> void CompressionConfig::visit(V&& v) {
  v("scheme", scheme);
  v("dp", dp);
  v("dp_stages", dp_stages);
  v("embedding", embedding);
  v("fused_embedding", fused_embedding);
  v("pipeline_forward", pipeline_forward);
  v("pipeline_backward", pipeline_backward);
  v("backward_phases", backward_phases);
  v("lep", lep);
  v("lep_decay", lep_decay);
  v("tp", tp);
  v("dp_strategy", dp_strategy);
}

template <class V> void DilocoConfig::visit(V&& v) {
  v("inner_steps", inner_steps);
  v("outer_lr", outer_lr);
  v("outer_momentum", outer_momentum);
  v("nesterov", nesterov);
  v("fragments", fragments);
  v("sync_delay", sync_delay);
  v("mix", mix);
  v("outer", outer);
}

template <class V> void NetworkConfig::visit(V&& v) {
  v("emulate", emulate);
  v("profile", profile);
  v("intra_node_gbps", intra_node_gbps);
  v("inter_node_gbps", inter_node_gbps);
  v("intra_node_latency_us", intra_node_latency_us);
  v("inter_node_latency_us", inter_node_latency_us);
  v("scale", scale);
  v("match_regime", match_regime);
  v("skip", skip);
}

template <class V> void LogConfig::visit(V&& v) {
  v("dir", dir);
  v("run_name", run_name);
  v("interval", interval);
  v("level", level);
  v("lep_orthogonality", lep_orthogonality);
  v("lep_diagnostics", lep_diagnostics);
  v("timeline_steps", timeline_steps);
}

template <class V> void CheckpointConfig::visit(V&& v) {
  v("dir", dir);
  v("interval", interval);
  v("save_final", save_final);
  v("keep", keep);
}

/// Calls `f(section_name, section_struct)` for every section, in file order.
template <class F> void for_each_section(Config& c, F&& f) {
  f("model", c.model);
  f("parallel", c.parallel);
  f("train", c.train);
  f("data", c.data);
  f("compression", c.compression);
  f("diloco", c.compression.diloco);
  f("network", c.network);
  f("log", c.log);
  f("checkpoint", c.checkpoint);
}

}  // namespace optcc
