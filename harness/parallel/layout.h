// Rank arithmetic for 3D parallelism: which global ranks form each group, which node each rank is
// on, and whether a message between two ranks stays inside a node. Pure: no LibTorch and no
// communicators (a later class creates one c10d group per list returned here).
//
// Megatron order, tensor-parallel fastest, then data-parallel, then pipeline (docs/design.md §1.1):
//   rank = tp + TP * (dp + DP * pp)
// With ranks_per_node a multiple of TP every TP group lies inside one node (NVLink), and PP and DP
// traffic is what crosses nodes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace optcc {

/// Sizes of the three parallel axes.
struct ParallelDims {
  int tp = 1;  // tensor-parallel size (ranks per TP group)
  int pp = 1;  // pipeline-parallel size (stages)
  int dp = 1;  // data-parallel size (model replicas)
  int world() const { return tp * pp * dp; }
  /// Throws std::invalid_argument when an axis is < 1 or tp*pp*dp != world_size; the message
  /// prints every factor and the product, e.g. "tp*pp*dp = 2*2*3 = 12 but world size is 8".
  void validate(int world_size) const;
};

/// Position of one rank on the three axes.
struct RankCoord {
  int tp = 0, dp = 0, pp = 0;
  bool operator==(const RankCoord& o) const { return tp == o.tp && dp == o.dp && pp == o.pp; }
  bool operator!=(const RankCoord& o) const { return !(*this == o); }
};

enum class Link { kIntraNode, kInterNode };

/// Kinds of groups. Every group is a sorted list of global ranks and is the same list on every
/// member. Groups of the first four kinds partition the world; kEmbedding and kFusedEmbedding
/// groups cover the first and last pipeline stages only.
enum class GroupKind {
  kTensorParallel,    // t consecutive ranks, fixed (dp, pp)
  kDataParallel,      // d ranks, fixed (tp, pp): pp*t*d + tp + j*t for j = 0..d-1
  kPipelineParallel,  // p ranks, fixed (tp, dp), ascending = ordered by stage
  kModelParallel,     // t*p ranks of one DP replica (grad-norm / inf-check all-reduces)
  kEmbedding,         // {stage 0, stage p-1} with the same (tp, dp): tied word-embedding sync
  kFusedEmbedding,    // Optimus-CC FE, corrected (docs/design.md §5.3): {stage 0, stage p-1} x all dp,
                      // one group per tp index; NOT the reference's single 2*t*d group
};
std::string_view group_kind_name(GroupKind kind);  // "tp", "dp", "pp", "mp", "embedding", "fe"

/// Dims plus the node size. Built once, passed by const reference; cheap to copy.
///
/// Nodes: node_of(rank) = rank / ranks_per_node. world need not be a multiple of ranks_per_node:
/// the last node is then partial (e.g. world 6, ranks_per_node 4: nodes {0..3}, {4, 5}), which is
/// what a heterogeneous allocation or an emulated cluster on one machine gives. ranks_per_node
/// larger than world is allowed (a single, partly used node).
///
/// Every method taking a rank REQUIRES 0 <= rank < world() and throws std::out_of_range otherwise.
class RankLayout {
 public:
  /// Throws std::invalid_argument when tp, pp, dp or ranks_per_node is < 1.
  RankLayout(ParallelDims dims, int ranks_per_node);

  const ParallelDims& dims() const { return dims_; }
  int world() const { return dims_.world(); }
  int ranks_per_node() const { return ranks_per_node_; }
  int num_nodes() const { return (world() + ranks_per_node_ - 1) / ranks_per_node_; }

  RankCoord coord(int rank) const;
  int rank(RankCoord c) const;  // throws std::out_of_range when a coordinate is outside its axis
  int node_of(int rank) const;
  bool is_first_stage(int rank) const { return coord(rank).pp == 0; }
  bool is_last_stage(int rank) const { return coord(rank).pp == dims_.pp - 1; }

  // The group of each kind that `rank` belongs to (sorted ascending).
  std::vector<int> tp_group(int rank) const;
  std::vector<int> dp_group(int rank) const;
  std::vector<int> pp_group(int rank) const;
  std::vector<int> model_parallel_group(int rank) const;
  /// {stage 0, stage p-1} with this rank's (tp, dp); {rank} when p == 1; empty for middle stages.
  std::vector<int> embedding_group(int rank) const;
  /// {stage 0, stage p-1} x all dp for this rank's tp index: 2*d ranks (d when p == 1); empty for
  /// middle stages. Summing word-embedding gradients over it then dividing by d equals the
  /// baseline DP average + embedding-pair sum, because all members hold the same vocab shard.
  std::vector<int> fused_embedding_group(int rank) const;
  /// Dispatches to the functions above.
  std::vector<int> group(GroupKind kind, int rank) const;

  /// Every distinct group of a kind, ordered by smallest member, so that all ranks can create all
  /// c10d groups in the same order (c10d requires every rank to call new_group for every group).
  std::vector<std::vector<int>> all_groups(GroupKind kind) const;

  /// Neighbours in the pipeline with the same (tp, dp); -1 at the first / last stage (no wrap:
  /// the non-interleaved 1F1B schedule never uses the wrapping neighbour).
  int prev_stage_rank(int rank) const;
  int next_stage_rank(int rank) const;

  /// kIntraNode when both ranks are on the same node (a == b included).
  Link link(int a, int b) const;
  /// kInterNode when any two members are on different nodes; kIntraNode for 0 or 1 members.
  Link group_link(const std::vector<int>& group) const;

  /// Multi-line table "rank tp dp pp node" for the start-up log, headed by the dims.
  std::string describe() const;

 private:
  void check_rank(int rank) const;

  ParallelDims dims_;
  int ranks_per_node_;
};

}  // namespace optcc
