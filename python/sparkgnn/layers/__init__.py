"""Merge-aware GNN layers: each conv is split into per-node preparation, per-edge messages, a
mergeable aggregation (partial -> merge -> finalize) and a per-node update, so the aggregation
can be spread over partitions and merged exactly (see docs/ARCHITECTURE.md "The merge-aware layer contract")."""

from sparkgnn.layers.aggregators import AGGREGATORS, Aggregator, get_aggregator
from sparkgnn.layers.base import CONVS, MergeableConv, build_conv, compute_stats, propagate
from sparkgnn.layers.bundle import BundleConv, ConcatAggregator
from sparkgnn.layers.edgeconv import EdgeConvLayer
from sparkgnn.layers.gat import GATLayer
from sparkgnn.layers.gatv2 import GATv2Layer
from sparkgnn.layers.gcn import GCNLayer
from sparkgnn.layers.gen import GENLayer
from sparkgnn.layers.generic import GenericConv
from sparkgnn.layers.gin import GINELayer, GINLayer
from sparkgnn.layers.graphconv import GraphConvLayer
from sparkgnn.layers.hgt import HGTOutputOp, HGTRelationLayer
from sparkgnn.layers.le import LELayer
from sparkgnn.layers.moments import MomentsAggregator, RawMomentAggregator
from sparkgnn.layers.multihop import APPNPLayer, ChebLayer, MultiRoundConv, SGLayer, TAGLayer
from sparkgnn.layers.nodeops import NODE_OPS, NodeOpStack, ParallelOp, build_node_op
from sparkgnn.layers.pna import MultiAggregator, PNALayer
from sparkgnn.layers.resgated import ResGatedLayer
from sparkgnn.layers.sage import SAGELayer
from sparkgnn.layers.selfloops import SELF_LOOP_POLICIES, apply_self_loops
from sparkgnn.layers.stats import STATS
from sparkgnn.layers.transformer import TransformerLayer

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
    "GINELayer",
    "GINLayer",
    "GATLayer",
    "GenericConv",
    "GraphConvLayer",
    "HGTOutputOp",
    "HGTRelationLayer",
    "SGLayer",
    "TAGLayer",
    "APPNPLayer",
    "ChebLayer",
    "EdgeConvLayer",
    "TransformerLayer",
    "GENLayer",
    "PNALayer",
    "MultiAggregator",
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
