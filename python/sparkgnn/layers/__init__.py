"""Merge-aware GNN layers: each conv is split into per-node preparation, per-edge messages, a
mergeable aggregation (partial -> merge -> finalize) and a per-node update, so the aggregation
can be spread over partitions and merged exactly (see docs/ARCHITECTURE.md "The merge-aware layer contract")."""

from sparkgnn.layers.aggregators import AGGREGATORS, Aggregator, get_aggregator
from sparkgnn.layers.base import CONVS, MergeableConv, build_conv, compute_stats, propagate
from sparkgnn.layers.bundle import BundleConv, ConcatAggregator
from sparkgnn.layers.gat import GATLayer
from sparkgnn.layers.gatv2 import GATv2Layer
from sparkgnn.layers.gcn import GCNLayer
from sparkgnn.layers.gin import GINLayer
from sparkgnn.layers.graphconv import GraphConvLayer
from sparkgnn.layers.le import LELayer
from sparkgnn.layers.moments import MomentsAggregator, RawMomentAggregator
from sparkgnn.layers.multihop import MultiRoundConv, SGLayer
from sparkgnn.layers.nodeops import NODE_OPS, NodeOpStack, ParallelOp, build_node_op
from sparkgnn.layers.resgated import ResGatedLayer
from sparkgnn.layers.sage import SAGELayer
from sparkgnn.layers.selfloops import SELF_LOOP_POLICIES, apply_self_loops
from sparkgnn.layers.stats import STATS

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "get_aggregator",
    "CONVS",
    "MergeableConv",
    "build_conv",
    "compute_stats",
    "propagate",
    "GCNLayer",
    "SAGELayer",
    "GINLayer",
    "GATLayer",
    "GraphConvLayer",
    "SGLayer",
    "MultiRoundConv",
    "GATv2Layer",
    "ResGatedLayer",
    "LELayer",
    "BundleConv",
    "ConcatAggregator",
    "MomentsAggregator",
    "RawMomentAggregator",
    "ParallelOp",
    "NODE_OPS",
    "NodeOpStack",
    "build_node_op",
    "SELF_LOOP_POLICIES",
    "apply_self_loops",
    "STATS",
]
