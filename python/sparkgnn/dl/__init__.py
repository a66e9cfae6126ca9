"""The DL engine: runs GNN layer operators with torch on Arrow tables handed over by the graph
engine (in-process or through the messenger). It never sees Spark."""
