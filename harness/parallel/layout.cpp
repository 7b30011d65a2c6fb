#include "harness/parallel/layout.h"

#include <fmt/format.h>

#include <stdexcept>

namespace optcc {

void ParallelDims::validate(int world_size) const {
  if (tp < 1 || pp < 1 || dp < 1) {
    throw std::invalid_argument(fmt::format(
        "parallel: tp, pp and dp must all be >= 1, got tp={} pp={} dp={}", tp, pp, dp));
  }
  if (world() == world_size) return;
  std::string hint;
  if (world_size % (tp * pp) == 0) {
    hint = fmt::format(" (e.g. keep tp={} pp={} and set dp = {} / ({}*{}) = {})", tp, pp, world_size, tp,
                       pp, world_size / (tp * pp));
  }
  throw std::invalid_argument(
      fmt::format("parallel: tp*pp*dp = {}*{}*{} = {} but world size is {}; choose tp, pp, dp whose "
                  "product is {}{}",
                  tp, pp, dp, world(), world_size, world_size, hint));
}

std::string_view group_kind_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::kTensorParallel: return "tp";
    case GroupKind::kDataParallel: return "dp";
    case GroupKind::kPipelineParallel: return "pp";
    case GroupKind::kModelParallel: return "mp";
    case GroupKind::kEmbedding: return "embedding";
    case GroupKind::kFusedEmbedding: return "fe";
  }
  return "?";
}

RankLayout::RankLayout(ParallelDims dims, int ranks_per_node) : dims_(dims), ranks_per_node_(ranks_per_node) {
  if (dims.tp < 1 || dims.pp < 1 || dims.dp < 1 || ranks_per_node < 1) {
    throw std::invalid_argument(fmt::format(
        "RankLayout: tp, pp, dp and ranks_per_node must all be >= 1, got tp={} pp={} dp={} "
        "ranks_per_node={}",
        dims.tp, dims.pp, dims.dp, ranks_per_node));
  }
}

void RankLayout::check_rank(int rank) const {
  if (rank < 0 || rank >= world()) {
    throw std::out_of_range(fmt::format("RankLayout: rank {} is outside [0, {}) for tp={} pp={} dp={}", rank,
                                        world(), dims_.tp, dims_.pp, dims_.dp));
  }
}

RankCoord RankLayout::coord(int rank) const {
  check_rank(rank);
  RankCoord c;
  c.tp = rank % dims_.tp;
  c.dp = (rank / dims_.tp) % dims_.dp;
  c.pp = rank / (dims_.tp * dims_.dp);
  return c;
}

int RankLayout::rank(RankCoord c) const {
  if (c.tp < 0 || c.tp >= dims_.tp || c.dp < 0 || c.dp >= dims_.dp || c.pp < 0 || c.pp >= dims_.pp) {
    throw std::out_of_range(fmt::format("RankLayout: coordinate (tp={}, dp={}, pp={}) is outside tp<{} dp<{} pp<{}",
                                        c.tp, c.dp, c.pp, dims_.tp, dims_.dp, dims_.pp));
  }
  return c.tp + dims_.tp * (c.dp + dims_.dp * c.pp);
}

int RankLayout::node_of(int rank) const {
  check_rank(rank);
  return rank / ranks_per_node_;
}

std::vector<int> RankLayout::tp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (c.tp = 0; c.tp < dims_.tp; ++c.tp) g.push_back(this->rank(c));
  return g;
}

std::vector<int> RankLayout::dp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (c.dp = 0; c.dp < dims_.dp; ++c.dp) g.push_back(this->rank(c));
  return g;
}

std::vector<int> RankLayout::pp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (c.pp = 0; c.pp < dims_.pp; ++c.pp) g.push_back(this->rank(c));
  return g;
}

std::vector<int> RankLayout::model_parallel_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (c.pp = 0; c.pp < dims_.pp; ++c.pp) {
    for (c.tp = 0; c.tp < dims_.tp; ++c.tp) g.push_back(this->rank(c));  // ascending: pp outer, tp inner
  }
  return g;
}

std::vector<int> RankLayout::embedding_group(int rank) const {
  RankCoord c = coord(rank);
  if (!is_first_stage(rank) && !is_last_stage(rank)) return {};
  if (dims_.pp == 1) return {rank};
  c.pp = 0;
  const int first = this->rank(c);
  c.pp = dims_.pp - 1;
  return {first, this->rank(c)};
}

std::vector<int> RankLayout::fused_embedding_group(int rank) const {
  RankCoord c = coord(rank);
  if (!is_first_stage(rank) && !is_last_stage(rank)) return {};
  std::vector<int> g;
  const int stages[2] = {0, dims_.pp - 1};
  const int num_stages = dims_.pp == 1 ? 1 : 2;  // stage 0 is also stage p-1: no duplicates
  for (int s = 0; s < num_stages; ++s) {
    c.pp = stages[s];
    for (c.dp = 0; c.dp < dims_.dp; ++c.dp) g.push_back(this->rank(c));  // ascending: stage outer
  }
  return g;
}

std::vector<int> RankLayout::group(GroupKind kind, int rank) const {
  switch (kind) {
    case GroupKind::kTensorParallel: return tp_group(rank);
    case GroupKind::kDataParallel: return dp_group(rank);
    case GroupKind::kPipelineParallel: return pp_group(rank);
    case GroupKind::kModelParallel: return model_parallel_group(rank);
    case GroupKind::kEmbedding: return embedding_group(rank);
    case GroupKind::kFusedEmbedding: return fused_embedding_group(rank);
  }
  throw std::invalid_argument("RankLayout::group: unknown GroupKind");
}

std::vector<std::vector<int>> RankLayout::all_groups(GroupKind kind) const {
  // A group is listed when visiting its smallest member, which gives the order by smallest member.
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world(); ++r) {
    std::vector<int> g = group(kind, r);
    if (!g.empty() && g.front() == r) groups.push_back(std::move(g));
  }
  return groups;
}

int RankLayout::prev_stage_rank(int rank) const {
  RankCoord c = coord(rank);
  if (c.pp == 0) return -1;
  --c.pp;
  return this->rank(c);
}

int RankLayout::next_stage_rank(int rank) const {
  RankCoord c = coord(rank);
  if (c.pp == dims_.pp - 1) return -1;
  ++c.pp;
  return this->rank(c);
}

Link RankLayout::link(int a, int b) const {
  return node_of(a) == node_of(b) ? Link::kIntraNode : Link::kInterNode;
}

Link RankLayout::group_link(const std::vector<int>& group) const {
  for (int r : group) {
    if (link(group.front(), r) == Link::kInterNode) return Link::kInterNode;
  }
  return Link::kIntraNode;
}

std::string RankLayout::describe() const {
  std::string out = fmt::format("layout: tp={} pp={} dp={} world={}, {} ranks per node, {} node(s)\n", dims_.tp,
                                dims_.pp, dims_.dp, world(), ranks_per_node_, num_nodes());
  out += fmt::format("{:>6} {:>4} {:>4} {:>4} {:>5}\n", "rank", "tp", "dp", "pp", "node");
  for (int r = 0; r < world(); ++r) {
    const RankCoord c = coord(r);
    out += fmt::format("{:>6} {:>4} {:>4} {:>4} {:>5}\n", r, c.tp, c.dp, c.pp, node_of(r));
  }
  return out;
}

}  // namespace optcc
